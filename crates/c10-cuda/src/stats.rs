//! Allocator statistics with PyTorch's update rules and `memory_stats()` key names.
//!
//! Mirrors `c10::CachingDeviceAllocator::DeviceStats`: nine [`StatArray`]s (aggregate, small
//! pool, large pool), two oversize [`Stat`]s and six counters (seven from torch 2.15), flattened
//! by [`DeviceStats::memory_stats`] into exactly the keys of `torch.cuda.memory_stats()` of the
//! PyTorch version the allocator follows: 122 for torch 2.7, 123 for 2.15.

use crate::rules::TorchVersion;

use std::collections::BTreeMap;

/// One statistic: PyTorch's `Stat` (`current`, `peak`, `allocated`, `freed`).
///
/// `allocated`/`freed` accumulate every increase/decrease; `peak` is the maximum `current` since
/// the last [`Stat::reset_peak`]. Values are bytes for the `*_bytes` stats, counts otherwise.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    /// The value now.
    pub current: i64,
    /// The largest `current` since the last peak reset.
    pub peak: i64,
    /// Sum of all increases since the last accumulated reset.
    pub allocated: i64,
    /// Sum of all decreases since the last accumulated reset.
    pub freed: i64,
}

impl Stat {
    /// Adds `amount` (PyTorch's `Stat::increase`).
    #[inline(always)]
    pub fn increase(&mut self, amount: u64) {
        let amount = amount as i64;
        self.current += amount;
        self.peak = self.peak.max(self.current);
        self.allocated += amount;
    }

    /// Subtracts `amount` (PyTorch's `Stat::decrease`). The allocator never drives `current`
    /// below zero; the property tests check that.
    #[inline(always)]
    pub fn decrease(&mut self, amount: u64) {
        let amount = amount as i64;
        self.current -= amount;
        self.freed += amount;
    }

    /// `peak = current` (PyTorch's `reset_peak`).
    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    /// `allocated = freed = 0` (PyTorch's `reset_accumulated`).
    pub fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
}

/// Which pool a statistic is about (PyTorch's `StatType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StatType {
    /// Both pools together (`all`).
    Aggregate = 0,
    /// The small pool: blocks of at most 1 MiB (`small_pool`).
    SmallPool = 1,
    /// The large pool (`large_pool`).
    LargePool = 2,
}

impl StatType {
    /// All three, in PyTorch's order.
    pub const ALL: [StatType; 3] = [
        StatType::Aggregate,
        StatType::SmallPool,
        StatType::LargePool,
    ];

    /// The key segment PyTorch prints: `all`, `small_pool`, `large_pool`.
    pub fn key(self) -> &'static str {
        match self {
            StatType::Aggregate => "all",
            StatType::SmallPool => "small_pool",
            StatType::LargePool => "large_pool",
        }
    }
}

/// One [`Stat`] per [`StatType`] (PyTorch's `StatArray`), indexed by `StatType as usize`.
pub type StatArray = [Stat; 3];

// How the allocator keeps its arrays: PyTorch updates the aggregate and the pool stat of every
// change (`for_each_selected_stat_type`). The allocator updates only the pool's stat, plus the
// aggregate's peak on an increase (the aggregate's current is the sum of the pools'); the
// aggregate's `current`, `allocated` and `freed` are filled in when the stats are read
// ([`DeviceStats::materialize`]). The values read are the same; a malloc/free pair does half
// the stat updates.

/// Index of the small or large pool's stat in a [`StatArray`].
#[inline(always)]
fn pool_index(small: bool) -> usize {
    2 - usize::from(small)
}

/// Adds `amount` to the pool's stat of `arr` and keeps the aggregate's peak.
#[inline(always)]
pub(crate) fn increase(arr: &mut StatArray, small: bool, amount: u64) {
    let i = pool_index(small);
    bump(arr, i, 3 - i, amount);
}

