//! The multi-device front (PyTorch's `NativeCachingAllocator` / THCCachingAllocator role):
//! one [`DeviceCachingAllocator`] per device behind a mutex, a pointer-to-device map,
//! free-memory callbacks, out-of-memory observers and trace trackers, the call sites of the
//! memory history, and c10-core's [`Allocator`] whose `DataPtr` deleter returns the block.

use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use c10_core::{Allocator, DataPtr, Device, DeviceType};
use parking_lot::{Mutex, RwLock};
use rustc_hash::FxBuildHasher;

use crate::allocator::{CacheInfo, DeviceCachingAllocator};
use crate::call_site::{self, HistoryOptions, Stacks};
use crate::config::AllocatorConfig;
use crate::device::{DeviceMemory, DevicePtr, StreamId};
use crate::error::{Error, Result};
use crate::history::{Clock, Frames, RecordContext};
use crate::observer::{OomObservation, OutOfMemoryObserver, TraceTracker};
use crate::snapshot::DeviceSnapshot;
use crate::stats::DeviceStats;
use crate::thread_cache::{Freed, Key, ThreadCaches};

/// A function the allocator may call to free memory before it asks the device for more
/// (PyTorch's `FreeMemoryCallback` registry). Returns whether it freed anything. It runs
/// without any allocator lock held, so it may free blocks (for example by evicting tensors).
pub type FreeMemoryCallback = Arc<dyn Fn() -> bool + Send + Sync>;

/// A device index the front does not serve, in `CachingAllocator::positions` (so a front serves
/// at most 255 devices).
const NO_DEVICE: u8 = u8::MAX;

/// Shards of the pointer-to-device map (PyTorch shards its `allocated_blocks` the same way).
const SHARDS: usize = 16;

/// The caching allocator for several devices of one backend. Thread safe: each device has its
/// own lock, and the pointer map is sharded.
///
/// Its allocating and freeing methods are `#[track_caller]`: with memory history recorded with
/// a context ([`CachingAllocator::record_memory_history`]) each allocation and free carries the
/// caller's location, or its whole stack (see [`crate::call_site`]), captured before the
/// device lock is taken.
pub struct CachingAllocator<D: DeviceMemory> {
    devices: Vec<Mutex<DeviceCachingAllocator<D>>>,
    /// Device index (`cuda:N`) -> position in [`Self::devices`], [`NO_DEVICE`] for none.
    positions: Box<[u8; 256]>,
    /// Which device handed out each live pointer; kept only with two or more devices (with one,
    /// the device allocator's own pointer map answers, and a pair skips two shard locks and two
    /// hash-map updates).
    owners: [Mutex<HashMap<DevicePtr, u8, FxBuildHasher>>; SHARDS],
    /// `devices.len() == 1`: [`Self::owners`] is not used.
    single: bool,
    callbacks: RwLock<Vec<FreeMemoryCallback>>,
    oom_observers: RwLock<Vec<OutOfMemoryObserver>>,
    /// The [`RecordContext`] in force, as its number (read without a lock on every call).
    record_context: AtomicU8,
    /// The [`Stacks`] kind, as its number.
    stacks: AtomicU8,
    /// Small blocks kept per thread while a device lock is contended ([`crate::thread_cache`]).
    caches: ThreadCaches,
    /// Whether a trace tracker is attached (then nothing bypasses the allocator).
    trackers: std::sync::atomic::AtomicBool,
    /// Whether memory history is recorded (likewise).
    history: std::sync::atomic::AtomicBool,
}

