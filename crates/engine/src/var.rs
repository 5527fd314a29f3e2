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
    running_reads: usize,
    write_running: bool,
    queued_writes: usize,
    version: u64,
}

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
            running_reads: 0,
            write_running: false,
            queued_writes: 0,
            version: 0,
        }
    }

    /// Appends a read (MXNet's `AppendReadDependency`). Returns `true` when the read is granted
    /// at once (`make` is not called); otherwise the block `make()` is queued and `false`
    /// returned.
    pub fn append_read(&mut self, make: impl FnOnce() -> O) -> bool {
        if !self.write_running && self.queue.is_empty() {
            self.running_reads += 1;
            true
        } else {
            self.queue.push_back(Waiting::Read(make()));
            false
        }
    }

    /// Appends a write (MXNet's `AppendWriteDependency`). Returns `true` when granted at once.
    pub fn append_write(&mut self, make: impl FnOnce() -> O) -> bool {
        if self.is_idle() {
            self.write_running = true;
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
        if !self.write_running && self.queued_writes == 0 {
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
            self.running_reads > 0,
            "complete_read without a running read"
        );
        self.running_reads -= 1;
        if self.running_reads == 0 {
            self.grant(out);
        }
    }

    /// The granted write finished (MXNet's `CompleteWriteDependency`): bumps the version and
    /// appends what it releases to `out`.
    ///
    /// # Panics
    /// If no write is running (an engine bug).
    pub fn complete_write(&mut self, out: &mut Vec<Grant<O, W>>) {
        assert!(self.write_running, "complete_write without a running write");
        self.write_running = false;
        self.version += 1;
        self.grant(out);
    }

    /// Releases blocks from the head of the queue while the rules allow.
    fn grant(&mut self, out: &mut Vec<Grant<O, W>>) {
        debug_assert!(!self.write_running);
        loop {
            match self.queue.front() {
                None => return,
                Some(Waiting::Read(_)) => {
                    let Some(Waiting::Read(op)) = self.queue.pop_front() else {
                        unreachable!()
                    };
                    self.running_reads += 1;
                    out.push(Grant::Run(op));
                }
                Some(Waiting::WaitRead(_)) => {
                    let Some(Waiting::WaitRead(w)) = self.queue.pop_front() else {
                        unreachable!()
                    };
                    out.push(Grant::Wake(w));
                }
                Some(Waiting::Write(_)) => {
                    if self.running_reads == 0 {
                        let Some(Waiting::Write(op)) = self.queue.pop_front() else {
                            unreachable!()
                        };
                        self.queued_writes -= 1;
                        self.write_running = true;
                        out.push(Grant::Run(op));
                    }
                    return;
                }
                Some(Waiting::WaitWrite(_)) => {
                    if self.running_reads > 0 {
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
        !self.write_running && self.running_reads == 0 && self.queue.is_empty()
    }

    /// Completed writes so far (MXNet's `VarHandle::version`).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Granted reads still running.
    pub fn running_reads(&self) -> usize {
        self.running_reads
    }

    /// Whether the granted write is running.
    pub fn write_running(&self) -> bool {
        self.write_running
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
    /// The failure of the last op that wrote this variable with an error, shared with every
    /// variable it poisoned; empty once delivered.
    pub(crate) error: Option<Arc<ErrorSlot>>,
}

pub(crate) struct VarInner {
    pub(crate) id: u64,
    /// The engine that made this variable.
    pub(crate) owner: u64,
    /// Set by `delete_variable` while holding both the engine's push lock and this variable's
    /// lock: single-variable pushes read it under the variable lock, multi-variable pushes
    /// under the push lock.
    pub(crate) deleted: AtomicBool,
    /// A cheap "maybe poisoned" flag, so ops check `state.error` only when it is set.
    pub(crate) error_hint: AtomicBool,
    pub(crate) state: Mutex<VarState>,
}

/// A variable: a unit of dependency tracking (MXNet's `VarHandle` / `Engine::NewVariable`).
///
/// Cheap to clone (a reference count); clones are the same variable. A variable stays alive as
/// long as a handle or a pending op refers to it, so an op can never touch a freed variable.
/// Equality is identity.
#[derive(Clone)]
pub struct Var(pub(crate) Arc<VarInner>);

impl Var {
    pub(crate) fn new(id: u64, owner: u64) -> Self {
        Var(Arc::new(VarInner {
            id,
            owner,
            deleted: AtomicBool::new(false),
            error_hint: AtomicBool::new(false),
            state: Mutex::new(VarState {
                queue: VarQueue::new(),
                error: None,
            }),
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
            .state
            .lock()
            .error
            .as_ref()
            .is_some_and(|slot| slot.is_set())
    }

    /// The pending error this variable carries, if any and not yet delivered (without taking
    /// it). Clears a stale reference to a delivered error.
    pub(crate) fn current_error(&self) -> Option<Arc<ErrorSlot>> {
        if !self.0.error_hint.load(Ordering::Acquire) {
            return None;
        }
        let mut state = self.0.state.lock();
        match &state.error {
            Some(slot) if slot.is_set() => Some(Arc::clone(slot)),
            _ => {
                state.error = None;
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
        Arc::ptr_eq(&self.0, &other.0)
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
