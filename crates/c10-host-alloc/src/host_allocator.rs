//! PyTorch's pinned host caching allocator (`at::CachingHostAllocatorImpl` in
//! `ATen/core/CachingHostAllocator.h`, its CUDA half in `ATen/cuda/CachingHostAllocator.cpp`),
//! following torch 2.15: page-locked staging buffers for host <-> device copies, reused only
//! after every stream that used them is done.
//!
//! The rules ([`CachingHostAllocator`]):
//! - a request is rounded up to a power of two (`c10::llvm::PowerOf2Ceil`), unless it is above
//!   `max_round_threshold` or `max_cached_size` ([`HostAllocatorConfig`]); blocks are never
//!   split;
//! - free blocks are cached per size class (bucket `ceil(log2(size))`, PyTorch's `size_index`);
//!   a request takes the most recently freed block of its bucket that is large enough;
//! - [`CachingHostAllocator::record_event`] marks a block as used on a stream (PyTorch's
//!   `record_event(ptr, ctx, stream)`); freeing it records one event per such stream, and the
//!   block returns to the cache only once all of them completed;
//! - pending events are processed oldest first at each allocation (unless
//!   `pinned_use_background_threads`, where a background thread does it every 100 µs) and stop
//!   at the first event that is not complete (`process_events`);
//! - a freed block larger than `max_cached_size` is released at once instead of cached;
//!   [`CachingHostAllocator::empty_cache`] releases every cached block.
//!
//! Statistics ([`HostStats`], `torch.cuda.host_memory_stats()`): `allocations` /
//! `allocated_bytes` count the blocks the allocator holds (in use or cached; earlier torch
//! versions called these `segment` and `reserved_bytes`), `active_requests` / `active_bytes` the
//! blocks handed out and not yet reusable, `num_host_alloc` / `num_host_free` the backend calls,
//! `host_alloc_time` / `host_free_time` the microseconds spent in them. As in PyTorch the active
//! stats are kept per bucket and summed when read, so their peak is the sum of the buckets'
//! peaks (PyTorch's "best-effort approximation").
//!
//! The knobs `pinned_use_cuda_host_register`, `pinned_num_register_threads` and
//! `pinned_use_background_threads` come from the PYTORCH_CUDA_ALLOC_CONF string
//! ([`HostAllocatorConfig::from_alloc_config`]). Where we differ: one mutex guards the whole
//! state (PyTorch has one per bucket, one for the events and one for the block set), but the
//! backend's allocations and frees run outside it as PyTorch's do; no private pools for CUDA
//! graph capture and no reserve segment (`pinned_reserve_segment_size_mb` is accepted and has no
//! effect).

use std::collections::{BTreeMap, VecDeque};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use c10_core::{Allocator, DataPtr, Device, DeviceType};
use parking_lot::Mutex;
use smallvec::SmallVec;
use thiserror::Error;

use c10_cuda::config::AllocatorConfig;
use c10_cuda::device::{DeviceError, EventId, StreamId};
use c10_cuda::stats::Stat;

use crate::pinned_memory::PinnedMemory;

/// Size classes (PyTorch's `MAX_SIZE_INDEX`): bucket `i` holds blocks of `2^(i-1) + 1 ..= 2^i`
/// bytes.
pub const BUCKETS: usize = 64;

/// How often the background thread processes events (PyTorch sleeps 100 µs between rounds).
pub const BACKGROUND_PERIOD: Duration = Duration::from_micros(100);

/// The host allocator's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostAllocatorConfig {
    /// Allocate with `malloc` + `cudaHostRegister` instead of `cudaHostAlloc`
    /// (`pinned_use_cuda_host_register`).
    pub use_host_register: bool,
    /// Threads that pre-fault the pages before `cudaHostRegister`
    /// (`pinned_num_register_threads`, a power of two, default 1).
    pub num_register_threads: usize,
    /// Process events on a background thread instead of in each allocation
    /// (`pinned_use_background_threads`).
    pub use_background_threads: bool,
    /// Requests above this many bytes are not rounded to a power of two (PyTorch's
    /// `pinned_max_round_threshold`, unlimited by default).
    pub max_round_threshold: usize,
    /// Freed blocks above this many bytes are released instead of cached, and requests above it
    /// are not rounded (PyTorch's `pinned_max_cached_size`, unlimited by default).
    pub max_cached_size: usize,
}

