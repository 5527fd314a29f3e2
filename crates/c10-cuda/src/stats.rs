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
// ([`DeviceStats::materialize`]).
//
// `active` and `active_bytes` are not kept as they are read either. An active block is
// allocated, or freed by the user and waiting on stream events (pending), so the allocator
// keeps, in those two arrays, the pending frees only: `current` the pending blocks (bytes),
// `allocated` the frees deferred and `freed` the deferred frees completed since the last
// accumulated reset, and `peak` the largest active value seen while a free was pending (or at
// the last peak reset). Reading derives `active` from `allocation` (`active_bytes` from
// `allocated_bytes`): current = allocation's + pending; allocated = allocation's (every
// allocation makes one active block); freed = allocation's - deferred + deferred completed;
// peak = the larger of allocation's peak and the kept one (while nothing is pending, active
// equals allocation). A free without recorded streams thus touches no active stat at all.
//
// The pool stats' `freed` is not kept either (the arrays other than `active` and
// `active_bytes`): a decrease changes `current` only, and `freed` holds the `current` at the
// last accumulated reset (0 before any), so that `allocated - freed` counts the same as
// `current - base` and reading derives PyTorch's `freed = allocated - current + base`. An
// accumulated reset of the kept stats sets `allocated = 0, freed = current`
// ([`DeviceStats::reset_kept_accumulated`]); a write of `current` outside `increase` and
// `decrease` moves `freed` with it (a forgotten private pool's).
//
// The values read are the same as PyTorch's; a warm malloc/free pair does 10 stat updates
// instead of PyTorch's 28.

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

/// Subtracts `amount` from the pool's stat of `arr` (its `current` only: `freed` is derived on
/// read, see the note on how the allocator keeps its arrays).
#[inline(always)]
pub(crate) fn decrease(arr: &mut StatArray, small: bool, amount: u64) {
    drop_by(arr, pool_index(small), amount);
}

/// [`increase`] with the pool's index `i` and the other pool's `o` computed by the caller (once
/// for several arrays). The peaks are stored only when they move (a compare and a branch when
/// they do not): measured on 2026-12-07 against branch-free maxima, 25 fewer instructions per
/// warm pair (33.0 -> 31.7 ns) and the shared traces' warm replays 0.5 to 0.8 ns faster or
/// unchanged, their new peaks being rare enough to predict.
#[inline(always)]
fn bump(arr: &mut StatArray, i: usize, o: usize, amount: u64) {
    let amount = amount as i64;
    let s = &mut arr[i];
    s.current += amount;
    s.allocated += amount;
    let now = s.current;
    if now > s.peak {
        s.peak = now;
    }
    let total = now + arr[o].current;
    if total > arr[0].peak {
        arr[0].peak = total;
    }
}

/// Adds `net` to pool `I`'s stat of `arr` (the other pool `O`), or subtracts `-net`; nothing
/// when 0 (PyTorch updates no stat then).
#[inline(always)]
fn apply_net<const I: usize, const O: usize>(arr: &mut StatArray, net: i64) {
    if net > 0 {
        bump(arr, I, O, net as u64);
    } else if net < 0 {
        drop_by(arr, I, net.unsigned_abs());
    }
}

/// [`decrease`] with the pool's index computed by the caller.
#[inline(always)]
fn drop_by(arr: &mut StatArray, i: usize, amount: u64) {
    arr[i].current -= amount as i64;
}

impl DeviceStats {
    /// A block of `size` bytes (`requested` asked for) handed out from the small or large pool:
    /// `allocation`, `allocated_bytes` and `requested_bytes` grow (and so the derived `active`
    /// and `active_bytes`), as in PyTorch's `alloc_found_block`.
    #[inline(always)]
    pub(crate) fn count_alloc(&mut self, small: bool, size: u64, requested: u64) {
        // Constant pool indices in each branch: the stats' addresses are fixed offsets.
        if small {
            self.count_alloc_in::<1, 2>(size, requested);
        } else {
            self.count_alloc_in::<2, 1>(size, requested);
        }
        if self.active[1].current | self.active[2].current != 0 {
            self.note_active_peaks();
        }
    }

    /// [`Self::count_alloc`]'s increases in pool `I` (the other pool `O`).
    #[inline(always)]
    fn count_alloc_in<const I: usize, const O: usize>(&mut self, size: u64, requested: u64) {
        bump(&mut self.allocation, I, O, 1);
        bump(&mut self.allocated_bytes, I, O, size);
        bump(&mut self.requested_bytes, I, O, requested);
    }

