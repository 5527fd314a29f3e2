//! Where the pinned host caching allocator ([`crate::host_allocator`]) gets page-locked host
//! memory and its events: the runtime half of PyTorch's `CachingHostAllocatorImpl`
//! (`allocate_host_memory`, `free_block`, `record_stream`, `query_event`).
//!
//! | backend | memory | `pinned_use_cuda_host_register` | events |
//! |---|---|---|---|
//! | `c10_cuda_driver::CudaPinnedMemory` (crate `c10-cuda-driver`) | `cuMemHostAlloc` / `cuMemFreeHost` | page-aligned heap memory, pages pre-faulted by `pinned_num_register_threads` threads, `cuMemHostRegister` / `cuMemHostUnregister` | the device's CUDA events |
//! | [`SimPinnedMemory`] | page-aligned zeroed heap memory, optionally `mlock`ed | the same, pages pre-faulted by the register threads first | the simulated device's events |

use std::alloc::Layout;
use std::ffi::c_void;
use std::sync::Arc;

use parking_lot::Mutex;

use c10_cuda::SimDevice;
use c10_cuda::device::{DeviceError, DeviceMemory, EventId, StreamId};

/// Bytes per host page the register path pre-faults (PyTorch's `mapPagesForRegister` uses 4 KiB).
pub const PREFAULT_PAGE: usize = 4096;

/// The runtime calls of a pinned host allocator backend. Addresses are host addresses.
pub trait PinnedMemory: Send + Sync {
    /// Allocates `size` bytes of page-locked host memory, zero-filled (`cudaHostAlloc` with
    /// `cudaHostAllocDefault`).
    ///
    /// # Errors
    /// [`DeviceError::OutOfMemory`] when the host refuses; driver failures.
    fn host_alloc(&self, size: usize) -> Result<usize, DeviceError>;

    /// Allocates `size` bytes of ordinary host memory, pre-faults its pages with `threads`
    /// threads (zero-filling them), and page-locks it (`malloc` + `cudaHostRegister`, PyTorch's
    /// `allocWithCudaHostRegister` under `pinned_use_cuda_host_register:True`).
    ///
    /// # Errors
    /// As [`PinnedMemory::host_alloc`].
    fn host_register_alloc(&self, size: usize, threads: usize) -> Result<usize, DeviceError>;

    /// Frees memory from [`PinnedMemory::host_alloc`] (`registered == false`: `cudaFreeHost`)
    /// or [`PinnedMemory::host_register_alloc`] (`cudaHostUnregister` + `free`), of `size` bytes.
    ///
    /// # Errors
    /// Driver failures; the memory is not freed then.
    fn host_free(&self, ptr: usize, size: usize, registered: bool) -> Result<(), DeviceError>;

    /// An event recorded on `stream` now (PyTorch's `record_stream`: an event from the pool,
    /// `cudaEventRecord`).
    ///
    /// # Errors
    /// An unknown stream; driver failures.
    fn record_event(&self, stream: StreamId) -> Result<EventId, DeviceError>;

    /// Whether `event` has completed (`cudaEventQuery`).
    ///
    /// # Errors
    /// Driver failures.
    fn query_event(&self, event: EventId) -> Result<bool, DeviceError>;

    /// Gives an event back (`cudaEventDestroy`, or PyTorch's return to the event pool).
    fn release_event(&self, event: EventId);
}

/// Zero-fills `[ptr, ptr + size)` with `threads` threads, each touching its share of the pages
/// (PyTorch's `mapPagesForRegister`, which writes one byte per 4 KiB page; we write them all so
/// that every byte is initialised). One thread when `threads <= 1` or the range is smaller than
/// a page per thread, as PyTorch.
///
/// # Safety
/// `[ptr, ptr + size)` must be writable memory that nothing else uses during the call.
pub unsafe fn prefault(ptr: usize, size: usize, threads: usize) {
    if threads <= 1 || size < PREFAULT_PAGE * threads {
        // SAFETY: guaranteed by the caller.
        unsafe { std::ptr::write_bytes(ptr as *mut u8, 0, size) };
        return;
    }
    std::thread::scope(|scope| {
        for i in 0..threads {
            let start = size * i / threads;
            let end = if i + 1 == threads {
                size
            } else {
                size * (i + 1) / threads
            };
            scope.spawn(move || {
                // SAFETY: the chunks `[start, end)` of the threads are disjoint and inside the
                // range the caller made ours.
                unsafe { std::ptr::write_bytes((ptr + start) as *mut u8, 0, end - start) };
            });
        }
    });
}

/// Counts of what a [`SimPinnedMemory`] was asked to do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimPinnedCounters {
    /// [`PinnedMemory::host_alloc`] calls that succeeded (`cudaHostAlloc`).
    pub host_allocs: u64,
    /// [`PinnedMemory::host_register_alloc`] calls that succeeded (`cudaHostRegister`).
    pub host_registers: u64,
    /// Frees of `host_alloc` memory (`cudaFreeHost`).
    pub host_frees: u64,
    /// Frees of registered memory (`cudaHostUnregister`).
    pub host_unregisters: u64,
    /// Bytes allocated now.
    pub live_bytes: u64,
    /// Bytes `mlock`ed now.
    pub locked_bytes: u64,
}