impl Default for HostAllocatorConfig {
    /// PyTorch's defaults: `cudaHostAlloc`, one register thread, no background thread, every
    /// size rounded and cached.
    fn default() -> Self {
        HostAllocatorConfig {
            use_host_register: false,
            num_register_threads: 1,
            use_background_threads: false,
            max_round_threshold: usize::MAX,
            max_cached_size: usize::MAX,
        }
    }
}

impl HostAllocatorConfig {
    /// The pinned knobs of a PYTORCH_CUDA_ALLOC_CONF configuration
    /// (`pinned_use_cuda_host_register`, `pinned_num_register_threads`,
    /// `pinned_use_background_threads`); the rest at their defaults.
    pub fn from_alloc_config(config: &AllocatorConfig) -> Self {
        HostAllocatorConfig {
            use_host_register: config.pinned_use_cuda_host_register,
            num_register_threads: config.pinned_num_register_threads.max(1),
            use_background_threads: config.pinned_use_background_threads,
            ..HostAllocatorConfig::default()
        }
    }
}

/// What the host allocator can fail with.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum HostAllocatorError {
    /// A request whose power-of-two rounding does not fit in `usize`.
    #[error(
        "cannot allocate {size} bytes of pinned memory: the size rounded to a power of two overflows"
    )]
    SizeTooLarge {
        /// The bytes asked for.
        size: usize,
    },
    /// The backend refused (out of host memory, `mlock` limit, driver error).
    #[error("pinned host allocation of {size} bytes failed: {source}")]
    Backend {
        /// The bytes asked for (rounded).
        size: usize,
        /// The backend's error.
        source: DeviceError,
    },
    /// A pointer that is not an allocated block of this allocator.
    #[error("pointer {ptr:#x} is not an allocated block of the pinned host allocator")]
    UnknownPointer {
        /// The address given.
        ptr: usize,
    },
}

/// Time statistics in microseconds (c10's `DurationStat`): `total`, `max`, `min` (0 means
/// "none yet"; a zero-length call does not count as a minimum), `count`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DurationStat {
    /// Sum of all durations.
    pub total: i64,
    /// The longest.
    pub max: i64,
    /// The shortest nonzero one since the last peak reset (0 while none).
    pub min: i64,
    /// How many were recorded.
    pub count: i64,
}

impl DurationStat {
    /// Records one duration (c10's `DurationStat::increase`).
    pub fn increase(&mut self, amount: i64) {
        self.total += amount;
        self.count += 1;
        self.max = self.max.max(amount);
        self.min = if self.min == 0 {
            amount
        } else {
            self.min.min(amount)
        };
    }

    /// `total = count = 0` (`reset_accumulated`).
    pub fn reset_accumulated(&mut self) {
        self.total = 0;
        self.count = 0;
    }

    /// `min = max = 0` (`reset_peak`).
    pub fn reset_peak(&mut self) {
        self.min = 0;
        self.max = 0;
    }

    /// `total / count`, 0 without any (the `avg` key).
    pub fn avg(&self) -> i64 {
        if self.count == 0 {
            0
        } else {
            self.total / self.count
        }
    }
}

/// The host allocator's statistics (PyTorch's `HostStats`, torch 2.15).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostStats {
    /// Blocks handed out and not yet reusable (`active_requests`), summed over buckets.
    pub active_requests: Stat,
    /// Their bytes (`active_bytes`), summed over buckets.
    pub active_bytes: Stat,
    /// Blocks the allocator holds, in use or cached (`allocations`).
    pub allocations: Stat,
    /// Their bytes (`allocated_bytes`).
    pub allocated_bytes: Stat,
    /// Microseconds in `cudaHostAlloc` / `cudaHostRegister` (`host_alloc_time`).
    pub host_alloc_time: DurationStat,
    /// Microseconds in `cudaFreeHost` / `cudaHostUnregister` (`host_free_time`).
    pub host_free_time: DurationStat,
    /// Backend allocations (`num_host_alloc`, = `allocations.allocated`).
    pub num_host_alloc: i64,
    /// Backend frees (`num_host_free`, = `allocations.freed`).
    pub num_host_free: i64,
    /// Backend allocations per bucket (`bucket_allocation`).
    pub bucket_allocation: Vec<i64>,
}

