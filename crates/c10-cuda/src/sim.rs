//! `SimDevice`: a simulated CUDA device for tests and trace replay.
//!
//! Two modes:
//! - [`SimMode::AddressOnly`]: no memory is touched; addresses come from a deterministic
//!   first-fit address space, so replays of tens of GiB cost nothing but bookkeeping.
//! - [`SimMode::HostBacked`]: every segment is real host memory (the device address *is* the
//!   host address), so tensors can live on the device and CPU kernels can run on its bytes.
//!   Expandable segments reserve address space with `mmap(PROT_NONE)` and map pages with
//!   `mprotect`.
//!
//! A host-backed device made [`SimDevice::with_shareable_memory`] puts its segments and
//! reserved ranges in `memfd_create` regions instead of the heap, so another process can map
//! the same bytes: what its IPC handles (crate `c10-cuda-ipc`) name; [`SimDevice::shared_region`]
//! tells that crate which region backs a segment.
//!
//! Streams and events are simulated: an event recorded on a stream stays pending until the
//! test completes it ([`SimDevice::complete_stream`], [`SimDevice::complete_all`]) or someone
//! synchronizes on it, unless auto-completion is on.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::address_space::AddressSpace;
use crate::device::{DeviceError, DeviceMemory, DevicePtr, EventId, MemInfo, StreamId};
use crate::host_memory::{HostAllocation, HostReservation};

/// Which host memory of a host-backed device [`SimDevice::shared_region`] looks up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HostRegion {
    /// A segment (`malloc`): the region is the whole segment.
    Segment,
    /// An expandable segment's reserved address range: the region covers the reservation.
    Reservation,
}

pub use crate::host_memory::SharedRegionInfo;

/// What [`SimDevice::shared_region`] found at an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharedLookup {
    /// The region behind the memory.
    Found(SharedRegionInfo),
    /// No host-backed segment (or reservation) starts there.
    Unknown,
    /// The memory was allocated while the device was not
    /// [`SimDevice::with_shareable_memory`] (or off Linux): it is on the heap, not in a region.
    NotShareable,
}

/// How a [`SimDevice`] backs its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimMode {
    /// Addresses only; nothing is allocated on the host.
    AddressOnly,
    /// Real host memory behind every segment and mapped page.
    HostBacked,
}

/// Counters of what the simulated device was asked to do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimCounters {
    /// Successful `malloc` calls (`cudaMalloc`).
    pub mallocs: u64,
    /// `malloc` calls refused for lack of memory.
    pub failed_mallocs: u64,
    /// `free` calls (`cudaFree`).
    pub frees: u64,
    /// Pages mapped (`cuMemMap`).
    pub maps: u64,
    /// Pages unmapped (`cuMemUnmap`).
    pub unmaps: u64,
    /// Events synchronized (`cudaEventSynchronize`).
    pub event_syncs: u64,
}

#[derive(Debug)]
struct EventState {
    stream: Option<StreamId>,
    complete: bool,
}

#[derive(Debug)]
struct SimState {
    capacity: usize,
    external: usize,
    used: usize,
    segments: BTreeMap<DevicePtr, usize>,
    malloc_space: AddressSpace,
    va_space: AddressSpace,
    reservations: BTreeMap<DevicePtr, usize>,
    mapped: BTreeMap<DevicePtr, usize>,
    host_segments: HashMap<DevicePtr, HostAllocation>,
    host_reservations: HashMap<DevicePtr, HostReservation>,
    events: HashMap<u64, EventState>,
    pending: BTreeMap<StreamId, VecDeque<u64>>,
    next_event: u64,
    next_stream: u64,
    auto_complete: bool,
    virtual_memory: bool,
    /// Host-backed segments and reservations live in shareable memfd regions.
    shareable: bool,
    counters: SimCounters,
    /// Addresses the next `malloc`s of matching size must return (trace replay).
    script: VecDeque<(DevicePtr, usize)>,
}

/// A simulated device: a capacity, deterministic addresses, streams and events under test
/// control. Cloning gives another handle to the same device.
#[derive(Clone, Debug)]
pub struct SimDevice {
    index: u8,
    mode: SimMode,
    state: Arc<Mutex<SimState>>,
}

/// Start of device `index`'s `cudaMalloc` address region.
fn malloc_base(index: u8) -> u64 {
    0x7000_0000_0000 + ((index as u64) << 44)
}

const REGION: u64 = 1 << 43;

impl SimDevice {
    /// A device of `capacity` bytes whose memory is never touched ([`SimMode::AddressOnly`]).
    pub fn address_only(index: u8, capacity: usize) -> Self {
        Self::new(index, capacity, SimMode::AddressOnly)
    }

