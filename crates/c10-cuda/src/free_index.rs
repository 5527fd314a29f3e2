//! The best-fit index of a pool's free blocks, ordered by `(stream, size, address)` exactly as
//! PyTorch's `std::set<Block*, BlockComparatorSize>`, but with O(1) size-class lookups.
//!
//! Per stream, sizes below [`EXACT_LIMIT`] bytes have one class per 512-byte size, found with
//! a three-level bitmap (the next non-empty class at or above a size is a few `trailing_zeros`);
//! each class keeps its blocks sorted by address (usually zero to a handful). Larger sizes live
//! in a B-tree keyed by `(size, address)`. Iteration order is the same total order as PyTorch's
//! set, so every decision (best fit, ties to the lowest address, release order) is unchanged.

use std::collections::BTreeMap;

use smallvec::SmallVec;

use crate::block::{BlockId, SizeKey};
use crate::device::{DevicePtr, StreamId};

/// Sizes below this many bytes (64 MiB) use exact size classes; larger ones a B-tree.
pub(crate) const EXACT_LIMIT: usize = 64 << 20;
const UNIT_SHIFT: u32 = 9;
const CLASSES: usize = EXACT_LIMIT >> UNIT_SHIFT; // 131072
const L0_WORDS: usize = CLASSES / 64; // 2048
const L1_WORDS: usize = L0_WORDS / 64; // 32

/// A three-level bitmap over the size classes: bit set = class non-empty.
#[derive(Clone, Debug)]
struct Bitmap {
    l0: Box<[u64; L0_WORDS]>,
    l1: [u64; L1_WORDS],
    l2: u64,
}

impl Bitmap {
    fn new() -> Self {
        Bitmap {
            l0: Box::new([0; L0_WORDS]),
            l1: [0; L1_WORDS],
            l2: 0,
        }
    }

    #[inline]
    fn set(&mut self, c: usize) {
        let w = c >> 6;
        self.l0[w] |= 1 << (c & 63);
        self.l1[w >> 6] |= 1 << (w & 63);
        self.l2 |= 1 << (w >> 6);
    }

    #[inline]
    fn clear(&mut self, c: usize) {
        let w = c >> 6;
        self.l0[w] &= !(1 << (c & 63));
        if self.l0[w] == 0 {
            self.l1[w >> 6] &= !(1 << (w & 63));
            if self.l1[w >> 6] == 0 {
                self.l2 &= !(1 << (w >> 6));
            }
        }
    }

    /// The lowest set class `>= c`.
    #[inline]
    fn next_at_or_above(&self, c: usize) -> Option<usize> {
        if c >= CLASSES {
            return None;
        }
        let w = c >> 6;
        let m = self.l0[w] & (!0u64 << (c & 63));
        if m != 0 {
            return Some((w << 6) | m.trailing_zeros() as usize);
        }
        let w1 = w + 1;
        if w1 >= L0_WORDS {
            return None;
        }
        let i = w1 >> 6;
        let m1 = self.l1[i] & (!0u64 << (w1 & 63));
        let word = if m1 != 0 {
            (i << 6) | m1.trailing_zeros() as usize
        } else {
            let i2 = i + 1;
            if i2 >= L1_WORDS {
                return None;
            }
            let m2 = self.l2 & (!0u64 << i2);
            if m2 == 0 {
                return None;
            }
            let i = m2.trailing_zeros() as usize;
            (i << 6) | self.l1[i].trailing_zeros() as usize
        };
        Some((word << 6) | self.l0[word].trailing_zeros() as usize)
    }

    /// The highest set class `< c`.
    #[inline]
    fn prev_below(&self, c: usize) -> Option<usize> {
        let c = c.min(CLASSES);
        if c == 0 {
            return None;
        }
        let top = c - 1;
        let w = top >> 6;
        let m = self.l0[w] & (!0u64 >> (63 - (top & 63)));
        if m != 0 {
            return Some((w << 6) | (63 - m.leading_zeros() as usize));
        }
        if w == 0 {
            return None;
        }
        let w1 = w - 1;
        let i = w1 >> 6;
        let m1 = self.l1[i] & (!0u64 >> (63 - (w1 & 63)));
        let word = if m1 != 0 {
            (i << 6) | (63 - m1.leading_zeros() as usize)
        } else {
            if i == 0 {
                return None;
            }
            let m2 = self.l2 & (!0u64 >> (63 - (i - 1)));
            if m2 == 0 {
                return None;
            }
            let i = 63 - m2.leading_zeros() as usize;
            (i << 6) | (63 - self.l1[i].leading_zeros() as usize)
        };
        Some((word << 6) | (63 - self.l0[word].leading_zeros() as usize))
    }
}

