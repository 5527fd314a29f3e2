//! The CUDA backend's IPC (PyTorch's `shareIpcHandle` / `getIpcDevPtr` device calls):
//! `cuIpcGetMemHandle` / `cuIpcOpenMemHandle` / `cuIpcCloseMemHandle` for `cudaMalloc`
//! segments, and for the pages of expandable segments the exported shareable handles PyTorch
//! 2.6 and later uses (`cuMemExportToShareableHandle` to a POSIX descriptor per page; the consumer takes
//! the descriptors with `pidfd_getfd`, `cuMemImportFromShareableHandle`, and maps them in a range
//! of its own, `ExpandableSegment::fromShared`).
//!
//! Physical pages are created with `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` requested where
//! the device supports it (`CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED`), and
//! without when the driver refuses it, as PyTorch falls back; such pages cannot be shared.
//! `pidfd_getfd` needs the consumer to be allowed to trace the producer (the same user, and
//! under Yama's `ptrace_scope` 1 an ancestor of it).

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use cudarc::driver::{CudaContext, DriverError, sys};
use parking_lot::Mutex;

use super::{CudaDevice, describe, device_location, driver};
use c10_cuda::device::DevicePtr;
use c10_cuda_ipc::{
    CUDA_IPC_HANDLE_SIZE, IpcError, IpcMemory, OpenedMemory, SegmentHandle, ShareRange,
};

/// The POSIX descriptor exported for each shared page, by (device index, page address); closed
/// when the page is unmapped ([`release_exported`]).
static EXPORTED: Mutex<BTreeMap<(u8, DevicePtr), OwnedFd>> = Mutex::new(BTreeMap::new());

/// Per device ordinal: 0 unknown, 1 POSIX descriptors requested for new pages, 2 not.
static POSIX_FD: [AtomicU8; 64] = [const { AtomicU8::new(0) }; 64];

/// Forgets (closes) the descriptor exported for the page at `ptr` of device `index`, if any:
/// called when the page is unmapped, since an open descriptor keeps the physical memory.
pub(super) fn release_exported(index: u8, ptr: DevicePtr) {
    EXPORTED.lock().remove(&(index, ptr));
}

/// Forgets every descriptor exported for device `index` (the device is being dropped).
pub(super) fn release_all_exported(index: u8) {
    EXPORTED.lock().retain(|&(i, _), _| i != index);
}

/// `cuMemCreate` of `size` bytes of pinned device memory on `device`, exportable as a POSIX
/// descriptor where the device supports it (falling back to no handle type when the driver
/// refuses, as PyTorch does).
pub(super) fn mem_create(
    ctx: &CudaContext,
    size: usize,
) -> Result<sys::CUmemGenericAllocationHandle, DriverError> {
    let device = ctx.cu_device();
    let ordinal = ctx.ordinal().min(POSIX_FD.len() - 1);
    let state = &POSIX_FD[ordinal];
    if state.load(Ordering::Relaxed) == 0 {
        let supported = ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
            )
            .is_ok_and(|v| v != 0);
        state.store(if supported { 1 } else { 2 }, Ordering::Relaxed);
    }
    let mut prop = super::allocation_prop(device);
    if state.load(Ordering::Relaxed) == 1 {
        prop.requestedHandleTypes =
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    }
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: `handle` is writable and `prop` fully initialized; the caller bound the context.
    let first = unsafe { sys::cuMemCreate(&mut handle, size, &prop, 0) }.result();
    match first {
        Err(e)
            if prop.requestedHandleTypes
                != sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE
                && matches!(
                    e.0,
                    sys::CUresult::CUDA_ERROR_NOT_SUPPORTED
                        | sys::CUresult::CUDA_ERROR_NOT_PERMITTED
                        | sys::CUresult::CUDA_ERROR_INVALID_VALUE
                ) =>
        {
            state.store(2, Ordering::Relaxed);
            prop.requestedHandleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
            // SAFETY: as above.
            unsafe { sys::cuMemCreate(&mut handle, size, &prop, 0) }.result()?;
            Ok(handle)
        }
        Err(e) => Err(e),
        Ok(()) => Ok(handle),
    }
}

/// A `cudaMalloc` segment of another process opened here; `cuIpcCloseMemHandle` on drop.
struct IpcMapping {
    ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `ptr` came from `cuIpcOpenMemHandle` in this context and is closed once.
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
        }
    }
}

/// Pages of another process's expandable segment imported and mapped here; unmapped and
/// released on drop.
struct ImportedRange {
    ctx: Arc<CudaContext>,
    base: sys::CUdeviceptr,
    reserved: usize,
    page: usize,
    handles: Vec<sys::CUmemGenericAllocationHandle>,
    mapped: usize,
}