    /// A device of `capacity` bytes backed by host memory ([`SimMode::HostBacked`]).
    pub fn host_backed(index: u8, capacity: usize) -> Self {
        Self::new(index, capacity, SimMode::HostBacked)
    }

    /// A device with `capacity` bytes in `mode`. Virtual memory (expandable segments) is
    /// available except for host-backed devices on non-Unix hosts.
    pub fn new(index: u8, capacity: usize, mode: SimMode) -> Self {
        let base = malloc_base(index);
        let virtual_memory = mode == SimMode::AddressOnly || cfg!(unix);
        SimDevice {
            index,
            mode,
            state: Arc::new(Mutex::new(SimState {
                capacity,
                external: 0,
                used: 0,
                segments: BTreeMap::new(),
                malloc_space: AddressSpace::new(base, REGION),
                va_space: AddressSpace::new(base + REGION, REGION),
                reservations: BTreeMap::new(),
                mapped: BTreeMap::new(),
                host_segments: HashMap::new(),
                host_reservations: HashMap::new(),
                events: HashMap::new(),
                pending: BTreeMap::new(),
                next_event: 1,
                next_stream: 1,
                auto_complete: false,
                virtual_memory,
                shareable: false,
                counters: SimCounters::default(),
                script: VecDeque::new(),
            })),
        }
    }

    /// Completes every event as soon as it is recorded (no asynchronous work), builder style.
    pub fn with_auto_complete(self, on: bool) -> Self {
        self.state.lock().auto_complete = on;
        self
    }

    /// Turns virtual memory management (expandable segments) on or off, builder style.
    pub fn with_virtual_memory(self, on: bool) -> Self {
        let mut s = self.state.lock();
        s.virtual_memory = on && (self.mode == SimMode::AddressOnly || cfg!(unix));
        drop(s);
        self
    }

    /// Puts host-backed memory allocated from now on in shareable `memfd_create` regions (Linux
    /// only), builder style, so that IPC handles of its blocks can be opened by another process
    /// (crate `c10-cuda-ipc`). Each live segment then holds one open file descriptor. Has no effect on
    /// an address-only device or off Linux ([`SimDevice::is_shareable`] says which).
    pub fn with_shareable_memory(self, on: bool) -> Self {
        self.state.lock().shareable =
            on && self.mode == SimMode::HostBacked && cfg!(target_os = "linux");
        self
    }

    /// Whether host-backed memory is allocated in shareable regions
    /// ([`SimDevice::with_shareable_memory`]).
    pub fn is_shareable(&self) -> bool {
        self.state.lock().shareable
    }

    /// The mode.
    pub fn mode(&self) -> SimMode {
        self.mode
    }
    /// The shareable memfd region behind the host-backed segment (or expandable reservation)
    /// that starts at `base`: what an IPC handle of its blocks carries (`c10-cuda-ipc` exports
    /// it; another process reopens the region through `/proc/<pid>/fd/<fd>`).
    pub fn shared_region(&self, kind: HostRegion, base: DevicePtr) -> SharedLookup {
        let s = self.state.lock();
        let region = match kind {
            HostRegion::Segment => s.host_segments.get(&base).map(HostAllocation::shared_info),
            HostRegion::Reservation => s
                .host_reservations
                .get(&base)
                .map(HostReservation::shared_info),
        };
        match region {
            None => SharedLookup::Unknown,
            Some(None) => SharedLookup::NotShareable,
            Some(Some(region)) => SharedLookup::Found(region),
        }
    }

    /// Bytes of device memory in total.
    pub fn capacity(&self) -> usize {
        self.state.lock().capacity
    }

    /// Bytes in use by segments and mapped pages (not counting external usage).
    pub fn used_bytes(&self) -> usize {
        self.state.lock().used
    }

    /// Pretends another process holds `bytes` of the device (shrinks what `malloc` can get).
    pub fn set_external_usage(&self, bytes: usize) {
        self.state.lock().external = bytes;
    }

    /// What the device was asked to do so far.
    pub fn counters(&self) -> SimCounters {
        self.state.lock().counters
    }

    /// Live `malloc`ed segments as `(address, bytes)`, sorted by address.
    pub fn live_segments(&self) -> Vec<(DevicePtr, usize)> {
        self.state
            .lock()
            .segments
            .iter()
            .map(|(&a, &s)| (a, s))
            .collect()
    }