/// The blocks of one size class, sorted by address; one block is stored inline.
type ClassList = SmallVec<[(DevicePtr, BlockId); 1]>;

/// Classes per lazily allocated page of the class table.
const PAGE: usize = 256;

/// One stream's free blocks.
#[derive(Clone, Debug)]
struct StreamFree {
    bitmap: Bitmap,
    /// Class -> blocks of exactly that size, in pages of [`PAGE`] classes allocated on first
    /// use (a direct index without hashing; memory grows with the size ranges in use).
    pages: Vec<Option<Box<[ClassList; PAGE]>>>,
    /// Blocks of `EXACT_LIMIT` bytes or more, by `(size, address)`.
    large: BTreeMap<(usize, DevicePtr), BlockId>,
}

impl StreamFree {
    fn new() -> Self {
        StreamFree {
            bitmap: Bitmap::new(),
            pages: vec![None; CLASSES / PAGE],
            large: BTreeMap::new(),
        }
    }

    #[inline]
    fn class_list(&self, c: usize) -> &[(DevicePtr, BlockId)] {
        match &self.pages[c / PAGE] {
            Some(page) => &page[c % PAGE],
            None => &[],
        }
    }

    #[inline]
    fn class_list_mut(&mut self, c: usize) -> &mut ClassList {
        let page = self.pages[c / PAGE]
            .get_or_insert_with(|| Box::new(std::array::from_fn(|_| ClassList::new())));
        &mut page[c % PAGE]
    }
}

/// The free blocks of one pool in `(stream, size, address)` order.
#[derive(Clone, Debug, Default)]
pub(crate) struct FreeIndex {
    /// Per stream, sorted by stream (PyTorch orders streams by handle value).
    streams: Vec<(StreamId, StreamFree)>,
    len: usize,
}

#[inline]
fn class_of(size: usize) -> usize {
    size >> UNIT_SHIFT
}

impl FreeIndex {
    #[inline]
    fn stream(&self, s: StreamId) -> Option<&StreamFree> {
        match self.streams.as_slice() {
            [(id, f)] => (*id == s).then_some(f),
            many => many.iter().find(|(id, _)| *id == s).map(|(_, f)| f),
        }
    }

    #[inline]
    fn stream_mut(&mut self, s: StreamId) -> &mut StreamFree {
        if self.streams.len() == 1 && self.streams[0].0 == s {
            return &mut self.streams[0].1;
        }
        match self.streams.iter().position(|(id, _)| *id == s) {
            Some(i) => &mut self.streams[i].1,
            None => {
                let at = self.streams.partition_point(|(id, _)| *id < s);
                self.streams.insert(at, (s, StreamFree::new()));
                &mut self.streams[at].1
            }
        }
    }

    /// Number of free blocks.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Inserts a key; false if it was present.
    #[inline(always)]
    pub(crate) fn insert(&mut self, k: SizeKey) -> bool {
        // Fast path: the only stream, an allocated page, an empty class.
        if k.size < EXACT_LIMIT {
            if let [(id, f)] = self.streams.as_mut_slice() {
                if *id == k.stream {
                    let c = class_of(k.size);
                    if let Some(page) = f.pages[c / PAGE].as_mut() {
                        let list = &mut page[c % PAGE];
                        if list.is_empty() {
                            list.push((k.ptr, k.id));
                            f.bitmap.set(c);
                            self.len += 1;
                            return true;
                        }
                    }
                }
            }
        }
        self.insert_slow(k)
    }

    #[cold]
    #[inline(never)]
    fn insert_slow(&mut self, k: SizeKey) -> bool {
        let f = self.stream_mut(k.stream);
        let inserted = if k.size < EXACT_LIMIT {
            let c = class_of(k.size);
            let list = f.class_list_mut(c);
            if list.is_empty() {
                list.push((k.ptr, k.id));
                f.bitmap.set(c);
                true
            } else {
                match list.binary_search_by_key(&k.ptr, |e| e.0) {
                    Ok(_) => false,
                    Err(at) => {
                        list.insert(at, (k.ptr, k.id));
                        true
                    }
                }
            }
        } else {
            f.large.insert((k.size, k.ptr), k.id).is_none()
        };
        self.len += usize::from(inserted);
        inserted
    }

    /// Removes a key; false if it was absent.
    #[inline(always)]
    pub(crate) fn remove(&mut self, k: &SizeKey) -> bool {
        // Fast path: the only stream, a class holding just this block.
        if k.size < EXACT_LIMIT {
            if let [(id, f)] = self.streams.as_mut_slice() {
                if *id == k.stream {
                    let c = class_of(k.size);
                    if let Some(page) = f.pages[c / PAGE].as_mut() {
                        let list = &mut page[c % PAGE];
                        if let [only] = list.as_slice() {
                            if *only == (k.ptr, k.id) {
                                list.clear();
                                f.bitmap.clear(c);
                                self.len -= 1;
                                return true;
                            }
                        }
                    }
                }
            }
        }
        self.remove_slow(k)
    }