impl<D: DeviceMemory> CachingAllocator<D> {
    /// One allocator per device in `devices`, all with `config`. Devices are named by their
    /// own [`DeviceMemory::index`] (as in `cuda:N`), in any order and with gaps: a front may
    /// serve only `cuda:2` and `cuda:5`.
    ///
    /// # Errors
    /// [`Error::InvalidDevice`] when two devices report the same index, or for more than 255
    /// devices (`count` is the number of devices given); [`Error::Device`] when a device cannot
    /// report its memory.
    pub fn new(devices: Vec<D>, config: AllocatorConfig) -> Result<Self> {
        let count = devices.len();
        let mut out = Vec::with_capacity(count);
        let mut positions = Box::new([NO_DEVICE; 256]);
        for (i, d) in devices.into_iter().enumerate() {
            let index = d.index();
            if positions[index as usize] != NO_DEVICE || i >= NO_DEVICE as usize {
                return Err(Error::InvalidDevice {
                    device: index,
                    count,
                });
            }
            positions[index as usize] = i as u8;
            out.push(Mutex::new(DeviceCachingAllocator::new(d, config.clone())?));
        }
        Ok(CachingAllocator {
            positions,
            single: out.len() == 1,
            devices: out,
            owners: std::array::from_fn(|_| Mutex::new(HashMap::default())),
            callbacks: RwLock::new(Vec::new()),
            oom_observers: RwLock::new(Vec::new()),
            record_context: AtomicU8::new(RecordContext::Never as u8),
            stacks: AtomicU8::new(Stacks::Caller as u8),
            caches: ThreadCaches::new(),
            trackers: Default::default(),
            history: Default::default(),
        })
    }

    /// Number of devices.
    pub fn device_count(&self) -> usize {
        self.devices.len()
    }

    /// Whether the front serves device `device` (`cuda:device`).
    pub fn has_device(&self, device: u8) -> bool {
        self.positions[device as usize] != NO_DEVICE
    }

    /// The indices of the devices served, in the order they were given.
    pub fn device_indices(&self) -> Vec<u8> {
        self.devices
            .iter()
            .map(|d| d.lock().device().index())
            .collect()
    }

    fn dev(&self, device: u8) -> Result<&Mutex<DeviceCachingAllocator<D>>> {
        match self.positions[device as usize] {
            NO_DEVICE => Err(Error::InvalidDevice {
                device,
                count: self.devices.len(),
            }),
            pos => Ok(&self.devices[pos as usize]),
        }
    }

    fn shard(&self, ptr: DevicePtr) -> &Mutex<HashMap<DevicePtr, u8, FxBuildHasher>> {
        // Blocks are 512-byte aligned: drop the low bits before picking a shard.
        &self.owners[((ptr >> 9) as usize) % SHARDS]
    }

    /// Runs `f` on one device's allocator under its lock (for anything not wrapped here).
    ///
    /// # Errors
    /// [`Error::InvalidDevice`] for an unknown device.
    pub fn with_device<R>(
        &self,
        device: u8,
        f: impl FnOnce(&mut DeviceCachingAllocator<D>) -> R,
    ) -> Result<R> {
        Ok(f(&mut self.dev(device)?.lock()))
    }

    /// Registers a free-memory callback (PyTorch's `REGISTER_FREE_MEMORY_CALLBACK`). Callbacks
    /// run, in registration order, after a cache miss and before the device is asked for a new
    /// segment; if any returns true the cache is searched again.
    pub fn register_free_memory_callback(&self, callback: FreeMemoryCallback) {
        self.callbacks.write().push(callback);
    }

    /// Attaches an out-of-memory observer (PyTorch's `attachOutOfMemoryObserver`): called, in
    /// attachment order, each time an allocation on any device fails with
    /// [`Error::OutOfMemory`], on the allocating thread, after the failure is recorded and before
    /// the error is returned, with no allocator lock held (so it may call back into this
    /// allocator, e.g. for a [`CachingAllocator::snapshot`]). See [`OomObservation`] for what it
    /// is told.
    pub fn attach_out_of_memory_observer(&self, observer: OutOfMemoryObserver) {
        self.oom_observers.write().push(observer);
    }

    /// Attaches a trace tracker to every device (PyTorch's `attachAllocatorTraceTracker`):
    /// called with the device index and each trace entry from now on, whether or not history is
    /// recorded, while that device's lock is held (see [`TraceTracker`] for what it must not do).
    pub fn attach_allocator_trace_tracker(&self, tracker: TraceTracker) {
        self.trackers.store(true, Ordering::Relaxed);
        self.update_bypass();
        for d in &self.devices {
            d.lock().attach_trace_tracker(Arc::clone(&tracker));
        }
    }

    /// The caller's stack when the history's context mode records stacks at `level` (PyTorch's
    /// `maybeGatherContext`), captured before any lock is taken.
    #[track_caller]
    #[inline]
    fn gather_context(&self, level: RecordContext) -> Option<Frames> {
        if self.record_context.load(Ordering::Relaxed) < level as u8 {
            return None;
        }
        Some(self.capture())
    }

