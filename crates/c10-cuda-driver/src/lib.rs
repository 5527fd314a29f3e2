//! The CUDA backend of c10-cuda's caching allocator ([`c10_cuda::device::DeviceMemory`]) on
//! cudarc's driver API, and the runtime GPU probe; with it the other CUDA-only parts: the cudarc
//! interop views of a [`DeviceBuffer`](c10_cuda::DeviceBuffer) ([`CudaBufferViews`]), the pinned
//! host memory backend of `c10-host-alloc` ([`CudaPinnedMemory`]) and the CUDA backend of
//! `c10-cuda-ipc` (`cuIpc*MemHandle`, exported expandable pages). This is the only crate of the
//! workspace that names cudarc (`cargo tree -p c10-cuda` has none); until the split these were
//! `c10_cuda::cuda::*` and `c10_cuda::pinned_memory::CudaPinnedMemory`.
//!
//! cudarc loads `libcuda` at run time (its `dynamic-loading` feature), so this crate builds on
//! machines with no CUDA toolkit and no driver. The price is that any driver call made while the
//! library is absent panics inside cudarc. Everything here therefore starts with [`probe`], which
//! only tries to `dlopen` the library before touching the driver and never panics;
//! [`CudaDevice::new`] runs it and returns an error instead of panicking.
//!
//! [`CudaDevice`] keeps its own books (live segments, reserved ranges, mapped pages, streams and
//! events it created) so that a bad handle from the caller comes back as
//! [`DeviceError::Invalid`] instead of reaching the driver, and so that [`CudaDevice::copy_htod`]
//! and friends can be safe functions: they only touch device memory this device handed out.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DriverError, result, sys};
use parking_lot::Mutex;

use c10_cuda::device::{DeviceError, DeviceMemory, DevicePtr, EventId, MemInfo, StreamId};

mod interop;
mod ipc;
mod pinned;

pub use interop::{BufferView, BufferViewMut, CudaBufferViews};
pub use pinned::CudaPinnedMemory;

/// What [`probe`] found: whether a CUDA driver and at least one device are usable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    /// `libcuda` could not be loaded: no NVIDIA driver is installed (or it is not on the dynamic
    /// loader path).
    NoDriver {
        /// The library file names that were tried, in order.
        searched: Vec<String>,
    },
    /// The driver loaded and initialized but reports no device (`cuDeviceGetCount` == 0, or
    /// `cuInit` returned `CUDA_ERROR_NO_DEVICE`).
    NoDevice,
    /// The driver loaded but `cuInit`, `cuDeviceGetCount` or `cuDriverGetVersion` failed; the text
    /// names the call and the driver's error.
    DriverError(String),
    /// The driver works and sees `devices` devices.
    Available {
        /// How many devices the driver reports (`cuDeviceGetCount`).
        devices: usize,
        /// The driver's CUDA version as `cuDriverGetVersion` encodes it: `1000 * major + 10 * minor`
        /// (12080 is CUDA 12.8).
        driver_version: i32,
    },
}

impl Probe {
    /// Whether a driver and at least one device are usable.
    pub fn is_available(&self) -> bool {
        matches!(self, Probe::Available { .. })
    }

    /// The number of usable devices (0 unless [`Probe::Available`]).
    pub fn devices(&self) -> usize {
        match self {
            Probe::Available { devices, .. } => *devices,
            _ => 0,
        }
    }
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Probe::NoDriver { .. } => write!(
                f,
                "no CUDA driver: {} could not be loaded (searched the dynamic loader path)",
                driver_library_name()
            ),
            Probe::NoDevice => write!(f, "CUDA driver loaded, but it reports 0 devices"),
            Probe::DriverError(message) => {
                write!(
                    f,
                    "CUDA driver loaded, but initializing it failed: {message}"
                )
            }
            Probe::Available {
                devices,
                driver_version,
            } => write!(
                f,
                "CUDA driver {}.{} loaded: {devices} device{}",
                driver_version / 1000,
                (driver_version % 1000) / 10,
                if *devices == 1 { "" } else { "s" }
            ),
        }
    }
}

