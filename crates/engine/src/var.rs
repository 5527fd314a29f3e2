//! Variables: the per-variable state machine ([`VarQueue`], MXNet's `ThreadedVar`) and the
//! [`Var`] handle (MXNet's `VarHandle`).
//!
//! The state machine is plain data: the engine keeps it behind the variable's lock, and every
//! method returns the ops to dispatch (through `out`) instead of dispatching them, so nothing
//! runs under a variable's lock.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use crate::error::ErrorSlot;
use crate::latch::Latch;
use crate::opr::OpRef;
use crate::sync::{AtomicBool, Mutex, Ordering};

/// A block waiting in a variable's FIFO: an op, or a waiter (`wait_for_var` / `wait_to_write`)
/// that needs no worker.
#[derive(Debug)]
enum Waiting<O, W> {
    Read(O),
    Write(O),
    /// Released like a read, but holds nothing once released.
    WaitRead(W),
    /// Released like a write (after every earlier read and write), holds nothing once released.
    WaitWrite(W),
}

/// What a completion or append releases: an op that now holds this variable, or a waiter to
/// wake.
#[derive(Debug, PartialEq, Eq)]
pub enum Grant<O, W> {
    /// The op now holds the variable (read or write as it asked); decrement its counter.
    Run(O),
    /// A waiter whose wait is over.
    Wake(W),
}

/// The per-variable dependency state machine of MXNet's threaded engine (`ThreadedVar`).
///
/// It keeps a FIFO of waiting blocks, whether a granted write is running, how many granted
/// reads are running, and the version (completed writes). Rules (from the reference):
///
/// - a read is granted at once when no write is running or waiting, else it queues; a read
///   never overtakes a write pushed before it;
/// - a write is granted at once when nothing runs and nothing waits, else it queues;
/// - completing the last running read grants the write at the head of the queue;
/// - completing a write bumps the version, then grants the run of reads up to the next write
///   at once, or that write if no read stands before it.
///
/// `O` is the op type, `W` the waiter type; both are opaque to the machine. Generic so that it
/// can be tested on its own and model-checked under loom.
#[derive(Debug)]
pub struct VarQueue<O, W> {
    queue: VecDeque<Waiting<O, W>>,
    version: u64,
    /// Granted reads still running, or [`WRITE_RUNNING`] while the granted write runs
    /// (MXNet's `num_pending_reads_`, -1 for a running write). Kept to 32 bits, with
    /// `queued_writes`, so that the whole state, its lock and the variable's reference count
    /// share one cache line.
    running: u32,
    queued_writes: u32,
}

/// `VarQueue::running` while a write runs.
const WRITE_RUNNING: u32 = u32::MAX;

impl<O, W> Default for VarQueue<O, W> {
    fn default() -> Self {
        Self::new()
    }
}

impl<O, W> VarQueue<O, W> {
    /// An idle variable at version 0.
    pub fn new() -> Self {
        VarQueue {
            queue: VecDeque::new(),
            version: 0,
            running: 0,
            queued_writes: 0,
        }
    }

    /// Appends a read (MXNet's `AppendReadDependency`). Returns `true` when the read is granted
    /// at once (`make` is not called); otherwise the block `make()` is queued and `false`
    /// returned.
    pub fn append_read(&mut self, make: impl FnOnce() -> O) -> bool {
        if self.running != WRITE_RUNNING && self.queue.is_empty() {
            self.running += 1;
            assert!(self.running != WRITE_RUNNING, "too many running reads");
            true
        } else {
            self.queue.push_back(Waiting::Read(make()));
            false
        }
    }

    /// Appends a write (MXNet's `AppendWriteDependency`). Returns `true` when granted at once.
    pub fn append_write(&mut self, make: impl FnOnce() -> O) -> bool {
        if self.is_idle() {
            self.running = WRITE_RUNNING;
            true
        } else {
            self.queued_writes += 1;
            self.queue.push_back(Waiting::Write(make()));
            false
        }
    }

    /// For `wait_for_var`: returns `true` when no write is running or queued (pending reads do
    /// not block it); otherwise queues `make()` to be woken once every earlier write is done.
    pub fn append_wait_read(&mut self, make: impl FnOnce() -> W) -> bool {
        if self.running != WRITE_RUNNING && self.queued_writes == 0 {
            true
        } else {
            self.queue.push_back(Waiting::WaitRead(make()));
            false
        }
    }

    /// For `wait_to_write`: returns `true` when nothing runs or waits; otherwise queues
    /// `make()` to be woken once every earlier read and write is done.
    pub fn append_wait_write(&mut self, make: impl FnOnce() -> W) -> bool {
        if self.is_idle() {
            true
        } else {
            self.queue.push_back(Waiting::WaitWrite(make()));
            false
        }
    }

