//! Reopening another process's memfd region (c10-cuda's [`c10_cuda::shared_memory`]): the
//! simulated device's IPC segments and the reference-counter files of shared blocks.
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
//! The regions are sealed against shrinking, so a checked mapping stays backed.

use std::os::fd::{AsFd, AsRawFd};

use c10_cuda::shared_memory::{memfd_name, page_size};
use rustix::fs::{Mode, OFlags};
use rustix::mm::{MapFlags, ProtFlags};

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

// SAFETY: as for c10-cuda's SharedRegion: the mapping is owned by this value and only its address is
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
        assert!(names_region(
            b"/memfd:tensormem:sim-segment:00000000000000ab (deleted)",
            "sim-segment",
            0xab
        ));
        assert!(names_region(
            b"/memfd:tensormem:sim-segment:00000000000000ab",
            "sim-segment",
            0xab
        ));
        assert!(!names_region(
            b"/memfd:tensormem:sim-segment:00000000000000ac (deleted)",
            "sim-segment",
            0xab
        ));
        assert!(!names_region(b"/dev/null", "sim-segment", 0xab));
    }
}
