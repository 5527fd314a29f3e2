//! Sharing device memory between processes: PyTorch's `shareIpcHandle` / `getIpcDevPtr` (the
//! seed's `getIpcDevPtr(std::string handle)`), the per-process cache of opened segments, and the
//! keep-alive of shared blocks (PyTorch's `CudaIPCSentData` and its reference counters).
//!
//! # What a handle names
//!
//! CUDA can only share whole `cudaMalloc` allocations, and the caching allocator hands out blocks
//! *inside* them. So, as PyTorch's `shareIpcHandle` does after `getBaseAllocation`, an
//! [`IpcHandle`] names the **segment** (its [`SegmentHandle`]) and the block's **offset** in it.
//! For a block of an expandable segment it names the pages covering the block (PyTorch 2.6 on,
//! `ExpandableSegment::share`), and the offset is from the first of them.
//!
//! | backend | segment handle | opened with | closed with |
//! |---|---|---|---|
//! | simulated, host-backed, [`SimDevice::with_shareable_memory`] | pid + fd + nonce of the segment's `memfd_create` region (or of the expandable reservation's, with the page range) | `/proc/<pid>/fd/<fd>` checked and mapped `MAP_SHARED` (see the `remote` module) | `munmap` |
//! | CUDA, regular segment | `cuIpcGetMemHandle` of the segment base (64 bytes) | `cuIpcOpenMemHandle` | `cuIpcCloseMemHandle` |
//! | CUDA, expandable segment | pid + one POSIX fd per page (`cuMemExportToShareableHandle`) | `pidfd_getfd`, `cuMemImportFromShareableHandle`, `cuMemMap` | `cuMemUnmap`, `cuMemRelease` |
//!
//! # Opening: the per-process cache ([`IpcFront::open_ipc_handle`])
//!
//! As PyTorch's `getIpcDevPtr` (its `ipcMemHandle_to_devptr` map of `MemHandleCacheEntry`s held
//! by `weak_ptr`): a segment is opened at most once per process. The cache maps each segment
//! handle to a weak reference; every [`DataPtr`] from [`IpcFront::open_ipc_handle`] holds
//! a strong one; when the last is dropped the segment is closed and leaves the cache. So opening
//! the same handle twice maps it once ([`open_segment_count`] stays 1), and a block that PyTorch
//! would reach through a typed storage at an offset we reach through a `DataPtr` at
//! `base + offset`.
//!
//! # Keeping the producer's block alive
//!
//! PyTorch's rule (`torch/multiprocessing/reductions.py`, `StorageSharing.cpp`'s `_share_cuda_`,
//! `CudaIPCTypes.cpp`): sharing a storage replaces its `DataPtr` by a `CudaIPCSentData` that owns
//! the original one and a reference counter in a shared-memory file (`/torch_<pid>_<random>`,
//! 10 000 slots); the counter starts at 1 for the consumer; the consumer's storage decrements it
//! when it dies (a consumer that already had the storage cached decrements at once,
//! `_release_ipc_counter`). When the producer's storage dies while the counter is above zero,
//! the `CudaIPCSentData` waits in a "limbo" list; `CudaIPCCollect` frees the ones whose counter
//! reached zero. It runs on every such death, from `torch.cuda.ipc_collect()`, and as a
//! free-memory callback before the caching allocator asks the device for a new segment.
//!
//! Ours ([`IpcFront::share_storage`]): the same counter file (a `memfd_create` region of
//! 10 000 slots, found as segments are, through `/proc`), the counter starting at 1. A c10-core
//! [`Storage`] cannot swap its `DataPtr`, so instead of replacing it the share puts a strong
//! handle to the storage into the limbo: the block stays allocated while the producer uses it
//! *or* a consumer holds the counter. [`ipc_collect`] (PyTorch's `CudaIPCCollect`) drops the limbo
//! entries whose counter is zero; it runs at every share, when called, and as a free-memory
//! callback of the front that shared. The consumer: the first `DataPtr` a process opens for a
//! counted handle takes over the counter's reference; each further one adds one; each drop
//! subtracts one. A counted handle whose counter is already zero is refused as stale (its block
//! may be reused by now). [`IpcFront::ipc_handle`] alone is the raw `shareIpcHandle`: it
//! keeps nothing alive, and the caller must keep the block allocated while the handle is in use.
//!
//! Memory opened from another process never counts in this process's allocator statistics (as in
//! PyTorch), and synchronising access to shared bytes between the processes is the users' work
//! (PyTorch sends an IPC event along; our host-backed simulated device runs no asynchronous work).
//!
//! [`SimDevice::with_shareable_memory`]: c10_cuda::SimDevice::with_shareable_memory

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Arc, Weak};

