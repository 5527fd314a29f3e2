//! One device's caching allocator: malloc, free, record_stream (PyTorch's
//! `DeviceCachingAllocator`).
//!
//! The release paths (events, empty_cache, garbage collection) live in `release.rs`, the
//! expandable-segment paths in `expandable.rs`, snapshots in `snapshot.rs`; all are `impl`
//! blocks of [`DeviceCachingAllocator`].

use crate::accounting::{Accounting, DeviceCall};
use crate::block::{Block, BlockId, SizeKey};
use crate::block_store::BlockStore;
use crate::config::{AllocatorConfig, ConfigWarning};
use crate::device::{DeviceError, DeviceMemory, DevicePtr, StreamId};
use crate::error::{Error, Result};
use crate::events::Events;
use crate::history::{Clock, History, TraceAction, TraceEntry};
use crate::oom::OutOfMemoryError;
use crate::pool_table::{BlockPool, DEFAULT_SLOT, PoolTable, Route};
use crate::rules::Rules;
use crate::sizes::{get_allocation_size, is_small, round_size, should_split};
use crate::stats::{DeviceStats, StatType};

/// A block handed out by [`DeviceCachingAllocator::malloc`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// Device address of the block.
    pub ptr: DevicePtr,
    /// Bytes of the block (the rounded size, or more when the block was not split).
    pub size: usize,
    /// Bytes the caller asked for.
    pub requested: usize,
    /// The allocation stream.
    pub stream: StreamId,
}

/// Totals of the cache (PyTorch's `cacheInfo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CacheInfo {
    /// Bytes in free cached blocks (both pools).
    pub cached_bytes: usize,
    /// The largest free cached block, in bytes.
    pub largest_block: usize,
}

/// The caching allocator of one device (PyTorch's `DeviceCachingAllocator`), generic over the
/// device backend.
///
/// Not thread safe by itself (`&mut self`); [`crate::CachingAllocator`] puts one behind a mutex
/// per device. Sizes are bytes; addresses are device addresses.
pub struct DeviceCachingAllocator<D: DeviceMemory> {
    /// The device backend.
    pub(crate) device: D,
    /// The configuration in force.
    pub(crate) config: AllocatorConfig,
    /// The config's `max_split_size` in bytes, `usize::MAX` when unlimited
    /// ([`AllocatorConfig::max_split_size_or_max`]), set with the config: a plain number for
    /// the malloc and free paths ([`Self::max_split`]).
    pub(crate) max_split: usize,
    /// The blocks, the allocated ones by address, expandable segments' page tables.
    pub(crate) blocks: BlockStore,
    /// The stats (built on read), the memory limit and the device's total.
    pub(crate) accounting: Accounting,
    /// Outstanding events per stream, FIFO (PyTorch's `cuda_events`).
    pub(crate) events: Events,
    /// The memory history and trace trackers.
    pub(crate) history: History,
    /// The warnings of the configuration in force ([`DeviceCachingAllocator::warnings`]).
    pub(crate) warnings: Vec<ConfigWarning>,
    /// The PyTorch version's rules and the deliberate fixes, fixed at construction.
    pub(crate) rules: Rules,
    /// The pool table: the default pools in slot 0, private pools after them (PyTorch's
    /// `large_blocks`, `small_blocks`, `graph_pools`, `captures_underway`...; `pool_table.rs`).
    pub(crate) pools: PoolTable,
    /// Nothing rare is in force: no stream events outstanding and no frees deferred, no private
    /// pool begun, no garbage collection, no `max_split_size`, no history recorded, no
    /// expandable segment ever made (so every block is mapped and in a `cudaMalloc`ed segment).
    /// The malloc and free paths then skip those checks (one test of this flag instead).
    /// [`Self::refresh_plain`] keeps it at every change of those (debug builds check it on
    /// every malloc and free). No PyTorch counterpart: a cache of its checks.
    pub(crate) plain: bool,
}

/// Blocks the tables start with room for (about 100 KiB in all), so that a new allocator
/// does not regrow them step by step during its first thousand allocations.
const INITIAL_BLOCKS: usize = 1024;

/// What one malloc is about (PyTorch's `AllocParams`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Params {
    pub(crate) orig_size: usize,
    pub(crate) size: usize,
    pub(crate) alloc_size: usize,
    pub(crate) small: bool,
    pub(crate) stream: StreamId,
    /// The slot of the pool table the request goes to: [`DEFAULT_SLOT`] for the default pools
    /// (PyTorch's `AllocParams::pool`).
    pub(crate) pool: u32,
    /// The private pool's `no_split` (torch 2.15): never split its blocks.
    pub(crate) no_split: bool,
    /// Where the request's free-block pool (`pool`'s small or large one) is in the pool table:
    /// [`PoolTable::index_of`]`(pool, small)`, kept with `pool` by [`Params::route_to`], so the
    /// malloc path's pool lookups take it as it is.
    table_index: usize,
}

impl Params {
    /// Routes the request to slot `pool` of the pool table, with that pool's `no_split`.
    #[inline(always)]
    pub(crate) fn route_to(&mut self, pool: u32, no_split: bool) {
        (self.pool, self.no_split) = (pool, no_split);
        self.table_index = PoolTable::index_of(pool, self.small);
    }

    /// [`Self::table_index`]: the index of the request's free-block pool in the pool table.
    #[inline(always)]
    pub(crate) fn table_index(&self) -> usize {
        debug_assert_eq!(self.table_index, PoolTable::index_of(self.pool, self.small));
        self.table_index
    }
}

/// The fields of a block being freed that [`DeviceCachingAllocator::free_block`] needs, read
/// once.
#[derive(Clone, Copy)]
struct Freed {
    ptr: DevicePtr,
    size: usize,
    requested: usize,
    stream: StreamId,
    small: bool,
    prev: Option<BlockId>,
    next: Option<BlockId>,
    pool: u32,
    mapped: bool,
}

impl Freed {
    #[inline(always)]
    fn of(b: &Block) -> Self {
        Freed {
            ptr: b.ptr,
            size: b.size,
            requested: b.requested_size,
            stream: b.stream,
            small: b.small,
            prev: b.prev,
            next: b.next,
            pool: b.pool,
            mapped: b.mapped,
        }
    }
}