    #[cold]
    #[inline(never)]
    fn remove_slow(&mut self, k: &SizeKey) -> bool {
        let Some(i) = self.streams.iter().position(|(id, _)| *id == k.stream) else {
            return false;
        };
        let f = &mut self.streams[i].1;
        let removed = if k.size < EXACT_LIMIT {
            let c = class_of(k.size);
            let Some(page) = f.pages[c / PAGE].as_mut() else {
                return false;
            };
            let list = &mut page[c % PAGE];
            let found = match list.as_slice() {
                [] => None,
                [only] => (only.0 == k.ptr).then_some(0),
                many => many.binary_search_by_key(&k.ptr, |e| e.0).ok(),
            };
            match found {
                Some(at) if list[at].1 == k.id => {
                    if list.len() == 1 {
                        list.clear();
                        f.bitmap.clear(c);
                    } else {
                        list.remove(at);
                    }
                    true
                }
                _ => false,
            }
        } else {
            f.large.remove(&(k.size, k.ptr)).is_some()
        };
        self.len -= usize::from(removed);
        removed
    }

    /// Whether the key is present.
    pub(crate) fn contains(&self, k: &SizeKey) -> bool {
        let Some(f) = self.stream(k.stream) else {
            return false;
        };
        if k.size < EXACT_LIMIT {
            f.class_list(class_of(k.size))
                .binary_search_by_key(&k.ptr, |e| e.0)
                .is_ok_and(|at| f.class_list(class_of(k.size))[at].1 == k.id)
        } else {
            f.large.get(&(k.size, k.ptr)) == Some(&k.id)
        }
    }

    /// The first key `>= (stream, size, 0)` on `stream` (best fit), if any.
    #[inline(always)]
    pub(crate) fn lower_bound(&self, stream: StreamId, size: usize) -> Option<SizeKey> {
        let f = self.stream(stream)?;
        if size < EXACT_LIMIT {
            if let Some(c) = f.bitmap.next_at_or_above(class_of(size)) {
                let (ptr, id) = f.class_list(c)[0];
                return Some(SizeKey {
                    stream,
                    size: c << UNIT_SHIFT,
                    ptr,
                    id,
                });
            }
        }
        f.large
            .range((size.max(EXACT_LIMIT), 0)..)
            .next()
            .map(|(&(size, ptr), &id)| SizeKey {
                stream,
                size,
                ptr,
                id,
            })
    }

    /// Keys of `stream` with size `>= size`, ascending by `(size, address)`.
    pub(crate) fn range_from(
        &self,
        stream: StreamId,
        size: usize,
    ) -> impl Iterator<Item = SizeKey> + '_ {
        let f = self.stream(stream);
        let start_class = if size < EXACT_LIMIT {
            f.and_then(|f| f.bitmap.next_at_or_above(class_of(size)))
        } else {
            None
        };
        let exact = ForwardClasses {
            f,
            class: start_class,
            idx: 0,
        }
        .map(move |(ptr, id, size)| SizeKey {
            stream,
            size,
            ptr,
            id,
        });
        let large = f
            .into_iter()
            .flat_map(move |f| f.large.range((size.max(EXACT_LIMIT), 0)..))
            .map(move |(&(size, ptr), &id)| SizeKey {
                stream,
                size,
                ptr,
                id,
            });
        exact.chain(large)
    }

    /// Keys of `stream` with size `< size`, descending by `(size, address)`.
    pub(crate) fn range_below_rev(
        &self,
        stream: StreamId,
        size: usize,
    ) -> impl Iterator<Item = SizeKey> + '_ {
        let f = self.stream(stream);
        let large = f
            .into_iter()
            .flat_map(move |f| f.large.range(..(size, 0)).rev())
            .map(move |(&(size, ptr), &id)| SizeKey {
                stream,
                size,
                ptr,
                id,
            });
        let start = f.and_then(|f| f.bitmap.prev_below(class_of(size.min(EXACT_LIMIT))));
        let exact = BackwardClasses {
            f,
            class: start,
            idx: usize::MAX,
        }
        .map(move |(ptr, id, size)| SizeKey {
            stream,
            size,
            ptr,
            id,
        });
        large.chain(exact)
    }

    /// All keys in `(stream, size, address)` order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = SizeKey> + '_ {
        self.streams
            .iter()
            .flat_map(move |(s, _)| self.range_from(*s, 0))
    }
}

/// Walks the exact classes upward from `class`.
struct ForwardClasses<'a> {
    f: Option<&'a StreamFree>,
    class: Option<usize>,
    idx: usize,
}