use c10_core::{DataPtr, Device, Storage};
use parking_lot::Mutex;
use thiserror::Error;

use c10_cuda::CachingAllocator;
use c10_cuda::Error;
use c10_cuda::device::{DeviceError, DeviceMemory, DevicePtr};
pub use c10_cuda::share_range::ShareRange;
use c10_cuda::shared_memory::{SIM_RESERVATION_KIND, SIM_SEGMENT_KIND};

mod refcount;
#[cfg(target_os = "linux")]
mod remote;
#[cfg(target_os = "linux")]
mod sim;

pub use crate::refcount::{RefCounterHandle, ipc_collect, shared_block_count};

/// The first byte of every encoded handle (PyTorch's `SHAREABLE_HANDLE_VERSION`).
pub const HANDLE_VERSION: u8 = 1;

/// Bytes of a CUDA IPC memory handle (`CU_IPC_HANDLE_SIZE`).
pub const CUDA_IPC_HANDLE_SIZE: usize = 64;

/// The most page descriptors one expandable handle may carry (a sanity bound on decoding).
const MAX_PAGES: usize = 1 << 20;

/// What sharing or opening device memory can fail with. Every bad or stale handle is one of
/// these, never a panic or a crash.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum IpcError {
    /// The bytes are not an encoded handle (truncated, unknown version or kind, trailing bytes,
    /// impossible numbers).
    #[error("malformed IPC handle: {0}")]
    Malformed(String),
    /// The handle was well formed but names memory that is gone or changed: the producer exited
    /// or freed the segment, a descriptor or pid was reused, or a counted handle's counter is
    /// already zero.
    #[error("stale IPC handle: {0}")]
    Stale(String),
    /// This backend, device or kind of memory cannot be shared or opened here.
    #[error("IPC not supported: {0}")]
    Unsupported(String),
    /// The pointer is not an allocated block of this allocator.
    #[error("pointer {ptr:#x} is not an allocated block of any device's caching allocator")]
    UnknownPointer {
        /// The address given.
        ptr: DevicePtr,
    },
    /// A storage that cannot be shared (resizable, empty, or of another device type).
    #[error("cannot share this storage: {0}")]
    Storage(String),
    /// The caching allocator refused (an unknown device index, say).
    #[error(transparent)]
    Allocator(#[from] Error),
    /// A device call failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A system call failed.
    #[error("{call} failed: {message}")]
    Os {
        /// The call.
        call: &'static str,
        /// The system's error text.
        message: String,
    },
}

/// A failure to map another process's region, as an [`IpcError`].
#[cfg(target_os = "linux")]
pub(crate) fn remote_error(e: crate::remote::RemoteError) -> IpcError {
    use crate::remote::RemoteError;
    match e {
        RemoteError::Stale(message) => IpcError::Stale(message),
        RemoteError::Invalid(message) => IpcError::Malformed(message),
        RemoteError::Os { call, errno } => IpcError::Os {
            call,
            message: errno.to_string(),
        },
    }
}

/// Which kind of simulated region a [`SegmentHandle::Sim`] names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SimRegion {
    /// A regular segment: the whole region is the segment.
    Segment,
    /// An expandable segment's reservation: the handle maps a page range of it.
    Reservation,
}

impl SimRegion {
    /// The region kind in the memfd name.
    pub(crate) fn kind(self) -> &'static str {
        match self {
            SimRegion::Segment => SIM_SEGMENT_KIND,
            SimRegion::Reservation => SIM_RESERVATION_KIND,
        }
    }
}