/// The driver library's file name on this platform (`libcuda.so` on Linux).
fn driver_library_name() -> String {
    format!(
        "{}cuda{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    )
}

/// Looks for a usable CUDA driver and device without ever panicking.
///
/// Steps: try to `dlopen` the driver library (`libcuda.so`, `libcuda.so.1`), then `cuInit(0)`,
/// `cuDeviceGetCount` and `cuDriverGetVersion`. Each call is cheap; the result is not cached, so
/// it reflects the machine at the time of the call.
pub fn probe() -> Probe {
    if !driver_library_loads() {
        return Probe::NoDriver {
            searched: DRIVER_LIBRARIES.iter().map(|s| s.to_string()).collect(),
        };
    }
    match probe_driver() {
        Ok((0, _)) => Probe::NoDevice,
        Ok((devices, driver_version)) => Probe::Available {
            devices,
            driver_version,
        },
        Err(ProbeFailure::NoDevice) => Probe::NoDevice,
        Err(ProbeFailure::Driver { call, message }) => {
            Probe::DriverError(format!("{call} failed: {message}"))
        }
    }
}

/// The driver library's names the probe tries, in order (the development name, then the soname
/// every NVIDIA driver installs).
#[cfg(unix)]
const DRIVER_LIBRARIES: [&str; 2] = ["libcuda.so", "libcuda.so.1"];
#[cfg(windows)]
const DRIVER_LIBRARIES: [&str; 1] = ["nvcuda.dll"];
#[cfg(not(any(unix, windows)))]
const DRIVER_LIBRARIES: [&str; 0] = [];

/// Whether the driver library can be loaded (`dlopen` of [`DRIVER_LIBRARIES`], closed again).
/// Checked by hand rather than through cudarc, so that it works in every linking mode cudarc is
/// built with (run-time loading, or linked, where the library is loaded already).
#[cfg(unix)]
fn driver_library_loads() -> bool {
    DRIVER_LIBRARIES.iter().any(|name| {
        let Ok(name) = std::ffi::CString::new(*name) else {
            return false;
        };
        // SAFETY: `name` is a valid NUL-terminated string; loading libcuda runs its
        // initializers, which any CUDA program does; the handle is closed right away (the
        // library stays loaded while anything else, such as cudarc, holds it).
        unsafe {
            let handle = libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
            if handle.is_null() {
                false
            } else {
                libc::dlclose(handle);
                true
            }
        }
    })
}

/// Elsewhere the check is left to the driver calls (which the probe guards against panics).
#[cfg(not(unix))]
fn driver_library_loads() -> bool {
    true
}

/// Whether a CUDA driver and at least one device are usable ([`probe`] is [`Probe::Available`]).
pub fn cuda_available() -> bool {
    probe().is_available()
}

/// Why [`probe_driver`] failed.
enum ProbeFailure {
    NoDevice,
    Driver { call: &'static str, message: String },
}

/// `cuInit`, `cuDeviceGetCount`, `cuDriverGetVersion`: (device count, driver version). Only call
/// once the library is known to load.
fn probe_driver() -> Result<(usize, i32), ProbeFailure> {
    // cudarc panics when a driver entry point is missing from the library (a very old or broken
    // driver). Turn that into an error too, so that the probe itself never panics.
    let outcome = std::panic::catch_unwind(|| -> Result<(usize, i32), ProbeFailure> {
        let fail = |call: &'static str| {
            move |e: DriverError| match e.0 {
                sys::CUresult::CUDA_ERROR_NO_DEVICE => ProbeFailure::NoDevice,
                _ => ProbeFailure::Driver {
                    call,
                    message: describe(e),
                },
            }
        };
        result::init().map_err(fail("cuInit"))?;
        let count = result::device::get_count().map_err(fail("cuDeviceGetCount"))?;
        let mut version: std::ffi::c_int = 0;
        // SAFETY: `version` is a valid, writable c_int for the duration of the call; the library
        // is loaded (checked by the caller) and initialized (`cuInit` above).
        unsafe { sys::cuDriverGetVersion(&mut version) }
            .result()
            .map_err(fail("cuDriverGetVersion"))?;
        Ok((usize::try_from(count).unwrap_or(0), version))
    });
    match outcome {
        Ok(result) => result,
        Err(payload) => Err(ProbeFailure::Driver {
            call: "dlsym",
            message: payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "cudarc panicked while loading a driver entry point".into()),
        }),
    }
}

/// The driver's name and description of an error, e.g.
/// `CUDA_ERROR_OUT_OF_MEMORY (out of memory)` (`cuGetErrorName` + `cuGetErrorString`).
///
/// Only call with an error that came back from the driver: the library is then loaded.
fn describe(e: DriverError) -> String {
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    match e.error_string() {
        Ok(text) => format!("{name} ({})", text.to_string_lossy()),
        Err(_) => name,
    }
}

/// Maps a driver failure of `call` to [`DeviceError::Driver`].
fn driver(call: &'static str) -> impl FnOnce(DriverError) -> DeviceError {
    move |e| DeviceError::Driver {
        call,
        message: describe(e),
    }
}

/// Like [`driver`], but `CUDA_ERROR_OUT_OF_MEMORY` becomes [`DeviceError::OutOfMemory`] for `size`
/// bytes.
fn alloc_failure(call: &'static str, size: usize) -> impl FnOnce(DriverError) -> DeviceError {
    move |e| match e.0 {
        sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => DeviceError::OutOfMemory { size },
        _ => driver(call)(e),
    }
}

/// A raw driver handle (`CUstream`) as the integer the allocator keys it by.
fn handle_id<T>(handle: *mut T) -> u64 {
    handle.expose_provenance() as u64
}