    /// [`Self::count_alloc`] of a block split from an unsplit one, whose remainder of
    /// `remaining` bytes becomes a new inactive split block (`inactive_split` and
    /// `inactive_split_bytes` grow): the five increases with one pool index.
    #[inline(always)]
    pub(crate) fn count_alloc_new_split(
        &mut self,
        small: bool,
        size: u64,
        requested: u64,
        remaining: u64,
    ) {
        if small {
            self.count_new_split_in::<1, 2>(remaining);
            self.count_alloc_in::<1, 2>(size, requested);
        } else {
            self.count_new_split_in::<2, 1>(remaining);
            self.count_alloc_in::<2, 1>(size, requested);
        }
        if self.active[1].current | self.active[2].current != 0 {
            self.note_active_peaks();
        }
    }

    /// A new inactive split block of `remaining` bytes in pool `I` (the other pool `O`).
    #[inline(always)]
    fn count_new_split_in<const I: usize, const O: usize>(&mut self, remaining: u64) {
        bump(&mut self.inactive_split_bytes, I, O, remaining);
        bump(&mut self.inactive_split, I, O, 1);
    }

    /// While a free is pending, active is more than allocation: keeps the kept `active` and
    /// `active_bytes` peaks (see the note on how the allocator keeps its arrays).
    #[cold]
    fn note_active_peaks(&mut self) {
        fn note(active: &mut StatArray, base: &StatArray) {
            let mut total = 0;
            for t in 1..3 {
                let now = base[t].current + active[t].current;
                active[t].peak = active[t].peak.max(now);
                total += now;
            }
            active[0].peak = active[0].peak.max(total);
        }
        note(&mut self.active, &self.allocation);
        note(&mut self.active_bytes, &self.allocated_bytes);
    }

    /// A block of `size` bytes freed by the user (PyTorch's `free`): `allocation` and
    /// `allocated_bytes` shrink.
    #[inline(always)]
    pub(crate) fn count_free_requested(&mut self, small: bool, size: u64) {
        let i = pool_index(small);
        drop_by(&mut self.allocation, i, 1);
        drop_by(&mut self.allocated_bytes, i, size);
    }

    /// [`Self::count_free_requested`] then [`Self::count_free_completed`]: a free that
    /// completes at once (no stream uses).
    #[inline(always)]
    pub(crate) fn count_free_now(&mut self, small: bool, size: u64, requested: u64) {
        // Constant pool indices in each branch, as in `count_alloc`.
        if small {
            self.count_free_now_in::<1>(size, requested);
        } else {
            self.count_free_now_in::<2>(size, requested);
        }
    }

    /// [`Self::count_free_now`] in pool `I`.
    #[inline(always)]
    fn count_free_now_in<const I: usize>(&mut self, size: u64, requested: u64) {
        drop_by(&mut self.allocation, I, 1);
        drop_by(&mut self.allocated_bytes, I, size);
        drop_by(&mut self.requested_bytes, I, requested);
    }

    /// The inactive split blocks change by `blocks` and their bytes by `bytes` (a free's
    /// merges: the merged neighbours leave, the merged block joins if still split).
    #[inline(always)]
    pub(crate) fn count_inactive_split_net(&mut self, small: bool, blocks: i64, bytes: i64) {
        // Constant pool indices in each branch, as in `count_alloc`.
        if small {
            apply_net::<1, 2>(&mut self.inactive_split, blocks);
            apply_net::<1, 2>(&mut self.inactive_split_bytes, bytes);
        } else {
            apply_net::<2, 1>(&mut self.inactive_split, blocks);
            apply_net::<2, 1>(&mut self.inactive_split_bytes, bytes);
        }
    }

    /// The user's free of a block of `size` bytes waits on stream events (PyTorch's
    /// `insert_events` path of `free`): the block stays active, pending.
    pub(crate) fn count_free_deferred(&mut self, small: bool, size: u64) {
        let i = pool_index(small);
        for (stat, amount) in [(&mut self.active[i], 1), (&mut self.active_bytes[i], size)] {
            stat.current += amount as i64;
            stat.allocated += amount as i64;
        }
    }