/// The device-specific half of a handle: which memory to open (PyTorch's shareable handle
/// string after its version byte). Two handles with equal segment handles open one mapping.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SegmentHandle {
    /// Host-backed simulated memory in a `memfd_create` region of process `pid` (kind `m` for a
    /// segment, `x` for a page range of an expandable reservation).
    Sim {
        /// Segment or reservation.
        region: SimRegion,
        /// The producer's process id.
        pid: u32,
        /// The region's descriptor in the producer.
        fd: i32,
        /// The nonce in the region's memfd name.
        nonce: u64,
        /// Bytes of the whole region.
        region_size: u64,
        /// Start of the mapped range in the region (page aligned).
        map_offset: u64,
        /// Bytes of the mapped range.
        map_size: u64,
    },
    /// A `cudaMalloc` segment (PyTorch's `SHAREABLE_CUDA_MALLOC`, `c`).
    CudaMalloc {
        /// The `cudaIpcMemHandle_t` bytes of the segment base.
        handle: [u8; CUDA_IPC_HANDLE_SIZE],
        /// Bytes of the segment.
        size: u64,
    },
    /// Pages of an expandable segment (PyTorch's `SHAREABLE_CUDA_EXPANDABLE_SEGMENT`, `e`).
    CudaExpandable {
        /// The producer's process id (for `pidfd_getfd`).
        pid: u32,
        /// Bytes per page.
        page_size: u64,
        /// The producer's POSIX descriptor of each page, in address order.
        fds: Vec<i32>,
    },
}

impl SegmentHandle {
    /// Bytes the opened mapping covers.
    pub fn mapped_size(&self) -> u64 {
        match self {
            SegmentHandle::Sim { map_size, .. } => *map_size,
            SegmentHandle::CudaMalloc { size, .. } => *size,
            SegmentHandle::CudaExpandable { page_size, fds, .. } => {
                page_size.saturating_mul(fds.len() as u64)
            }
        }
    }

    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            SegmentHandle::Sim {
                region,
                pid,
                fd,
                nonce,
                region_size,
                map_offset,
                map_size,
            } => {
                out.push(match region {
                    SimRegion::Segment => b'm',
                    SimRegion::Reservation => b'x',
                });
                out.extend_from_slice(&pid.to_le_bytes());
                out.extend_from_slice(&fd.to_le_bytes());
                out.extend_from_slice(&nonce.to_le_bytes());
                out.extend_from_slice(&region_size.to_le_bytes());
                out.extend_from_slice(&map_offset.to_le_bytes());
                out.extend_from_slice(&map_size.to_le_bytes());
            }
            SegmentHandle::CudaMalloc { handle, size } => {
                out.push(b'c');
                out.extend_from_slice(handle);
                out.extend_from_slice(&size.to_le_bytes());
            }
            SegmentHandle::CudaExpandable {
                pid,
                page_size,
                fds,
            } => {
                out.push(b'e');
                out.extend_from_slice(&pid.to_le_bytes());
                out.extend_from_slice(&page_size.to_le_bytes());
                out.extend_from_slice(&(fds.len() as u32).to_le_bytes());
                for fd in fds {
                    out.extend_from_slice(&fd.to_le_bytes());
                }
            }
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, IpcError> {
        match r.u8("segment kind")? {
            kind @ (b'm' | b'x') => Ok(SegmentHandle::Sim {
                region: if kind == b'm' {
                    SimRegion::Segment
                } else {
                    SimRegion::Reservation
                },
                pid: r.u32("pid")?,
                fd: r.i32("fd")?,
                nonce: r.u64("nonce")?,
                region_size: r.u64("region size")?,
                map_offset: r.u64("map offset")?,
                map_size: r.u64("map size")?,
            }),
            b'c' => {
                let mut handle = [0u8; CUDA_IPC_HANDLE_SIZE];
                handle.copy_from_slice(r.take("cudaIpcMemHandle", CUDA_IPC_HANDLE_SIZE)?);
                Ok(SegmentHandle::CudaMalloc {
                    handle,
                    size: r.u64("segment size")?,
                })
            }
            b'e' => {
                let pid = r.u32("pid")?;
                let page_size = r.u64("page size")?;
                let count = r.u32("page count")? as usize;
                if count == 0 || count > MAX_PAGES {
                    return Err(IpcError::Malformed(format!(
                        "an expandable handle with {count} pages"
                    )));
                }
                let fds = (0..count)
                    .map(|_| r.i32("page fd"))
                    .collect::<Result<_, _>>()?;
                Ok(SegmentHandle::CudaExpandable {
                    pid,
                    page_size,
                    fds,
                })
            }
            other => Err(IpcError::Malformed(format!(
                "unknown segment kind {other:#04x}"
            ))),
        }
    }