/// `[ptr, ptr + len)` as an end address, or [`DeviceError::Invalid`] when it wraps.
fn range_end(ptr: DevicePtr, len: usize) -> Result<u64, DeviceError> {
    u64::try_from(len)
        .ok()
        .and_then(|len| ptr.checked_add(len))
        .ok_or(DeviceError::Invalid {
            what: "address range (wraps around)",
            value: ptr,
        })
}

/// One page range backed by `cuMemCreate` and mapped with `cuMemMap`.
#[derive(Clone, Copy, Debug)]
struct Mapping {
    /// Bytes mapped at the key address.
    size: usize,
    /// The physical allocation (`CUmemGenericAllocationHandle`, an integer).
    handle: sys::CUmemGenericAllocationHandle,
}

/// Virtual memory bookkeeping: reserved ranges and the pages mapped inside them.
#[derive(Debug, Default)]
struct VirtualMemory {
    /// Reserved address ranges (`cuMemAddressReserve`): start -> bytes.
    reservations: BTreeMap<DevicePtr, usize>,
    /// Mapped ranges: start -> mapping. Never overlapping.
    mappings: BTreeMap<DevicePtr, Mapping>,
}

impl VirtualMemory {
    /// Whether `[ptr, end)` is covered by consecutive mappings.
    fn covers(&self, ptr: DevicePtr, end: u64) -> bool {
        let Some((&start, first)) = self.mappings.range(..=ptr).next_back() else {
            return false;
        };
        let mut covered = start + first.size as u64;
        if covered <= ptr {
            return false;
        }
        while covered < end {
            match self.mappings.get(&covered) {
                Some(next) => covered += next.size as u64,
                None => return false,
            }
        }
        true
    }

    /// Whether any mapping overlaps `[ptr, end)`.
    fn overlaps(&self, ptr: DevicePtr, end: u64) -> bool {
        self.mappings
            .range(..end)
            .next_back()
            .is_some_and(|(&start, m)| start + m.size as u64 > ptr)
    }
}

/// One GPU as a [`DeviceMemory`], over cudarc's driver API (`cuMemAlloc`, `cuEvent*`, `cuMem*`
/// virtual memory management) in the device's primary context.
///
/// Every method binds the context to the calling thread first (`cuCtxSetCurrent`), so a
/// `CudaDevice` can be shared between threads. Streams and events are identified by integers:
/// [`StreamId`] is the raw `CUstream` value (0 = the legacy default stream) and [`EventId`] a
/// counter. Only [`StreamId::DEFAULT`] and streams made by [`CudaDevice::new_stream`] are accepted.
///
/// Dropping a `CudaDevice` waits for the device and releases whatever it still holds (segments,
/// mapped pages, reserved ranges, its streams and events).
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    index: u8,
    /// `cuMemGetAllocationGranularity` (minimum) in bytes, when virtual memory is supported.
    granularity: Option<usize>,
    /// Live `cuMemAlloc` segments: address -> bytes.
    segments: Mutex<BTreeMap<DevicePtr, usize>>,
    vmm: Mutex<VirtualMemory>,
    /// The legacy default stream (the null `CUstream`).
    default_stream: Arc<CudaStream>,
    /// The legacy default stream (key 0) and the streams this device created, by raw handle.
    streams: Mutex<HashMap<u64, Arc<CudaStream>>>,
    /// Live events by [`EventId`]; cudarc destroys one when its last `Arc` drops.
    events: Mutex<HashMap<u64, Arc<CudaEvent>>>,
    next_event: AtomicU64,
    /// Whether [`DeviceMemory::record_event`] accepts raw `CUstream` handles it did not create
    /// (set by the unsafe [`CudaDevice::accept_external_streams`]).
    external_streams: AtomicBool,
}

impl fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaDevice")
            .field("index", &self.index)
            .field("granularity", &self.granularity)
            .field("segments", &self.segments.lock().len())
            .field("mappings", &self.vmm.lock().mappings.len())
            .finish_non_exhaustive()
    }
}