    #[track_caller]
    #[cold]
    #[inline(never)]
    fn capture(&self) -> Frames {
        if self.stacks.load(Ordering::Relaxed) == Stacks::Full as u8 {
            call_site::full_frames()
        } else {
            call_site::capture(Stacks::Caller)
        }
    }

    /// Allocates `size` bytes on `device` for the default stream (PyTorch's `raw_alloc`).
    /// Zero bytes give the null address 0.
    ///
    /// # Errors
    /// As [`CachingAllocator::raw_alloc_with_stream`].
    #[track_caller]
    pub fn raw_alloc(&self, device: u8, size: usize) -> Result<DevicePtr> {
        self.raw_alloc_with_stream(device, size, StreamId::DEFAULT)
    }

    /// Allocates `size` bytes on `device` for use on `stream` (PyTorch's
    /// `raw_alloc_with_stream`). Zero bytes give the null address 0.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the device is full even after the callbacks and the release
    /// chain (the out-of-memory observers have been called by then); [`Error::InvalidDevice`];
    /// [`Error::Device`].
    #[track_caller]
    pub fn raw_alloc_with_stream(
        &self,
        device: u8,
        size: usize,
        stream: StreamId,
    ) -> Result<DevicePtr> {
        if size == 0 {
            return Ok(0);
        }
        let key = Key {
            device,
            stream,
            size,
        };
        if self.caches.may_serve(size) {
            if let Some(ptr) = self.take_cached(key) {
                return Ok(ptr);
            }
        }
        let context = self.gather_context(RecordContext::State);
        let dev = self.dev(device)?;
        let ptr = match self.malloc_locked(dev, size, stream, &context) {
            Ok(ptr) => ptr,
            Err(e) => self.malloc_failed(dev, size, stream, &context, e)?,
        };
        if !self.single {
            self.shard(ptr).lock().insert(ptr, device);
        }
        if self.caches.may_serve(size) {
            self.caches.handed_out(ptr, key);
        }
        Ok(ptr)
    }

    /// A contended thread's allocation from its thread cache ([`crate::thread_cache`]): the
    /// waiting block of `key`, if any, after freeing the blocks handed back if contended mode
    /// just ended. Out of line: the uncontended allocation only tests whether to call it.
    #[inline(never)]
    fn take_cached(&self, key: Key) -> Option<DevicePtr> {
        let (hit, done) = self.caches.take(key);
        self.free_drained(done);
        hit
    }

    /// [`Self::raw_alloc_with_stream`] after [`Self::malloc_locked`] failed with `error`: out of
    /// memory is retried once after freeing the blocks waiting in thread caches (they are the
    /// allocator's to reuse), and an out-of-memory error that stays is shown to the observers,
    /// with the device lock released (they may call back into the allocator). Out of line: the
    /// usual allocation does not fail.
    #[cold]
    #[inline(never)]
    fn malloc_failed(
        &self,
        dev: &Mutex<DeviceCachingAllocator<D>>,
        size: usize,
        stream: StreamId,
        context: &Option<Frames>,
        error: Error,
    ) -> Result<DevicePtr> {
        let mut result = Err(error);
        if matches!(result, Err(Error::OutOfMemory(_))) {
            let drained = self.caches.drain_all();
            if !drained.is_empty() {
                self.free_drained(drained);
                result = self.malloc_locked(dev, size, stream, context);
            }
        }
        match result {
            Err(Error::OutOfMemory(oom)) => {
                let observers = self.oom_observers.read().clone();
                if !observers.is_empty() {
                    let seen = OomObservation::from_error(&oom);
                    for observer in &observers {
                        observer(&seen);
                    }
                }
                Err(Error::OutOfMemory(oom))
            }
            other => other,
        }
    }

    /// The malloc of one device under its lock, the free-memory callbacks run unlocked between
    /// the cache search and the device malloc; `context` is the stack of the call.
    fn malloc_locked(
        &self,
        dev: &Mutex<DeviceCachingAllocator<D>>,
        size: usize,
        stream: StreamId,
        context: &Option<Frames>,
    ) -> Result<DevicePtr> {
        let mut guard = self.lock(dev);
        let cached = with_context(&mut guard, context.clone(), |a| {
            a.try_malloc_cached(size, stream)
        })?;
        if let Some(a) = cached {
            return Ok(a.ptr);
        }
        let callbacks = self.callbacks.read().clone();
        if callbacks.is_empty() {
            return with_context(&mut guard, context.clone(), |a| {
                a.malloc_uncached(size, stream, false).map(|a| a.ptr)
            });
        }
        // Callbacks may free blocks (and so take this lock): run them unlocked.
        drop(guard);
        let mut freed = false;
        for cb in &callbacks {
            freed |= cb();
        }
        with_context(&mut dev.lock(), context.clone(), |a| {
            a.malloc_uncached(size, stream, freed).map(|a| a.ptr)
        })
    }