impl<D: DeviceMemory> DeviceCachingAllocator<D> {
    /// Creates the allocator of `device` with `config`, following the newest PyTorch version's
    /// rules with every deliberate fix ([`Rules::default`]); see [`Self::with_rules`].
    ///
    /// # Errors
    /// As [`Self::with_rules`].
    pub fn new(device: D, config: AllocatorConfig) -> Result<Self> {
        Self::with_rules(device, config, Rules::default())
    }

    /// Creates the allocator of `device` with `config`, following `rules`: a PyTorch version's
    /// decisions ([`crate::rules::TorchVersion`]) and the PyTorch bugs to fix
    /// ([`crate::rules::Fixes`]). The rules cannot change afterwards.
    ///
    /// A `per_process_memory_fraction` in the config is applied at once. When the config asks
    /// for expandable segments and the device has no virtual memory management, expandable
    /// segments are turned off, as PyTorch does; that and the config's own notes are kept in
    /// [`DeviceCachingAllocator::warnings`].
    ///
    /// # Errors
    /// [`Error::Device`] when the device cannot report its memory.
    pub fn with_rules(device: D, mut config: AllocatorConfig, rules: Rules) -> Result<Self> {
        let info = device.mem_get_info()?;
        let warnings = fit_to_device(&mut config, &device);
        let mut stats = DeviceStats {
            max_split_size: config.max_split_size.map(|v| v as u64),
            torch: rules.version,
            ..DeviceStats::default()
        };
        stats.num_ooms = 0;
        let mut this = DeviceCachingAllocator {
            device,
            max_split: config.max_split_size_or_max(),
            config,
            blocks: BlockStore::with_capacity(INITIAL_BLOCKS),
            accounting: Accounting::new(stats, info.total),
            events: Events::default(),
            history: History::default(),
            warnings,
            rules,
            pools: PoolTable::default(),
            plain: false,
        };
        this.refresh_plain();
        if let Some(f) = this.config.per_process_memory_fraction {
            this.set_memory_fraction(f)?;
        }
        Ok(this)
    }

    /// The device backend.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// The configuration in force.
    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    /// The PyTorch version's rules and the deliberate fixes this allocator follows.
    pub fn rules(&self) -> Rules {
        self.rules
    }

    /// The warnings of the configuration in force, the crate's one warnings channel
    /// ([`ConfigWarning`]): the device-dependent ones (expandable segments unavailable) followed
    /// by [`AllocatorConfig::validate_warnings`] of the configuration as applied (so a note
    /// about expandable segments that were turned off does not appear). Set by the constructor,
    /// replaced by every successful [`DeviceCachingAllocator::set_config`]; nothing is printed.
    pub fn warnings(&self) -> &[ConfigWarning] {
        &self.warnings
    }

    /// `max_split_size` in bytes, `usize::MAX` when unlimited: the config's, as kept.
    #[inline(always)]
    pub(crate) fn max_split(&self) -> usize {
        debug_assert_eq!(self.max_split, self.config.max_split_size_or_max());
        self.max_split
    }

    /// Bytes reserved from the device (PyTorch's `total_allocated_memory`):
    /// `reserved_bytes.all.current` of [`Self::stats`], which is what it always equals, read
    /// without copying the stats.
    #[inline]
    pub fn reserved_bytes(&self) -> usize {
        self.accounting.reserved_bytes()
    }