impl CudaDevice {
    /// Opens device `index` (`cuInit`, `cuDeviceGet`, `cuDevicePrimaryCtxRetain`) after running
    /// [`probe`], and queries virtual memory support
    /// (`CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`, `cuMemGetAllocationGranularity`).
    ///
    /// # Errors
    /// Never panics. [`DeviceError::Unsupported`] when there is no driver or no device;
    /// [`DeviceError::Invalid`] when `index` is not below the device count;
    /// [`DeviceError::Driver`] when the driver fails to initialize or to create the context.
    pub fn new(index: u8) -> Result<Self, DeviceError> {
        match probe() {
            Probe::Available { devices, .. } if usize::from(index) < devices => {}
            Probe::Available { .. } => {
                return Err(DeviceError::Invalid {
                    what: "CUDA device ordinal",
                    value: index.into(),
                });
            }
            Probe::NoDriver { .. } => {
                return Err(DeviceError::Unsupported {
                    what: "CUDA (no driver: libcuda could not be loaded)",
                });
            }
            Probe::NoDevice => {
                return Err(DeviceError::Unsupported {
                    what: "CUDA (the driver reports 0 devices)",
                });
            }
            Probe::DriverError(message) => {
                return Err(DeviceError::Driver {
                    call: "cuInit",
                    message,
                });
            }
        }
        let ctx =
            CudaContext::new(usize::from(index)).map_err(driver("cuDevicePrimaryCtxRetain"))?;
        let vmm = ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            )
            .is_ok_and(|v| v > 0);
        let granularity = if vmm {
            let prop = allocation_prop(ctx.cu_device());
            let mut granularity = 0usize;
            // SAFETY: both pointers are valid for the call (`granularity` writable, `prop` a fully
            // initialized CUmemAllocationProp); the context is current (CudaContext::new binds it).
            unsafe {
                sys::cuMemGetAllocationGranularity(
                    &mut granularity,
                    &prop,
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                )
            }
            .result()
            .ok()
            .map(|()| granularity)
            .filter(|&g| g > 0)
        } else {
            None
        };
        let default_stream = ctx.default_stream();
        Ok(CudaDevice {
            index,
            granularity,
            segments: Mutex::default(),
            vmm: Mutex::default(),
            streams: Mutex::new(HashMap::from([(
                StreamId::DEFAULT.0,
                Arc::clone(&default_stream),
            )])),
            default_stream,
            events: Mutex::default(),
            next_event: AtomicU64::new(1),
            external_streams: AtomicBool::new(false),
            ctx,
        })
    }

    /// The cudarc context (the device's primary context), for launching work on this device.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The device's name, e.g. `NVIDIA H100 80GB HBM3` (`cuDeviceGetName`).
    ///
    /// # Errors
    /// A driver failure.
    pub fn name(&self) -> Result<String, DeviceError> {
        self.ctx.name().map_err(driver("cuDeviceGetName"))
    }

    /// The physical allocation granularity in bytes (`cuMemGetAllocationGranularity`, minimum),
    /// or `None` without virtual memory support. [`DeviceMemory::map`] sizes and addresses must be
    /// multiples of it (2 MiB on current GPUs).
    pub fn allocation_granularity(&self) -> Option<usize> {
        self.granularity
    }

    /// Binds the primary context to the calling thread (`cuCtxSetCurrent`, skipped when current).
    fn bind(&self) -> Result<(), DeviceError> {
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))
    }

    /// Creates a stream this device owns (`cuStreamCreate` with `CU_STREAM_NON_BLOCKING`: it does
    /// not synchronize with the legacy default stream) and returns its id (the raw `CUstream`) and
    /// the cudarc handle for launching work on it.
    ///
    /// # Errors
    /// A driver failure.
    pub fn new_stream(&self) -> Result<(StreamId, Arc<CudaStream>), DeviceError> {
        self.bind()?;
        let stream = self.ctx.new_stream().map_err(driver("cuStreamCreate"))?;
        let id = StreamId(handle_id(stream.cu_stream()));
        self.streams.lock().insert(id.0, Arc::clone(&stream));
        Ok((id, stream))
    }

    /// The cudarc handle of a stream known to this device ([`StreamId::DEFAULT`] or one from
    /// [`CudaDevice::new_stream`]).
    ///
    /// # Errors
    /// [`DeviceError::Invalid`] for any other stream.
    pub fn stream(&self, stream: StreamId) -> Result<Arc<CudaStream>, DeviceError> {
        self.streams
            .lock()
            .get(&stream.0)
            .cloned()
            .ok_or(DeviceError::Invalid {
                what: "stream",
                value: stream.0,
            })
    }

    /// Makes a cudarc stream of this device's context known to it, so that blocks can be
    /// allocated for it and recorded on it ([`c10_cuda::CachingAllocator::record_stream`]), and
    /// returns its id (the raw `CUstream`). The device keeps the `Arc` until
    /// [`CudaDevice::destroy_stream`] (or its own drop), so the id stays valid meanwhile.
    /// Registering a stream twice, or the legacy default stream, returns the same id.
    ///
    /// # Errors
    /// [`DeviceError::Invalid`] when the stream belongs to another context (another device).
    pub fn register_stream(&self, stream: &Arc<CudaStream>) -> Result<StreamId, DeviceError> {
        if stream.context().cu_ctx() != self.ctx.cu_ctx() {
            return Err(DeviceError::Invalid {
                what: "stream (it belongs to another CUDA context)",
                value: handle_id(stream.cu_stream()),
            });
        }
        let id = StreamId(handle_id(stream.cu_stream()));
        self.streams
            .lock()
            .entry(id.0)
            .or_insert_with(|| Arc::clone(stream));
        Ok(id)
    }

    /// Lets [`DeviceMemory::record_event`] record on any raw `CUstream` handle (a [`StreamId`]
    /// holding the handle's value), not only on streams this device made: for callers whose
    /// streams come from elsewhere, such as PyTorch's through the C ABI
    /// (`CUDAPluggableAllocator` passes its `cudaStream_t`, which is a `CUstream`).
    ///
    /// # Safety
    /// From then on every [`StreamId`] given to this device that it did not make must be the
    /// handle of a live stream of this device's primary context (or 0, the legacy default
    /// stream, or a per-thread default stream handle), until the events recorded on it are
    /// destroyed.
    pub unsafe fn accept_external_streams(&self) {
        self.external_streams.store(true, Ordering::Release);
    }

    /// Forgets a stream from [`CudaDevice::new_stream`]; cudarc destroys it (`cuStreamDestroy_v2`)
    /// once the last `Arc<CudaStream>` handed out for it is dropped. Queued work still completes.
    ///
    /// # Errors
    /// [`DeviceError::Invalid`] for [`StreamId::DEFAULT`] or an unknown stream.
    pub fn destroy_stream(&self, stream: StreamId) -> Result<(), DeviceError> {
        let invalid = DeviceError::Invalid {
            what: "stream",
            value: stream.0,
        };
        if stream == StreamId::DEFAULT {
            return Err(invalid);
        }
        // cudarc's `Drop` binds the context before destroying the stream.
        match self.streams.lock().remove(&stream.0) {
            Some(_) => Ok(()),
            None => Err(invalid),
        }
    }

    /// Runs `f` while `[ptr, ptr + len)` is known to lie inside one live segment or inside
    /// consecutive mapped pages of this device, holding the lock that keeps it so.
    fn with_owned_range<R>(
        &self,
        ptr: DevicePtr,
        len: usize,
        f: impl FnOnce() -> R,
    ) -> Result<R, DeviceError> {
        let end = range_end(ptr, len)?;
        {
            let segments = self.segments.lock();
            if let Some((&start, &size)) = segments.range(..=ptr).next_back() {
                if end <= start + size as u64 {
                    return Ok(f());
                }
            }
        }
        let vmm = self.vmm.lock();
        if vmm.covers(ptr, end) {
            return Ok(f());
        }
        drop(vmm);
        // Memory of another process opened here (`c10-cuda-ipc`), kept open meanwhile.
        if let Some(r) = c10_cuda_ipc::with_open_range(ptr, len, f) {
            return Ok(r);
        }
        Err(DeviceError::Invalid {
            what: "device range (not inside memory allocated by this device)",
            value: ptr,
        })
    }

    /// Copies `src.len()` bytes from host memory to device address `dst` (`cuMemcpyHtoD_v2` on the
    /// legacy default stream, then `cuStreamSynchronize`): when it returns the bytes are on the
    /// device. It does not wait for work on non-blocking streams.
    ///
    /// # Errors
    /// [`DeviceError::Invalid`] unless `[dst, dst + src.len())` lies inside one segment from
    /// [`DeviceMemory::malloc`] or inside consecutive pages from [`DeviceMemory::map`];
    /// a driver failure.
    pub fn copy_htod(&self, dst: DevicePtr, src: &[u8]) -> Result<(), DeviceError> {
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        self.with_owned_range(dst, src.len(), || {
            // SAFETY: `src` is a live host slice of `src.len()` bytes; `[dst, dst + len)` is device
            // memory this device allocated and keeps allocated while the lock is held; the context
            // is bound. The call returns once `src` has been read (staged) by the driver.
            unsafe { result::memcpy_htod_sync(dst, src) }.map_err(driver("cuMemcpyHtoD_v2"))?;
            self.default_stream
                .synchronize()
                .map_err(driver("cuStreamSynchronize"))
        })?
    }

    /// Copies `dst.len()` bytes from device address `src` into host memory (`cuMemcpyDtoH_v2` on
    /// the legacy default stream; synchronous). It waits for earlier work on the legacy default
    /// stream, not for work on non-blocking streams (synchronize an event first).
    ///
    /// # Errors
    /// [`DeviceError::Invalid`] unless `[src, src + dst.len())` lies inside memory this device
    /// allocated (as for [`CudaDevice::copy_htod`]); a driver failure.
    pub fn copy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> Result<(), DeviceError> {
        if dst.is_empty() {
            return Ok(());
        }
        self.bind()?;
        self.with_owned_range(src, dst.len(), || {
            // SAFETY: `dst` is a live, exclusively borrowed host slice of `dst.len()` bytes and any
            // byte pattern is a valid u8; `[src, src + len)` is device memory this device keeps
            // allocated while the lock is held; the context is bound. A device-to-pageable-host
            // copy returns only once it has completed, so `dst` is not written after we return.
            unsafe { result::memcpy_dtoh_sync(dst, src) }.map_err(driver("cuMemcpyDtoH_v2"))
        })?
    }

    /// Sets `len` bytes at device address `dst` to `value` (`cuMemsetD8_v2` on the legacy default
    /// stream, then `cuStreamSynchronize`): when it returns the bytes are set.
    ///
    /// # Errors
    /// [`DeviceError::Invalid`] unless `[dst, dst + len)` lies inside memory this device allocated
    /// (as for [`CudaDevice::copy_htod`]); a driver failure.
    pub fn memset_d8(&self, dst: DevicePtr, value: u8, len: usize) -> Result<(), DeviceError> {
        if len == 0 {
            return Ok(());
        }
        self.bind()?;
        self.with_owned_range(dst, len, || {
            // SAFETY: `[dst, dst + len)` is device memory this device keeps allocated while the
            // lock is held; the context is bound.
            unsafe { result::memset_d8_sync(dst, value, len) }.map_err(driver("cuMemsetD8_v2"))?;
            self.default_stream
                .synchronize()
                .map_err(driver("cuStreamSynchronize"))
        })?
    }

    /// Queues setting `len` bytes at device address `dst` to `value` on `stream`
    /// (`cuMemsetD8Async`); returns before the device does it. Record an event on `stream` to
    /// know when it is done.
    ///
    /// # Errors
    /// [`DeviceError::Invalid`] for an unknown stream or a range outside memory this device
    /// allocated (as for [`CudaDevice::copy_htod`]); a driver failure.
    pub fn memset_d8_async(
        &self,
        dst: DevicePtr,
        value: u8,
        len: usize,
        stream: StreamId,
    ) -> Result<(), DeviceError> {
        let stream = self.stream(stream)?;
        if len == 0 {
            return Ok(());
        }
        self.bind()?;
        self.with_owned_range(dst, len, || {
            // SAFETY: `[dst, dst + len)` is device memory this device allocated; `stream` is a live
            // stream of this context (we hold an Arc). The memory must stay allocated until the
            // queued memset has run: freeing it is the caller's stream-ordering duty, as with
            // every allocator, and `cuMemFree`/our `unmap` wait for the device anyway.
            unsafe { result::memset_d8_async(dst, value, len, stream.cu_stream()) }
                .map_err(driver("cuMemsetD8Async"))
        })?
    }

    /// The event behind `event`, or [`DeviceError::Invalid`].
    fn event(&self, event: EventId) -> Result<Arc<CudaEvent>, DeviceError> {
        self.events
            .lock()
            .get(&event.0)
            .cloned()
            .ok_or(DeviceError::Invalid {
                what: "event",
                value: event.0,
            })
    }
}