impl HostStats {
    /// `torch.cuda.host_memory_stats()`: the flattened keys, sorted
    /// (`active_bytes.{allocated,current,freed,peak}`, `active_requests.*`, `allocated_bytes.*`,
    /// `allocations.*`, `host_alloc_time.{avg,count,max,min,total}`, `host_free_time.*`,
    /// `num_host_alloc`, `num_host_free`).
    pub fn host_memory_stats(&self) -> BTreeMap<String, i64> {
        let mut out = BTreeMap::new();
        for (name, s) in [
            ("active_bytes", &self.active_bytes),
            ("active_requests", &self.active_requests),
            ("allocated_bytes", &self.allocated_bytes),
            ("allocations", &self.allocations),
        ] {
            out.insert(format!("{name}.current"), s.current);
            out.insert(format!("{name}.peak"), s.peak);
            out.insert(format!("{name}.allocated"), s.allocated);
            out.insert(format!("{name}.freed"), s.freed);
        }
        for (name, d) in [
            ("host_alloc_time", &self.host_alloc_time),
            ("host_free_time", &self.host_free_time),
        ] {
            out.insert(format!("{name}.total"), d.total);
            out.insert(format!("{name}.max"), d.max);
            out.insert(format!("{name}.min"), d.min);
            out.insert(format!("{name}.count"), d.count);
            out.insert(format!("{name}.avg"), d.avg());
        }
        out.insert("num_host_alloc".into(), self.num_host_alloc);
        out.insert("num_host_free".into(), self.num_host_free);
        out
    }
}

/// PyTorch's `c10::llvm::PowerOf2Ceil` (`None` when it overflows).
pub fn power_of_two_ceil(size: usize) -> Option<usize> {
    if size == 0 {
        Some(0)
    } else {
        size.checked_next_power_of_two()
    }
}

/// The bucket of a block of `size` bytes: `ceil(log2(size))` (PyTorch's `size_index`,
/// `c10::llvm::Log2_64_Ceil`); 0 for 0 and 1.
pub fn size_index(size: usize) -> usize {
    if size <= 1 {
        0
    } else {
        (usize::BITS - (size - 1).leading_zeros()) as usize
    }
}

/// One pinned block (PyTorch's `HostBlock`).
#[derive(Clone, Debug)]
struct HostBlock {
    size: usize,
    allocated: bool,
    /// Events recorded at the last free and not yet processed.
    event_count: usize,
    /// Streams that used the block since it was handed out (`streams_`).
    streams: SmallVec<[StreamId; 2]>,
    /// Allocated through the register path (PyTorch's `use_host_register` map).
    registered: bool,
    /// An event could not be recorded at a free: the block is never reused (nor released).
    retired: bool,
}

/// Per-bucket statistics (PyTorch's `HostBlockPool` stat vectors).
#[derive(Clone, Copy, Debug, Default)]
struct BucketStats {
    active: Stat,
    active_bytes: Stat,
    allocation: Stat,
    allocated_bytes: Stat,
}

#[derive(Debug)]
struct State {
    /// Every block by address (PyTorch's `blocks_` and `ptr_to_block_`).
    blocks: BTreeMap<usize, HostBlock>,
    /// Cached blocks per bucket, most recently freed last (`free_list_`).
    free_list: Vec<Vec<usize>>,
    /// Pending events with their block, newest first (`events_`).
    events: VecDeque<(EventId, usize)>,
    buckets: Vec<BucketStats>,
    allocations: Stat,
    allocated_bytes: Stat,
    host_alloc_time: DurationStat,
    host_free_time: DurationStat,
}

struct Inner<B: PinnedMemory> {
    backend: B,
    config: HostAllocatorConfig,
    state: Mutex<State>,
    background: AtomicBool,
}

/// PyTorch's pinned host caching allocator over a [`PinnedMemory`] backend (see the
/// [module docs](self) for its rules). Thread safe; cloning gives another handle to the same
/// allocator. Addresses are host addresses.
pub struct CachingHostAllocator<B: PinnedMemory> {
    inner: Arc<Inner<B>>,
}

impl<B: PinnedMemory> Clone for CachingHostAllocator<B> {
    fn clone(&self) -> Self {
        CachingHostAllocator {
            inner: Arc::clone(&self.inner),
        }
    }
}

/// Microseconds since `start`, as PyTorch measures the backend calls.
fn micros(start: Instant) -> i64 {
    i64::try_from(start.elapsed().as_micros()).unwrap_or(i64::MAX)
}