    /// A granted read finished (MXNet's `CompleteReadDependency`): appends what it releases to
    /// `out`.
    ///
    /// # Panics
    /// If no read is running (an engine bug).
    pub fn complete_read(&mut self, out: &mut Vec<Grant<O, W>>) {
        assert!(
            self.running != 0 && self.running != WRITE_RUNNING,
            "complete_read without a running read"
        );
        self.running -= 1;
        if self.running == 0 {
            self.grant(out);
        }
    }

    /// The granted write finished (MXNet's `CompleteWriteDependency`): bumps the version and
    /// appends what it releases to `out`.
    ///
    /// # Panics
    /// If no write is running (an engine bug).
    pub fn complete_write(&mut self, out: &mut Vec<Grant<O, W>>) {
        assert!(
            self.running == WRITE_RUNNING,
            "complete_write without a running write"
        );
        self.running = 0;
        self.version += 1;
        self.grant(out);
    }

    /// Releases blocks from the head of the queue while the rules allow.
    fn grant(&mut self, out: &mut Vec<Grant<O, W>>) {
        debug_assert!(self.running != WRITE_RUNNING);
        loop {
            match self.queue.front() {
                None => return,
                Some(Waiting::Read(_)) => {
                    let Some(Waiting::Read(op)) = self.queue.pop_front() else {
                        unreachable!()
                    };
                    self.running += 1;
                    assert!(self.running != WRITE_RUNNING, "too many running reads");
                    out.push(Grant::Run(op));
                }
                Some(Waiting::WaitRead(_)) => {
                    let Some(Waiting::WaitRead(w)) = self.queue.pop_front() else {
                        unreachable!()
                    };
                    out.push(Grant::Wake(w));
                }
                Some(Waiting::Write(_)) => {
                    if self.running == 0 {
                        let Some(Waiting::Write(op)) = self.queue.pop_front() else {
                            unreachable!()
                        };
                        self.queued_writes -= 1;
                        self.running = WRITE_RUNNING;
                        out.push(Grant::Run(op));
                    }
                    return;
                }
                Some(Waiting::WaitWrite(_)) => {
                    if self.running != 0 {
                        return;
                    }
                    let Some(Waiting::WaitWrite(w)) = self.queue.pop_front() else {
                        unreachable!()
                    };
                    out.push(Grant::Wake(w));
                }
            }
        }
    }

    /// Whether nothing runs and nothing waits.
    pub fn is_idle(&self) -> bool {
        self.running == 0 && self.queue.is_empty()
    }

    /// Completed writes so far (MXNet's `VarHandle::version`).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Granted reads still running.
    pub fn running_reads(&self) -> usize {
        if self.running == WRITE_RUNNING {
            0
        } else {
            self.running as usize
        }
    }

    /// Whether the granted write is running.
    pub fn write_running(&self) -> bool {
        self.running == WRITE_RUNNING
    }

    /// Blocks waiting in the FIFO (ops and waiters).
    pub fn queued(&self) -> usize {
        self.queue.len()
    }
}

/// What a variable's lock protects in the engines.
#[derive(Debug)]
pub(crate) struct VarState {
    pub(crate) queue: VarQueue<OpRef, Arc<Latch>>,
}

/// A variable's shared state. The first cache line holds what every push and completion
/// writes (the reference count, the lock and the queue), so that a thread taking over a
/// variable from another core misses on one line only; the rest (read-mostly) lies on the next
/// line, and no two variables share a line.
#[repr(C, align(64))]
pub(crate) struct VarInner {
    /// Handles and ops referring to the variable (`Var` is a hand-made `Arc`).
    refs: std::sync::atomic::AtomicUsize,
    pub(crate) state: Mutex<VarState>,
    pub(crate) id: u64,
    /// The engine that made this variable.
    pub(crate) owner: u64,
    /// Set by `delete_variable` while holding both the engine's push lock and this variable's
    /// lock: single-variable pushes read it under the variable lock, multi-variable pushes
    /// under the push lock.
    pub(crate) deleted: AtomicBool,
    /// A cheap "maybe poisoned" flag, so ops check `error` only when it is set.
    pub(crate) error_hint: AtomicBool,
    /// The failure of the last op that wrote this variable with an error, shared with every
    /// variable it poisoned; empty once delivered. Stored before the write that failed is
    /// completed, so every op that write releases sees it.
    pub(crate) error: Mutex<Option<Arc<ErrorSlot>>>,
}

