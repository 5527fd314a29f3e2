//! A deterministic first-fit address allocator with coalescing (the simulated device's
//! `cudaMalloc` and `cuMemAddressReserve` address spaces).

use std::collections::BTreeMap;

/// Hands out address ranges from `[base, base + len)`: the lowest free range that fits,
/// 512-byte granular, merging neighbours on free.
#[derive(Clone, Debug)]
pub(crate) struct AddressSpace {
    /// Free ranges: start -> length.
    free: BTreeMap<u64, u64>,
    base: u64,
    len: u64,
}

const GRANULE: u64 = 512;

impl AddressSpace {
    pub(crate) fn new(base: u64, len: u64) -> Self {
        let mut free = BTreeMap::new();
        free.insert(base, len);
        AddressSpace { free, base, len }
    }

    /// The lowest free range of `size` bytes (rounded up to 512), or `None` when none fits.
    pub(crate) fn allocate(&mut self, size: u64) -> Option<u64> {
        let size = size.checked_add(GRANULE - 1)? & !(GRANULE - 1);
        let (&start, &len) = self.free.iter().find(|&(_, &len)| len >= size)?;
        self.free.remove(&start);
        if len > size {
            self.free.insert(start + size, len - size);
        }
        Some(start)
    }

    /// Takes exactly `[start, start + size)` (rounded up to 512) if it is free; false otherwise.
    pub(crate) fn allocate_at(&mut self, start: u64, size: u64) -> bool {
        let Some(size) = size.checked_add(GRANULE - 1).map(|s| s & !(GRANULE - 1)) else {
            return false;
        };
        let Some((&s, &l)) = self.free.range(..=start).next_back() else {
            return false;
        };
        let Some(end) = start.checked_add(size) else {
            return false;
        };
        if end > s + l {
            return false;
        }
        self.free.remove(&s);
        if start > s {
            self.free.insert(s, start - s);
        }
        if s + l > end {
            self.free.insert(end, s + l - end);
        }
        true
    }

    /// Whether `[start, start + len)` lies inside the managed region.
    pub(crate) fn contains(&self, start: u64, len: u64) -> bool {
        start >= self.base && start.saturating_add(len) <= self.base + self.len
    }

    /// Returns `[start, start + size)` (as given to `allocate`) to the free list.
    pub(crate) fn free(&mut self, start: u64, size: u64) {
        let mut start = start;
        let mut size = (size + GRANULE - 1) & !(GRANULE - 1);
        if let Some((&s, &l)) = self.free.range(..start).next_back() {
            if s + l == start {
                self.free.remove(&s);
                start = s;
                size += l;
            }
        }
        if let Some(&l) = self.free.get(&(start + size)) {
            self.free.remove(&(start + size));
            size += l;
        }
        self.free.insert(start, size);
    }
}

#[cfg(test)]
mod tests {
    use super::AddressSpace;

    #[test]
    fn first_fit_reuses_and_coalesces() {
        let mut a = AddressSpace::new(0x1000_0000, 1 << 30);
        let x = a.allocate(2 << 20).unwrap();
        let y = a.allocate(20 << 20).unwrap();
        let z = a.allocate(2 << 20).unwrap();
        assert_eq!((x, y, z), (0x1000_0000, 0x1020_0000, 0x1160_0000));
        a.free(x, 2 << 20);
        a.free(y, 20 << 20);
        // The two freed neighbours merged: a 22 MiB request fits at the start again.
        assert_eq!(a.allocate(22 << 20), Some(0x1000_0000));
        assert_eq!(a.allocate(1 << 31), None);
        assert_eq!(a.allocate(1), Some(0x1180_0000));
    }

    #[test]
    fn allocate_at_takes_exact_free_ranges_only() {
        let mut a = AddressSpace::new(0x1000_0000, 1 << 30);
        assert!(a.allocate_at(0x1040_0000, 2 << 20));
        assert!(!a.allocate_at(0x1040_0000, 512));
        assert!(!a.allocate_at(0x0fff_0000, 512));
        assert_eq!(a.allocate(4 << 20), Some(0x1000_0000));
        assert_eq!(a.allocate(2 << 20), Some(0x1060_0000));
        a.free(0x1040_0000, 2 << 20);
        assert_eq!(a.allocate(2 << 20), Some(0x1040_0000));
    }
}