    /// The cache key: the encoded segment handle.
    fn key(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }
}

/// A block of one process's caching allocator, as another process can open it (PyTorch's
/// `ShareableHandle {offset, handle}` plus the storage's reference counter). Travels as bytes
/// ([`IpcHandle::to_bytes`], [`IpcHandle::from_bytes`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpcHandle {
    /// The producer's device index (informational: the consumer opens on the device it chooses).
    pub device: u8,
    /// The memory to open.
    pub segment: SegmentHandle,
    /// Bytes from the start of the mapped memory to the block (PyTorch's `offset`).
    pub offset: u64,
    /// Bytes of the block.
    pub size: u64,
    /// Where the consumer returns its reference, for handles from
    /// [`IpcFront::share_storage`]; `None` for raw [`IpcFront::ipc_handle`]s.
    pub ref_counter: Option<RefCounterHandle>,
}

impl IpcHandle {
    /// The handle as bytes: [`HANDLE_VERSION`], the device, offset and size (little endian), the
    /// segment handle (a kind byte and its fields) and the optional reference counter.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = vec![HANDLE_VERSION, self.device];
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        self.segment.encode(&mut out);
        match &self.ref_counter {
            None => out.push(0),
            Some(c) => {
                out.push(1);
                c.encode(&mut out);
            }
        }
        out
    }

    /// Decodes [`IpcHandle::to_bytes`]'s output. Only checks the encoding; whether the memory
    /// still exists is for [`IpcFront::open_ipc_handle`] to find out.
    ///
    /// # Errors
    /// [`IpcError::Malformed`] for truncated input, another version, an unknown kind, trailing
    /// bytes, or a block that does not fit in the memory the handle maps.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, IpcError> {
        let mut r = Reader { bytes, at: 0 };
        let version = r.u8("version")?;
        if version != HANDLE_VERSION {
            return Err(IpcError::Malformed(format!(
                "version {version}, expected {HANDLE_VERSION}"
            )));
        }
        let device = r.u8("device")?;
        let offset = r.u64("offset")?;
        let size = r.u64("size")?;
        let segment = SegmentHandle::decode(&mut r)?;
        let ref_counter = match r.u8("counter flag")? {
            0 => None,
            1 => Some(RefCounterHandle::decode(&mut r)?),
            other => {
                return Err(IpcError::Malformed(format!(
                    "counter flag {other}, expected 0 or 1"
                )));
            }
        };
        if r.at != bytes.len() {
            return Err(IpcError::Malformed(format!(
                "{} trailing bytes",
                bytes.len() - r.at
            )));
        }
        if size == 0
            || offset
                .checked_add(size)
                .is_none_or(|end| end > segment.mapped_size())
        {
            return Err(IpcError::Malformed(format!(
                "a block of {size} bytes at offset {offset} does not fit in the {} bytes the \
                 handle maps",
                segment.mapped_size()
            )));
        }
        Ok(IpcHandle {
            device,
            segment,
            offset,
            size,
            ref_counter,
        })
    }
}