/// Subtracts `amount` from the pool's stat of `arr`.
#[inline(always)]
pub(crate) fn decrease(arr: &mut StatArray, small: bool, amount: u64) {
    drop_by(arr, pool_index(small), amount);
}

/// [`increase`] with the pool's index `i` and the other pool's `o` computed by the caller (once
/// for several arrays). The maxima are branch-free: a forward pass sets new peaks at
/// unpredictable points.
#[inline(always)]
fn bump(arr: &mut StatArray, i: usize, o: usize, amount: u64) {
    arr[i].increase(amount);
    let total = arr[i].current + arr[o].current;
    arr[0].peak = arr[0].peak.max(total);
}

/// [`decrease`] with the pool's index computed by the caller.
#[inline(always)]
fn drop_by(arr: &mut StatArray, i: usize, amount: u64) {
    arr[i].decrease(amount);
}

impl DeviceStats {
    /// A block of `size` bytes (`requested` asked for) handed out from the small or large pool:
    /// `allocation`, `allocated_bytes`, `active`, `active_bytes` and `requested_bytes` grow, in
    /// PyTorch's order (`alloc_found_block`).
    #[inline(always)]
    pub(crate) fn count_alloc(&mut self, small: bool, size: u64, requested: u64) {
        let i = pool_index(small);
        let o = 3 - i;
        bump(&mut self.allocation, i, o, 1);
        bump(&mut self.allocated_bytes, i, o, size);
        bump(&mut self.active, i, o, 1);
        bump(&mut self.active_bytes, i, o, size);
        bump(&mut self.requested_bytes, i, o, requested);
    }

    /// A block of `size` bytes freed by the user (PyTorch's `free`): `allocation` and
    /// `allocated_bytes` shrink.
    #[inline(always)]
    pub(crate) fn count_free_requested(&mut self, small: bool, size: u64) {
        let i = pool_index(small);
        drop_by(&mut self.allocation, i, 1);
        drop_by(&mut self.allocated_bytes, i, size);
    }

    /// A block of `size` bytes (`requested` asked for) really free (PyTorch's `free_block`):
    /// `active`, `active_bytes` and `requested_bytes` shrink.
    #[inline(always)]
    pub(crate) fn count_free_completed(&mut self, small: bool, size: u64, requested: u64) {
        let i = pool_index(small);
        drop_by(&mut self.active, i, 1);
        drop_by(&mut self.active_bytes, i, size);
        drop_by(&mut self.requested_bytes, i, requested);
    }
}

/// All statistics of one device allocator (PyTorch's `DeviceStats`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Live allocations (blocks handed out and not yet freed by the user).
    pub allocation: StatArray,
    /// Device segments (`cudaMalloc` calls not yet `cudaFree`d).
    pub segment: StatArray,
    /// Active blocks: allocated, or freed but waiting on stream events.
    pub active: StatArray,
    /// Free blocks inside split segments (these cannot be released: fragmentation).
    pub inactive_split: StatArray,
    /// Bytes of live allocations (rounded block sizes).
    pub allocated_bytes: StatArray,
    /// Bytes of device memory held by the allocator (reserved).
    pub reserved_bytes: StatArray,
    /// Bytes of active blocks.
    pub active_bytes: StatArray,
    /// Bytes of free blocks inside split segments.
    pub inactive_split_bytes: StatArray,
    /// Bytes the user asked for (unrounded) of active blocks.
    pub requested_bytes: StatArray,
    /// Allocations of blocks of at least `max_split_size` bytes.
    pub oversize_allocations: Stat,
    /// Segments of at least `max_split_size` bytes.
    pub oversize_segments: Stat,
    /// `cudaMalloc` retries after releasing cache (`num_alloc_retries`).
    pub num_alloc_retries: i64,
    /// Out-of-memory errors raised (`num_ooms`).
    pub num_ooms: i64,
    /// Full synchronizations of outstanding events (`num_sync_all_streams`).
    pub num_sync_all_streams: i64,
    /// Device allocations: `cudaMalloc` calls and expandable-segment page maps
    /// (`num_device_alloc`).
    pub num_device_alloc: i64,
    /// Device frees: `cudaFree` calls and expandable-segment unmaps (`num_device_free`).
    pub num_device_free: i64,
    /// The configured `max_split_size` in bytes; `None` when unlimited.
    pub max_split_size: Option<u64>,
    /// Allocations refused without trying the device (`num_oom_rejections`, torch 2.15 only:
    /// `throw_on_cudamalloc_oom`, which this allocator does not implement, so always 0).
    pub num_oom_rejections: i64,
    /// The PyTorch version whose key set [`DeviceStats::memory_stats`] reports (the allocator's
    /// [`crate::rules::Rules`] version; the default is the newest).
    pub torch: TorchVersion,
    /// Bytes reserved by each private pool seen so far, by id (torch 2.15's
    /// `reserved_bytes_by_private_pools`, reported by [`DeviceStats::memory_stats`] under 2.15's
    /// rules only), kept as the other arrays are (see the note on how the allocator keeps its
    /// arrays); a forgotten pool's `current` is 0, its peak and totals stay.
    pub reserved_bytes_by_private_pools: BTreeMap<crate::pool_types::MempoolId, StatArray>,
}