impl<B: PinnedMemory + 'static> CachingHostAllocator<B> {
    /// An empty allocator over `backend` with `config`.
    pub fn new(backend: B, config: HostAllocatorConfig) -> Self {
        CachingHostAllocator {
            inner: Arc::new(Inner {
                backend,
                config,
                state: Mutex::new(State {
                    blocks: BTreeMap::new(),
                    free_list: vec![Vec::new(); BUCKETS],
                    events: VecDeque::new(),
                    buckets: vec![BucketStats::default(); BUCKETS],
                    allocations: Stat::default(),
                    allocated_bytes: Stat::default(),
                    host_alloc_time: DurationStat::default(),
                    host_free_time: DurationStat::default(),
                }),
                background: AtomicBool::new(false),
            }),
        }
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.inner.backend
    }

    /// The settings.
    pub fn config(&self) -> &HostAllocatorConfig {
        &self.inner.config
    }

    /// The block size a request of `size` bytes gets (PyTorch's `roundSize`).
    ///
    /// # Errors
    /// [`HostAllocatorError::SizeTooLarge`] when the rounding overflows.
    pub fn round_size(&self, size: usize) -> Result<usize, HostAllocatorError> {
        let c = &self.inner.config;
        if size <= c.max_round_threshold && size <= c.max_cached_size {
            power_of_two_ceil(size).ok_or(HostAllocatorError::SizeTooLarge { size })
        } else {
            Ok(size)
        }
    }

    /// Allocates a block of at least `size` bytes and returns its address (PyTorch's
    /// `CachingHostAllocatorImpl::allocate`); 0 bytes give address 0. Takes a cached block of
    /// the request's bucket when one is free (after processing completed events, unless the
    /// background thread does that), otherwise asks the backend for a new one.
    ///
    /// # Errors
    /// [`HostAllocatorError::SizeTooLarge`]; [`HostAllocatorError::Backend`] when the backend
    /// cannot allocate (nothing changes then).
    pub fn malloc(&self, size: usize) -> Result<usize, HostAllocatorError> {
        if size == 0 {
            return Ok(0);
        }
        let inner = &*self.inner;
        let round = self.round_size(size)?;
        if !inner.config.use_background_threads {
            inner.process_events();
        }
        if let Some(ptr) = inner.state.lock().get_free_block(round) {
            return Ok(ptr);
        }
        if inner.config.use_background_threads && !inner.background.swap(true, Ordering::AcqRel) {
            self.start_background_thread();
        }
        // Slow path, without the lock (PyTorch's `allocate_host_memory`).
        let start = Instant::now();
        let registered = inner.config.use_host_register;
        let ptr = if registered {
            inner
                .backend
                .host_register_alloc(round, inner.config.num_register_threads)
        } else {
            inner.backend.host_alloc(round)
        }
        .map_err(|source| HostAllocatorError::Backend {
            size: round,
            source,
        })?;
        let elapsed = micros(start);
        let mut s = inner.state.lock();
        s.host_alloc_time.increase(elapsed);
        s.add_allocated_block(ptr, round, registered);
        Ok(ptr)
    }

    /// Frees the block at `ptr` (PyTorch's `free(ctx)`): with no recorded streams it goes back
    /// to the cache at once; otherwise one event is recorded per stream and it returns once they
    /// complete. A stream whose event cannot be recorded retires the block for good (PyTorch
    /// warns and does the same). Address 0 is ignored.
    ///
    /// # Errors
    /// [`HostAllocatorError::UnknownPointer`] when `ptr` is not an allocated block (nothing
    /// changes).
    pub fn free(&self, ptr: usize) -> Result<(), HostAllocatorError> {
        if ptr == 0 {
            return Ok(());
        }
        let inner = &*self.inner;
        let streams = {
            let mut s = inner.state.lock();
            let Some(block) = s.blocks.get_mut(&ptr).filter(|b| b.allocated) else {
                return Err(HostAllocatorError::UnknownPointer { ptr });
            };
            block.allocated = false;
            if block.streams.is_empty() {
                let released = s.maybe_cache_block(ptr, inner.config.max_cached_size);
                drop(s);
                if let Some(released) = released {
                    inner.release(vec![released]);
                }
                return Ok(());
            }
            block.event_count += block.streams.len();
            std::mem::take(&mut block.streams)
        };
        // Events are recorded outside the lock, as PyTorch does.
        let events: Vec<EventId> = streams
            .iter()
            .filter_map(|&stream| inner.backend.record_event(stream).ok())
            .collect();
        let mut s = inner.state.lock();
        if events.len() < streams.len() {
            if let Some(block) = s.blocks.get_mut(&ptr) {
                block.retired = true;
            }
        }
        for event in events {
            s.events.push_front((event, ptr));
        }
        Ok(())
    }

    /// Marks the allocated block containing `ptr` as used on `stream` (PyTorch's
    /// `record_event(ptr, ctx, stream)`): its reuse will wait for the work queued on `stream`
    /// when it is freed. Returns false when `ptr` is not inside an allocated block of this
    /// allocator (then nothing is recorded, as in PyTorch).
    pub fn record_event(&self, ptr: usize, stream: StreamId) -> bool {
        let mut s = self.inner.state.lock();
        let Some(start) = s.block_containing(ptr) else {
            return false;
        };
        let block = s.blocks.get_mut(&start).expect("found above");
        if !block.allocated {
            return false;
        }
        if !block.streams.contains(&stream) {
            block.streams.push(stream);
        }
        true
    }

    /// Whether `ptr` lies inside a block of this allocator (PyTorch's `isPinnedPtr` for its
    /// pinned memory).
    pub fn is_pinned(&self, ptr: usize) -> bool {
        self.inner.state.lock().block_containing(ptr).is_some()
    }

    /// The size of the allocated block starting at `ptr`, if any.
    pub fn block_size(&self, ptr: usize) -> Option<usize> {
        self.inner
            .state
            .lock()
            .blocks
            .get(&ptr)
            .filter(|b| b.allocated)
            .map(|b| b.size)
    }

    /// Moves blocks whose events all completed back to the cache, oldest event first, up to the
    /// first event that has not completed (PyTorch's `process_events`). What each allocation
    /// does first, or the background thread with `pinned_use_background_threads`.
    pub fn process_events(&self) {
        self.inner.process_events();
    }

    /// Releases every cached block to the backend after processing completed events (PyTorch's
    /// `empty_cache`, `torch._C._host_emptyCache()`); blocks in use or waiting for events stay.
    pub fn empty_cache(&self) {
        let inner = &*self.inner;
        inner.process_events();
        let released = inner.state.lock().take_cached();
        inner.release(released);
    }

    /// The statistics (PyTorch's `getStats`).
    pub fn stats(&self) -> HostStats {
        let s = self.inner.state.lock();
        let mut stats = HostStats {
            allocations: s.allocations,
            allocated_bytes: s.allocated_bytes,
            num_host_alloc: s.allocations.allocated,
            num_host_free: s.allocations.freed,
            host_alloc_time: s.host_alloc_time,
            host_free_time: s.host_free_time,
            bucket_allocation: vec![0; BUCKETS],
            ..HostStats::default()
        };
        for (i, b) in s.buckets.iter().enumerate() {
            add_stats(&mut stats.active_requests, &b.active);
            add_stats(&mut stats.active_bytes, &b.active_bytes);
            stats.bucket_allocation[i] = b.allocation.allocated;
        }
        stats
    }

    /// `torch.cuda.host_memory_stats()` ([`HostStats::host_memory_stats`]).
    pub fn host_memory_stats(&self) -> BTreeMap<String, i64> {
        self.stats().host_memory_stats()
    }

    /// `torch.cuda.reset_accumulated_host_memory_stats()`: `allocated`/`freed` and the time
    /// totals and counts to zero.
    pub fn reset_accumulated_stats(&self) {
        let mut s = self.inner.state.lock();
        s.allocations.reset_accumulated();
        s.allocated_bytes.reset_accumulated();
        for b in &mut s.buckets {
            b.active.reset_accumulated();
            b.active_bytes.reset_accumulated();
            b.allocation.reset_accumulated();
            b.allocated_bytes.reset_accumulated();
        }
        s.host_alloc_time.reset_accumulated();
        s.host_free_time.reset_accumulated();
    }

    /// `torch.cuda.reset_peak_host_memory_stats()`: peaks to the current values, time extremes
    /// to zero.
    pub fn reset_peak_stats(&self) {
        let mut s = self.inner.state.lock();
        s.allocations.reset_peak();
        s.allocated_bytes.reset_peak();
        for b in &mut s.buckets {
            b.active.reset_peak();
            b.active_bytes.reset_peak();
            b.allocation.reset_peak();
            b.allocated_bytes.reset_peak();
        }
        s.host_alloc_time.reset_peak();
        s.host_free_time.reset_peak();
    }

    /// Pending events (recorded at frees, not yet processed).
    pub fn pending_events(&self) -> usize {
        self.inner.state.lock().events.len()
    }

    /// Cached (free) blocks.
    pub fn cached_blocks(&self) -> usize {
        self.inner.state.lock().free_list.iter().map(Vec::len).sum()
    }

    /// Whether the background event thread has been started.
    pub fn background_thread_started(&self) -> bool {
        self.inner.background.load(Ordering::Acquire)
    }

    /// Checks the structure and recounts every statistic from the blocks: each cached block is
    /// free, event-less and in its bucket exactly once; allocated and pending blocks are not
    /// cached; every pending event names a freed block whose event count matches; `allocations`
    /// and `allocated_bytes` equal the blocks held, the per-bucket active and allocation counts
    /// equal the blocks of the bucket; nothing is negative.
    ///
    /// # Errors
    /// A description of the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.inner.state.lock().check()
    }

    /// A c10-core [`Allocator`] over this allocator (CPU device, as PyTorch's pinned tensors are
    /// CPU tensors) whose `DataPtr`s return their block when dropped (PyTorch's
    /// `CachingHostAllocatorInterface::allocate`).
    pub fn allocator(&self) -> HostDataAllocator<B> {
        HostDataAllocator { host: self.clone() }
    }

    fn start_background_thread(&self) {
        let weak: Weak<Inner<B>> = Arc::downgrade(&self.inner);
        let spawned = std::thread::Builder::new()
            .name("tensormem-pinned-events".into())
            .spawn(move || {
                while let Some(inner) = weak.upgrade() {
                    inner.process_events();
                    drop(inner);
                    std::thread::sleep(BACKGROUND_PERIOD);
                }
            });
        if spawned.is_err() {
            // No thread: allocations process events themselves again.
            self.inner.background.store(false, Ordering::Release);
        }
    }
}