    /// Limits reserved memory to `fraction` of the device's total memory
    /// (PyTorch's `setMemoryFraction` / `torch.cuda.set_per_process_memory_fraction`).
    ///
    /// # Errors
    /// [`Error::InvalidFraction`] unless `0 < fraction <= 1`; [`Error::Device`] when the device
    /// cannot report its memory.
    pub fn set_memory_fraction(&mut self, fraction: f64) -> Result<()> {
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(Error::InvalidFraction { fraction });
        }
        let info = self.device.mem_get_info()?;
        self.accounting.device_total = info.total;
        self.accounting.allowed_memory_maximum =
            if fraction == 1.0 && self.rules.version.fraction_one_is_unlimited() {
                None
            } else {
                let limit = fraction * info.total as f64;
                let limit = if self.rules.version.fraction_limit_rounds() {
                    limit.round()
                } else {
                    limit
                };
                Some(limit as usize)
            };
        self.config.per_process_memory_fraction = Some(fraction);
        self.refresh_plain();
        Ok(())
    }

    /// Starts (or resizes) the memory history ring buffer with room for `max_entries` entries
    /// (PyTorch's `_record_memory_history(max_entries=...)`). `max_entries == 0` stops recording.
    pub fn record_history(&mut self, max_entries: usize, clock: Clock) {
        if max_entries == 0 {
            self.history.disable();
        } else {
            self.history.enable(max_entries, clock);
        }
        self.refresh_plain();
    }

    /// Stops recording history; the entries so far are kept.
    pub fn stop_history(&mut self) {
        self.history.disable();
        self.refresh_plain();
    }

    /// Drops the recorded history.
    pub fn clear_history(&mut self) {
        self.history.clear();
    }

    /// The recorded trace entries, oldest first.
    pub fn history(&self) -> Vec<TraceEntry> {
        self.history.entries().cloned().collect()
    }

    /// Number of trace entries held.
    pub fn history_len(&self) -> usize {
        self.history.len()
    }

    /// The trace entries from position `start` on (positions shift when the ring buffer is
    /// full and drops its oldest entries).
    pub fn history_since(&self, start: usize) -> impl ExactSizeIterator<Item = &TraceEntry> {
        self.history.since(start)
    }

    /// Bytes of live allocations (rounded block sizes) now: `allocated_bytes.all.current` of
    /// [`Self::stats`] (PyTorch's `torch.cuda.memory_allocated`), without copying the stats.
    pub fn allocated_bytes(&self) -> usize {
        self.accounting.allocated_bytes()
    }

    /// The statistics (PyTorch's `getDeviceStats`): a copy, taken now.
    pub fn stats(&self) -> DeviceStats {
        self.accounting.stats()
    }

    /// `peak = current` for every stat (PyTorch's `resetPeakStats`).
    pub fn reset_peak_stats(&mut self) {
        self.accounting.reset_peak();
    }

    /// Zeroes accumulated stats and counters (PyTorch's `resetAccumulatedStats`).
    pub fn reset_accumulated_stats(&mut self) {
        self.accounting.kept_mut().reset_kept_accumulated();
    }

    /// Free cached bytes and the largest free block (PyTorch's `cacheInfo`).
    pub fn cache_info(&self) -> CacheInfo {
        let mut info = CacheInfo::default();
        let (large, small) = self.pools.block_pools(DEFAULT_SLOT);
        for key in large.blocks.iter().chain(small.blocks.iter()) {
            info.cached_bytes += key.size;
            info.largest_block = info.largest_block.max(key.size);
        }
        info
    }

    /// Allocates `size` bytes for use on `stream` (PyTorch's `DeviceCachingAllocator::malloc`).
    ///
    /// Follows PyTorch's order: process completed events, round, best-fit search, (garbage
    /// collection), device malloc, release oversize cached blocks and retry, release all cached
    /// blocks and retry; then out of memory. Free-memory callbacks are run by the
    /// multi-device front ([`crate::CachingAllocator`]) between [`Self::try_malloc_cached`] and
    /// [`Self::malloc_uncached`], without this allocator's lock held.
    ///
    /// A zero-byte request gets a 512-byte block, as in PyTorch's `malloc`.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] with every figure when nothing works (the allocator stays
    /// usable); [`Error::Device`] when the device fails in another way.
    #[inline(always)]
    pub fn malloc(&mut self, size: usize, stream: StreamId) -> Result<Allocation> {
        match self.try_malloc_cached(size, stream)? {
            Some(a) => Ok(a),
            None => self.malloc_uncached(size, stream, false),
        }
    }

    /// The first half of [`Self::malloc`]: process completed events and try the cache.
    /// `Ok(None)` on a miss (nothing changed but event processing and GC ages).
    ///
    /// # Errors
    /// [`Error::Device`] when an event query fails.
    #[inline(always)]
    pub fn try_malloc_cached(
        &mut self,
        size: usize,
        stream: StreamId,
    ) -> Result<Option<Allocation>> {
        debug_assert_eq!(self.plain, self.compute_plain(), "stale `plain`");
        if self.plain {
            // No events to process, the default pools, none of the rare checks.
            let p = self.sized(size, stream);
            return Ok(self.cached::<true>(&p));
        }
        self.process_events()?;
        let p = self.params(size, stream)?;
        Ok(self.cached::<false>(&p))
    }

    /// The cache search and hand-out of [`Self::try_malloc_cached`] (`PLAIN`: [`Self::plain`]).
    #[inline(always)]
    fn cached<const PLAIN: bool>(&mut self, p: &Params) -> Option<Allocation> {
        let key = self.find_free_block_in::<PLAIN>(p)?;
        Some(self.alloc_found::<PLAIN>(p, key.id, Some(key)))
    }

    /// Whether nothing rare is in force ([`Self::plain`], computed).
    pub(crate) fn compute_plain(&self) -> bool {
        (self.events.streams_waiting() | self.pools.deferred.len()) == 0
            && self.pools.begun.is_empty()
            && !(self.accounting.allowed_memory_maximum.is_some() && self.config.gc_enabled())
            && self.max_split == usize::MAX
            && !self.history.is_active()
            && self.blocks.segments.is_empty()
    }

    /// Brings [`Self::plain`] up to date: called wherever events, deferred frees, begun pools,
    /// the memory fraction, the configuration or the history change (and cleared when an
    /// expandable segment is made).
    pub(crate) fn refresh_plain(&mut self) {
        self.plain = self.compute_plain();
    }

    /// The second half of [`Self::malloc`], after a cache miss and the free-memory callbacks:
    /// search again when `search_again` (a callback freed memory), then garbage collection and
    /// the device-malloc retry chain.
    ///
    /// # Errors
    /// As [`Self::malloc`].
    #[inline(never)]
    pub fn malloc_uncached(
        &mut self,
        size: usize,
        stream: StreamId,
        search_again: bool,
    ) -> Result<Allocation> {
        let mut p = self.params(size, stream)?;
        match self.find_or_grow(&mut p, search_again)? {
            Some(id) => Ok(self.alloc_found_block(&p, id)),
            None => Err(self.out_of_memory(&p)),
        }
    }

    /// The block [`Self::malloc_uncached`] hands out, removed from its pool, or `None` where
    /// it would raise out of memory (nothing recorded for that).
    pub(crate) fn find_or_grow(
        &mut self,
        p: &mut Params,
        search_again: bool,
    ) -> Result<Option<BlockId>> {
        if search_again {
            self.process_events()?;
            if let Some(id) = self.get_free_block(p) {
                return Ok(Some(id));
            }
        }
        if self.accounting.allowed_memory_maximum.is_some() && self.config.gc_enabled() {
            self.garbage_collect_cached_blocks()?;
        }
        let mut found = self.alloc_block(p, false)?;
        if found.is_none() && p.pool == DEFAULT_SLOT && !self.pools.use_on_oom_is_empty() {
            // torch 2.15: a request of the default pools takes a free block of a `use_on_oom`
            // private pool.
            found = self.use_on_oom_block(p)?;
        }
        if found.is_none() && self.release_available_cached_blocks(p)? {
            found = self.alloc_block(p, false)?;
        }
        if found.is_none() && !self.capture_underway() {
            self.release_cached_blocks(None)?;
            if !self.pools.slot_in_use(p.pool) {
                // Defensive: the pool the request was routed to lost its slot.
                return Err(self.missing_pool_error(p.stream));
            }
            // pytorch#189504: releasing synchronizes events, which can free a block that fits
            // inside a split segment; PyTorch would not look at it and raise a spurious OOM.
            if self.rules.fixes.search_after_release {
                found = self.get_free_block(p);
            }
            if found.is_none() {
                found = self.alloc_block(p, true)?;
            }
        }
        Ok(found)
    }

    /// The rank of a new segment: the next registration counter under torch 2.15's rules
    /// (PyTorch 2.15's `registration_counter`), 0 under 2.7's. Segment creation is a cold path,
    /// so this asks the version.
    pub(crate) fn take_registration(&mut self) -> u64 {
        if !self.rules.version.ties_by_segment_age() {
            return 0;
        }
        self.blocks.take_registration()
    }

    /// What a request of `orig_size` bytes on `stream` is about: its sizes and its route.
    ///
    /// # Errors
    /// [`crate::private_pool::PoolError::RoutedToMissingPool`] when the begun pool that
    /// accepts it was forgotten.
    #[inline(always)]
    pub(crate) fn params(&self, orig_size: usize, stream: StreamId) -> Result<Params> {
        let mut p = self.sized(orig_size, stream);
        // With no private pool begun: one predictable branch.
        if !self.pools.begun.is_empty() {
            match self.route(stream) {
                Route::Slot { slot, no_split } => p.route_to(slot, no_split),
                Route::Missing(_) => return Err(self.missing_pool_error(stream)),
            }
        }
        Ok(p)
    }

    /// The sizes of a request of `orig_size` bytes on `stream`, routed to the default pools
    /// ([`Self::params`] routes it).
    #[inline(always)]
    pub(crate) fn sized(&self, orig_size: usize, stream: StreamId) -> Params {
        let size = round_size(orig_size, &self.config);
        Params {
            orig_size,
            size,
            alloc_size: get_allocation_size(size),
            small: is_small(size),
            stream,
            pool: DEFAULT_SLOT,
            no_split: false,
            table_index: PoolTable::index_of(DEFAULT_SLOT, is_small(size)),
        }
    }

    /// The free-block pool (small or large) of slot `pool` of the pool table.
    #[inline(always)]
    pub(crate) fn block_pool_mut(&mut self, pool: u32, small: bool) -> &mut BlockPool {
        self.pools.block_pool_mut(pool, small)
    }

    /// [`Self::block_pool_mut`], shared.
    #[inline(always)]
    pub(crate) fn block_pool(&self, pool: u32, small: bool) -> &BlockPool {
        self.pools.block_pool(pool, small)
    }

    /// The stat types a pool's blocks count in: aggregate plus the pool's own.
    #[inline]
    pub(crate) fn stat_types(small: bool) -> [usize; 2] {
        [
            StatType::Aggregate as usize,
            if small {
                StatType::SmallPool as usize
            } else {
                StatType::LargePool as usize
            },
        ]
    }

    /// Best-fit search (PyTorch's `get_free_block`); removes and returns the block on a hit.
    #[inline(always)]
    pub(crate) fn get_free_block(&mut self, p: &Params) -> Option<BlockId> {
        let key = self.find_free_block(p)?;
        let pool = self.pools.block_pool_mut(p.pool, p.small);
        pool.blocks.remove_present(&key);
        Some(key.id)
    }

    /// The search of [`Self::get_free_block`]: the key of the block it hands out, left in its
    /// pool ([`Self::alloc_found_key`] takes it out).
    #[inline(always)]
    pub(crate) fn find_free_block(&mut self, p: &Params) -> Option<SizeKey> {
        self.find_free_block_in::<false>(p)
    }

    /// [`Self::find_free_block`]; `PLAIN`: [`Self::plain`] holds (no GC, no `max_split_size`).
    #[inline(always)]
    fn find_free_block_in<const PLAIN: bool>(&mut self, p: &Params) -> Option<SizeKey> {
        let gc =
            !PLAIN && self.accounting.allowed_memory_maximum.is_some() && self.config.gc_enabled();
        let blocks = &self.blocks;
        // SAFETY: `p.table_index()` is `index_of` the request's route, a slot of this table
        // (`Params::sized` routes to the default slot, `route_to` to a pool the table made).
        let pool = unsafe { self.pools.block_pool_at(p.table_index()) };
        if gc {
            pool.get_free_blocks_call_count += 1;
        }
        let mut key = pool.blocks.lower_bound(p.stream, p.size)?;
        if !PLAIN && blocks.get(key.id).expandable.is_some() {
            // Rare: walk on in best-fit order.
            let mut it = pool.blocks.range_from(p.stream, p.size);
            it.next();
            if self.config.expandable_segments {
                // Best fit counts an expandable block's unmapped successor as room it can grow
                // into: prefer the block with the least such room.
                let expandable_size = |k: &SizeKey| {
                    let b = blocks.get(k.id);
                    b.size
                        + b.next
                            .map(|n| blocks.get(n))
                            .filter(|n| !n.mapped)
                            .map_or(0, |n| n.size)
                };
                while blocks.get(key.id).expandable.is_some() {
                    match it.next() {
                        Some(next) if expandable_size(&next) < expandable_size(&key) => {
                            key = next;
                        }
                        _ => break,
                    }
                }
            } else {
                // Expandable segments were turned off after some were made: skip their blocks.
                loop {
                    key = it.next()?;
                    if blocks.get(key.id).expandable.is_none() {
                        break;
                    }
                }
            }
        }
        if PLAIN {
            // No `max_split_size`: no block is oversize.
            return Some(key);
        }
        // Never hand an oversize block to a normal request, nor a much larger oversize block to
        // an oversize request (the limits read once a block is found).
        let max_split = self.max_split();
        if p.size < max_split && key.size >= max_split {
            return None;
        }
        let max_non_split_rounding = self.config.max_non_split_rounding;
        if p.size >= max_split && key.size >= p.size.saturating_add(max_non_split_rounding) {
            return None;
        }
        Some(key)
    }

    /// Allocates a new segment (PyTorch's `alloc_block`); `Ok(None)` when the device (or the
    /// memory fraction) refuses.
    pub(crate) fn alloc_block(&mut self, p: &Params, is_retry: bool) -> Result<Option<BlockId>> {
        if is_retry {
            self.accounting.kept_mut().num_alloc_retries += 1;
        }
        let size = p.alloc_size;
        if let Some(allowed) = self.accounting.allowed_memory_maximum {
            if self.reserved_bytes().saturating_add(size) > allowed {
                return Ok(None);
            }
        }
        if self.config.expandable_segments {
            let found = self.try_allocate_expandable_block(p)?;
            if found.is_some() {
                // PyTorch counts a private pool's `cudaMalloc_count` per request here, not
                // per page mapped.
                self.pool_counted_alloc(p.pool);
            }
            return Ok(found);
        }
        let ptr = match self.device.malloc(size) {
            Ok(ptr) => ptr,
            Err(DeviceError::OutOfMemory { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let mut block = Block::new(ptr, size, p.stream, p.small);
        block.rank = self.take_registration();
        block.pool = p.pool;
        let id = self.blocks.insert(block);
        self.account(DeviceCall::Malloc, p.pool, p.small, ptr, size, p.stream)?;
        Ok(Some(id))
    }

    /// The one accounting path of device memory: counts `bytes` at `ptr` reserved (`Malloc`,
    /// `Map`) or given back (`Free`, `Unmap`) by the pools of slot `pool` (small or large) for
    /// `stream`, after the device call succeeded: the stats ([`count_device_call`]), the
    /// private pool's `reserved_bytes_by_private_pools` and `cudaMalloc_count` (a segment
    /// allocated counts one; pages mapped count none here, as PyTorch counts one per request in
    /// `alloc_block`; every release counts one back), and the history entry. The same updates
    /// as PyTorch's, in its order.
    ///
    /// # Errors
    /// [`crate::private_pool::PoolError::NoAllocationCounted`] when a private pool gives back
    /// memory while its `cudaMalloc_count` is 0 (after everything else was counted, as
    /// PyTorch's assertion fails there).
    pub(crate) fn account(
        &mut self,
        call: DeviceCall,
        pool: u32,
        small: bool,
        ptr: DevicePtr,
        bytes: usize,
        stream: StreamId,
    ) -> Result<()> {
        let max_split = self.config.max_split_size_or_max();
        self.accounting.device_call(call, small, bytes, max_split);
        let up = matches!(call, DeviceCall::Malloc | DeviceCall::Map);
        self.pool_reserved(pool, small, bytes, up);
        self.history
            .record(call.action(), ptr, bytes as u64, stream);
        match call {
            DeviceCall::Malloc => self.pool_counted_alloc(pool),
            DeviceCall::Map => {}
            DeviceCall::Free | DeviceCall::Unmap => self.pool_counted_release(pool)?,
        }
        Ok(())
    }

    /// Hands out a found block, already out of its pool, splitting it if the rules say so
    /// (PyTorch's `alloc_found_block`).
    #[inline(always)]
    pub(crate) fn alloc_found_block(&mut self, p: &Params, found: BlockId) -> Allocation {
        self.alloc_found::<false>(p, found, None)
    }

    /// [`Self::alloc_found_block`], with `indexed` the key under which the block is still in its
    /// pool, if it is. `PLAIN`: [`Self::plain`] holds (no history, no `max_split_size`).
    #[inline(always)]
    fn alloc_found<const PLAIN: bool>(
        &mut self,
        p: &Params,
        found: BlockId,
        indexed: Option<SizeKey>,
    ) -> Allocation {
        let small = p.small;
        // One read of the found block: everything both paths need.
        let (block_size, already_split, expandable, ptr) = {
            let b = self.blocks.get(found);
            (b.size, b.is_split(), b.expandable, b.ptr)
        };
        let not_expandable = PLAIN || expandable.is_none();
        let (id, size) = if !p.no_split && should_split(block_size, p.size, p.small, &self.config) {
            // The allocation takes the low addresses; the remainder keeps the old id. The stats
            // first (they do not depend on the blocks' bookkeeping).
            let remaining_size = block_size - p.size;
            let stats = self.accounting.kept_mut();
            let (size, requested) = (p.size as u64, p.orig_size as u64);
            if already_split && not_expandable {
                // An already-split inactive block shrinks by `size` bytes.
                stats.count_inactive_split_taken(small, 0, size);
                stats.count_alloc(small, size, requested);
            } else if not_expandable {
                // A new inactive split block appears from a previously unsplit block.
                stats.count_alloc_new_split(small, size, requested, remaining_size as u64);
            } else {
                stats.count_alloc(small, size, requested);
            }
            let remaining = found;
            let (id, r) = self
                .blocks
                .split_off_low::<PLAIN>(found, p.size, p.orig_size);
            debug_assert_eq!((r.ptr, r.size), (ptr + p.size as u64, remaining_size));
            // SAFETY: as in `find_free_block`: the request's route is a slot of this table.
            let pool = unsafe { self.pools.block_pool_at(p.table_index()) };
            match indexed {
                Some(old) => pool.rekey_in_blocks(&old, remaining, r),
                None => pool.insert_into_blocks(remaining, r),
            }
            (id, p.size)
        } else {
            if let Some(old) = indexed {
                self.pools
                    .block_pool_mut(p.pool, p.small)
                    .blocks
                    .remove_present(&old);
            }
            let stats = self.accounting.kept_mut();
            if already_split && not_expandable {
                // An already-split block becomes active.
                stats.count_inactive_split_taken(small, 1, block_size as u64);
            }
            stats.count_alloc(small, block_size as u64, p.orig_size as u64);
            let b = self.blocks.get_mut(found);
            b.allocated = true;
            b.requested_size = p.orig_size;
            (found, block_size)
        };
        if !PLAIN {
            self.history
                .record(TraceAction::Alloc, ptr, p.orig_size as u64, p.stream);
        }
        self.blocks.allocated.insert_new(ptr, id);
        if !PLAIN && size >= self.max_split() {
            self.accounting.kept_mut().oversize_allocations.increase(1);
        }
        Allocation {
            ptr,
            size,
            requested: p.orig_size,
            stream: p.stream,
        }
    }

    /// Builds the out-of-memory error and records it (PyTorch's OOM branch of `malloc`).
    fn out_of_memory(&mut self, p: &Params) -> Error {
        let (device_free, device_total) = match self.device.mem_get_info() {
            Ok(info) => (info.free, info.total),
            Err(_) => (0, self.accounting.device_total),
        };
        self.history.record(
            TraceAction::Oom,
            device_free as u64,
            p.size as u64,
            p.stream,
        );
        self.accounting.kept_mut().num_ooms += 1;
        // With expandable segments, what the limit is checked against (our fix) is the pages the
        // request would map, which can be more than the 2 MiB-rounded request.
        let segment_size = if self.config.expandable_segments
            && self.accounting.allowed_memory_maximum.is_some()
            && self.rules.fixes.expandable_fraction_limit
        {
            let found = self.find_expandable_candidate(p.stream, p.small, p.size, p.pool);
            self.expandable_bytes_to_map(found, p.small, p.size)
                .max(p.alloc_size)
        } else {
            p.alloc_size
        };
        let agg = StatType::Aggregate as usize;
        let stats = self.stats();
        Error::OutOfMemory(Box::new(OutOfMemoryError {
            device: self.device.index(),
            requested: p.orig_size as u64,
            rounded: p.size as u64,
            segment_size: segment_size as u64,
            device_total: device_total as u64,
            device_free: device_free as u64,
            allocated: stats.allocated_bytes[agg].current as u64,
            reserved: stats.reserved_bytes[agg].current as u64,
            allowed: self.accounting.allowed_memory_maximum.map(|v| v as u64),
            expandable_segments: self.config.expandable_segments,
            max_split_size: self.config.max_split_size.map(|v| v as u64),
            stream: p.stream.0,
            torch: self.rules.version,
        }))
    }

    /// Frees the block at `ptr` (PyTorch's `DeviceCachingAllocator::free`).
    ///
    /// Without recorded streams the block is free at once (merged with free neighbours, back in
    /// its pool). With streams recorded by [`Self::record_stream`], one event is recorded per
    /// stream and the block stays `active_pending_free` until they complete.
    ///
    /// # Errors
    /// [`Error::InvalidPointer`] when `ptr` is not an allocated block of this allocator (nothing
    /// changes); [`Error::Device`] when recording an event fails.
    #[inline(always)]
    pub fn free(&mut self, ptr: DevicePtr) -> Result<()> {
        debug_assert_eq!(self.plain, self.compute_plain(), "stale `plain`");
        if self.plain {
            self.free_in::<true>(ptr)
        } else {
            self.free_in::<false>(ptr)
        }
    }

    /// [`Self::free`]; `PLAIN`: [`Self::plain`] holds (no history, no `max_split_size`).
    #[inline(always)]
    fn free_in<const PLAIN: bool>(&mut self, ptr: DevicePtr) -> Result<()> {
        let Some(id) = self.blocks.allocated.remove(ptr) else {
            return Err(Error::InvalidPointer {
                ptr,
                device: self.device.index(),
            });
        };
        let b = self.blocks.get_mut(id);
        b.allocated = false;
        b.tag = None;
        if !b.stream_uses.is_empty() {
            return self.free_with_uses(id, ptr);
        }
        let (small, size, requested, stream) = (b.small, b.size, b.requested_size, b.stream);
        // The free completes below ([`Self::free_idle_block`]): `requested_bytes` counted here
        // with the others (PyTorch counts it in `free_block`, after the merges; no other update
        // of that stat in between).
        self.accounting
            .kept_mut()
            .count_free_now(small, size as u64, requested as u64);
        if !PLAIN {
            self.history
                .record(TraceAction::FreeRequested, ptr, requested as u64, stream);
            if size >= self.max_split() {
                self.accounting.kept_mut().oversize_allocations.decrease(1);
            }
        }
        // The block's fields read again here rather than kept across the counting.
        let f = Freed::of(self.blocks.get(id));
        self.free_idle_block::<PLAIN>(id, f);
        Ok(())
    }

    /// [`Self::free`] of block `id` (at `ptr`, already marked not allocated) with streams
    /// recorded by [`Self::record_stream`]: one event per stream, and the block stays
    /// `active_pending_free` until they complete. Out of line: a free without stream uses
    /// only tests for them.
    #[cold]
    #[inline(never)]
    fn free_with_uses(&mut self, id: BlockId, ptr: DevicePtr) -> Result<()> {
        let b = self.blocks.get(id);
        let (small, size, requested, stream) = (b.small, b.size, b.requested_size, b.stream);
        self.accounting
            .kept_mut()
            .count_free_requested(small, size as u64);
        self.history
            .record(TraceAction::FreeRequested, ptr, requested as u64, stream);
        let oversize = size >= self.max_split();
        let stats = self.accounting.kept_mut();
        if oversize {
            stats.oversize_allocations.decrease(1);
        }
        stats.count_free_deferred(small, size as u64);
        if self.capture_underway() {
            // torch 2.7: a begun pool is a capture; the events wait until it ends.
            self.pools.deferred.push(id);
            self.plain = false;
            return Ok(());
        }
        self.insert_events(id)
    }

    /// Marks the block at `ptr` as used by `stream` (PyTorch's `recordStream`): freeing it will
    /// wait for the work queued on `stream` so far. The allocation stream itself is ignored.
    ///
    /// # Errors
    /// [`Error::InvalidPointer`] when `ptr` is not an allocated block of this allocator.
    pub fn record_stream(&mut self, ptr: DevicePtr, stream: StreamId) -> Result<()> {
        let Some(id) = self.blocks.allocated.get(ptr) else {
            return Err(Error::InvalidPointer {
                ptr,
                device: self.device.index(),
            });
        };
        let b = self.blocks.get_mut(id);
        if stream != b.stream {
            if !b.stream_uses.contains(&stream) {
                b.stream_uses.push(stream);
            }
            if self.capture_underway() {
                // torch 2.7's `block_to_cudagraph_stream_uses`: dropped from the block's uses
                // when its deferred events are recorded, even if recorded before the begin.
                self.pools.record_capture_use(id, stream);
            }
        }
        Ok(())
    }

    /// The allocation containing `ptr`'s block: `(segment base address, segment bytes)`
    /// (PyTorch's `getBaseAllocation`).
    ///
    /// # Errors
    /// [`Error::InvalidPointer`] when `ptr` is not an allocated block of this allocator.
    pub fn get_base_allocation(&self, ptr: DevicePtr) -> Result<(DevicePtr, usize)> {
        let Some(id) = self.blocks.allocated.get(ptr) else {
            return Err(Error::InvalidPointer {
                ptr,
                device: self.device.index(),
            });
        };
        let mut head = id;
        while let Some(prev) = self.blocks.get(head).prev {
            head = prev;
        }
        let base = self.blocks.get(head).ptr;
        let mut size = 0;
        let mut cur = Some(head);
        while let Some(c) = cur {
            size += self.blocks.get(c).size;
            cur = self.blocks.get(c).next;
        }
        Ok((base, size))
    }

    /// The block size and requested size of the allocated block at `ptr`, if any.
    pub fn block_info(&self, ptr: DevicePtr) -> Option<(usize, usize)> {
        self.blocks.allocated.get(ptr).map(|id| {
            let b = self.blocks.get(id);
            (b.size, b.requested_size)
        })
    }

    /// Records one event per stream that used the block and defers its release
    /// (PyTorch's `insert_events`).
    pub(crate) fn insert_events(&mut self, id: BlockId) -> Result<()> {
        let uses = std::mem::take(&mut self.blocks.get_mut(id).stream_uses);
        for stream in uses {
            let event = self.device.create_event()?;
            self.device.record_event(event, stream)?;
            self.blocks.get_mut(id).event_count += 1;
            self.events.push(stream, event, id);
            self.plain = false;
        }
        Ok(())
    }

    /// Returns a block whose deferred free completed (its events are done, or a capture's
    /// deferred block has none) to its pool, merging with free neighbours (PyTorch's
    /// `free_block` as `process_events` calls it). A free without stream uses takes
    /// [`Self::free_idle_block`] directly.
    #[inline(always)]
    pub(crate) fn free_block(&mut self, id: BlockId) {
        let b = self.blocks.get(id);
        debug_assert!(b.is_idle());
        let f = Freed::of(b);
        let stats = self.accounting.kept_mut();
        stats.count_deferred_completed(f.small, f.size as u64);
        stats.count_free_completed(f.small, f.requested as u64);
        self.free_idle_block::<false>(id, f);
    }

    /// [`Self::free_block`] with the block's fields already read (by [`Self::free`]) and
    /// `requested_bytes` already counted (by both). `PLAIN`: [`Self::plain`] holds (no
    /// history).
    #[inline(always)]
    fn free_idle_block<const PLAIN: bool>(&mut self, id: BlockId, f: Freed) {
        let Freed {
            ptr,
            size: _,
            requested,
            stream,
            small,
            prev,
            next,
            pool: block_pool,
            mapped,
        } = f;
        if !PLAIN {
            self.history
                .record(TraceAction::FreeCompleted, ptr, requested as u64, stream);
        }
        // `requested_bytes` was counted by the callers (PyTorch counts it last; no other update
        // of that stat in between).
        // Merged neighbours leave the inactive split blocks; PyTorch merges the lower one first.
        let mut merged_blocks: i64 = 0;
        let mut merged_bytes: usize = 0;
        // The neighbours are in the block's pool (no block crosses pools).
        let pool = self.pools.block_pool_mut(block_pool, small);
        if let Some(up) = next {
            if (PLAIN || mapped) && merges_up_only::<PLAIN>(&self.blocks, prev, up) {
                merge_up(&mut self.blocks, pool, id, f);
                let b = self.blocks.get(up);
                let stats = self.accounting.kept_mut();
                // The upper neighbour left the inactive split blocks; the merged block joins
                // them if it is still split (its bytes less the upper neighbour's: `size`).
                let (blocks, bytes) = if b.is_split() {
                    (0, f.size as i64)
                } else {
                    (-1, -((b.size - f.size) as i64))
                };
                stats.count_inactive_split_net(small, blocks, bytes);
                return;
            }
        }
        if let Some(src) = prev {
            let subsumed = merge_neighbour::<PLAIN>(&mut self.blocks, pool, id, src, mapped, true);
            merged_blocks += i64::from(subsumed > 0);
            merged_bytes += subsumed;
        }
        if let Some(src) = next {
            let subsumed = merge_neighbour::<PLAIN>(&mut self.blocks, pool, id, src, mapped, false);
            merged_blocks += i64::from(subsumed > 0);
            merged_bytes += subsumed;
        }
        let b = self.blocks.get_mut(id);
        pool.insert_into_blocks(id, b);
        let (net_inactive_split_blocks, net_inactive_split_size) = if b.is_split() {
            (1 - merged_blocks, b.size as i64 - merged_bytes as i64)
        } else {
            (-merged_blocks, -(merged_bytes as i64))
        };
        let expandable = !PLAIN && b.expandable.is_some();
        let stats = self.accounting.kept_mut();
        if !expandable {
            stats.count_inactive_split_net(
                small,
                net_inactive_split_blocks,
                net_inactive_split_size,
            );
        }
    }

    /// Merges `src` into `dst` when `src` is an idle neighbour with the same mapping state;
    /// returns the bytes subsumed, 0 when not merged (PyTorch's `try_merge_blocks`).
    #[inline(always)]
    pub(crate) fn try_merge_blocks(&mut self, dst: BlockId, src: Option<BlockId>) -> usize {
        match src {
            Some(src) => self.merge_into(dst, src),
            None => 0,
        }
    }

    /// [`Self::try_merge_blocks`] with a present neighbour.
    #[inline(always)]
    fn merge_into(&mut self, dst: BlockId, src: BlockId) -> usize {
        let d = self.blocks.get(dst);
        let (dst_mapped, lower) = (d.mapped, d.prev == Some(src));
        let pool = self.pools.block_pool_mut(d.pool, d.small);
        merge_neighbour::<false>(&mut self.blocks, pool, dst, src, dst_mapped, lower)
    }
}

/// [`DeviceCachingAllocator::try_merge_blocks`] given `dst`'s pool and mapping state and on
/// which side `src` lies (`lower`: `src` is `dst`'s `prev`). `PLAIN`: the allocator's `plain`
/// holds (every block mapped; a free block is idle).
#[inline(always)]
fn merge_neighbour<const PLAIN: bool>(
    blocks: &mut BlockStore,
    pool: &mut BlockPool,
    dst: BlockId,
    src: BlockId,
    dst_mapped: bool,
    lower: bool,
) -> usize {
    let s = blocks.get(src);
    if !s.is_idle_in::<PLAIN>() || (!PLAIN && s.mapped != dst_mapped) {
        return 0;
    }
    debug_assert!(s.pool == blocks.get(dst).pool && s.small == blocks.get(dst).small);
    let (s_ptr, s_size, s_prev, s_next, s_stream) = (s.ptr, s.size, s.prev, s.next, s.stream);
    let key = SizeKey::of(src, s);
    if dst_mapped {
        pool.blocks.remove_present(&key);
    } else {
        pool.unmapped.remove(&crate::block::AddrKey {
            stream: s_stream,
            ptr: s_ptr,
            id: src,
        });
    }
    if lower {
        // [src dst]
        if let Some(p) = s_prev {
            blocks.get_mut(p).next = Some(dst);
        }
        let d = blocks.get_mut(dst);
        d.ptr = s_ptr;
        d.prev = s_prev;
        d.size += s_size;
    } else {
        // [dst src]
        if let Some(n) = s_next {
            blocks.get_mut(n).prev = Some(dst);
        }
        let d = blocks.get_mut(dst);
        d.next = s_next;
        d.size += s_size;
    }
    blocks.remove(src);
    s_size
}

/// Whether freeing a mapped block between `prev` and `up` merges it with `up` alone: `up` is
/// idle, mapped and outside expandable segments, and `prev` is absent or not idle (so the
/// merged block is `up` grown downwards: [`merge_up`]). `PLAIN`: no expandable segment exists
/// (every block is mapped and outside them).
#[inline(always)]
fn merges_up_only<const PLAIN: bool>(
    blocks: &BlockStore,
    prev: Option<BlockId>,
    up: BlockId,
) -> bool {
    let u = blocks.get(up);
    u.is_idle_in::<PLAIN>()
        && (PLAIN || (u.mapped && u.expandable.is_none()))
        && prev.is_none_or(|p| !blocks.get(p).is_idle_in::<PLAIN>())
}

/// The free of block `id` (`f`) that [`merges_up_only`] with its upper neighbour: the same
/// blocks and free-index keys as merging the neighbour into the block (PyTorch's
/// `try_merge_blocks`, then `insert_into_blocks`), but the neighbour keeps its id and its place
/// in the free index, re-keyed to the merged range and given the freed block's fields, and the
/// freed block's slot is deleted. A
/// freed split piece below a free remainder (a warm alloc/free pair) so takes one re-key
/// instead of a removal and an insert.
#[inline(always)]
fn merge_up(blocks: &mut BlockStore, pool: &mut BlockPool, id: BlockId, f: Freed) {
    let Some(up) = f.next else {
        unreachable!("merge_up is given a block with an upper neighbour");
    };
    let old = SizeKey::of(up, blocks.get(up));
    if let Some(p) = f.prev {
        blocks.get_mut(p).next = Some(up);
    }
    let u = blocks.get_mut(up);
    u.ptr = f.ptr;
    u.size += f.size;
    u.prev = f.prev;
    // The merged block is the freed one in PyTorch: its last request stays (snapshots show it).
    u.requested_size = f.requested;
    pool.rekey_in_blocks(&old, up, u);
    blocks.remove(id);
}

/// Turns off what `device` cannot do in `config` (expandable segments without virtual memory
/// management, as PyTorch does) and returns the warnings of the configuration as applied: the
/// device-dependent ones, then [`AllocatorConfig::validate_warnings`].
pub(crate) fn fit_to_device<D: DeviceMemory + ?Sized>(
    config: &mut AllocatorConfig,
    device: &D,
) -> Vec<ConfigWarning> {
    let mut warnings = Vec::new();
    if config.expandable_segments && !device.supports_virtual_memory() {
        config.expandable_segments = false;
        warnings.push(ConfigWarning::ExpandableSegmentsUnsupported {
            device: device.index(),
        });
    }
    warnings.extend(config.validate_warnings());
    warnings
}

#[cfg(test)]
mod plain_tests {
    //! The `plain` flag follows every state it summarizes (debug builds also check it on every
    //! malloc and free).

    use super::*;
    use crate::SimDevice;
    use crate::pool_types::{MempoolId, StreamFilter};

    const S0: StreamId = StreamId::DEFAULT;

    fn allocator(conf: &str) -> (SimDevice, DeviceCachingAllocator<SimDevice>) {
        let dev = SimDevice::address_only(0, 1 << 30);
        let config = AllocatorConfig::parse(conf).expect("valid config");
        let alloc = DeviceCachingAllocator::new(dev.clone(), config).expect("allocator");
        (dev, alloc)
    }

    /// Each rare state turns `plain` off while it holds, and back on when it ends.
    #[test]
    fn plain_follows_the_rare_states() {
        let (dev, mut a) = allocator("");
        assert!(a.plain, "a new allocator with the default config");

        a.record_history(100, Clock::Logical);
        assert!(!a.plain, "history recorded");
        a.stop_history();
        assert!(a.plain, "history stopped");

        let pool = MempoolId::new(1, 0);
        a.begin_allocate_to_pool(pool, StreamFilter::All).unwrap();
        assert!(!a.plain, "a private pool begun");
        a.end_allocate_to_pool(pool).unwrap();
        assert!(a.plain, "the pool ended");

        // A free with a stream use waits on an event; the next malloc processes it.
        let x = a.malloc(4096, S0).unwrap();
        a.record_stream(x.ptr, StreamId(7)).unwrap();
        assert!(a.plain, "a stream use alone changes nothing yet");
        a.free(x.ptr).unwrap();
        assert!(!a.plain, "an event outstanding");
        dev.complete_all();
        let y = a.malloc(4096, S0).unwrap();
        assert!(a.plain, "the event processed by the next malloc");
        a.free(y.ptr).unwrap();

        a.set_memory_fraction(0.5).unwrap();
        assert!(a.plain, "a memory fraction without a GC threshold");
        a.empty_cache().unwrap();
        let config = AllocatorConfig::parse("garbage_collection_threshold:0.6").unwrap();
        a.set_config(config).unwrap();
        assert!(a.plain, "a GC threshold without a memory fraction");
        a.set_memory_fraction(0.5).unwrap();
        assert!(!a.plain, "GC in force");

        let (_, b) = allocator("max_split_size_mb:20");
        assert!(!b.plain, "max_split_size set");
        let (_, mut c) = allocator("expandable_segments:True");
        let z = c.malloc(4096, S0).unwrap();
        assert!(
            c.config.expandable_segments,
            "the simulated device maps pages"
        );
        assert!(!c.plain, "an expandable segment made");
        c.free(z.ptr).unwrap();
    }
}