/// The physical allocation properties for `cuMemCreate`: pinned device memory on `device`, no
/// shareable handle type.
fn allocation_prop(device: sys::CUdevice) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: device_location(device),
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// `device` as a `CUmemLocation`.
fn device_location(device: sys::CUdevice) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: device,
    }
}

impl DeviceMemory for CudaDevice {
    fn index(&self) -> u8 {
        self.index
    }

    /// `cuMemGetInfo_v2` in this device's context.
    fn mem_get_info(&self) -> Result<MemInfo, DeviceError> {
        let (free, total) = self.ctx.mem_get_info().map_err(driver("cuMemGetInfo_v2"))?;
        Ok(MemInfo { free, total })
    }

    /// `cuMemAlloc_v2`; `CUDA_ERROR_OUT_OF_MEMORY` becomes [`DeviceError::OutOfMemory`], a zero
    /// size [`DeviceError::Invalid`].
    fn malloc(&self, size: usize) -> Result<DevicePtr, DeviceError> {
        if size == 0 {
            return Err(DeviceError::Invalid {
                what: "allocation size",
                value: 0,
            });
        }
        self.bind()?;
        // SAFETY: the context is bound; the returned memory is uninitialized, and we never read it
        // as anything but bytes (which any pattern is).
        let ptr =
            unsafe { result::malloc_sync(size) }.map_err(alloc_failure("cuMemAlloc_v2", size))?;
        self.segments.lock().insert(ptr, size);
        Ok(ptr)
    }