impl<B: PinnedMemory> Inner<B> {
    fn process_events(&self) {
        let mut released = Vec::new();
        {
            let mut s = self.state.lock();
            while let Some((event, ptr)) = s.events.pop_back() {
                let done = self.backend.query_event(event).unwrap_or(false);
                if !done {
                    s.events.push_back((event, ptr));
                    break;
                }
                self.backend.release_event(event);
                let block = s
                    .blocks
                    .get_mut(&ptr)
                    .expect("pending events name live blocks");
                block.event_count -= 1;
                if block.event_count == 0 {
                    if let Some(r) = s.maybe_cache_block(ptr, self.config.max_cached_size) {
                        released.push(r);
                    }
                }
            }
        }
        self.release(released);
    }

    /// Frees blocks already removed from the state, outside the lock, and times it.
    fn release(&self, blocks: Vec<(usize, usize, bool)>) {
        if blocks.is_empty() {
            return;
        }
        let mut times = Vec::with_capacity(blocks.len());
        for (ptr, size, registered) in blocks {
            let start = Instant::now();
            // A failed free leaves the memory with the backend; nothing else can be done.
            let _ = self.backend.host_free(ptr, size, registered);
            times.push(micros(start));
        }
        let mut s = self.state.lock();
        for t in times {
            s.host_free_time.increase(t);
        }
    }
}