impl Drop for ImportedRange {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        // Unmapping does not wait for queued work (as in `CudaDevice::unmap`).
        let _ = self.ctx.synchronize();
        for i in 0..self.mapped {
            // SAFETY: page `i` of our reservation is mapped to `handles[i]` (mapped in order);
            // it is unmapped once.
            let _ = unsafe { sys::cuMemUnmap(self.base + (i * self.page) as u64, self.page) };
        }
        for &h in &self.handles {
            // SAFETY: each handle was imported once and is no longer mapped.
            let _ = unsafe { sys::cuMemRelease(h) };
        }
        if self.reserved > 0 {
            // SAFETY: the range was reserved by us and nothing is mapped in it any more.
            let _ = unsafe { sys::cuMemAddressFree(self.base, self.reserved) };
        }
    }
}

fn stale(call: &'static str) -> impl FnOnce(DriverError) -> IpcError {
    move |e| IpcError::Stale(format!("{call} failed: {}", describe(e)))
}

impl IpcMemory for CudaDevice {
    /// `cuIpcGetMemHandle` of a live segment's base, or the exported POSIX descriptor of each
    /// mapped page covering the block (kept open until the page is unmapped).
    ///
    /// # Errors
    /// [`IpcError::UnknownPointer`] for memory this device does not hold;
    /// [`IpcError::Unsupported`] for pages created without an exportable handle type;
    /// driver failures.
    fn export_ipc(&self, range: &ShareRange) -> Result<SegmentHandle, IpcError> {
        self.bind()?;
        match *range {
            ShareRange::Segment { base, size } => {
                let segments = self.segments.lock();
                if segments.get(&base) != Some(&size) {
                    return Err(IpcError::UnknownPointer { ptr: base });
                }
                let mut handle = sys::CUipcMemHandle_st {
                    reserved: [0; CUDA_IPC_HANDLE_SIZE],
                };
                // SAFETY: `handle` is writable; `base` is a live `cuMemAlloc` segment of this
                // context (checked under the lock we hold); the context is bound.
                unsafe { sys::cuIpcGetMemHandle(&mut handle, base) }
                    .result()
                    .map_err(driver("cuIpcGetMemHandle"))?;
                Ok(SegmentHandle::CudaMalloc {
                    handle: handle.reserved.map(|b| b as u8),
                    size: size as u64,
                })
            }
            ShareRange::Expandable {
                page_size,
                begin,
                len,
                ..
            } => {
                let vmm = self.vmm.lock();
                let mut exported = EXPORTED.lock();
                let mut fds = Vec::with_capacity(len / page_size.max(1));
                let mut page = begin;
                while page < begin + len as u64 {
                    let mapping = match vmm.mappings.get(&page) {
                        Some(m) if m.size == page_size => *m,
                        _ => return Err(IpcError::UnknownPointer { ptr: page }),
                    };
                    let fd = match exported.get(&(self.index, page)) {
                        Some(fd) => fd.as_raw_fd(),
                        None => {
                            let mut raw: c_int = -1;
                            // SAFETY: `raw` is a writable int, what the POSIX descriptor handle
                            // type writes; `mapping.handle` is a live allocation of this context.
                            unsafe {
                                sys::cuMemExportToShareableHandle(
                                    (&mut raw as *mut c_int).cast::<c_void>(),
                                    mapping.handle,
                                    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                    0,
                                )
                            }
                            .result()
                            .map_err(|e| {
                                IpcError::Unsupported(format!(
                                    "this expandable page cannot be exported \
                                     (cuMemExportToShareableHandle: {})",
                                    describe(e)
                                ))
                            })?;
                            if raw < 0 {
                                return Err(IpcError::Os {
                                    call: "cuMemExportToShareableHandle",
                                    message: format!("returned descriptor {raw}"),
                                });
                            }
                            // SAFETY: the driver handed us a fresh descriptor that nothing else
                            // owns.
                            let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                            exported.insert((self.index, page), owned);
                            raw
                        }
                    };
                    fds.push(fd);
                    page += page_size as u64;
                }
                Ok(SegmentHandle::CudaExpandable {
                    pid: std::process::id(),
                    page_size: page_size as u64,
                    fds,
                })
            }
        }
    }

