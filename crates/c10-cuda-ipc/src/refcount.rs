//! The reference counters that keep a shared block alive while other processes use it:
//! PyTorch's `CudaIPCRefCountersFile` (a shared-memory file of 10 000 counters),
//! `CudaIPCSentData` (one counter per share), `CudaIPCSentDataLimbo` and `CudaIPCCollect`
//! (`torch.cuda.ipc_collect()`). The rule is in the [crate docs](crate).
//!
//! A counter is one `u64` slot of a `memfd_create` region that the producer maps and each
//! consumer maps too (found through `/proc/<pid>/fd/<fd>`, as segments are); both sides only
//! touch it with atomic operations. As in PyTorch a file's slots are used once each, in order; a
//! file is released when its last shared block has been collected and no new share can use it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use c10_core::Storage;
use parking_lot::Mutex;

use crate::{IpcError, Reader};

/// Counters per file (PyTorch's `CUDA_IPC_REF_COUNTER_FILE_SIZE`).
pub const REF_COUNTER_FILE_SLOTS: u64 = 10_000;

/// Where a consumer returns its reference to a shared block: slot `slot` of the counter file
/// that process `pid` holds open as `fd` (PyTorch's `ref_counter_handle` and
/// `ref_counter_offset`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RefCounterHandle {
    /// The producer's process id.
    pub pid: u32,
    /// The counter file's descriptor in the producer.
    pub fd: i32,
    /// The nonce in the counter file's memfd name.
    pub nonce: u64,
    /// The counter's index in the file.
    pub slot: u64,
}

impl RefCounterHandle {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.pid.to_le_bytes());
        out.extend_from_slice(&self.fd.to_le_bytes());
        out.extend_from_slice(&self.nonce.to_le_bytes());
        out.extend_from_slice(&self.slot.to_le_bytes());
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, IpcError> {
        let handle = RefCounterHandle {
            pid: r.u32("counter pid")?,
            fd: r.i32("counter fd")?,
            nonce: r.u64("counter nonce")?,
            slot: r.u64("counter slot")?,
        };
        if handle.slot >= REF_COUNTER_FILE_SLOTS {
            return Err(IpcError::Malformed(format!(
                "counter slot {} of a file of {REF_COUNTER_FILE_SLOTS}",
                handle.slot
            )));
        }
        Ok(handle)
    }

    fn key(&self) -> (u32, i32, u64) {
        (self.pid, self.fd, self.nonce)
    }
}

/// The memfd kind of counter files.
#[cfg(target_os = "linux")]
const KIND: &str = "refcount";

/// Bytes of one counter file.
#[cfg(target_os = "linux")]
const FILE_BYTES: usize = (REF_COUNTER_FILE_SLOTS as usize) * size_of::<u64>();

/// The counter at `slot` of a mapping that starts at `base`.
///
/// # Safety
/// `base` must be the page-aligned start of a live mapping of a counter file (at least
/// [`REF_COUNTER_FILE_SLOTS`] `u64`s) that stays mapped for `'a`, `slot` below the slot count,
/// and every process must touch the slots only atomically.
#[cfg(target_os = "linux")]
unsafe fn counter_at<'a>(base: u64, slot: u64) -> &'a AtomicU64 {
    // SAFETY: guaranteed by the caller: the address is 8-byte aligned (page-aligned base plus a
    // multiple of 8) and valid for the lifetime; all accesses are atomic.
    unsafe { AtomicU64::from_ptr((base + slot * 8) as *mut u64) }
}

/// One counter file of this process (PyTorch's `CudaIPCRefCountersFile`).
#[cfg(target_os = "linux")]
struct CounterFile {
    region: c10_cuda::shared_memory::SharedRegion,
}

#[cfg(target_os = "linux")]
impl CounterFile {
    fn counter(&self, slot: u64) -> &AtomicU64 {
        // SAFETY: the region is a live counter file as long as `self`, and `slot` comes from
        // our own slot allocation (below the slot count).
        unsafe { counter_at(self.region.addr(), slot) }
    }
}

