//! [`CudaPinnedMemory`]: the CUDA driver's page-locked host memory (`cuMemHostAlloc`,
//! `cuMemHostRegister`) as a [`PinnedMemory`] backend of the pinned host caching allocator.

use std::alloc::Layout;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys;

use super::CudaDevice;
use c10_cuda::CachingAllocator;
use c10_cuda::device::{DeviceError, DeviceMemory, EventId, StreamId};
use c10_host_alloc::pinned_memory::{PREFAULT_PAGE, PinnedMemory, prefault};

/// Pinned memory of the CUDA driver (`cuMemHostAlloc`, `cuMemHostRegister`), with events of one
/// device of a CUDA caching allocator front (streams are that device's).
pub struct CudaPinnedMemory {
    front: Arc<CachingAllocator<CudaDevice>>,
    device: u8,
}

impl CudaPinnedMemory {
    /// Pinned memory whose events are recorded on streams of `front`'s device `device`.
    ///
    /// # Errors
    /// [`DeviceError::Invalid`] when `front` has no such device.
    pub fn new(front: Arc<CachingAllocator<CudaDevice>>, device: u8) -> Result<Self, DeviceError> {
        if !front.has_device(device) {
            return Err(DeviceError::Invalid {
                what: "device index",
                value: u64::from(device),
            });
        }
        Ok(CudaPinnedMemory { front, device })
    }

    /// Runs `f` on the device with its context bound to this thread.
    fn on_device<R>(
        &self,
        f: impl FnOnce(&CudaDevice) -> Result<R, DeviceError>,
    ) -> Result<R, DeviceError> {
        self.front
            .with_device(self.device, |a| {
                let device = a.device();
                device
                    .context()
                    .bind_to_thread()
                    .map_err(|e| DeviceError::Driver {
                        call: "cuCtxSetCurrent",
                        message: format!("{e:?}"),
                    })?;
                f(device)
            })
            .map_err(|e| DeviceError::Driver {
                call: "device lookup",
                message: e.to_string(),
            })?
    }
}

/// A driver result as a [`DeviceError`].
fn check(call: &'static str, size: usize, r: sys::CUresult) -> Result<(), DeviceError> {
    match r {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => Err(DeviceError::OutOfMemory { size }),
        other => Err(DeviceError::Driver {
            call,
            message: format!("{other:?}"),
        }),
    }
}

impl PinnedMemory for CudaPinnedMemory {
    fn host_alloc(&self, size: usize) -> Result<usize, DeviceError> {
        self.on_device(|_| {
            let mut ptr: *mut c_void = std::ptr::null_mut();
            // SAFETY: `ptr` is writable; the context is bound; flags 0 is cudaHostAllocDefault.
            check("cuMemHostAlloc", size, unsafe {
                sys::cuMemHostAlloc(&mut ptr, size, 0)
            })?;
            // The driver does not zero the memory; every byte we hand out is initialised.
            // SAFETY: `ptr` is a fresh pinned allocation of `size` bytes.
            unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, size) };
            Ok(ptr as usize)
        })
    }

    fn host_register_alloc(&self, size: usize, threads: usize) -> Result<usize, DeviceError> {
        let layout = Layout::from_size_align(size.max(1), PREFAULT_PAGE).map_err(|_| {
            DeviceError::Invalid {
                what: "pinned allocation size",
                value: size as u64,
            }
        })?;
        // SAFETY: the layout has a nonzero size.
        let ptr = unsafe { std::alloc::alloc(layout) } as usize;
        if ptr == 0 {
            return Err(DeviceError::OutOfMemory { size });
        }
        // SAFETY: a fresh allocation of at least `size` bytes that nothing else knows.
        unsafe { prefault(ptr, size, threads) };
        let registered = self.on_device(|_| {
            // SAFETY: `[ptr, ptr + size)` is our own live host allocation; flags 0 is
            // cudaHostRegisterDefault; the context is bound.
            check("cuMemHostRegister", size, unsafe {
                sys::cuMemHostRegister_v2(ptr as *mut c_void, size, 0)
            })
        });
        if let Err(e) = registered {
            // SAFETY: `ptr` came from `alloc` with `layout` and is freed once, here.
            unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
            return Err(e);
        }
        Ok(ptr)
    }

    fn host_free(&self, ptr: usize, size: usize, registered: bool) -> Result<(), DeviceError> {
        self.on_device(|_| {
            if registered {
                // SAFETY: `ptr` was registered by `host_register_alloc` and is unregistered once.
                check("cuMemHostUnregister", size, unsafe {
                    sys::cuMemHostUnregister(ptr as *mut c_void)
                })?;
                let layout = Layout::from_size_align(size.max(1), PREFAULT_PAGE).map_err(|_| {
                    DeviceError::Invalid {
                        what: "pinned allocation size",
                        value: size as u64,
                    }
                })?;
                // SAFETY: `ptr` came from `alloc` with this layout and is freed once.
                unsafe { std::alloc::dealloc(ptr as *mut u8, layout) };
                Ok(())
            } else {
                // SAFETY: `ptr` came from `cuMemHostAlloc` and is freed once.
                check("cuMemFreeHost", size, unsafe {
                    sys::cuMemFreeHost(ptr as *mut c_void)
                })
            }
        })
    }

    fn record_event(&self, stream: StreamId) -> Result<EventId, DeviceError> {
        self.on_device(|d| {
            let event = d.create_event()?;
            if let Err(e) = d.record_event(event, stream) {
                d.destroy_event(event);
                return Err(e);
            }
            Ok(event)
        })
    }

    fn query_event(&self, event: EventId) -> Result<bool, DeviceError> {
        self.on_device(|d| d.query_event(event))
    }

    fn release_event(&self, event: EventId) {
        let _ = self.on_device(|d| {
            d.destroy_event(event);
            Ok(())
        });
    }
}