/// A little-endian reader over handle bytes that reports what was missing.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, what: &str, n: usize) -> Result<&'a [u8], IpcError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(IpcError::Malformed(format!(
                "truncated: {what} needs {n} bytes at byte {}, {} left",
                self.at,
                self.bytes.len().saturating_sub(self.at)
            )));
        };
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], IpcError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(what, N)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &str) -> Result<u8, IpcError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, IpcError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn i32(&mut self, what: &str) -> Result<i32, IpcError> {
        Ok(i32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, IpcError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
}

/// Memory of another process opened in this one; dropping it closes it
/// (`cudaIpcCloseMemHandle`, `munmap`, ...).
pub struct OpenedMemory {
    /// The address of the opened memory in this process.
    pub base: DevicePtr,
    /// Bytes opened.
    pub len: usize,
    /// Whether the bytes are host memory this process can read and write (the simulated
    /// device's).
    pub host: bool,
    /// Closes the memory when dropped.
    pub closer: Box<dyn Send + Sync>,
}

/// A device backend whose memory can be shared with another process: PyTorch's
/// `cudaIpcGetMemHandle` / `cudaIpcOpenMemHandle` pair (and the expandable-segment export).
pub trait IpcMemory: DeviceMemory {
    /// What another process needs to open `range`, which this device allocated
    /// (`cudaIpcGetMemHandle` of the segment base; `cuMemExportToShareableHandle` of each page).
    ///
    /// # Errors
    /// [`IpcError::Unsupported`] for memory this backend cannot share; device failures.
    fn export_ipc(&self, range: &ShareRange) -> Result<SegmentHandle, IpcError>;

    /// Opens another process's memory in this device's context (`cudaIpcOpenMemHandle`).
    ///
    /// # Errors
    /// [`IpcError::Stale`] when the memory is gone; [`IpcError::Unsupported`] for a kind this
    /// backend cannot open; device and system failures.
    fn open_ipc(&self, segment: &SegmentHandle) -> Result<OpenedMemory, IpcError>;
}

/// One segment of another process opened in this one (PyTorch's `MemHandleCacheEntry`).
struct OpenSegment {
    key: Vec<u8>,
    memory: Option<OpenedMemory>,
}

/// What the cache knows about an open segment without upgrading its weak reference.
struct CacheEntry {
    segment: Weak<OpenSegment>,
    base: DevicePtr,
    len: usize,
    host: bool,
}

/// The per-process cache of opened segments (PyTorch's `ipcMemHandle_to_devptr`), by segment
/// handle. An entry is present exactly while its segment is mapped.
static OPEN: Mutex<BTreeMap<Vec<u8>, CacheEntry>> = Mutex::new(BTreeMap::new());

impl Drop for OpenSegment {
    fn drop(&mut self) {
        let mut open = OPEN.lock();
        if open
            .get(&self.key)
            .is_some_and(|e| std::ptr::eq(e.segment.as_ptr(), self))
        {
            open.remove(&self.key);
        }
        // Closed under the cache lock: nobody can open the same handle again until it is.
        drop(self.memory.take());
    }
}

/// How many segments of other processes this process has open now (each one once, however many
/// `DataPtr`s use it).
pub fn open_segment_count() -> usize {
    OPEN.lock().len()
}

/// Whether `[ptr, ptr + len)` lies inside host memory opened from another process's simulated
/// device (what aten checks before running CPU kernels on a simulated tensor's bytes).
pub fn is_open_host_range(ptr: DevicePtr, len: usize) -> bool {
    let Some(end) = ptr.checked_add(len as u64) else {
        return false;
    };
    OPEN.lock()
        .values()
        .any(|e| e.host && ptr >= e.base && end <= e.base + e.len as u64)
}

/// Runs `f` if `[ptr, ptr + len)` lies inside memory opened from another process, holding the
/// cache lock so that it stays open meanwhile (`c10-cuda-driver`'s copies to and from it);
/// `None`, without running `f`, when it does not. `f` must take no lock of this crate.
pub fn with_open_range<R>(ptr: DevicePtr, len: usize, f: impl FnOnce() -> R) -> Option<R> {
    let end = ptr.checked_add(len as u64)?;
    let open = OPEN.lock();
    let inside = open
        .values()
        .any(|e| ptr >= e.base && end <= e.base + e.len as u64);
    inside.then(f)
}

/// Serialises openings, so that one handle is opened once even while another thread closes
/// it. Lock order: `OPENING` before the device locks and before `OPEN`; a device lock before
/// `OPEN` (the CUDA backend's copies check [`with_open_range`] under it); nothing is taken under
/// `OPEN` (closing a segment takes no allocator lock).
static OPENING: Mutex<()> = Mutex::new(());

/// Finds `segment` in the cache or opens it with `open` (PyTorch's `getIpcDevPtr`).
fn open_cached(
    segment: &SegmentHandle,
    open: impl FnOnce() -> Result<OpenedMemory, IpcError>,
) -> Result<Arc<OpenSegment>, IpcError> {
    let key = segment.key();
    let _opening = OPENING.lock();
    loop {
        let cache = OPEN.lock();
        match cache.get(&key) {
            Some(entry) => match entry.segment.upgrade() {
                Some(found) => return Ok(found),
                // Its last user is closing it (the entry leaves once it is closed): wait.
                None => {
                    drop(cache);
                    std::thread::yield_now();
                }
            },
            None => break,
        }
    }
    let memory = open()?;
    if memory.len as u64 != segment.mapped_size() {
        return Err(IpcError::Unsupported(format!(
            "the backend opened {} bytes for a handle of {}",
            memory.len,
            segment.mapped_size()
        )));
    }
    let (base, len, host) = (memory.base, memory.len, memory.host);
    let opened = Arc::new(OpenSegment {
        key: key.clone(),
        memory: Some(memory),
    });
    OPEN.lock().insert(
        key,
        CacheEntry {
            segment: Arc::downgrade(&opened),
            base,
            len,
            host,
        },
    );
    Ok(opened)
}

/// What a `DataPtr` from [`IpcFront::open_ipc_handle`] owns.
struct OpenedBlock {
    _segment: Arc<OpenSegment>,
    _counter: Option<crate::refcount::CounterRef>,
}

/// The deleter of opened blocks.
///
/// # Safety
/// `ctx` must come from `Box::into_raw(Box<OpenedBlock>)` and be passed exactly once.
unsafe fn delete_opened(ctx: *mut c_void) {
    // SAFETY: guaranteed by the caller (DataPtr calls its deleter once, with the context made in
    // `open_ipc_handle`).
    drop(unsafe { Box::from_raw(ctx.cast::<OpenedBlock>()) });
}

/// Fronts that have [`ipc_collect`] registered as a free-memory callback.
static COLLECTING: Mutex<Vec<Weak<dyn std::any::Any + Send + Sync>>> = Mutex::new(Vec::new());

/// The IPC calls of the thread-safe front ([`CachingAllocator`]) over a backend that can share
/// its memory: PyTorch's `shareIpcHandle`, `getIpcDevPtr` and `_share_cuda_`. Implemented for
/// every `CachingAllocator<D>` with `D: IpcMemory`; bring it into scope to call them
/// (`use c10_cuda_ipc::IpcFront;`).
pub trait IpcFront {
    /// An IPC handle of the allocated block at `ptr` (PyTorch's `shareIpcHandle`): the segment
    /// (or, in an expandable segment, the pages) holding it and the block's offset. It keeps
    /// nothing alive: the caller must keep the block allocated while the handle is in use, or use
    /// [`IpcFront::share_storage`].
    ///
    /// # Errors
    /// [`IpcError::UnknownPointer`] when `ptr` is not an allocated block;
    /// [`IpcError::Unsupported`] when the backend cannot share it (an address-only or
    /// non-shareable simulated device); device failures.
    fn ipc_handle(&self, ptr: DevicePtr) -> Result<IpcHandle, IpcError>;

    /// Opens a handle from another process on `device` (PyTorch's `getIpcDevPtr`): a
    /// [`DataPtr`] at the block, tagged with `device`. The segment is opened once per process and
    /// closed when the last `DataPtr` over it drops (see the [crate docs](crate)); the bytes do
    /// not count in this allocator's statistics. For a counted handle, this `DataPtr` holds one
    /// reference of the producer's counter until it drops.
    ///
    /// # Errors
    /// [`IpcError::Stale`] when the memory or the counter is gone (or the counter is zero);
    /// [`IpcError::Allocator`] for an unknown device; the backend's errors.
    fn open_ipc_handle(&self, device: u8, handle: &IpcHandle) -> Result<DataPtr, IpcError>;

    /// Shares the block under `storage` with other processes and keeps it alive until they are
    /// done (PyTorch's `_share_cuda_` with `CudaIPCSentData`; see the [crate docs](crate)): the
    /// handle carries a reference counter set to 1, and a strong handle to the storage waits in
    /// the limbo until the counter is back to zero and [`ipc_collect`] runs. Registers
    /// [`ipc_collect`] as a free-memory callback of this front the first time.
    ///
    /// # Errors
    /// [`IpcError::Storage`] for an empty or resizable storage (a resize would free the shared
    /// block) or one on another device type; those of [`IpcFront::ipc_handle`]; a failure
    /// to create the counter file.
    fn share_storage(self: &Arc<Self>, storage: &Storage) -> Result<IpcHandle, IpcError>;
}

impl<D: IpcMemory + 'static> IpcFront for CachingAllocator<D> {
    fn ipc_handle(&self, ptr: DevicePtr) -> Result<IpcHandle, IpcError> {
        for index in self.device_indices() {
            let found = self.with_device(index, |a| {
                let (range, offset, size) = match a.ipc_share_range(ptr) {
                    Ok(found) => found,
                    Err(_) => return None,
                };
                Some(a.device().export_ipc(&range).map(|segment| IpcHandle {
                    device: index,
                    segment,
                    offset,
                    size,
                    ref_counter: None,
                }))
            })?;
            if let Some(handle) = found {
                return handle;
            }
        }
        Err(IpcError::UnknownPointer { ptr })
    }

    fn open_ipc_handle(&self, device: u8, handle: &IpcHandle) -> Result<DataPtr, IpcError> {
        let device_type = self.with_device(device, |a| a.device().device_type())?;
        if handle.size == 0
            || handle
                .offset
                .checked_add(handle.size)
                .is_none_or(|end| end > handle.segment.mapped_size())
        {
            return Err(IpcError::Malformed(format!(
                "a block of {} bytes at offset {} does not fit in the {} bytes the handle maps",
                handle.size,
                handle.offset,
                handle.segment.mapped_size()
            )));
        }
        // The counter first: a stale counted handle must not even map its segment.
        let counter = handle
            .ref_counter
            .as_ref()
            .map(crate::refcount::CounterRef::acquire)
            .transpose()?;
        let segment = open_cached(&handle.segment, || {
            self.with_device(device, |a| a.device().open_ipc(&handle.segment))?
        })?;
        let base = segment.memory.as_ref().map_or(0, |m| m.base);
        let data = (base + handle.offset) as *mut u8;
        let ctx = Box::into_raw(Box::new(OpenedBlock {
            _segment: segment,
            _counter: counter,
        }));
        // SAFETY: `ctx` is a fresh boxed OpenedBlock freed exactly once by `delete_opened`; it
        // keeps the opened segment mapped, and `data` lies `handle.size` bytes inside it
        // (checked above against the mapped size, which the backend confirmed).
        Ok(unsafe {
            DataPtr::new(
                data,
                ctx.cast(),
                Some(delete_opened),
                Device::new(device_type, Some(device)),
            )
        })
    }

    fn share_storage(self: &Arc<Self>, storage: &Storage) -> Result<IpcHandle, IpcError> {
        if storage.nbytes() == 0 || storage.data_ptr().is_null() {
            return Err(IpcError::Storage("it has no bytes".into()));
        }
        if storage.resizable() {
            return Err(IpcError::Storage(
                "it is resizable, and a resize would free the shared block".into(),
            ));
        }
        let ptr = storage.data_ptr() as DevicePtr;
        let mut handle = self.ipc_handle(ptr)?;
        let expected = self.with_device(handle.device, |a| a.device().device_type())?;
        if storage.device_type() != expected {
            return Err(IpcError::Storage(format!(
                "it is on {}, the allocator serves {expected}",
                storage.device_type()
            )));
        }
        register_collect(self);
        ipc_collect();
        handle.ref_counter = Some(crate::refcount::share(storage.clone())?);
        Ok(handle)
    }
}

/// Registers [`ipc_collect`] as a free-memory callback of `front`, once.
fn register_collect<D: IpcMemory + 'static>(front: &Arc<CachingAllocator<D>>) {
    let me: Arc<dyn std::any::Any + Send + Sync> = Arc::<CachingAllocator<D>>::clone(front);
    let mut fronts = COLLECTING.lock();
    fronts.retain(|w| w.strong_count() > 0);
    if fronts
        .iter()
        .any(|w| std::ptr::addr_eq(w.as_ptr(), Arc::as_ptr(&me)))
    {
        return;
    }
    fronts.push(Arc::downgrade(&me));
    drop(fronts);
    front.register_free_memory_callback(Arc::new(ipc_collect));
}