/// A block shared by this process and what keeps it alive (PyTorch's `CudaIPCSentData`).
struct SentBlock {
    /// Keeps the storage, so its block, allocated.
    _storage: Storage,
    #[cfg(target_os = "linux")]
    file: Arc<CounterFile>,
    slot: u64,
}

impl SentBlock {
    fn counter_value(&self) -> u64 {
        #[cfg(target_os = "linux")]
        return self.file.counter(self.slot).load(Ordering::Acquire);
        #[cfg(not(target_os = "linux"))]
        return 0;
    }
}

/// The file new shares take their counter from, and its next free slot.
#[cfg(target_os = "linux")]
struct Producer {
    current: Option<Arc<CounterFile>>,
    next_slot: u64,
}

#[cfg(target_os = "linux")]
static PRODUCER: Mutex<Producer> = Mutex::new(Producer {
    current: None,
    next_slot: 0,
});

/// Shared blocks waiting for their consumers (PyTorch's `CudaIPCSentDataLimbo`).
static LIMBO: Mutex<Vec<SentBlock>> = Mutex::new(Vec::new());

/// Takes a counter for a new share of `storage`, sets it to 1 and puts the storage in the
/// limbo (PyTorch's `GetNewRefCountedSentData`).
#[cfg(target_os = "linux")]
pub(crate) fn share(storage: Storage) -> Result<RefCounterHandle, IpcError> {
    let mut producer = PRODUCER.lock();
    let file = match &producer.current {
        Some(file) => Arc::clone(file),
        None => {
            let region = c10_cuda::shared_memory::SharedRegion::create(KIND, FILE_BYTES, true)
                .map_err(|e| IpcError::Os {
                    call: "memfd_create (reference counter file)",
                    message: e.to_string(),
                })?;
            let file = Arc::new(CounterFile { region });
            producer.current = Some(Arc::clone(&file));
            producer.next_slot = 0;
            file
        }
    };
    let slot = producer.next_slot;
    producer.next_slot += 1;
    if producer.next_slot == REF_COUNTER_FILE_SLOTS {
        producer.current = None;
    }
    drop(producer);
    file.counter(slot).store(1, Ordering::Release);
    let handle = RefCounterHandle {
        pid: std::process::id(),
        fd: file.region.raw_fd(),
        nonce: file.region.nonce(),
        slot,
    };
    LIMBO.lock().push(SentBlock {
        _storage: storage,
        file,
        slot,
    });
    Ok(handle)
}

/// Unsupported off Linux.
#[cfg(not(target_os = "linux"))]
pub(crate) fn share(_storage: Storage) -> Result<RefCounterHandle, IpcError> {
    Err(IpcError::Unsupported(
        "shared reference counters need Linux (memfd_create)".into(),
    ))
}

/// Releases every shared block whose consumers are all done (counter zero), returning whether
/// any was released: PyTorch's `CudaIPCCollect` (`torch.cuda.ipc_collect()`). The storages are
/// dropped outside the limbo's lock, so their blocks go back to the caching allocator from here.
pub fn ipc_collect() -> bool {
    let released: Vec<SentBlock> = {
        let mut limbo = LIMBO.lock();
        let (done, kept): (Vec<SentBlock>, Vec<SentBlock>) =
            limbo.drain(..).partition(|b| b.counter_value() == 0);
        *limbo = kept;
        done
    };
    let any = !released.is_empty();
    drop(released);
    any
}

/// How many shared blocks this process keeps alive for consumers now (the limbo's size).
pub fn shared_block_count() -> usize {
    LIMBO.lock().len()
}

/// A counter file of another process, mapped here.
#[cfg(target_os = "linux")]
struct RemoteCounterFile {
    key: (u32, i32, u64),
    mapping: crate::remote::RemoteMapping,
}