    /// Frees a pointer from [`CachingAllocator::raw_alloc`] (PyTorch's `raw_delete`). The null
    /// address is ignored.
    ///
    /// # Errors
    /// [`Error::UnknownPointer`] when `ptr` is not live (freed twice, or never allocated here).
    #[track_caller]
    pub fn raw_delete(&self, ptr: DevicePtr) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        let context = self.gather_context(RecordContext::All);
        self.delete_with(ptr, context)
    }

    /// [`Self::raw_delete`] with the free's stack given: into the caller's thread cache when it
    /// takes the block ([`crate::thread_cache`]), else to the allocator.
    fn delete_with(&self, ptr: DevicePtr, context: Option<Frames>) -> Result<()> {
        if self.caches.tracking() {
            return self.delete_tracked(ptr, context);
        }
        self.delete_locked(ptr, context)
    }

    /// [`Self::delete_with`] while the thread caches track blocks: out of line, so that the
    /// usual free (nothing tracked) is a test and a call.
    #[inline(never)]
    fn delete_tracked(&self, ptr: DevicePtr, context: Option<Frames>) -> Result<()> {
        let (outcome, done) = self.caches.free(ptr);
        self.free_drained(done);
        match outcome {
            Freed::Cached => Ok(()),
            Freed::Twice => Err(Error::UnknownPointer { ptr }),
            Freed::Allocator => self.delete_locked(ptr, context),
        }
    }

    /// The allocator's free of `ptr`, under its device's lock.
    fn delete_locked(&self, ptr: DevicePtr, context: Option<Frames>) -> Result<()> {
        if self.single {
            return with_context(&mut self.lock(&self.devices[0]), context, |a| a.free(ptr))
                .map_err(unknown_pointer);
        }
        let Some(device) = self.shard(ptr).lock().remove(&ptr) else {
            return Err(Error::UnknownPointer { ptr });
        };
        with_context(&mut self.lock(self.dev(device)?), context, |a| a.free(ptr))
    }

    /// A device's lock: `try_lock` first; when another thread holds it, the caller enters the
    /// thread caches' contended mode ([`crate::thread_cache`]) and waits.
    #[inline(always)]
    fn lock<'a>(
        &self,
        dev: &'a Mutex<DeviceCachingAllocator<D>>,
    ) -> parking_lot::MutexGuard<'a, DeviceCachingAllocator<D>> {
        match dev.try_lock() {
            Some(guard) => guard,
            None => {
                self.caches.contended();
                dev.lock()
            }
        }
    }

    /// Gives the blocks waiting in thread caches ([`crate::thread_cache`]) back to the
    /// allocators, so that what is read next counts only the user's blocks as allocated.
    ///
    /// Stats, snapshots, cache info and `empty_cache` do this themselves;
    /// [`CachingAllocator::with_device`] does not (its closure sees the raw allocator, where a
    /// waiting block is allocated), so a caller that budgets on the raw allocator's
    /// `allocated_bytes` (DTR's live backend) calls this first. Cheap when no block waits (one
    /// relaxed atomic load). Another thread may cache a block it frees right after this
    /// returns: the raw figures are exact only while no other thread frees on the device.
    /// PyTorch has no thread caches, so no counterpart.
    pub fn settle_thread_caches(&self) {
        self.settle();
    }

    /// Gives the blocks waiting in thread caches back to the allocator, so that what is reported
    /// next (stats, snapshots, cache info) counts only the user's blocks as allocated.
    fn settle(&self) {
        if self.caches.any_waiting() {
            self.free_drained(self.caches.drain_all());
        }
    }

    /// Frees blocks taken out of thread caches to the allocator (they are live: cannot fail).
    fn free_drained(&self, blocks: Vec<(Key, DevicePtr)>) {
        for (_, ptr) in blocks {
            let _ = self.delete_locked(ptr, None);
        }
    }

    /// Thread caches off while history is recorded or a trace tracker is attached (every
    /// event must reach them); turning them off frees what they hold.
    fn update_bypass(&self) {
        let bypass = self.trackers.load(Ordering::Relaxed) || self.history.load(Ordering::Relaxed);
        self.caches.set_bypass(bypass);
        if bypass {
            self.free_drained(self.caches.drain_all());
        }
    }

    /// The free's stack for a `DataPtr` deleter: a caller location would only name the
    /// deleter, so there is one only with full stacks (which show the drop's callers).
    fn deleter_context(&self) -> Option<Frames> {
        if self.stacks.load(Ordering::Relaxed) == Stacks::Full as u8 {
            self.gather_context(RecordContext::All)
        } else {
            None
        }
    }

    /// The device that handed out `ptr`. With one device, device 0 without a look-up: the
    /// caller's device call then reports an unknown pointer ([`unknown_pointer`]).
    fn owner(&self, ptr: DevicePtr) -> Result<u8> {
        if self.single {
            return Ok(0);
        }
        self.shard(ptr)
            .lock()
            .get(&ptr)
            .copied()
            .ok_or(Error::UnknownPointer { ptr })
    }

    /// Marks `ptr`'s block as used on `stream` (PyTorch's `recordStream`).
    ///
    /// # Errors
    /// [`Error::UnknownPointer`] when `ptr` is not live.
    pub fn record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<()> {
        // A block with a recorded stream must reach the allocator's free (its events).
        if self.caches.tracking() && !self.caches.untrack(ptr) {
            return Err(Error::UnknownPointer { ptr });
        }
        let device = self.owner(ptr)?;
        self.dev(device)?
            .lock()
            .record_stream(ptr, stream)
            .map_err(unknown_pointer)
    }

    /// The segment holding `ptr`: `(base address, segment bytes)` (PyTorch's
    /// `getBaseAllocation`).
    ///
    /// # Errors
    /// [`Error::UnknownPointer`] when `ptr` is not live.
    pub fn get_base_allocation(&self, ptr: DevicePtr) -> Result<(DevicePtr, usize)> {
        let device = self.owner(ptr)?;
        self.dev(device)?
            .lock()
            .get_base_allocation(ptr)
            .map_err(unknown_pointer)
    }

    /// Cached bytes and the largest cached block of `device` (PyTorch's `cacheInfo`).
    ///
    /// # Errors
    /// [`Error::InvalidDevice`].
    pub fn cache_info(&self, device: u8) -> Result<CacheInfo> {
        self.settle();
        Ok(self.dev(device)?.lock().cache_info())
    }

    /// A copy of `device`'s statistics (PyTorch's `getDeviceStats`).
    ///
    /// # Errors
    /// [`Error::InvalidDevice`].
    pub fn device_stats(&self, device: u8) -> Result<DeviceStats> {
        self.settle();
        Ok(self.dev(device)?.lock().stats())
    }

    /// `torch.cuda.memory_stats(device)`: PyTorch's keys (123 under torch 2.15's rules, the default; 122 under 2.7's).
    ///
    /// # Errors
    /// [`Error::InvalidDevice`].
    pub fn memory_stats(&self, device: u8) -> Result<BTreeMap<String, i64>> {
        Ok(self.device_stats(device)?.memory_stats())
    }

    /// `torch.cuda.memory_summary(device, abbreviated)`.
    ///
    /// # Errors
    /// [`Error::InvalidDevice`].
    pub fn memory_summary(&self, device: u8, abbreviated: bool) -> Result<String> {
        let stats = self.device_stats(device)?;
        Ok(crate::summary::memory_summary(device, &stats, abbreviated))
    }

    /// `torch.cuda.reset_peak_memory_stats(device)`.
    ///
    /// # Errors
    /// [`Error::InvalidDevice`].
    pub fn reset_peak_stats(&self, device: u8) -> Result<()> {
        self.settle();
        self.dev(device)?.lock().reset_peak_stats();
        Ok(())
    }

    /// `torch.cuda.reset_accumulated_memory_stats(device)`.
    ///
    /// # Errors
    /// [`Error::InvalidDevice`].
    pub fn reset_accumulated_stats(&self, device: u8) -> Result<()> {
        self.settle();
        self.dev(device)?.lock().reset_accumulated_stats();
        Ok(())
    }

    /// Limits `device` to `fraction` of its memory
    /// (`torch.cuda.set_per_process_memory_fraction`).
    ///
    /// # Errors
    /// [`Error::InvalidFraction`], [`Error::InvalidDevice`], [`Error::Device`].
    pub fn set_memory_fraction(&self, device: u8, fraction: f64) -> Result<()> {
        self.dev(device)?.lock().set_memory_fraction(fraction)
    }

    /// Replaces every device's configuration (PyTorch's `_set_allocator_settings`), only while
    /// no device holds memory: see [`DeviceCachingAllocator::set_config`]. All devices or none
    /// change.
    ///
    /// # Errors
    /// [`Error::Config`] when `config` does not validate; [`Error::ConfigInUse`] when a device
    /// holds memory; [`Error::Device`].
    pub fn set_config(&self, config: AllocatorConfig) -> Result<()> {
        config.validate()?;
        // Devices are locked in index order, the only order anything takes two of them in.
        let mut guards: Vec<_> = self.devices.iter().map(|d| d.lock()).collect();
        if let Some(busy) = guards.iter_mut().find(|g| g.holds_memory()) {
            // Refused with `ConfigInUse`, nothing changed.
            return busy.set_config(config);
        }
        for g in &mut guards {
            g.set_config(config.clone())?;
        }
        Ok(())
    }

    /// Releases every device's cached whole segments (`torch.cuda.empty_cache()`).
    ///
    /// # Errors
    /// [`Error::Device`] from the first device that fails.
    #[track_caller]
    pub fn empty_cache(&self) -> Result<()> {
        self.free_drained(self.caches.drain_all());
        let context = self.gather_context(RecordContext::All);
        for d in &self.devices {
            with_context(&mut d.lock(), context.clone(), |a| a.empty_cache())?;
        }
        Ok(())
    }

    /// Starts memory history on every device with room for `max_entries` entries each
    /// (`torch.cuda.memory._record_memory_history(max_entries=...)`) and no stacks
    /// ([`RecordContext::Never`]); 0 stops it.
    pub fn record_history(&self, max_entries: usize, clock: Clock) {
        self.record_memory_history(
            &HistoryOptions::new(max_entries)
                .clock(clock)
                .context(RecordContext::Never),
        );
    }

    /// Starts (or changes, or with `max_entries == 0` stops) memory history on every device
    /// with a context mode and a kind of stack: PyTorch's
    /// `torch.cuda.memory._record_memory_history(enabled, context, stacks, max_entries)`. From
    /// then on the allocating and freeing methods (and c10-core's `Allocator::allocate` through
    /// [`CachingAllocator::allocator`]) capture their caller's stack as `options.context` asks.
    /// Frees through a `DataPtr`'s drop have no caller to name: their entries carry the stack of
    /// the allocation, as PyTorch's do in mode `alloc`.
    pub fn record_memory_history(&self, options: &HistoryOptions) {
        let context = if options.max_entries == 0 {
            RecordContext::Never
        } else {
            options.context
        };
        self.stacks.store(options.stacks as u8, Ordering::Relaxed);
        self.record_context.store(context as u8, Ordering::Relaxed);
        self.history
            .store(options.max_entries > 0, Ordering::Relaxed);
        self.update_bypass();
        for d in &self.devices {
            d.lock().record_memory_history(options);
        }
    }

    /// Every device's segments and history (`torch.cuda.memory._snapshot()`).
    pub fn snapshot(&self) -> Vec<DeviceSnapshot> {
        self.settle();
        self.devices.iter().map(|d| d.lock().snapshot()).collect()
    }

    /// A c10-core [`Allocator`] for `device` whose `DataPtr`s return their block to this
    /// allocator when dropped (PyTorch's `CUDACachingAllocator::allocate`).
    ///
    /// # Errors
    /// [`Error::InvalidDevice`] for an unknown device.
    pub fn allocator(self: &Arc<Self>, device: u8) -> Result<DeviceAllocator<D>>
    where
        D: 'static,
    {
        let dev = self.dev(device)?;
        let device_type = dev.lock().device().device_type();
        Ok(DeviceAllocator {
            front: Arc::clone(self),
            device: Device::new(device_type, Some(device)),
        })
    }
}