    /// Mapped pages as `(address, bytes)`, sorted by address.
    pub fn mapped_pages(&self) -> Vec<(DevicePtr, usize)> {
        self.state
            .lock()
            .mapped
            .iter()
            .map(|(&a, &s)| (a, s))
            .collect()
    }

    /// Makes a later `malloc` of exactly `size` bytes return `addr` (address-only mode), so a
    /// replay can place segments where the recorded run had them. Scripted addresses are used
    /// in FIFO order by mallocs of matching size; a malloc of another size, or a scripted range
    /// that overlaps a live segment, falls back to first fit.
    pub fn script_malloc(&self, addr: DevicePtr, size: usize) {
        self.state.lock().script.push_back((addr, size));
    }

    /// Drops every scripted address not yet used; returns how many there were.
    pub fn clear_script(&self) -> usize {
        let mut s = self.state.lock();
        let n = s.script.len();
        s.script.clear();
        n
    }

    /// A new stream (`cudaStreamCreate`); ids start at 1 (0 is the default stream).
    pub fn new_stream(&self) -> StreamId {
        let mut s = self.state.lock();
        let id = StreamId(s.next_stream);
        s.next_stream += 1;
        id
    }

    /// Completes every pending event recorded on `stream` (its queued work finished).
    pub fn complete_stream(&self, stream: StreamId) {
        let mut s = self.state.lock();
        if let Some(queue) = s.pending.remove(&stream) {
            for e in queue {
                if let Some(ev) = s.events.get_mut(&e) {
                    ev.complete = true;
                }
            }
        }
    }

    /// Completes the oldest pending event of `stream`; returns whether there was one.
    pub fn complete_next(&self, stream: StreamId) -> bool {
        let mut s = self.state.lock();
        let Some(e) = s.pending.get_mut(&stream).and_then(|q| q.pop_front()) else {
            return false;
        };
        if let Some(ev) = s.events.get_mut(&e) {
            ev.complete = true;
        }
        true
    }

    /// Completes every pending event on every stream.
    pub fn complete_all(&self) {
        let streams: Vec<StreamId> = self.state.lock().pending.keys().copied().collect();
        for st in streams {
            self.complete_stream(st);
        }
    }

    /// Events recorded and not yet complete.
    pub fn pending_events(&self) -> usize {
        self.state.lock().pending.values().map(VecDeque::len).sum()
    }

