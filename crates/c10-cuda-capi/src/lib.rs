//! A C ABI for tensormem's CUDA caching allocator: `libtensormem_alloc.so`, declared by
//! `include/tensormem_alloc.h`.
//!
//! `tm_malloc` and `tm_free` have exactly the signatures PyTorch's
//! `torch.cuda.memory.CUDAPluggableAllocator(path, "tm_malloc", "tm_free")` loads, so PyTorch
//! can run on our allocator (`torch.cuda.memory.change_current_allocator`); the other entry
//! points give C callers what PyTorch's Python API gives: `empty_cache`, `record_stream`,
//! `_set_allocator_settings`, `memory_stats`, `memory_summary`, `_record_memory_history` and
//! `_dump_snapshot`.
//!
//! One allocator per process ([`c10_cuda::CachingAllocator`], thread safe), made at the first
//! call from the environment (`TENSORMEM_ALLOC_BACKEND=sim` for simulated devices of
//! `TENSORMEM_SIM_MEMORY` bytes, otherwise CUDA through cudarc, loaded at run time; see
//! [`backend`]). Every entry point runs inside [`guard::guard`]: errors and panics become the
//! documented return value and the calling thread's `tm_last_error()`, and nothing unwinds
//! into C (the library must be built with `panic = "unwind"`, Cargo's default).
//!
//! The Rust functions here are the C functions; Rust code should use `c10_cuda` directly.

pub mod backend;
pub mod guard;

use std::ffi::{CStr, c_char, c_int, c_void};

use c10_cuda::call_site::{HistoryOptions, Stacks};
use c10_cuda::config::AllocatorConfig;
use c10_cuda::device::{DevicePtr, StreamId};
use c10_cuda::history::RecordContext;

use crate::backend::front;
use crate::guard::{guard, last_error, write_c_string};

/// `cudaStream_t`: an opaque handle (`struct CUstream_st *`), passed through as a stream id.
pub type CudaStream = *mut c_void;

/// `ssize_t`.
pub type SSize = isize;

fn stream_id(stream: CudaStream) -> StreamId {
    StreamId(stream.expose_provenance() as u64)
}

fn device_index(device: c_int) -> Result<u8, String> {
    u8::try_from(device).map_err(|_| format!("device {device} is not a device index"))
}

fn error(e: c10_cuda::Error) -> String {
    e.to_string()
}

/// Allocates `size` bytes on `device` for `stream` (PyTorch's `raw_alloc_with_stream`, as
/// `CUDAPluggableAllocator` calls it). NULL for 0 bytes (no error) or on failure (last error
/// set: out of memory, a negative size, an unknown device).
#[unsafe(no_mangle)]
pub extern "C" fn tm_malloc(size: SSize, device: c_int, stream: CudaStream) -> *mut c_void {
    guard("tm_malloc", std::ptr::null_mut(), || {
        let size = usize::try_from(size).map_err(|_| format!("negative size {size}"))?;
        let device = device_index(device)?;
        if size == 0 {
            return Ok(std::ptr::null_mut());
        }
        let ptr = front()?
            .malloc(device, size, stream_id(stream))
            .map_err(error)?;
        Ok(std::ptr::with_exposed_provenance_mut(ptr as usize))
    })
}

/// Frees a pointer from [`tm_malloc`] (PyTorch's `raw_delete`). `size`, `device` and `stream`
/// are `CUDAPluggableAllocator`'s arguments and are not checked: the pointer names the block.
/// NULL is ignored; an unknown pointer sets the last error and changes nothing.
#[unsafe(no_mangle)]
pub extern "C" fn tm_free(ptr: *mut c_void, size: SSize, device: c_int, stream: CudaStream) {
    let _ = (size, device, stream);
    guard("tm_free", (), || {
        if ptr.is_null() {
            return Ok(());
        }
        front()?
            .free(ptr.expose_provenance() as DevicePtr)
            .map_err(error)
    });
}

/// Releases every device's cached whole segments (`torch.cuda.empty_cache()`); failures set
/// the last error.
#[unsafe(no_mangle)]
pub extern "C" fn tm_empty_cache() {
    guard("tm_empty_cache", (), || {
        front()?.empty_cache().map_err(error)
    });
}

/// Marks `ptr`'s block as used on `stream` (PyTorch's `recordStream`). 0, or -1 when `ptr` is
/// not a live block.
#[unsafe(no_mangle)]
pub extern "C" fn tm_record_stream(ptr: *mut c_void, stream: CudaStream) -> c_int {
    guard("tm_record_stream", -1, || {
        front()?
            .record_stream(ptr.expose_provenance() as DevicePtr, stream_id(stream))
            .map_err(error)?;
        Ok(0)
    })
}