    /// `cuMemFree_v2` (which waits for the device); only for a live segment of exactly `size`.
    fn free(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError> {
        self.bind()?;
        let mut segments = self.segments.lock();
        if segments.get(&ptr) != Some(&size) {
            return Err(DeviceError::Invalid {
                what: "segment address (not a live segment of that size)",
                value: ptr,
            });
        }
        // SAFETY: `ptr` came from `cuMemAlloc_v2` in this context and is still live (it is in
        // `segments`, and we hold the lock, so nobody frees it twice or copies into it meanwhile).
        unsafe { result::free_sync(ptr) }.map_err(driver("cuMemFree_v2"))?;
        segments.remove(&ptr);
        Ok(())
    }

    /// `cuEventCreate(CU_EVENT_DISABLE_TIMING)`.
    fn create_event(&self) -> Result<EventId, DeviceError> {
        self.bind()?;
        let event = self
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(driver("cuEventCreate"))?;
        let id = self.next_event.fetch_add(1, Ordering::Relaxed);
        self.events.lock().insert(id, Arc::new(event));
        Ok(EventId(id))
    }

    /// `cuEventRecord` on the raw stream ([`StreamId::DEFAULT`] or one from
    /// [`CudaDevice::new_stream`], or any handle after [`CudaDevice::accept_external_streams`]).
    fn record_event(&self, event: EventId, stream: StreamId) -> Result<(), DeviceError> {
        let event = self.event(event)?;
        let known = self.streams.lock().get(&stream.0).cloned();
        match known {
            Some(stream) => {
                self.bind()?;
                event.record(&stream).map_err(driver("cuEventRecord"))
            }
            None if self.external_streams.load(Ordering::Acquire) => {
                self.bind()?;
                // SAFETY: the event is live (we hold an Arc of it) and was made in this context;
                // the stream handle is a live stream of this context, as the caller of
                // `accept_external_streams` promised.
                unsafe {
                    result::event::record(
                        event.cu_event(),
                        std::ptr::with_exposed_provenance_mut(stream.0 as usize),
                    )
                }
                .map_err(driver("cuEventRecord"))
            }
            None => Err(DeviceError::Invalid {
                what: "stream",
                value: stream.0,
            }),
        }
    }

    /// `cuEventQuery`: `CUDA_SUCCESS` -> true, `CUDA_ERROR_NOT_READY` -> false.
    fn query_event(&self, event: EventId) -> Result<bool, DeviceError> {
        let event = self.event(event)?;
        self.bind()?;
        event.try_is_complete().map_err(driver("cuEventQuery"))
    }

    /// `cuEventSynchronize` (the event lock is not held while waiting).
    fn synchronize_event(&self, event: EventId) -> Result<(), DeviceError> {
        let event = self.event(event)?;
        self.bind()?;
        event.synchronize().map_err(driver("cuEventSynchronize"))
    }

    /// `cuEventDestroy_v2` (by cudarc, when the last handle drops); unknown events are ignored.
    fn destroy_event(&self, event: EventId) {
        // cudarc's `Drop` binds the context before destroying the event.
        self.events.lock().remove(&event.0);
    }

    /// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED` (and a usable granularity).
    fn supports_virtual_memory(&self) -> bool {
        self.granularity.is_some()
    }

    /// `cuMemAddressReserve` (alignment 0: the granularity). `size` must be a nonzero multiple of
    /// [`CudaDevice::allocation_granularity`].
    fn reserve_address_range(&self, size: usize) -> Result<DevicePtr, DeviceError> {
        let granularity = self.granularity.ok_or(DeviceError::Unsupported {
            what: "virtual memory management",
        })?;
        if size == 0 || size % granularity != 0 {
            return Err(DeviceError::Invalid {
                what: "reservation size (not a multiple of the allocation granularity)",
                value: size as u64,
            });
        }
        self.bind()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is writable for the call; the context is bound; address 0 and flags 0 let
        // the driver choose where.
        unsafe { sys::cuMemAddressReserve(&mut ptr, size, 0, 0, 0) }
            .result()
            .map_err(alloc_failure("cuMemAddressReserve", size))?;
        self.vmm.lock().reservations.insert(ptr, size);
        Ok(ptr)
    }

    /// `cuMemAddressFree`; the range must be exactly one reservation with nothing mapped in it.
    fn release_address_range(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError> {
        self.bind()?;
        let mut vmm = self.vmm.lock();
        if vmm.reservations.get(&ptr) != Some(&size) {
            return Err(DeviceError::Invalid {
                what: "reserved range (not a reservation of that size)",
                value: ptr,
            });
        }
        if vmm.overlaps(ptr, range_end(ptr, size)?) {
            return Err(DeviceError::Invalid {
                what: "reserved range (pages are still mapped)",
                value: ptr,
            });
        }
        // SAFETY: `[ptr, ptr + size)` is exactly a live reservation of this context with nothing
        // mapped in it (checked above under the lock); the context is bound.
        unsafe { sys::cuMemAddressFree(ptr, size) }
            .result()
            .map_err(driver("cuMemAddressFree"))?;
        vmm.reservations.remove(&ptr);
        Ok(())
    }

    /// `cuMemCreate` (pinned, this device) + `cuMemMap` + `cuMemSetAccess` (read/write for this
    /// device). `ptr` and `size` must be multiples of [`CudaDevice::allocation_granularity`] and
    /// the range must lie in one reservation with nothing mapped yet; otherwise
    /// [`DeviceError::Invalid`]. `CUDA_ERROR_OUT_OF_MEMORY` becomes [`DeviceError::OutOfMemory`].
    fn map(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError> {
        let granularity = self.granularity.ok_or(DeviceError::Unsupported {
            what: "virtual memory management",
        })?;
        if size == 0 || size % granularity != 0 {
            return Err(DeviceError::Invalid {
                what: "mapping size (not a multiple of the allocation granularity)",
                value: size as u64,
            });
        }
        if ptr % granularity as u64 != 0 {
            return Err(DeviceError::Invalid {
                what: "mapping address (not a multiple of the allocation granularity)",
                value: ptr,
            });
        }
        let end = range_end(ptr, size)?;
        self.bind()?;
        let mut vmm = self.vmm.lock();
        let reserved = vmm
            .reservations
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&start, &len)| end <= start + len as u64);
        if !reserved {
            return Err(DeviceError::Invalid {
                what: "mapping address (not inside a reserved range)",
                value: ptr,
            });
        }
        if vmm.overlaps(ptr, end) {
            return Err(DeviceError::Invalid {
                what: "mapping address (already mapped)",
                value: ptr,
            });
        }
        let device = self.ctx.cu_device();
        // `cuMemCreate`, exportable to other processes where the device allows (`c10-cuda-ipc`).
        let handle =
            ipc::mem_create(&self.ctx, size).map_err(alloc_failure("cuMemCreate", size))?;
        // SAFETY: `[ptr, ptr + size)` lies in a reservation of this context with nothing mapped in
        // it (checked under the lock we hold); `handle` is a fresh allocation of exactly `size`.
        let mapped = unsafe { sys::cuMemMap(ptr, size, 0, handle, 0) }
            .result()
            .map_err(alloc_failure("cuMemMap", size));
        if let Err(e) = mapped {
            // SAFETY: `handle` is ours, unmapped, and released exactly once here.
            let _ = unsafe { sys::cuMemRelease(handle) };
            return Err(e);
        }
        let access = sys::CUmemAccessDesc {
            location: device_location(device),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: `access` is one valid descriptor (count 1) for the range we just mapped.
        let accessible = unsafe { sys::cuMemSetAccess(ptr, size, &access, 1) }
            .result()
            .map_err(alloc_failure("cuMemSetAccess", size));
        if let Err(e) = accessible {
            // SAFETY: we mapped exactly this range to `handle` above and nothing used it since;
            // unmapping then releasing returns it. Each happens once.
            unsafe {
                let _ = sys::cuMemUnmap(ptr, size);
                let _ = sys::cuMemRelease(handle);
            }
            return Err(e);
        }
        vmm.mappings.insert(ptr, Mapping { size, handle });
        Ok(())
    }

    /// Waits for the device (`cuCtxSynchronize`: unlike `cuMemFree`, `cuMemUnmap` does not wait
    /// for queued work), then `cuMemUnmap` + `cuMemRelease` of the handle mapped at `ptr`.
    /// `[ptr, ptr + size)` must be exactly one earlier [`DeviceMemory::map`] range.
    fn unmap(&self, ptr: DevicePtr, size: usize) -> Result<(), DeviceError> {
        self.bind()?;
        let mut vmm = self.vmm.lock();
        let mapping = match vmm.mappings.get(&ptr) {
            Some(m) if m.size == size => *m,
            _ => {
                return Err(DeviceError::Invalid {
                    what: "mapped range (not a mapping of that size)",
                    value: ptr,
                });
            }
        };
        self.ctx.synchronize().map_err(driver("cuCtxSynchronize"))?;
        // SAFETY: `[ptr, ptr + size)` is exactly one live mapping of this context (checked under
        // the lock we hold) and the device has finished all queued work.
        unsafe { sys::cuMemUnmap(ptr, size) }
            .result()
            .map_err(driver("cuMemUnmap"))?;
        vmm.mappings.remove(&ptr);
        // A descriptor exported for IPC would keep the physical memory: close it.
        ipc::release_exported(self.index, ptr);
        // SAFETY: `mapping.handle` came from `cuMemCreate`, is no longer mapped anywhere, and is
        // released exactly once (its entry is gone).
        unsafe { sys::cuMemRelease(mapping.handle) }
            .result()
            .map_err(driver("cuMemRelease"))
    }
}

impl Drop for CudaDevice {
    /// Best effort: waits for the device, then releases mapped pages, reserved ranges and
    /// segments still held (errors are ignored). Events and streams are destroyed by cudarc when
    /// their maps drop.
    fn drop(&mut self) {
        ipc::release_all_exported(self.index);
        let vmm = self.vmm.get_mut();
        let segments = self.segments.get_mut();
        if vmm.mappings.is_empty() && vmm.reservations.is_empty() && segments.is_empty() {
            return;
        }
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        let _ = self.ctx.synchronize();
        for (&ptr, mapping) in &vmm.mappings {
            // SAFETY: each entry is a live mapping of this context, unmapped and released once;
            // the device is idle and nothing can use `self` any more.
            unsafe {
                let _ = sys::cuMemUnmap(ptr, mapping.size);
                let _ = sys::cuMemRelease(mapping.handle);
            }
        }
        vmm.mappings.clear();
        for (&ptr, &size) in &vmm.reservations {
            // SAFETY: each entry is a live reservation of this context with its pages unmapped
            // above; it is freed once.
            let _ = unsafe { sys::cuMemAddressFree(ptr, size) };
        }
        vmm.reservations.clear();
        for &ptr in segments.keys() {
            // SAFETY: each entry is a live `cuMemAlloc_v2` segment of this context, freed once.
            let _ = unsafe { result::free_sync(ptr) };
        }
        segments.clear();
    }
}
