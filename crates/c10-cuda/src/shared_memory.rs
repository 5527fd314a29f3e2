//! Host memory another process can map: sealed `memfd_create` regions named
//! `tensormem:<kind>:<nonce>` (a random nonce per region). The host-backed simulated device puts
//! its segments and reservations in them when made
//! [`SimDevice::with_shareable_memory`](crate::SimDevice::with_shareable_memory), and
//! `c10-cuda-ipc` keeps its reference-counter files in them; how another process finds and checks
//! a region through `/proc/<pid>/fd/<fd>` is `c10-cuda-ipc`'s (its `remote` module).
//!
//! Regions are sealed against shrinking and growing (`F_SEAL_SHRINK | F_SEAL_GROW`), so no
//! process that opened one can truncate it under the others' mappings (which would turn their
//! accesses into `SIGBUS`).

use std::hash::{BuildHasher, Hasher};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, MprotectFlags, ProtFlags};

/// The prefix of every memfd name this crate creates (as `/proc/<pid>/fd/<fd>` shows it, after
/// `/memfd:`).
pub const NAME_PREFIX: &str = "tensormem:";

/// A fresh 64-bit nonce (random per process, distinct per call).
fn nonce() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish()
}

/// The memfd name of a region of `kind` with `nonce` (`tensormem:<kind>:<nonce as 16 hex digits>`).
pub fn memfd_name(kind: &str, nonce: u64) -> String {
    format!("{NAME_PREFIX}{kind}:{nonce:016x}")
}

/// The host page size in bytes (`sysconf(_SC_PAGESIZE)`).
pub fn page_size() -> usize {
    rustix::param::page_size()
}

/// One memfd region of this process, mapped `MAP_SHARED` here; unmapped and closed on drop.
#[derive(Debug)]
pub struct SharedRegion {
    fd: OwnedFd,
    ptr: *mut u8,
    size: usize,
    nonce: u64,
}

// SAFETY: the region is a mapping plus a descriptor owned by this value; moving it to another
// thread moves that ownership. Access to the bytes is synchronised by whoever hands them out
// (the simulated device's lock, the allocator's block ownership).
unsafe impl Send for SharedRegion {}
// SAFETY: `&SharedRegion` only exposes the address, size, nonce and descriptor number; nothing
// in it is mutated through a shared reference.
unsafe impl Sync for SharedRegion {}

impl SharedRegion {
    /// Creates a sealed memfd region of `size` bytes named after `kind` and maps it. With
    /// `accessible` the mapping is readable and writable (fresh bytes read as zero); without,
    /// it is reserved address space (`PROT_NONE`, `MAP_NORESERVE`) whose pages
    /// the simulated device opens page by page (`commit`, crate-private).
    ///
    /// # Errors
    /// The failing system call's error (`memfd_create`, `ftruncate`, `fcntl`, `mmap`).
    pub fn create(kind: &str, size: usize, accessible: bool) -> rustix::io::Result<Self> {
        if size == 0 {
            return Err(rustix::io::Errno::INVAL);
        }
        let nonce = nonce();
        let fd = rustix::fs::memfd_create(
            memfd_name(kind, nonce),
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        rustix::fs::ftruncate(&fd, size as u64)?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        let (prot, flags) = if accessible {
            (ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED)
        } else {
            (ProtFlags::empty(), MapFlags::SHARED | MapFlags::NORESERVE)
        };
        // SAFETY: a fresh mapping with a null hint replaces nothing; `fd` is a memfd of exactly
        // `size` bytes that can no longer shrink (sealed above), so every mapped page stays
        // backed by the file.
        let ptr = unsafe { rustix::mm::mmap(std::ptr::null_mut(), size, prot, flags, &fd, 0)? };
        Ok(SharedRegion {
            fd,
            ptr: ptr.cast(),
            size,
            nonce,
        })
    }

    /// The mapping's address.
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Bytes of the region.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The nonce in the region's memfd name.
    pub fn nonce(&self) -> u64 {
        self.nonce
    }

    /// The descriptor number another process opens through `/proc/<pid>/fd/<fd>`.
    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Whether `[ptr, ptr + len)` lies inside the mapping.
    fn contains(&self, ptr: u64, len: usize) -> bool {
        ptr >= self.addr() && ptr.saturating_add(len as u64) <= self.addr() + self.size as u64
    }

    /// Makes `[ptr, ptr + len)` of a reserved region readable and writable (page aligned).
    pub(crate) fn commit(&self, ptr: u64, len: usize) -> bool {
        if !self.contains(ptr, len) {
            return false;
        }
        // SAFETY: the range lies inside our own mapping (checked) and is page aligned (the
        // simulated device's pages are 2 MiB or 20 MiB multiples from a page-aligned mapping).
        unsafe {
            rustix::mm::mprotect(
                ptr as *mut _,
                len,
                MprotectFlags::READ | MprotectFlags::WRITE,
            )
            .is_ok()
        }
    }

    /// Frees the memory of `[ptr, ptr + len)` (`MADV_REMOVE` punches the pages out of the file,
    /// so they read as zero when committed again) and removes access again.
    pub(crate) fn decommit(&self, ptr: u64, len: usize) {
        if !self.contains(ptr, len) {
            return;
        }
        // SAFETY: the range lies inside our own shared mapping and is page aligned; removing the
        // pages discards bytes nobody may use any more (the allocator unmapped them), and
        // PROT_NONE turns stray accesses into faults instead of silent writes.
        unsafe {
            let _ = rustix::mm::madvise(ptr as *mut _, len, rustix::mm::Advice::LinuxRemove);
            let _ = rustix::mm::mprotect(ptr as *mut _, len, MprotectFlags::empty());
        }
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`size` are exactly the mapping made in `create`, unmapped only here; the
        // descriptor closes when `fd` drops right after.
        unsafe {
            let _ = rustix::mm::munmap(self.ptr.cast(), self.size);
        }
    }
}

/// The region kind of a host-backed simulated device's segment (in the memfd name).
pub const SIM_SEGMENT_KIND: &str = "sim-segment";

/// The region kind of a host-backed simulated device's expandable reservation.
pub const SIM_RESERVATION_KIND: &str = "sim-reservation";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_names_carry_kind_and_nonce() {
        let name = memfd_name(SIM_SEGMENT_KIND, 0xab);
        assert_eq!(name, "tensormem:sim-segment:00000000000000ab");
        assert_ne!(nonce(), nonce());
    }
}