    /// `cuIpcOpenMemHandle` (with `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`), or the import and
    /// mapping of each page of an expandable handle into a new reserved range.
    ///
    /// # Errors
    /// [`IpcError::Stale`] when the driver or the kernel cannot find the memory (freed, the
    /// producer exited); [`IpcError::Unsupported`] for simulated handles; driver failures.
    fn open_ipc(&self, segment: &SegmentHandle) -> Result<OpenedMemory, IpcError> {
        self.bind()?;
        match segment {
            SegmentHandle::CudaMalloc { handle, size } => {
                let size = usize::try_from(*size)
                    .map_err(|_| IpcError::Malformed(format!("segment of {size} bytes")))?;
                let raw = sys::CUipcMemHandle_st {
                    reserved: handle.map(|b| b as std::ffi::c_char),
                };
                let mut ptr: sys::CUdeviceptr = 0;
                // SAFETY: `ptr` is writable; the handle is plain bytes the driver validates; the
                // context is bound.
                unsafe {
                    sys::cuIpcOpenMemHandle_v2(
                        &mut ptr,
                        raw,
                        sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
                    )
                }
                .result()
                .map_err(stale("cuIpcOpenMemHandle"))?;
                Ok(OpenedMemory {
                    base: ptr,
                    len: size,
                    host: false,
                    closer: Box::new(IpcMapping {
                        ctx: Arc::clone(&self.ctx),
                        ptr,
                    }),
                })
            }
            SegmentHandle::CudaExpandable {
                pid,
                page_size,
                fds,
            } => self.open_expandable(*pid, *page_size, fds),
            _ => Err(IpcError::Unsupported(
                "a CUDA device cannot open simulated memory".into(),
            )),
        }
    }
}

impl CudaDevice {
    /// PyTorch's `ExpandableSegment::fromShared`: takes each page's descriptor from process
    /// `pid` (`pidfd_open` + `pidfd_getfd`), imports it, and maps the pages in order into a new
    /// reserved range with read/write access for this device.
    fn open_expandable(
        &self,
        pid: u32,
        page_size: u64,
        fds: &[i32],
    ) -> Result<OpenedMemory, IpcError> {
        let page = usize::try_from(page_size)
            .ok()
            .filter(|&p| p > 0 && self.granularity.is_some_and(|g| p % g == 0))
            .ok_or_else(|| {
                IpcError::Malformed(format!(
                    "page size {page_size} is not a multiple of this device's granularity"
                ))
            })?;
        let total = page
            .checked_mul(fds.len())
            .ok_or_else(|| IpcError::Malformed("expandable handle too large".into()))?;
        let pid = rustix::process::Pid::from_raw(pid as i32)
            .ok_or_else(|| IpcError::Malformed(format!("process id {pid}")))?;
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
            .map_err(|e| IpcError::Stale(format!("pidfd_open({}): {e}", pid.as_raw_pid())))?;
        let mut range = ImportedRange {
            ctx: Arc::clone(&self.ctx),
            base: 0,
            reserved: 0,
            page,
            handles: Vec::with_capacity(fds.len()),
            mapped: 0,
        };
        for &fd in fds {
            let mine =
                rustix::process::pidfd_getfd(&pidfd, fd, rustix::process::PidfdGetfdFlags::empty())
                    .map_err(|e| IpcError::Stale(format!("pidfd_getfd of descriptor {fd}: {e}")))?;
            let mut handle: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: `handle` is writable; the POSIX descriptor handle type takes the
            // descriptor's value in the pointer argument; `mine` stays open during the call.
            unsafe {
                sys::cuMemImportFromShareableHandle(
                    &mut handle,
                    mine.as_raw_fd() as usize as *mut c_void,
                    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                )
            }
            .result()
            .map_err(stale("cuMemImportFromShareableHandle"))?;
            range.handles.push(handle);
        }
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: `base` is writable; the size is a nonzero multiple of the granularity.
        unsafe { sys::cuMemAddressReserve(&mut base, total, 0, 0, 0) }
            .result()
            .map_err(driver("cuMemAddressReserve"))
            .map_err(IpcError::Device)?;
        range.base = base;
        range.reserved = total;
        for (i, &h) in range.handles.clone().iter().enumerate() {
            // SAFETY: page `i` of our fresh reservation is unmapped; `h` is an imported
            // allocation of one page.
            unsafe { sys::cuMemMap(base + (i * page) as u64, page, 0, h, 0) }
                .result()
                .map_err(driver("cuMemMap"))
                .map_err(IpcError::Device)?;
            range.mapped = i + 1;
        }
        let access = sys::CUmemAccessDesc {
            location: device_location(self.ctx.cu_device()),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: one valid descriptor for the range we just mapped.
        unsafe { sys::cuMemSetAccess(base, total, &access, 1) }
            .result()
            .map_err(driver("cuMemSetAccess"))
            .map_err(IpcError::Device)?;
        Ok(OpenedMemory {
            base,
            len: total,
            host: false,
            closer: Box::new(range),
        })
    }
}