impl State {
    fn block_containing(&self, ptr: usize) -> Option<usize> {
        self.blocks
            .range(..=ptr)
            .next_back()
            .filter(|(start, b)| ptr < *start + b.size)
            .map(|(start, _)| *start)
    }

    /// PyTorch's `get_free_block`: the most recently cached block of the bucket that is large
    /// enough.
    fn get_free_block(&mut self, size: usize) -> Option<usize> {
        let index = size_index(size);
        let list = &mut self.free_list[index];
        let pos = list.iter().rposition(|p| self.blocks[p].size >= size)?;
        let ptr = list.remove(pos);
        let block = self.blocks.get_mut(&ptr).expect("cached blocks are live");
        block.allocated = true;
        let bsize = block.size;
        self.buckets[index].active.increase(1);
        self.buckets[index].active_bytes.increase(bsize as u64);
        Some(ptr)
    }

    /// PyTorch's `add_allocated_block` for a new allocated block.
    fn add_allocated_block(&mut self, ptr: usize, size: usize, registered: bool) {
        self.blocks.insert(
            ptr,
            HostBlock {
                size,
                allocated: true,
                event_count: 0,
                streams: SmallVec::new(),
                registered,
                retired: false,
            },
        );
        self.allocations.increase(1);
        self.allocated_bytes.increase(size as u64);
        let b = &mut self.buckets[size_index(size)];
        b.allocation.increase(1);
        b.allocated_bytes.increase(size as u64);
        b.active.increase(1);
        b.active_bytes.increase(size as u64);
    }