/// The nine stat arrays in the order PyTorch's `memory_stats()` emits them.
const ARRAY_NAMES: [&str; 9] = [
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
];

impl DeviceStats {
    /// The nine stat arrays with their PyTorch names.
    pub fn arrays(&self) -> [(&'static str, &StatArray); 9] {
        let a = [
            &self.allocation,
            &self.segment,
            &self.active,
            &self.inactive_split,
            &self.allocated_bytes,
            &self.reserved_bytes,
            &self.active_bytes,
            &self.inactive_split_bytes,
            &self.requested_bytes,
        ];
        std::array::from_fn(|i| (ARRAY_NAMES[i], a[i]))
    }

    fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }

    /// The flat map of `torch.cuda.memory_stats()`: exactly the keys of the PyTorch version in
    /// [`DeviceStats::torch`] (122 for torch 2.7, 123 for 2.15), sorted.
    ///
    /// Keys: `<array>.<all|small_pool|large_pool>.<current|peak|allocated|freed>` for the nine
    /// arrays (108), `oversize_allocations.*` and `oversize_segments.*` (8), and the scalars
    /// `num_alloc_retries`, `num_ooms`, `max_split_size`, `num_sync_all_streams`,
    /// `num_device_alloc`, `num_device_free` (6), plus `num_oom_rejections` from torch 2.15.
    /// Under 2.15 also `reserved_bytes_by_private_pools.<first>_<second>.<all|small_pool|
    /// large_pool>.<current|peak|allocated|freed>` (12 keys) for each private pool seen, as
    /// `torch.cuda.memory_stats()` flattens them; with no private pool the count is 123.
    ///
    /// Deliberate difference: none in the values. Like PyTorch, `max_split_size` reads `-1` when
    /// unlimited (PyTorch stores `SIZE_MAX` and converts it to a signed -1); the typed field
    /// [`DeviceStats::max_split_size`] says `None` instead.
    pub fn memory_stats(&self) -> BTreeMap<String, i64> {
        let mut out = BTreeMap::new();
        let mut put_stat = |prefix: &str, s: &Stat| {
            out.insert(format!("{prefix}.current"), s.current);
            out.insert(format!("{prefix}.peak"), s.peak);
            out.insert(format!("{prefix}.allocated"), s.allocated);
            out.insert(format!("{prefix}.freed"), s.freed);
        };
        for (name, array) in self.arrays() {
            for t in StatType::ALL {
                put_stat(&format!("{name}.{}", t.key()), &array[t as usize]);
            }
        }
        put_stat("oversize_allocations", &self.oversize_allocations);
        put_stat("oversize_segments", &self.oversize_segments);
        out.insert("num_alloc_retries".into(), self.num_alloc_retries);
        out.insert("num_ooms".into(), self.num_ooms);
        out.insert(
            "max_split_size".into(),
            self.max_split_size.map_or(-1, |v| v as i64),
        );
        out.insert("num_sync_all_streams".into(), self.num_sync_all_streams);
        out.insert("num_device_alloc".into(), self.num_device_alloc);
        out.insert("num_device_free".into(), self.num_device_free);
        if self.torch.has_oom_rejections_stat() {
            out.insert("num_oom_rejections".into(), self.num_oom_rejections);
            for (id, array) in &self.reserved_bytes_by_private_pools {
                for t in StatType::ALL {
                    let prefix = format!(
                        "reserved_bytes_by_private_pools.{}.{}",
                        id.stats_key(),
                        t.key()
                    );
                    let s = &array[t as usize];
                    out.insert(format!("{prefix}.current"), s.current);
                    out.insert(format!("{prefix}.peak"), s.peak);
                    out.insert(format!("{prefix}.allocated"), s.allocated);
                    out.insert(format!("{prefix}.freed"), s.freed);
                }
            }
        }
        out
    }