/// The front's error for a pointer no device handed out: a device allocator's
/// [`Error::InvalidPointer`] becomes [`Error::UnknownPointer`]; other errors pass unchanged.
fn unknown_pointer(e: Error) -> Error {
    match e {
        Error::InvalidPointer { ptr, .. } => Error::UnknownPointer { ptr },
        other => other,
    }
}

/// Runs `f` on a locked device allocator with `context` as the operation's stack (nothing extra
/// when there is none).
#[inline(always)]
fn with_context<D: DeviceMemory, R>(
    alloc: &mut DeviceCachingAllocator<D>,
    context: Option<Frames>,
    f: impl FnOnce(&mut DeviceCachingAllocator<D>) -> R,
) -> R {
    match context {
        None => f(alloc),
        Some(frames) => alloc.with_context(Some(frames), f),
    }
}

/// The c10-core [`Allocator`] view of one device of a [`CachingAllocator`].
pub struct DeviceAllocator<D: DeviceMemory> {
    front: Arc<CachingAllocator<D>>,
    device: Device,
}

impl<D: DeviceMemory> Clone for DeviceAllocator<D> {
    fn clone(&self) -> Self {
        DeviceAllocator {
            front: Arc::clone(&self.front),
            device: self.device,
        }
    }
}

impl<D: DeviceMemory> DeviceAllocator<D> {
    /// The front this allocator hands blocks out of.
    pub fn front(&self) -> &Arc<CachingAllocator<D>> {
        &self.front
    }