/// A counted pointer to a [`VarInner`] (an `Arc` whose count lies in the variable's hot
/// cache line: cloning a variable for an op costs no extra cache miss).
pub(crate) struct VarRef(std::ptr::NonNull<VarInner>);

// SAFETY: `VarInner` is `Send + Sync` (atomics and locks); `VarRef` shares it like `Arc`.
unsafe impl Send for VarRef {}
// SAFETY: as above.
unsafe impl Sync for VarRef {}

impl VarRef {
    fn new(inner: VarInner) -> Self {
        VarRef(std::ptr::NonNull::from(Box::leak(Box::new(inner))))
    }

    pub(crate) fn as_ptr(&self) -> *const VarInner {
        self.0.as_ptr()
    }
}

impl std::ops::Deref for VarRef {
    type Target = VarInner;

    fn deref(&self) -> &VarInner {
        // SAFETY: the block lives while a `VarRef` (this one) counts it.
        unsafe { self.0.as_ref() }
    }
}

impl Clone for VarRef {
    fn clone(&self) -> Self {
        // Relaxed as in `Arc::clone`: a new reference comes from an existing one.
        let old = self.refs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        assert!(
            old < isize::MAX as usize,
            "variable reference count overflow"
        );
        VarRef(self.0)
    }
}

impl Drop for VarRef {
    fn drop(&mut self) {
        use std::sync::atomic::{Ordering as O, fence};
        if self.refs.fetch_sub(1, O::Release) != 1 {
            return;
        }
        fence(O::Acquire);
        // SAFETY: this was the last reference; the block came from `Box::leak` in `new`.
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

/// A variable: a unit of dependency tracking (MXNet's `VarHandle` / `Engine::NewVariable`).
///
/// Cheap to clone (a reference count); clones are the same variable. A variable stays alive as
/// long as a handle or a pending op refers to it, so an op can never touch a freed variable.
/// Equality is identity.
#[derive(Clone)]
pub struct Var(pub(crate) VarRef);

impl Var {
    pub(crate) fn new(id: u64, owner: u64) -> Self {
        Var(VarRef::new(VarInner {
            refs: std::sync::atomic::AtomicUsize::new(1),
            state: Mutex::new(VarState {
                queue: VarQueue::new(),
            }),
            id,
            owner,
            deleted: AtomicBool::new(false),
            error_hint: AtomicBool::new(false),
            error: Mutex::new(None),
        }))
    }

    /// A number unique among the variables of the process (for messages and `Debug`).
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// The number of completed writes to this variable (MXNet's `Var::version()`). Reads do
    /// not change it; `delete_variable` counts as a write.
    pub fn version(&self) -> u64 {
        self.0.state.lock().queue.version()
    }

    /// Whether `delete_variable` was called on it.
    pub fn is_deleted(&self) -> bool {
        self.0.deleted.load(Ordering::Acquire)
    }

    /// Whether the variable holds an undelivered error (what `throw` would report).
    pub fn has_error(&self) -> bool {
        if !self.0.error_hint.load(Ordering::Acquire) {
            return false;
        }
        self.0
            .error
            .lock()
            .as_ref()
            .is_some_and(|slot| slot.is_set())
    }

    /// The pending error this variable carries, if any and not yet delivered (without taking
    /// it). Clears a stale reference to a delivered error.
    pub(crate) fn current_error(&self) -> Option<Arc<ErrorSlot>> {
        if !self.0.error_hint.load(Ordering::Acquire) {
            return None;
        }
        let mut error = self.0.error.lock();
        match &*error {
            Some(slot) if slot.is_set() => Some(Arc::clone(slot)),
            _ => {
                *error = None;
                self.0.error_hint.store(false, Ordering::Release);
                None
            }
        }
    }

    /// Takes the variable's undelivered error (delivering it: it is gone for every variable
    /// that shares it).
    pub(crate) fn take_error(&self) -> Option<crate::EngineError> {
        let slot = self.current_error()?;
        slot.take()
    }

    pub(crate) fn ptr_eq(&self, other: &Var) -> bool {
        std::ptr::eq(self.0.as_ptr(), other.0.as_ptr())
    }
}

impl PartialEq for Var {
    fn eq(&self, other: &Self) -> bool {
        self.ptr_eq(other)
    }
}

impl Eq for Var {}

impl std::hash::Hash for Var {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.id.hash(state);
    }
}

impl fmt::Debug for Var {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Var({})", self.0.id)
    }
}

// The hot part (count, lock, queue) fills exactly the first cache line.
#[cfg(not(loom))]
const _: () = assert!(std::mem::offset_of!(VarInner, id) == 64);