/// Pinned memory for the simulated device: page-aligned zeroed heap memory, `mlock`ed when
/// asked ([`SimPinnedMemory::with_mlock`]), with the simulated device's streams and events, so
/// tests drive event completion ([`SimDevice::complete_stream`]). Cloning shares the counters.
#[derive(Clone, Debug)]
pub struct SimPinnedMemory {
    device: SimDevice,
    mlock: bool,
    counters: Arc<Mutex<SimPinnedCounters>>,
}

impl SimPinnedMemory {
    /// Pinned memory whose events live on `device`.
    pub fn new(device: SimDevice) -> Self {
        SimPinnedMemory {
            device,
            mlock: false,
            counters: Arc::default(),
        }
    }

    /// Page-locks every allocation with `mlock` (builder style). An `mlock` the host refuses
    /// (`RLIMIT_MEMLOCK`) fails the allocation with [`DeviceError::Driver`].
    pub fn with_mlock(mut self, on: bool) -> Self {
        self.mlock = on;
        self
    }

    /// The simulated device whose events gate reuse.
    pub fn device(&self) -> &SimDevice {
        &self.device
    }

    /// What was done so far.
    pub fn counters(&self) -> SimPinnedCounters {
        *self.counters.lock()
    }

    fn layout(size: usize) -> Result<Layout, DeviceError> {
        Layout::from_size_align(size.max(1), PREFAULT_PAGE).map_err(|_| DeviceError::Invalid {
            what: "pinned allocation size",
            value: size as u64,
        })
    }

    /// Locks `[ptr, ptr + size)` when asked to; frees the memory on failure.
    fn lock_or_free(&self, ptr: usize, size: usize, layout: Layout) -> Result<(), DeviceError> {
        if !self.mlock {
            return Ok(());
        }
        // SAFETY: `[ptr, ptr + size)` is our own live allocation.
        if let Err(e) = unsafe { rustix::mm::mlock(ptr as *mut c_void, size) } {
            // SAFETY: `ptr` came from `alloc*` with `layout` and is freed once, here.
            unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
            return Err(DeviceError::Driver {
                call: "mlock",
                message: format!(
                    "{e} (raise RLIMIT_MEMLOCK, or use SimPinnedMemory without mlock)"
                ),
            });
        }
        self.counters.lock().locked_bytes += size as u64;
        Ok(())
    }
}

impl PinnedMemory for SimPinnedMemory {
    fn host_alloc(&self, size: usize) -> Result<usize, DeviceError> {
        let layout = Self::layout(size)?;
        // SAFETY: the layout has a nonzero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as usize;
        if ptr == 0 {
            return Err(DeviceError::OutOfMemory { size });
        }
        self.lock_or_free(ptr, size, layout)?;
        let mut c = self.counters.lock();
        c.host_allocs += 1;
        c.live_bytes += size as u64;
        Ok(ptr)
    }

    fn host_register_alloc(&self, size: usize, threads: usize) -> Result<usize, DeviceError> {
        let layout = Self::layout(size)?;
        // SAFETY: the layout has a nonzero size.
        let ptr = unsafe { std::alloc::alloc(layout) } as usize;
        if ptr == 0 {
            return Err(DeviceError::OutOfMemory { size });
        }
        // SAFETY: a fresh allocation of at least `size` bytes that nothing else knows.
        unsafe { prefault(ptr, size, threads) };
        self.lock_or_free(ptr, size, layout)?;
        let mut c = self.counters.lock();
        c.host_registers += 1;
        c.live_bytes += size as u64;
        Ok(ptr)
    }

    fn host_free(&self, ptr: usize, size: usize, registered: bool) -> Result<(), DeviceError> {
        let layout = Self::layout(size)?;
        let mut c = self.counters.lock();
        if self.mlock {
            // SAFETY: the range is a live allocation of ours that we locked.
            let _ = unsafe { rustix::mm::munlock(ptr as *mut c_void, size) };
            c.locked_bytes -= size as u64;
        }
        // SAFETY: `ptr` came from `host_alloc`/`host_register_alloc` with this layout (same
        // size) and the allocator frees each block once.
        unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
        if registered {
            c.host_unregisters += 1;
        } else {
            c.host_frees += 1;
        }
        c.live_bytes -= size as u64;
        Ok(())
    }

    fn record_event(&self, stream: StreamId) -> Result<EventId, DeviceError> {
        let event = self.device.create_event()?;
        if let Err(e) = self.device.record_event(event, stream) {
            self.device.destroy_event(event);
            return Err(e);
        }
        Ok(event)
    }

    fn query_event(&self, event: EventId) -> Result<bool, DeviceError> {
        self.device.query_event(event)
    }

    fn release_event(&self, event: EventId) {
        self.device.destroy_event(event);
    }
}
