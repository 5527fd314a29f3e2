//! Host memory behind a host-backed simulated device: aligned segments and reserved address
//! ranges whose pages are committed on demand; private heap memory, or shareable memfd regions
//! ([`crate::shared_memory`]) that another process can map (the device's IPC, in `c10-cuda-ipc`).

use std::alloc::Layout;

#[cfg(target_os = "linux")]
use crate::shared_memory::{SIM_RESERVATION_KIND, SIM_SEGMENT_KIND, SharedRegion};

/// What another process needs to know of `region`.
#[cfg(target_os = "linux")]
/// The shareable memfd region behind a host-backed segment or reservation, as another process
/// needs it: this process's descriptor number, the nonce in the region's memfd name
/// (`tensormem:<kind>:<nonce>`, see [`crate::shared_memory`]) and its size in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SharedRegionInfo {
    /// The region's descriptor in this process (open while the memory lives).
    pub fd: i32,
    /// The nonce in its memfd name.
    pub nonce: u64,
    /// Bytes of the region.
    pub size: usize,
}

fn region_info(region: &SharedRegion) -> SharedRegionInfo {
    SharedRegionInfo {
        fd: region.raw_fd(),
        nonce: region.nonce(),
        size: region.size(),
    }
}

/// Alignment of host-backed segments, in bytes (CUDA guarantees at least 256; PyTorch's
/// blocks are multiples of 512; we use a page).
const SEGMENT_ALIGN: usize = 4096;

/// One zero-initialised host allocation standing in for a `cudaMalloc`ed segment. Freed on
/// drop.
#[derive(Debug)]
pub(crate) struct HostAllocation {
    ptr: *mut u8,
    layout: Layout,
    /// The memfd region behind a shareable segment (then `ptr` is its mapping and nothing is
    /// freed through `layout`).
    #[cfg(target_os = "linux")]
    shared: Option<SharedRegion>,
}

// SAFETY: the allocation is plain bytes owned by this value; moving ownership between threads
// is sound, and all access to its bytes goes through the simulated device's lock.
unsafe impl Send for HostAllocation {}

impl HostAllocation {
    /// Allocates `size` zeroed bytes; `None` when the host refuses or `size` is 0 or too big.
    pub(crate) fn new(size: usize) -> Option<Self> {
        if size == 0 {
            return None;
        }
        let layout = Layout::from_size_align(size, SEGMENT_ALIGN).ok()?;
        // SAFETY: the layout has a non-zero size (checked above).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return None;
        }
        Some(HostAllocation {
            ptr,
            layout,
            #[cfg(target_os = "linux")]
            shared: None,
        })
    }

    /// `size` zeroed bytes in a shareable memfd region (Linux only); `None` when the host
    /// refuses.
    #[cfg(target_os = "linux")]
    pub(crate) fn new_shared(size: usize) -> Option<Self> {
        let layout = Layout::from_size_align(size, SEGMENT_ALIGN).ok()?;
        let region = SharedRegion::create(SIM_SEGMENT_KIND, size, true).ok()?;
        Some(HostAllocation {
            ptr: region.addr() as *mut u8,
            layout,
            shared: Some(region),
        })
    }

    /// Unsupported off Linux.
    #[cfg(not(target_os = "linux"))]
    pub(crate) fn new_shared(_size: usize) -> Option<Self> {
        None
    }

    /// The address as a device address.
    pub(crate) fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// The memfd region behind a shareable segment (`None` for heap memory, and off Linux).
    pub(crate) fn shared_info(&self) -> Option<SharedRegionInfo> {
        #[cfg(target_os = "linux")]
        return self.shared.as_ref().map(region_info);
        #[cfg(not(target_os = "linux"))]
        None
    }
}