/// Reads a C string argument.
///
/// # Safety
/// `text` is NULL or a NUL-terminated string valid for reads.
unsafe fn c_str<'a>(text: *const c_char, what: &str) -> Result<&'a str, String> {
    if text.is_null() {
        return Err(format!("{what} is NULL"));
    }
    // SAFETY: non-null, and the caller guarantees a NUL-terminated readable string.
    unsafe { CStr::from_ptr(text) }
        .to_str()
        .map_err(|_| format!("{what} is not UTF-8"))
}

/// Applies a `PYTORCH_CUDA_ALLOC_CONF` string to every device (PyTorch's
/// `_set_allocator_settings`), while no device holds memory. 0 when accepted, -1 (last error
/// set) when not.
///
/// # Safety
/// `alloc_conf` is NULL or a NUL-terminated string valid for reads.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tm_set_config(alloc_conf: *const c_char) -> c_int {
    guard("tm_set_config", -1, || {
        // SAFETY: as this function's contract.
        let text = unsafe { c_str(alloc_conf, "alloc_conf") }?;
        let config = AllocatorConfig::parse(text).map_err(|e| e.to_string())?;
        front()?.set_config(config).map_err(error)?;
        Ok(0)
    })
}

/// `torch.cuda.memory_stats(device)` as one JSON object, written to `buf` as `snprintf` does;
/// returns the object's length (without the NUL), or -1.
///
/// # Safety
/// When `len > 0`, `buf` is valid for writes of `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tm_memory_stats_json(
    device: c_int,
    buf: *mut c_char,
    len: usize,
) -> SSize {
    guard("tm_memory_stats_json", -1, || {
        let stats = front()?
            .memory_stats(device_index(device)?)
            .map_err(error)?;
        let json = serde_json::to_string(&stats).map_err(|e| e.to_string())?;
        // SAFETY: as this function's contract.
        unsafe { write_c_string(&json, buf, len) }
    })
}

/// `torch.cuda.memory_summary(device, abbreviated)`, written and returned as
/// [`tm_memory_stats_json`] does.
///
/// # Safety
/// When `len > 0`, `buf` is valid for writes of `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tm_memory_summary(
    device: c_int,
    abbreviated: c_int,
    buf: *mut c_char,
    len: usize,
) -> SSize {
    guard("tm_memory_summary", -1, || {
        let text = front()?
            .memory_summary(device_index(device)?, abbreviated != 0)
            .map_err(error)?;
        // SAFETY: as this function's contract.
        unsafe { write_c_string(&text, buf, len) }
    })
}

/// Starts (`max_entries > 0`) or stops memory history on every device, with `context` 0..3 as
/// PyTorch's `RecordContext` (none, state, alloc, all) and full native stacks. 0, or -1.
#[unsafe(no_mangle)]
pub extern "C" fn tm_record_history(max_entries: usize, context: c_int) -> c_int {
    guard("tm_record_history", -1, || {
        let context = u8::try_from(context)
            .ok()
            .and_then(RecordContext::from_u8)
            .ok_or_else(|| {
                format!("context {context}: expected 0 (none), 1 (state), 2 (alloc) or 3 (all)")
            })?;
        front()?.record_history(
            &HistoryOptions::new(max_entries)
                .context(context)
                .stacks(Stacks::Full),
        );
        Ok(0)
    })
}

/// Writes every device's snapshot to `path` as `torch.cuda.memory._dump_snapshot` does. 0, or
/// -1.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string valid for reads.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tm_snapshot_pickle(path: *const c_char) -> c_int {
    guard("tm_snapshot_pickle", -1, || {
        if path.is_null() {
            return Err("path is NULL".to_string());
        }
        // SAFETY: non-null, NUL-terminated and readable, as this function's contract.
        let bytes = unsafe { CStr::from_ptr(path) }.to_bytes();
        let path = std::path::Path::new(
            <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(bytes),
        );
        let pickle = front()?.snapshot_pickle();
        std::fs::write(path, pickle)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        Ok(0)
    })
}

/// The calling thread's last error ("" when none), valid until its next failing call.
#[unsafe(no_mangle)]
pub extern "C" fn tm_last_error() -> *const c_char {
    // Reading a thread-local cannot panic; nothing to guard.
    last_error()
}