/// Counter files mapped in this process, by `(pid, fd, nonce)`, held weakly.
#[cfg(target_os = "linux")]
static REMOTE: Mutex<BTreeMap<(u32, i32, u64), Weak<RemoteCounterFile>>> =
    Mutex::new(BTreeMap::new());

/// Counters whose initial reference this process has taken over.
static TAKEN: Mutex<BTreeSet<(u32, i32, u64, u64)>> = Mutex::new(BTreeSet::new());

#[cfg(target_os = "linux")]
impl Drop for RemoteCounterFile {
    fn drop(&mut self) {
        let mut remote = REMOTE.lock();
        if remote
            .get(&self.key)
            .is_some_and(|w| std::ptr::eq(w.as_ptr(), self))
        {
            remote.remove(&self.key);
        }
    }
}

/// One reference to a shared block's counter, held by a consumer's `DataPtr`; returned (the
/// counter decremented) on drop.
pub(crate) struct CounterRef {
    #[cfg(target_os = "linux")]
    file: Arc<RemoteCounterFile>,
    #[cfg(target_os = "linux")]
    slot: u64,
}

impl CounterRef {
    /// Takes a reference for a new `DataPtr` over a counted handle: the first one in this
    /// process takes over the reference the producer set aside; later ones add one.
    ///
    /// # Errors
    /// [`IpcError::Stale`] when the counter file is gone or the counter is already zero (every
    /// consumer finished and the producer may have reused the block).
    #[cfg(target_os = "linux")]
    pub(crate) fn acquire(handle: &RefCounterHandle) -> Result<CounterRef, IpcError> {
        let file = {
            let mut remote = REMOTE.lock();
            match remote.get(&handle.key()).and_then(Weak::upgrade) {
                Some(file) => file,
                None => {
                    let mapping = crate::remote::open_remote(
                        KIND,
                        handle.pid,
                        handle.fd,
                        handle.nonce,
                        FILE_BYTES as u64,
                        0,
                        FILE_BYTES as u64,
                    )
                    .map_err(crate::remote_error)?;
                    let file = Arc::new(RemoteCounterFile {
                        key: handle.key(),
                        mapping,
                    });
                    remote.insert(handle.key(), Arc::downgrade(&file));
                    file
                }
            }
        };
        if handle.slot >= REF_COUNTER_FILE_SLOTS {
            return Err(IpcError::Malformed(format!(
                "counter slot {} of a file of {REF_COUNTER_FILE_SLOTS}",
                handle.slot
            )));
        }
        // SAFETY: the mapping is a whole counter file (its size was checked when it was opened)
        // and lives as long as `file`; the slot is in range (checked just above).
        let counter = unsafe { counter_at(file.mapping.addr(), handle.slot) };
        let taken_key = (handle.pid, handle.fd, handle.nonce, handle.slot);
        let mut taken = TAKEN.lock();
        let stale = || {
            IpcError::Stale(format!(
                "reference counter {} of process {} is zero: its consumers are done and the \
                 block may have been reused",
                handle.slot, handle.pid
            ))
        };
        if taken.contains(&taken_key) {
            counter
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                    (v > 0).then_some(v + 1)
                })
                .map_err(|_| stale())?;
        } else {
            if counter.load(Ordering::Acquire) == 0 {
                return Err(stale());
            }
            taken.insert(taken_key);
        }
        Ok(CounterRef {
            file,
            slot: handle.slot,
        })
    }

    /// Unsupported off Linux.
    #[cfg(not(target_os = "linux"))]
    pub(crate) fn acquire(_handle: &RefCounterHandle) -> Result<CounterRef, IpcError> {
        Err(IpcError::Unsupported(
            "shared reference counters need Linux (memfd_create)".into(),
        ))
    }
}

impl Drop for CounterRef {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: as in `acquire`: `self.file` keeps the counter file mapped, the slot is in
            // range.
            let counter = unsafe { counter_at(self.file.mapping.addr(), self.slot) };
            let _ = counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| v.checked_sub(1));
        }
    }
}