impl Drop for HostAllocation {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if self.shared.is_some() {
            // The region unmaps and closes itself.
            return;
        }
        // SAFETY: `ptr` came from `alloc_zeroed` with exactly `layout` and is freed only here.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// A reserved range of host address space with no access, whose pages are made readable and
/// writable by [`HostReservation::commit`] (standing in for `cuMemAddressReserve` +
/// `cuMemMap`). Unmapped on drop.
#[derive(Debug)]
pub(crate) struct HostReservation {
    ptr: *mut u8,
    size: usize,
    /// The memfd region behind a shareable reservation (then it owns the mapping).
    #[cfg(target_os = "linux")]
    shared: Option<SharedRegion>,
}

// SAFETY: as for HostAllocation: the mapping is owned by this value and used under the
// simulated device's lock.
unsafe impl Send for HostReservation {}

#[cfg(unix)]
impl HostReservation {
    /// Reserves `size` bytes of address space (`mmap(PROT_NONE, MAP_NORESERVE)`).
    pub(crate) fn new(size: usize) -> Option<Self> {
        if size == 0 {
            return None;
        }
        // SAFETY: an anonymous private mapping with a null hint touches no existing memory;
        // the result is checked against MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        Some(HostReservation {
            ptr: ptr.cast(),
            size,
            #[cfg(target_os = "linux")]
            shared: None,
        })
    }

    /// Reserves `size` bytes backed by a sparse shareable memfd region (Linux only): pages take
    /// memory only once committed and written.
    #[cfg(target_os = "linux")]
    pub(crate) fn new_shared(size: usize) -> Option<Self> {
        let region = SharedRegion::create(SIM_RESERVATION_KIND, size, false).ok()?;
        Some(HostReservation {
            ptr: region.addr() as *mut u8,
            size,
            shared: Some(region),
        })
    }

    /// Unsupported off Linux.
    #[cfg(not(target_os = "linux"))]
    pub(crate) fn new_shared(_size: usize) -> Option<Self> {
        None
    }

    /// The memfd region behind a shareable reservation (`None` for heap memory, and off Linux).
    pub(crate) fn shared_info(&self) -> Option<SharedRegionInfo> {
        #[cfg(target_os = "linux")]
        return self.shared.as_ref().map(region_info);
        #[cfg(not(target_os = "linux"))]
        None
    }

    /// The start address as a device address.
    pub(crate) fn addr(&self) -> u64 {
        self.ptr as u64
    }

    fn contains(&self, ptr: u64, size: usize) -> bool {
        ptr >= self.addr() && ptr + size as u64 <= self.addr() + self.size as u64
    }

    /// Makes `[ptr, ptr + size)` readable and writable (fresh pages read as zero).
    pub(crate) fn commit(&self, ptr: u64, size: usize) -> bool {
        #[cfg(target_os = "linux")]
        if let Some(region) = &self.shared {
            return region.commit(ptr, size);
        }
        if !self.contains(ptr, size) {
            return false;
        }
        // SAFETY: the range lies inside our own mapping (checked above) and is page aligned
        // (pages are 2 MiB or 20 MiB multiples from a page-aligned mmap result).
        unsafe {
            libc::mprotect(
                ptr as *mut libc::c_void,
                size,
                libc::PROT_READ | libc::PROT_WRITE,
            ) == 0
        }
    }

    /// Drops the contents of `[ptr, ptr + size)` and removes access again.
    pub(crate) fn decommit(&self, ptr: u64, size: usize) {
        #[cfg(target_os = "linux")]
        if let Some(region) = &self.shared {
            return region.decommit(ptr, size);
        }
        if !self.contains(ptr, size) {
            return;
        }
        // SAFETY: the range lies inside our own mapping and is page aligned; MADV_DONTNEED on
        // a private anonymous mapping discards the pages (they read as zero if committed
        // again); mprotect(PROT_NONE) makes stray accesses fault instead of corrupting data.
        unsafe {
            libc::madvise(ptr as *mut libc::c_void, size, libc::MADV_DONTNEED);
            libc::mprotect(ptr as *mut libc::c_void, size, libc::PROT_NONE);
        }
    }
}

#[cfg(not(unix))]
impl HostReservation {
    /// Unsupported off Unix: host-backed devices there report no virtual memory.
    pub(crate) fn new(_size: usize) -> Option<Self> {
        None
    }
    /// Unreachable off Unix.
    pub(crate) fn addr(&self) -> u64 {
        self.ptr as u64
    }
    /// Unreachable off Unix.
    pub(crate) fn commit(&self, _ptr: u64, _size: usize) -> bool {
        false
    }
    /// Unreachable off Unix.
    pub(crate) fn decommit(&self, _ptr: u64, _size: usize) {}
}

impl Drop for HostReservation {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if self.shared.is_some() {
            // The region unmaps and closes itself.
            return;
        }
        #[cfg(unix)]
        // SAFETY: `ptr`/`size` are exactly the mapping created in `new`, unmapped only here.
        unsafe {
            libc::munmap(self.ptr.cast(), self.size);
        }
    }
}
