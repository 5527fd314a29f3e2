//! Host memory another process can map: `memfd_create` regions, named with a random nonce, and
//! their reopening from another process through `/proc/<pid>/fd/<fd>` (the simulated device's
//! IPC segments and the reference-counter files of shared blocks).
//!
//! How a second process finds the bytes: the producer keeps the region's file descriptor open
//! for as long as the region lives; a handle carries `(pid, fd, nonce, size)`. The consumer
//! reads the link `/proc/<pid>/fd/<fd>` and checks that it names *our* memfd with that nonce
//! (`/memfd:tensormem:<kind>:<nonce> (deleted)`), opens it (which reopens the same memory file),
//! checks again through its own `/proc/self/fd/<fd>` link (so the descriptor cannot have changed
//! between the two steps), checks the size, and maps it `MAP_SHARED`. A freed region, an exited
//! producer, a reused descriptor number or a reused pid all fail one of these checks and come
//! back as [`RemoteError`], never as a mapping of the wrong bytes.
//!
//! This needs no channel besides the handle bytes, unlike passing the descriptor over a Unix
//! socket (`SCM_RIGHTS`), at the price of `/proc` and of the same-user rule for opening another
//! process's descriptors (PyTorch's `file_descriptor` CPU sharing strategy passes descriptors over
//! a socket instead; its CUDA expandable segments use `pidfd_getfd`, which the same rule governs).
//!
//! Regions are sealed against shrinking and growing (`F_SEAL_SHRINK | F_SEAL_GROW`), so no
//! process that opened one can truncate it under the others' mappings (which would turn their
//! accesses into `SIGBUS`).

use std::hash::{BuildHasher, Hasher};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{MemfdFlags, Mode, OFlags, SealFlags};
use rustix::mm::{MapFlags, MprotectFlags, ProtFlags};

/// The prefix of every memfd name this crate creates (as `/proc/<pid>/fd/<fd>` shows it, after
/// `/memfd:`).
pub(crate) const NAME_PREFIX: &str = "tensormem:";

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

/// The memfd name of a region of `kind` with `nonce`.
fn memfd_name(kind: &str, nonce: u64) -> String {
    format!("{NAME_PREFIX}{kind}:{nonce:016x}")
}

/// The host page size in bytes.
pub(crate) fn page_size() -> usize {
    rustix::param::page_size()
}