    /// The device served.
    pub fn device(&self) -> Device {
        self.device
    }
}

/// What a caching-allocator `DataPtr` owns: the front and the block address.
struct BlockContext<D: DeviceMemory> {
    front: Arc<CachingAllocator<D>>,
    ptr: DevicePtr,
}

/// The `DataPtr` deleter: returns the block to the caching allocator.
///
/// # Safety
/// `ctx` must be a pointer from `Box::into_raw(Box<BlockContext<D>>)`, passed exactly once.
unsafe fn delete_block<D: DeviceMemory>(ctx: *mut c_void) {
    // SAFETY: guaranteed by the caller: `ctx` came from `Box::into_raw` in `allocate` with the
    // same `D`, and DataPtr runs its deleter exactly once.
    let ctx = unsafe { Box::from_raw(ctx.cast::<BlockContext<D>>()) };
    // A deleter cannot report errors; a failure here means a double free elsewhere, which the
    // front's pointer map already refused without touching allocator state.
    let context = ctx.front.deleter_context();
    let _ = ctx.front.delete_with(ctx.ptr, context);
}

// SAFETY: every DataPtr from `allocate` is on `self.device` (whose type is the device
// backend's type); for nbytes > 0 it points at a live block of at least nbytes bytes that the
// caching allocator hands to no one else until the deleter returns it; the context is a boxed
// BlockContext freed exactly once by `delete_block`. Host byte access (c10-core's
// `try_bytes_mut`) is only ever granted for DeviceType::Cpu, which this allocator never is.
unsafe impl<D: DeviceMemory + 'static> Allocator for DeviceAllocator<D> {
    #[track_caller]
    fn allocate(&self, nbytes: usize) -> c10_core::Result<DataPtr> {
        if nbytes == 0 {
            return Ok(DataPtr::null(self.device));
        }
        let index = self.device.index().unwrap_or(0);
        let ptr = self.front.raw_alloc(index, nbytes).map_err(|e| match e {
            Error::OutOfMemory(oom) => c10_core::Error::DeviceOutOfMemory {
                requested: nbytes,
                device: self.device,
                message: oom.to_string(),
            },
            other => c10_core::Error::AllocatorFailure {
                device: self.device,
                message: other.to_string(),
            },
        })?;
        let ctx = Box::into_raw(Box::new(BlockContext {
            front: Arc::clone(&self.front),
            ptr,
        }));
        // SAFETY: `ctx` is a fresh boxed BlockContext<D> and `delete_block::<D>` frees exactly
        // that type once; `ptr` is a live block of at least `nbytes` bytes on `self.device`
        // until the deleter returns it.
        Ok(unsafe {
            DataPtr::new(
                ptr as *mut u8,
                ctx.cast(),
                Some(delete_block::<D>),
                self.device,
            )
        })
    }

    fn device_type(&self) -> DeviceType {
        self.device.device_type()
    }
}