    /// Sets the aggregate of every array to the sum of its pools (`current`, `allocated`,
    /// `freed`; the aggregate's peak is kept as it is tracked). See the note on how the
    /// allocator keeps its arrays.
    pub(crate) fn materialize(&mut self) {
        fn sum(array: &mut StatArray) {
            let [aggregate, small_pool, large_pool] = array;
            aggregate.current = small_pool.current + large_pool.current;
            aggregate.allocated = small_pool.allocated + large_pool.allocated;
            aggregate.freed = small_pool.freed + large_pool.freed;
        }
        self.arrays_mut().into_iter().for_each(sum);
        self.reserved_bytes_by_private_pools
            .values_mut()
            .for_each(sum);
    }

    /// `peak = current` for every stat (PyTorch's `resetPeakStats`).
    pub fn reset_peak(&mut self) {
        for array in self.arrays_mut() {
            array.iter_mut().for_each(Stat::reset_peak);
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
        for array in self.reserved_bytes_by_private_pools.values_mut() {
            array.iter_mut().for_each(Stat::reset_peak);
        }
    }

    /// `allocated = freed = 0` everywhere and the counters to 0 (PyTorch's
    /// `resetAccumulatedStats`).
    pub fn reset_accumulated(&mut self) {
        for array in self.arrays_mut() {
            array.iter_mut().for_each(Stat::reset_accumulated);
        }
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        for array in self.reserved_bytes_by_private_pools.values_mut() {
            array.iter_mut().for_each(Stat::reset_accumulated);
        }
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
        self.num_oom_rejections = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_stats_has_exactly_pytorchs_keys_per_version() {
        let old = DeviceStats {
            torch: TorchVersion::V2_7,
            ..DeviceStats::default()
        };
        assert_eq!(old.memory_stats().len(), 122);
        assert!(!old.memory_stats().contains_key("num_oom_rejections"));
        let stats = DeviceStats::default();
        let map = stats.memory_stats();
        assert_eq!(map.len(), 123);
        assert_eq!(map["num_oom_rejections"], 0);
        assert_eq!(map["max_split_size"], -1);
        assert!(map.contains_key("allocated_bytes.all.current"));
        assert!(map.contains_key("reserved_bytes.large_pool.peak"));
        assert!(map.contains_key("inactive_split_bytes.small_pool.freed"));
        assert!(map.contains_key("oversize_segments.allocated"));
    }

    #[test]
    fn stat_update_rules() {
        let mut s = Stat::default();
        s.increase(10);
        s.increase(5);
        s.decrease(12);
        assert_eq!(
            s,
            Stat {
                current: 3,
                peak: 15,
                allocated: 15,
                freed: 12
            }
        );
        s.reset_peak();
        assert_eq!(s.peak, 3);
        s.reset_accumulated();
        assert_eq!(
            s,
            Stat {
                current: 3,
                peak: 3,
                allocated: 0,
                freed: 0
            }
        );
    }
}