    /// PyTorch's `maybe_cache_block`: back to its bucket, or (above `max_cached`) removed, when
    /// it returns what the caller must free.
    fn maybe_cache_block(&mut self, ptr: usize, max_cached: usize) -> Option<(usize, usize, bool)> {
        let size = self.blocks[&ptr].size;
        let index = size_index(size);
        if size > max_cached {
            return Some(self.destroy_block(ptr, true));
        }
        self.free_list[index].push(ptr);
        self.buckets[index].active.decrease(1);
        self.buckets[index].active_bytes.decrease(size as u64);
        None
    }

    /// PyTorch's `destroy_block` without the free itself: returns `(ptr, size, registered)`.
    fn destroy_block(&mut self, ptr: usize, is_active: bool) -> (usize, usize, bool) {
        let block = self.blocks.remove(&ptr).expect("destroyed blocks are live");
        let index = size_index(block.size);
        self.allocations.decrease(1);
        self.allocated_bytes.decrease(block.size as u64);
        let b = &mut self.buckets[index];
        b.allocation.decrease(1);
        b.allocated_bytes.decrease(block.size as u64);
        if is_active {
            b.active.decrease(1);
            b.active_bytes.decrease(block.size as u64);
        }
        (ptr, block.size, block.registered)
    }

    /// Removes every cached block (PyTorch's `free_from_pool`).
    fn take_cached(&mut self) -> Vec<(usize, usize, bool)> {
        let cached: Vec<usize> = self.free_list.iter_mut().flat_map(std::mem::take).collect();
        cached
            .into_iter()
            .map(|ptr| self.destroy_block(ptr, false))
            .collect()
    }

    fn check(&self) -> Result<(), String> {
        let mut cached = BTreeMap::new();
        for (index, list) in self.free_list.iter().enumerate() {
            for &ptr in list {
                let Some(b) = self.blocks.get(&ptr) else {
                    return Err(format!("cached block {ptr:#x} is not a live block"));
                };
                if b.allocated || b.event_count != 0 || !b.streams.is_empty() {
                    return Err(format!(
                        "cached block {ptr:#x} is allocated or has events or streams: {b:?}"
                    ));
                }
                if size_index(b.size) != index {
                    return Err(format!(
                        "block {ptr:#x} of {} bytes cached in bucket {index}",
                        b.size
                    ));
                }
                if cached.insert(ptr, ()).is_some() {
                    return Err(format!("block {ptr:#x} cached twice"));
                }
            }
        }
        let mut events: BTreeMap<usize, usize> = BTreeMap::new();
        for &(_, ptr) in &self.events {
            *events.entry(ptr).or_default() += 1;
        }
        let mut per_bucket = vec![(0i64, 0i64, 0i64, 0i64); BUCKETS];
        let (mut count, mut bytes) = (0i64, 0i64);
        for (&ptr, b) in &self.blocks {
            let pending = events.get(&ptr).copied().unwrap_or(0);
            if b.retired {
                // Its unrecorded events never come: it stays active for good.
                if b.event_count < pending || b.allocated {
                    return Err(format!("retired block {ptr:#x} is inconsistent: {b:?}"));
                }
            } else if b.event_count != pending {
                return Err(format!(
                    "block {ptr:#x} counts {} events, {pending} are pending",
                    b.event_count
                ));
            }
            if pending > 0 && b.allocated {
                return Err(format!("allocated block {ptr:#x} has pending events"));
            }
            if !b.allocated && !b.streams.is_empty() {
                return Err(format!("free block {ptr:#x} still lists streams"));
            }
            let is_cached = cached.contains_key(&ptr);
            if !is_cached && !b.allocated && pending == 0 && !b.retired {
                return Err(format!(
                    "block {ptr:#x} is neither allocated, pending nor cached"
                ));
            }
            let e = &mut per_bucket[size_index(b.size)];
            e.0 += 1;
            e.1 += b.size as i64;
            if !is_cached {
                e.2 += 1;
                e.3 += b.size as i64;
            }
            count += 1;
            bytes += b.size as i64;
        }
        if self.allocations.current != count || self.allocated_bytes.current != bytes {
            return Err(format!(
                "allocations {} / {} bytes recorded, {count} / {bytes} held",
                self.allocations.current, self.allocated_bytes.current
            ));
        }
        for (i, (b, e)) in self.buckets.iter().zip(&per_bucket).enumerate() {
            let recount = (
                b.allocation.current,
                b.allocated_bytes.current,
                b.active.current,
                b.active_bytes.current,
            );
            if recount != *e {
                return Err(format!(
                    "bucket {i}: recorded (blocks, bytes, active, active bytes) {recount:?}, \
                     recounted {e:?}"
                ));
            }
            for s in [
                &b.active,
                &b.active_bytes,
                &b.allocation,
                &b.allocated_bytes,
            ] {
                if s.current < 0 || s.peak < s.current {
                    return Err(format!("bucket {i}: impossible stat {s:?}"));
                }
            }
        }
        Ok(())
    }
}

