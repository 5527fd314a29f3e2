//! [`CpuAllocator`]: 64-byte aligned host memory, as c10's `DefaultCPUAllocator` / `alloc_cpu`.
//!
//! Every allocation is aligned to [`ALIGNMENT`] bytes (c10's `gAlignment = 64`), zero bytes give a
//! null [`DataPtr`] that frees nothing, and a refusal from the system allocator (or a size too
//! large to describe) is an [`Error`], never an abort.
//!
//! Layout of one allocation: a 64-byte header followed by the user's bytes.
//!
//! ```text
//! base                       base + 64 = data = context
//! | nbytes | counter | pad   | nbytes user bytes ...
//! ```
//!
//! The header records the requested size and a strong reference to the allocator's live-byte
//! counter, so the deleter (a plain `unsafe fn(*mut c_void)` that receives only the context) can
//! rebuild the `Layout`, decrement the counter and free the block, even after the
//! `CpuAllocator` value itself is gone. The context equals the data pointer, so data pointers are
//! "simple" and [`Allocator::raw_allocate`] works, as in c10.

use std::alloc::{self, Layout};
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::allocator::Allocator;
use crate::data_ptr::{DataPtr, DeleterFn};
use crate::device::{Device, DeviceType};
use crate::error::{Error, Result};

/// Alignment in bytes of every CPU allocation, as c10's `gAlignment` (64).
pub const ALIGNMENT: usize = 64;

/// Bytes reserved in front of every allocation for bookkeeping (one alignment unit, so the data
/// stays 64-byte aligned).
const HEADER: usize = ALIGNMENT;

/// Bookkeeping stored at the start of each block, `HEADER` bytes before the data.
#[repr(C)]
struct Header {
    /// The size in bytes the caller asked for (the block is `nbytes + HEADER` bytes).
    nbytes: usize,
    /// `Arc::into_raw` of the owning allocator's live-byte counter.
    counter: *const AtomicUsize,
}

const _: () = assert!(size_of::<Header>() <= HEADER && align_of::<Header>() <= ALIGNMENT);

/// Host memory allocator with 64-byte alignment and optional zero fill, as c10's
/// `DefaultCPUAllocator` (which calls `alloc_cpu` / `free_cpu`).
///
/// Each instance counts the bytes it has handed out and not yet had back
/// ([`CpuAllocator::allocated_bytes`]).
#[derive(Debug, Default)]
pub struct CpuAllocator {
    zero_fill: bool,
    live_bytes: Arc<AtomicUsize>,
}

impl CpuAllocator {
    /// An allocator that leaves new memory uninitialised, as c10's default `alloc_cpu`.
    pub fn new() -> Self {
        CpuAllocator::default()
    }

    /// An allocator that zero-fills new memory, as c10's `alloc_cpu` with
    /// `caffe2_cpu_allocator_do_zero_fill` set.
    pub fn zeroed() -> Self {
        CpuAllocator {
            zero_fill: true,
            live_bytes: Arc::default(),
        }
    }

    /// Whether new memory is zero-filled.
    pub fn zero_fill(&self) -> bool {
        self.zero_fill
    }

    /// Bytes currently allocated by this allocator and not yet freed (requested sizes, without
    /// the 64-byte headers).
    pub fn allocated_bytes(&self) -> usize {
        self.live_bytes.load(Ordering::Acquire)
    }

    /// The layout of a block holding `nbytes` user bytes plus the header.
    fn layout(nbytes: usize) -> Result<Layout> {
        nbytes
            .checked_add(HEADER)
            .and_then(|total| Layout::from_size_align(total, ALIGNMENT).ok())
            .ok_or(Error::SizeOverflow { nbytes })
    }
}

/// Frees a block made by [`CpuAllocator::allocate`]; `ctx` is its data pointer.
///
/// # Safety
/// `ctx` must be null or a data pointer returned by `CpuAllocator` that was not freed yet.
unsafe fn free_cpu(ctx: *mut c_void) {
    if ctx.is_null() {
        return;
    }
    // SAFETY: `ctx` is `HEADER` bytes into a live block from `CpuAllocator::allocate` (caller's
    // contract), so stepping back stays inside the block and lands on its start.
    let base = unsafe { ctx.cast::<u8>().sub(HEADER) };
    // SAFETY: `allocate` wrote a `Header` at `base`, which is 64-byte aligned.
    let header = unsafe { base.cast::<Header>().read() };
    // SAFETY: `header.counter` came from `Arc::into_raw` in `allocate` and this block's strong
    // reference is given back exactly once, here.
    let counter = unsafe { Arc::from_raw(header.counter) };
    counter.fetch_sub(header.nbytes, Ordering::AcqRel);
    // SAFETY: `allocate` validated this layout before allocating the block with it.
    let layout = unsafe { Layout::from_size_align_unchecked(header.nbytes + HEADER, ALIGNMENT) };
    // SAFETY: `base` was allocated by the global allocator with exactly `layout`, and is freed once.
    unsafe { alloc::dealloc(base, layout) };
}

// SAFETY: `allocate` returns null for zero bytes and otherwise a fresh, exclusively owned block of
// `nbytes` host bytes (plus a private header) on `Device::cpu()`; its context is the data pointer
// and its deleter `free_cpu` frees exactly that block from any thread; `raw_deleter` is the same
// `free_cpu`.
unsafe impl Allocator for CpuAllocator {
    /// Allocates `nbytes` 64-byte-aligned host bytes (zero-filled if [`CpuAllocator::zeroed`]),
    /// as c10's `alloc_cpu`. Zero bytes return [`DataPtr::null`] without touching the system
    /// allocator.
    ///
    /// # Errors
    /// [`Error::SizeOverflow`] when `nbytes + 64` does not fit a `Layout` (more than
    /// `isize::MAX`), [`Error::OutOfMemory`] when the system allocator returns null.
    fn allocate(&self, nbytes: usize) -> Result<DataPtr> {
        if nbytes == 0 {
            return Ok(DataPtr::null(Device::cpu()));
        }
        let layout = Self::layout(nbytes)?;
        // SAFETY: `layout` has a non-zero size (at least `HEADER`).
        let base = unsafe {
            if self.zero_fill {
                alloc::alloc_zeroed(layout)
            } else {
                alloc::alloc(layout)
            }
        };
        if base.is_null() {
            return Err(Error::OutOfMemory {
                requested: nbytes,
                device: Device::cpu(),
            });
        }
        let header = Header {
            nbytes,
            counter: Arc::into_raw(Arc::clone(&self.live_bytes)),
        };
        // SAFETY: `base` is a fresh block of at least `HEADER` bytes, aligned to 64 bytes.
        unsafe { base.cast::<Header>().write(header) };
        self.live_bytes.fetch_add(nbytes, Ordering::AcqRel);
        // SAFETY: the block is `HEADER + nbytes` bytes long, so `base + HEADER` is in bounds.
        let data = unsafe { base.add(HEADER) };
        // SAFETY: `free_cpu(data)` frees exactly this block once, from any thread; `data` is valid
        // for `nbytes` host bytes that only this `DataPtr` knows about.
        Ok(unsafe {
            DataPtr::new(
                data,
                data.cast(),
                Some(free_cpu as DeleterFn),
                Device::cpu(),
            )
        })
    }

    fn device_type(&self) -> DeviceType {
        DeviceType::Cpu
    }

    fn raw_deleter(&self) -> Option<DeleterFn> {
        Some(free_cpu)
    }
}