    /// A pending free of `size` bytes completes (its events are done; PyTorch's `free_block`
    /// from `process_events`): the block leaves the active ones.
    pub(crate) fn count_deferred_completed(&mut self, small: bool, size: u64) {
        let i = pool_index(small);
        for (stat, amount) in [(&mut self.active[i], 1), (&mut self.active_bytes[i], size)] {
            stat.current -= amount as i64;
            stat.freed += amount as i64;
        }
    }

    /// An already split free block shrinks by `bytes` (malloc's split) or leaves the inactive
    /// split blocks (`blocks` 1: malloc hands it out whole). Out of line: malloc's warm path
    /// splits unsplit blocks, and the register pressure of the inlined malloc is lower.
    #[inline(never)]
    pub(crate) fn count_inactive_split_taken(&mut self, small: bool, blocks: u64, bytes: u64) {
        let i = pool_index(small);
        drop_by(&mut self.inactive_split, i, blocks);
        drop_by(&mut self.inactive_split_bytes, i, bytes);
    }

    /// A block (`requested` bytes asked for) really free (PyTorch's `free_block`):
    /// `requested_bytes` shrinks (`active` and `active_bytes` follow from `allocation` and the
    /// pending frees).
    #[inline(always)]
    pub(crate) fn count_free_completed(&mut self, small: bool, requested: u64) {
        drop_by(&mut self.requested_bytes, pool_index(small), requested);
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

/// The positions of `active` and `active_bytes` in [`ARRAY_NAMES`] (kept as pending frees).
const ACTIVE: usize = 2;
const ACTIVE_BYTES: usize = 6;

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

    /// Turns the stats as the allocator keeps them into the stats as PyTorch reports them: the
    /// aggregate of every array becomes the sum of its pools (`current`, `allocated`, `freed`;
    /// the aggregate's peak is kept as it is tracked), and `active` / `active_bytes` are
    /// derived from `allocation` / `allocated_bytes` and the pending frees kept in their place.
    /// See the note on how the allocator keeps its arrays. Call it once, on a copy.
    pub(crate) fn materialize(&mut self) {
        fn derive_freed(array: &mut StatArray) {
            for s in &mut array[1..] {
                s.freed += s.allocated - s.current;
            }
        }
        fn sum(array: &mut StatArray) {
            let [aggregate, small_pool, large_pool] = array;
            aggregate.current = small_pool.current + large_pool.current;
            aggregate.allocated = small_pool.allocated + large_pool.allocated;
            aggregate.freed = small_pool.freed + large_pool.freed;
        }
        fn derive(pending: &mut StatArray, base: &StatArray) {
            for (p, b) in pending.iter_mut().zip(base) {
                *p = Stat {
                    current: b.current + p.current,
                    peak: b.peak.max(p.peak),
                    allocated: b.allocated,
                    freed: b.freed - p.allocated + p.freed,
                };
            }
        }
        for (k, array) in self.arrays_mut().into_iter().enumerate() {
            if k != ACTIVE && k != ACTIVE_BYTES {
                derive_freed(array);
            }
            sum(array);
        }
        for array in self.reserved_bytes_by_private_pools.values_mut() {
            derive_freed(array);
            sum(array);
        }
        derive(&mut self.active, &self.allocation);
        derive(&mut self.active_bytes, &self.allocated_bytes);
    }

    /// [`DeviceStats::reset_peak`] on the stats as the allocator keeps them (`reported` is
    /// their [`DeviceStats::materialize`]d copy): every peak becomes the current value read.
    pub(crate) fn reset_kept_peak(&mut self, reported: &DeviceStats) {
        let mut kept = self.arrays_mut();
        for ((_, now), kept) in reported.arrays().into_iter().zip(kept.iter_mut()) {
            for (k, r) in kept.iter_mut().zip(now) {
                k.peak = r.current;
            }
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
        for (id, array) in self.reserved_bytes_by_private_pools.iter_mut() {
            if let Some(now) = reported.reserved_bytes_by_private_pools.get(id) {
                for (k, r) in array.iter_mut().zip(now) {
                    k.peak = r.current;
                }
            }
        }
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

    /// [`DeviceStats::reset_accumulated`] on the stats as the allocator keeps them: the pool
    /// stats' `freed` becomes the base of the derived one, their `current` (see the note on how
    /// the allocator keeps its arrays).
    pub(crate) fn reset_kept_accumulated(&mut self) {
        self.reset_accumulated();
        let mut arrays = self.arrays_mut();
        for (k, array) in arrays.iter_mut().enumerate() {
            if k != ACTIVE && k != ACTIVE_BYTES {
                for s in array.iter_mut() {
                    s.freed = s.current;
                }
            }
        }
        for array in self.reserved_bytes_by_private_pools.values_mut() {
            for s in array.iter_mut() {
                s.freed = s.current;
            }
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

    /// One step of the property test below.
    #[derive(Clone, Debug)]
    enum Step {
        Alloc {
            small: bool,
            size: u64,
            requested: u64,
        },
        Free {
            which: usize,
            deferred: bool,
        },
        Complete {
            which: usize,
        },
        ResetPeak,
        ResetAccumulated,
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (any::<bool>(), 1u64..5000, 0u64..5000).prop_map(|(small, size, r)| Step::Alloc {
                small,
                size,
                requested: r.min(size),
            }),
            3 => (any::<usize>(), any::<bool>()).prop_map(|(which, deferred)| Step::Free { which, deferred }),
            2 => any::<usize>().prop_map(|which| Step::Complete { which }),
            1 => Just(Step::ResetPeak),
            1 => Just(Step::ResetAccumulated),
        ]
    }

    #[test]
    fn active_positions() {
        assert_eq!(ARRAY_NAMES[ACTIVE], "active");
        assert_eq!(ARRAY_NAMES[ACTIVE_BYTES], "active_bytes");
    }

    /// PyTorch's update of one array: the pool's stat and the aggregate's.
    fn both(array: &mut StatArray, small: bool, amount: u64, up: bool) {
        for t in [0, pool_index(small)] {
            if up {
                array[t].increase(amount);
            } else {
                array[t].decrease(amount);
            }
        }
    }

    proptest::proptest! {
        /// The stats as kept (pool stats only, `active` as pending frees) read exactly as
        /// PyTorch's stats updated in full (`for_each_selected_stat_type` on every change),
        /// through allocations, immediate and deferred frees, completions and both resets.
        #[test]
        fn kept_stats_read_as_pytorchs(steps in proptest::collection::vec(step(), 1..300)) {
            let mut kept = DeviceStats::default();
            let mut model = DeviceStats::default();
            let mut live: Vec<(bool, u64, u64)> = Vec::new();
            let mut pending: Vec<(bool, u64, u64)> = Vec::new();
            for step in steps {
                match step {
                    Step::Alloc { small, size, requested } => {
                        kept.count_alloc(small, size, requested);
                        both(&mut model.allocation, small, 1, true);
                        both(&mut model.allocated_bytes, small, size, true);
                        both(&mut model.active, small, 1, true);
                        both(&mut model.active_bytes, small, size, true);
                        both(&mut model.requested_bytes, small, requested, true);
                        live.push((small, size, requested));
                    }
                    Step::Free { which, deferred } if !live.is_empty() => {
                        let (small, size, requested) = live.swap_remove(which % live.len());
                        kept.count_free_requested(small, size);
                        both(&mut model.allocation, small, 1, false);
                        both(&mut model.allocated_bytes, small, size, false);
                        if deferred {
                            kept.count_free_deferred(small, size);
                            pending.push((small, size, requested));
                        } else {
                            kept.count_free_completed(small, requested);
                            both(&mut model.active, small, 1, false);
                            both(&mut model.active_bytes, small, size, false);
                            both(&mut model.requested_bytes, small, requested, false);
                        }
                    }
                    Step::Complete { which } if !pending.is_empty() => {
                        let (small, size, requested) = pending.swap_remove(which % pending.len());
                        kept.count_deferred_completed(small, size);
                        kept.count_free_completed(small, requested);
                        both(&mut model.active, small, 1, false);
                        both(&mut model.active_bytes, small, size, false);
                        both(&mut model.requested_bytes, small, requested, false);
                    }
                    Step::ResetPeak => {
                        let mut reported = kept.clone();
                        reported.materialize();
                        kept.reset_kept_peak(&reported);
                        model.reset_peak();
                    }
                    Step::ResetAccumulated => {
                        kept.reset_kept_accumulated();
                        model.reset_accumulated();
                    }
                    Step::Free { .. } | Step::Complete { .. } => {}
                }
                let mut reported = kept.clone();
                reported.materialize();
                proptest::prop_assert_eq!(&reported, &model);
            }
        }
    }
}