    /// Copies `src` to device memory at `dst` (host-backed mode; `cudaMemcpyHtoD`).
    ///
    /// # Errors
    /// [`DeviceError::Unsupported`] in address-only mode; [`DeviceError::Invalid`] when
    /// `[dst, dst + len)` is not inside one live segment or mapped range.
    pub fn write(&self, dst: DevicePtr, src: &[u8]) -> Result<(), DeviceError> {
        let s = self.state.lock();
        self.check_host_range(&s, dst, src.len())?;
        // SAFETY: check_host_range proved [dst, dst+len) lies inside live host memory owned by
        // this device (a host segment or a read-write mapped page range), and `src` is a
        // distinct Rust slice, so the regions do not overlap. The state lock is held, so no
        // free or unmap can race with the copy.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    /// Copies device memory at `src` into `dst` (host-backed mode; `cudaMemcpyDtoH`).
    ///
    /// # Errors
    /// As [`SimDevice::write`].
    pub fn read(&self, src: DevicePtr, dst: &mut [u8]) -> Result<(), DeviceError> {
        let s = self.state.lock();
        self.check_host_range(&s, src, dst.len())?;
        // SAFETY: as in `write`: the source range is live host memory of this device, the
        // destination a distinct exclusive slice, and the lock prevents a concurrent free.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Whether `[ptr, ptr + len)` is backed by host memory of this device (host-backed mode).
    pub fn is_host_range(&self, ptr: DevicePtr, len: usize) -> bool {
        let s = self.state.lock();
        self.check_host_range(&s, ptr, len).is_ok()
    }

    fn check_host_range(
        &self,
        s: &SimState,
        ptr: DevicePtr,
        len: usize,
    ) -> Result<(), DeviceError> {
        if self.mode != SimMode::HostBacked {
            return Err(DeviceError::Unsupported {
                what: "byte access on an address-only simulated device",
            });
        }
        let invalid = DeviceError::Invalid {
            what: "address range",
            value: ptr,
        };
        let end = ptr.checked_add(len as u64).ok_or(invalid.clone())?;
        if let Some((&a, &sz)) = s.segments.range(..=ptr).next_back() {
            if end <= a + sz as u64 {
                return Ok(());
            }
        }
        // Mapped pages: contiguous run of pages covering the range.
        let mut cursor = ptr;
        while cursor < end {
            match s.mapped.range(..=cursor).next_back() {
                Some((&a, &sz)) if cursor < a + sz as u64 => cursor = a + sz as u64,
                _ => return Err(invalid),
            }
        }
        if len == 0 && s.mapped.range(..=ptr).next_back().is_none() {
            return Err(invalid);
        }
        Ok(())
    }

    fn available(s: &SimState) -> usize {
        s.capacity.saturating_sub(s.used + s.external)
    }
}

impl DeviceMemory for SimDevice {
    fn index(&self) -> u8 {
        self.index
    }

    fn device_type(&self) -> c10_core::DeviceType {
        c10_core::DeviceType::Sim
    }

    fn mem_get_info(&self) -> Result<MemInfo, DeviceError> {
        let s = self.state.lock();
        Ok(MemInfo {
            free: Self::available(&s),
            total: s.capacity,
        })
    }

    fn malloc(&self, size: usize) -> Result<DevicePtr, DeviceError> {
        let mut s = self.state.lock();
        if size == 0 || size > Self::available(&s) {
            s.counters.failed_mallocs += 1;
            return Err(DeviceError::OutOfMemory { size });
        }
        let scripted = match s.script.front() {
            Some(&(addr, sz)) if sz == size && self.mode == SimMode::AddressOnly => {
                s.script.pop_front();
                let end = addr.saturating_add(size as u64);
                let overlaps = s
                    .segments
                    .range(..end)
                    .next_back()
                    .is_some_and(|(&a, &l)| a + l as u64 > addr);
                let in_region = s.malloc_space.contains(addr, size as u64);
                if overlaps || (in_region && !s.malloc_space.allocate_at(addr, size as u64)) {
                    None
                } else {
                    Some(addr)
                }
            }
            _ => None,
        };
        let ptr = match (scripted, self.mode) {
            (Some(addr), _) => addr,
            (None, SimMode::AddressOnly) => match s.malloc_space.allocate(size as u64) {
                Some(p) => p,
                None => {
                    s.counters.failed_mallocs += 1;
                    return Err(DeviceError::OutOfMemory { size });
                }
            },
            (None, SimMode::HostBacked) => {
                let alloc = if s.shareable {
                    HostAllocation::new_shared(size)
                } else {
                    HostAllocation::new(size)
                }
                .ok_or(DeviceError::OutOfMemory { size })?;
                let p = alloc.addr();
                s.host_segments.insert(p, alloc);
                p
            }
        };
        s.segments.insert(ptr, size);
        s.used += size;
        s.counters.mallocs += 1;
        Ok(ptr)
    }

    fn free(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError> {
        let mut s = self.state.lock();
        match s.segments.get(&ptr) {
            Some(&sz) if sz == size => {}
            _ => {
                return Err(DeviceError::Invalid {
                    what: "segment address",
                    value: ptr,
                });
            }
        }
        s.segments.remove(&ptr);
        match self.mode {
            SimMode::AddressOnly => {
                if s.malloc_space.contains(ptr, size as u64) {
                    s.malloc_space.free(ptr, size as u64);
                }
            }
            SimMode::HostBacked => {
                s.host_segments.remove(&ptr);
            }
        }
        s.used -= size;
        s.counters.frees += 1;
        Ok(())
    }

    fn create_event(&self) -> Result<EventId, DeviceError> {
        let mut s = self.state.lock();
        let id = s.next_event;
        s.next_event += 1;
        s.events.insert(
            id,
            EventState {
                stream: None,
                complete: true,
            },
        );
        Ok(EventId(id))
    }

    fn record_event(&self, event: EventId, stream: StreamId) -> Result<(), DeviceError> {
        let mut s = self.state.lock();
        let auto = s.auto_complete;
        let Some(ev) = s.events.get_mut(&event.0) else {
            return Err(DeviceError::Invalid {
                what: "event",
                value: event.0,
            });
        };
        ev.stream = Some(stream);
        ev.complete = auto;
        if !auto {
            s.pending.entry(stream).or_default().push_back(event.0);
        }
        Ok(())
    }

    fn query_event(&self, event: EventId) -> Result<bool, DeviceError> {
        let s = self.state.lock();
        s.events
            .get(&event.0)
            .map(|e| e.complete)
            .ok_or(DeviceError::Invalid {
                what: "event",
                value: event.0,
            })
    }

    fn synchronize_event(&self, event: EventId) -> Result<(), DeviceError> {
        let mut s = self.state.lock();
        let Some(ev) = s.events.get(&event.0) else {
            return Err(DeviceError::Invalid {
                what: "event",
                value: event.0,
            });
        };
        let (complete, stream) = (ev.complete, ev.stream);
        s.counters.event_syncs += 1;
        if complete {
            return Ok(());
        }
        // Waiting on an event waits for the stream's work up to it: complete it and every
        // earlier event of the same stream.
        let stream = stream.expect("a pending event was recorded on a stream");
        let mut done = Vec::new();
        if let Some(queue) = s.pending.get_mut(&stream) {
            while let Some(e) = queue.pop_front() {
                done.push(e);
                if e == event.0 {
                    break;
                }
            }
        }
        for e in done {
            if let Some(ev) = s.events.get_mut(&e) {
                ev.complete = true;
            }
        }
        Ok(())
    }

    fn destroy_event(&self, event: EventId) {
        let mut s = self.state.lock();
        if let Some(ev) = s.events.remove(&event.0) {
            if let (false, Some(stream)) = (ev.complete, ev.stream) {
                if let Some(q) = s.pending.get_mut(&stream) {
                    q.retain(|&e| e != event.0);
                }
            }
        }
    }

    fn supports_virtual_memory(&self) -> bool {
        self.state.lock().virtual_memory
    }

    fn reserve_address_range(&self, size: usize) -> Result<DevicePtr, DeviceError> {
        let mut s = self.state.lock();
        if !s.virtual_memory {
            return Err(DeviceError::Unsupported {
                what: "virtual memory management",
            });
        }
        let ptr = match self.mode {
            SimMode::AddressOnly => {
                s.va_space
                    .allocate(size as u64)
                    .ok_or(DeviceError::Driver {
                        call: "cuMemAddressReserve",
                        message: format!("no {size} bytes of simulated address space left"),
                    })?
            }
            SimMode::HostBacked => {
                let r = if s.shareable {
                    HostReservation::new_shared(size)
                } else {
                    HostReservation::new(size)
                }
                .ok_or(DeviceError::Driver {
                    call: "cuMemAddressReserve",
                    message: format!("mmap of {size} bytes of address space failed"),
                })?;
                let p = r.addr();
                s.host_reservations.insert(p, r);
                p
            }
        };
        s.reservations.insert(ptr, size);
        Ok(ptr)
    }

    fn release_address_range(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError> {
        let mut s = self.state.lock();
        if s.reservations.get(&ptr) != Some(&size) {
            return Err(DeviceError::Invalid {
                what: "reserved address range",
                value: ptr,
            });
        }
        let end = ptr + size as u64;
        if s.mapped.range(ptr..end).next().is_some() {
            return Err(DeviceError::Driver {
                call: "cuMemAddressFree",
                message: "range still has mapped pages".into(),
            });
        }
        s.reservations.remove(&ptr);
        match self.mode {
            SimMode::AddressOnly => s.va_space.free(ptr, size as u64),
            SimMode::HostBacked => {
                s.host_reservations.remove(&ptr);
            }
        }
        Ok(())
    }

    fn map(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError> {
        let mut s = self.state.lock();
        let Some((&base, &rsize)) = s.reservations.range(..=ptr).next_back() else {
            return Err(DeviceError::Invalid {
                what: "address to map",
                value: ptr,
            });
        };
        let end = ptr + size as u64;
        if end > base + rsize as u64 || s.mapped.range(ptr..end).next().is_some() {
            return Err(DeviceError::Invalid {
                what: "address to map",
                value: ptr,
            });
        }
        if size > Self::available(&s) {
            return Err(DeviceError::OutOfMemory { size });
        }
        if self.mode == SimMode::HostBacked {
            let r = s.host_reservations.get(&base).expect("reservation exists");
            if !r.commit(ptr, size) {
                return Err(DeviceError::Driver {
                    call: "cuMemMap",
                    message: "mprotect failed".into(),
                });
            }
        }
        s.mapped.insert(ptr, size);
        s.used += size;
        s.counters.maps += 1;
        Ok(())
    }

    fn unmap(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError> {
        let mut s = self.state.lock();
        if s.mapped.get(&ptr) != Some(&size) {
            return Err(DeviceError::Invalid {
                what: "mapped page",
                value: ptr,
            });
        }
        if self.mode == SimMode::HostBacked {
            let (&base, _) = s
                .reservations
                .range(..=ptr)
                .next_back()
                .expect("mapped pages lie in a reservation");
            let r = s.host_reservations.get(&base).expect("reservation exists");
            r.decommit(ptr, size);
        }
        s.mapped.remove(&ptr);
        s.used -= size;
        s.counters.unmaps += 1;
        Ok(())
    }
}