/// One memfd region of this process, mapped `MAP_SHARED` here; unmapped and closed on drop.
#[derive(Debug)]
pub(crate) struct SharedRegion {
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
    /// [`SharedRegion::commit`] opens.
    ///
    /// # Errors
    /// The failing system call's error (`memfd_create`, `ftruncate`, `fcntl`, `mmap`).
    pub(crate) fn create(kind: &str, size: usize, accessible: bool) -> rustix::io::Result<Self> {
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
    pub(crate) fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Bytes of the region.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// The nonce in the region's memfd name.
    pub(crate) fn nonce(&self) -> u64 {
        self.nonce
    }

    /// The descriptor number another process opens through `/proc/<pid>/fd/<fd>`.
    pub(crate) fn raw_fd(&self) -> i32 {
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

/// Why a region of another process could not be mapped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RemoteError {
    /// The process or the descriptor no longer exists, or it is no longer the region the handle
    /// names (freed, descriptor number reused, pid reused): the handle is stale.
    Stale(String),
    /// The handle's numbers cannot describe a mapping (range outside the region, unaligned).
    Invalid(String),
    /// A system call failed for another reason.
    Os {
        /// The call.
        call: &'static str,
        /// Its error.
        errno: rustix::io::Errno,
    },
}

/// A mapping of another process's region (or of part of it); unmapped on drop.
#[derive(Debug)]
pub(crate) struct RemoteMapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: as for SharedRegion: the mapping is owned by this value and only its address is
// exposed; synchronising access to the bytes is the users' business (as with CUDA IPC).
unsafe impl Send for RemoteMapping {}
// SAFETY: `&RemoteMapping` exposes only the address and length.
unsafe impl Sync for RemoteMapping {}

impl RemoteMapping {
    /// The mapping's address in this process.
    pub(crate) fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Bytes mapped.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for RemoteMapping {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `open_remote`, unmapped only here.
        unsafe {
            let _ = rustix::mm::munmap(self.ptr.cast(), self.len);
        }
    }
}

/// Whether a `/proc/.../fd/N` link target names our memfd of `kind` with `nonce`.
fn names_region(target: &[u8], kind: &str, nonce: u64) -> bool {
    let expected = format!("/memfd:{}", memfd_name(kind, nonce));
    target == expected.as_bytes()
        || target.strip_prefix(expected.as_bytes()) == Some(b" (deleted)".as_slice())
}

/// Maps `[offset, offset + len)` of the region of `kind` that process `pid` holds open as `fd`,
/// named with `nonce` and `size` bytes long (see the [module docs](self) for the checks).
/// `offset` must be a multiple of the page size.
///
/// # Errors
/// [`RemoteError::Stale`] when the process, the descriptor or the region is gone or is not the
/// one named; [`RemoteError::Invalid`] for a range outside the region or an unaligned offset;
/// [`RemoteError::Os`] for other failures.
pub(crate) fn open_remote(
    kind: &str,
    pid: u32,
    fd: i32,
    nonce: u64,
    size: u64,
    offset: u64,
    len: u64,
) -> Result<RemoteMapping, RemoteError> {
    if len == 0 || offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(RemoteError::Invalid(format!(
            "range [{offset}, {offset} + {len}) is not inside the region of {size} bytes"
        )));
    }
    if offset % page_size() as u64 != 0 {
        return Err(RemoteError::Invalid(format!(
            "offset {offset} is not a multiple of the page size {}",
            page_size()
        )));
    }
    let len_usize = usize::try_from(len)
        .map_err(|_| RemoteError::Invalid(format!("length {len} does not fit this host")))?;
    if pid == 0 || fd < 0 {
        return Err(RemoteError::Invalid(format!(
            "process {pid} / descriptor {fd} cannot name a region"
        )));
    }
    let path = format!("/proc/{pid}/fd/{fd}");
    let stale = |why: &str| RemoteError::Stale(format!("{path}: {why}"));
    let target = rustix::fs::readlink(path.as_str(), Vec::new())
        .map_err(|e| stale(&format!("cannot read the link ({e})")))?;
    if !names_region(target.as_bytes(), kind, nonce) {
        return Err(stale(&format!(
            "names {:?}, not the {kind} region with nonce {nonce:016x}",
            String::from_utf8_lossy(target.as_bytes())
        )));
    }
    // O_NONBLOCK: should the descriptor have become a FIFO since the check, opening it must not
    // block (on the memfd it changes nothing).
    let file = rustix::fs::open(
        path.as_str(),
        OFlags::RDWR | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| stale(&format!("cannot open it ({e})")))?;
    // The same check on our own descriptor: what we opened is what we checked.
    let own = rustix::fs::readlink(format!("/proc/self/fd/{}", file.as_raw_fd()), Vec::new())
        .map_err(|errno| RemoteError::Os {
            call: "readlink",
            errno,
        })?;
    if !names_region(own.as_bytes(), kind, nonce) {
        return Err(stale("changed while it was opened"));
    }
    let stat = rustix::fs::fstat(&file).map_err(|errno| RemoteError::Os {
        call: "fstat",
        errno,
    })?;
    if stat.st_size as u64 != size {
        return Err(stale(&format!(
            "the region has {} bytes, the handle says {size}",
            stat.st_size
        )));
    }
    // SAFETY: a fresh mapping with a null hint replaces nothing; the file is a sealed memfd of
    // `size` bytes (it cannot shrink, so every page of the checked range stays backed).
    let ptr = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len_usize,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            file.as_fd(),
            offset,
        )
    }
    .map_err(|errno| RemoteError::Os {
        call: "mmap",
        errno,
    })?;
    Ok(RemoteMapping {
        ptr: ptr.cast(),
        len: len_usize,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipc_region_names_carry_kind_and_nonce() {
        let name = memfd_name("sim-segment", 0xab);
        assert_eq!(name, "tensormem:sim-segment:00000000000000ab");
        assert!(names_region(
            b"/memfd:tensormem:sim-segment:00000000000000ab (deleted)",
            "sim-segment",
            0xab
        ));
        assert!(!names_region(
            b"/memfd:tensormem:sim-segment:00000000000000ac (deleted)",
            "sim-segment",
            0xab
        ));
        assert!(!names_region(b"/dev/null", "sim-segment", 0xab));
        assert_ne!(nonce(), nonce());
    }
}