/// PyTorch's `add_stats`: sums every field, peaks included.
fn add_stats(acc: &mut Stat, other: &Stat) {
    acc.current += other.current;
    acc.peak += other.peak;
    acc.allocated += other.allocated;
    acc.freed += other.freed;
}

/// The c10-core [`Allocator`] view of a [`CachingHostAllocator`]
/// ([`CachingHostAllocator::allocator`]).
pub struct HostDataAllocator<B: PinnedMemory> {
    host: CachingHostAllocator<B>,
}

impl<B: PinnedMemory> Clone for HostDataAllocator<B> {
    fn clone(&self) -> Self {
        HostDataAllocator {
            host: self.host.clone(),
        }
    }
}

impl<B: PinnedMemory + 'static> HostDataAllocator<B> {
    /// The host allocator behind it.
    pub fn host(&self) -> &CachingHostAllocator<B> {
        &self.host
    }
}

/// What a pinned `DataPtr` owns.
struct PinnedContext<B: PinnedMemory + 'static> {
    host: CachingHostAllocator<B>,
    ptr: usize,
}

/// The pinned `DataPtr` deleter: returns the block (PyTorch's `raw_local_deleter`).
///
/// # Safety
/// `ctx` must come from `Box::into_raw(Box<PinnedContext<B>>)`, passed once.
unsafe fn delete_pinned<B: PinnedMemory + 'static>(ctx: *mut c_void) {
    // SAFETY: guaranteed by the caller (DataPtr runs its deleter once with our context).
    let ctx = unsafe { Box::from_raw(ctx.cast::<PinnedContext<B>>()) };
    let _ = ctx.host.free(ctx.ptr);
}

// SAFETY: every DataPtr from `allocate` is on the CPU (this allocator's device type); for
// nbytes > 0 it points at a block of at least nbytes bytes of host memory, initialised (backends
// zero new blocks), readable and writable, that the allocator hands to no one else until the
// deleter returns it; the context is a boxed PinnedContext freed once by `delete_pinned`.
unsafe impl<B: PinnedMemory + 'static> Allocator for HostDataAllocator<B> {
    #[track_caller]
    fn allocate(&self, nbytes: usize) -> c10_core::Result<DataPtr> {
        if nbytes == 0 {
            return Ok(DataPtr::null(Device::cpu()));
        }
        let ptr = self.host.malloc(nbytes).map_err(|e| match e {
            HostAllocatorError::Backend {
                source: DeviceError::OutOfMemory { .. },
                ..
            } => c10_core::Error::OutOfMemory {
                requested: nbytes,
                device: Device::cpu(),
            },
            other => c10_core::Error::AllocatorFailure {
                device: Device::cpu(),
                message: other.to_string(),
            },
        })?;
        let ctx = Box::into_raw(Box::new(PinnedContext {
            host: self.host.clone(),
            ptr,
        }));
        // SAFETY: `ctx` is a fresh boxed PinnedContext<B>, freed once by `delete_pinned::<B>`;
        // `ptr` is an allocated block of at least `nbytes` bytes until then.
        Ok(unsafe {
            DataPtr::new(
                ptr as *mut u8,
                ctx.cast(),
                Some(delete_pinned::<B>),
                Device::cpu(),
            )
        })
    }

    fn device_type(&self) -> DeviceType {
        DeviceType::Cpu
    }
}