impl Iterator for ForwardClasses<'_> {
    type Item = (DevicePtr, BlockId, usize);

    fn next(&mut self) -> Option<Self::Item> {
        let f = self.f?;
        loop {
            let c = self.class?;
            let list = f.class_list(c);
            if let Some(&(ptr, id)) = list.get(self.idx) {
                self.idx += 1;
                return Some((ptr, id, c << UNIT_SHIFT));
            }
            self.class = f.bitmap.next_at_or_above(c + 1);
            self.idx = 0;
        }
    }
}

/// Walks the exact classes downward from `class` (addresses descending within a class).
struct BackwardClasses<'a> {
    f: Option<&'a StreamFree>,
    class: Option<usize>,
    /// Next index to yield plus one, within the current class (`usize::MAX` = from the end).
    idx: usize,
}

impl Iterator for BackwardClasses<'_> {
    type Item = (DevicePtr, BlockId, usize);

    fn next(&mut self) -> Option<Self::Item> {
        let f = self.f?;
        loop {
            let c = self.class?;
            let list = f.class_list(c);
            let end = self.idx.min(list.len());
            if end > 0 {
                self.idx = end - 1;
                let (ptr, id) = list[end - 1];
                return Some((ptr, id, c << UNIT_SHIFT));
            }
            self.class = f.bitmap.prev_below(c);
            self.idx = usize::MAX;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn key(stream: u64, size: usize, ptr: u64, id: u32) -> SizeKey {
        SizeKey {
            stream: StreamId(stream),
            size,
            ptr,
            id: BlockId(id),
        }
    }

    #[test]
    fn bitmap_finds_neighbours_across_levels() {
        let mut b = Bitmap::new();
        for c in [1usize, 63, 64, 4095, 4096, 70000, CLASSES - 1] {
            b.set(c);
        }
        assert_eq!(b.next_at_or_above(0), Some(1));
        assert_eq!(b.next_at_or_above(2), Some(63));
        assert_eq!(b.next_at_or_above(65), Some(4095));
        assert_eq!(b.next_at_or_above(4097), Some(70000));
        assert_eq!(b.next_at_or_above(70001), Some(CLASSES - 1));
        assert_eq!(b.next_at_or_above(CLASSES), None);
        assert_eq!(b.prev_below(CLASSES), Some(CLASSES - 1));
        assert_eq!(b.prev_below(70000), Some(4096));
        assert_eq!(b.prev_below(64), Some(63));
        assert_eq!(b.prev_below(1), None);
        b.clear(63);
        b.clear(64);
        assert_eq!(b.next_at_or_above(2), Some(4095));
        assert_eq!(b.prev_below(4095), Some(1));
    }

    /// The index behaves exactly like a BTreeSet of (stream, size, ptr) keys.
    #[test]
    fn matches_a_btree_set_on_random_operations() {
        let mut idx = FreeIndex::default();
        let mut model: BTreeSet<SizeKey> = BTreeSet::new();
        let mut state = 0x1234_5678_9abc_def0u64;
        let mut rnd = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let sizes = [
            512usize,
            1024,
            2 << 20,
            (2 << 20) - 512,
            20 << 20,
            64 << 20,
            100 << 20,
            3 << 30,
        ];
        for _ in 0..20_000 {
            let r = rnd();
            let k = key(
                r % 3,
                sizes[(r >> 8) as usize % sizes.len()] + ((r >> 16) as usize % 4) * 512,
                ((r >> 24) % 64) * 512,
                ((r >> 24) % 64) as u32,
            );
            if r & (1 << 40) != 0 {
                assert_eq!(idx.insert(k), model.insert(k));
            } else {
                assert_eq!(idx.remove(&k), model.remove(&k));
            }
            assert_eq!(idx.len(), model.len());
            let probe_stream = StreamId(rnd() % 3);
            let probe_size = sizes[rnd() as usize % sizes.len()];
            let lower = SizeKey::lower(probe_stream, probe_size);
            let want: Vec<_> = model
                .range(lower..)
                .take_while(|k| k.stream == probe_stream)
                .copied()
                .collect();
            assert_eq!(
                idx.range_from(probe_stream, probe_size).collect::<Vec<_>>(),
                want
            );
            let want_rev: Vec<_> = model
                .range(..lower)
                .rev()
                .take_while(|k| k.stream == probe_stream)
                .copied()
                .collect();
            assert_eq!(
                idx.range_below_rev(probe_stream, probe_size)
                    .collect::<Vec<_>>(),
                want_rev
            );
        }
        assert_eq!(
            idx.iter().collect::<Vec<_>>(),
            model.iter().copied().collect::<Vec<_>>()
        );
        for k in &model {
            assert!(idx.contains(k));
        }
    }
}
