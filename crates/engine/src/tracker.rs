//! [`Tracker`]: the threaded engines' core without threads. Pushes register ops on their
//! variables exactly as the threaded engines do; ready ops wait in a list until the caller
//! runs them. It is what the loom models drive, and a base for callers that want their own
//! executor (MXNet's `ThreadedEngine` with `PushToExecute` left to the subclass).

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use crate::context::Context;
use crate::engine::EngineKind;
use crate::engine::FnProperty;
use crate::error::Result;
use crate::opr::{OpRef, Task};
use crate::stream::NoStream;
use crate::sync::Mutex;
use crate::threaded::{Core, Executor, Scratch};
use crate::var::Var;

/// The ready list of a [`Tracker`].
struct ReadyList(Mutex<VecDeque<OpRef>>);

impl Executor for ReadyList {
    fn check_ctx(&self, _ctx: Context) -> Result<()> {
        Ok(())
    }

    fn dispatch(&self, _core: &Arc<Core>, op: OpRef) {
        self.0.lock().push_back(op);
    }

    fn stop(&self, _join: bool) {}

    fn start(&self, _core: &Arc<Core>) {}
}

/// An op whose every dependency is granted, taken from a [`Tracker`]; pass it to
/// [`Tracker::run`].
pub struct ReadyOp(OpRef);

impl ReadyOp {
    /// The op's name.
    pub fn name(&self) -> &'static str {
        self.0.name
    }

    /// The op's priority.
    pub fn priority(&self) -> i32 {
        self.0.priority
    }

    /// The op's context.
    pub fn ctx(&self) -> Context {
        self.0.ctx
    }

    /// The op's property.
    pub fn prop(&self) -> FnProperty {
        self.0.prop
    }
}

impl fmt::Debug for ReadyOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The dependency tracker of the threaded engines, with the caller as executor.
///
/// `push` registers a task (exactly the threaded engines' code: counter guard, per-variable
/// FIFOs, push lock, deleted checks); ops that become ready are listed; `pop_ready` + `run`
/// execute one (errors, skips and versions as in the engines) and list the ops its completion
/// releases. `Async` ops ready at push time run inline in `push`, as in the engines. Safe to use
/// from many threads.
pub struct Tracker {
    core: Arc<Core>,
    ready: Arc<ReadyList>,
}

impl Default for Tracker {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Tracker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tracker")
            .field("pending", &self.core.pending.get())
            .finish()
    }
}

impl Tracker {
    /// An empty tracker.
    pub fn new() -> Self {
        let ready = Arc::new(ReadyList(Mutex::new(VecDeque::new())));
        let exec: Arc<dyn Executor> = Arc::clone(&ready) as Arc<dyn Executor>;
        Tracker {
            core: Core::new(EngineKind::PerDevice, exec),
            ready,
        }
    }

    /// A new variable (MXNet's `NewVariable`).
    pub fn new_variable(&self) -> Var {
        self.core.new_var()
    }

    /// Registers `task` (MXNet's `Push`): if it is ready at once it joins the ready list.
    ///
    /// # Errors
    /// As [`crate::Engine::push_task`].
    pub fn push(&self, task: Task) -> Result<()> {
        self.core.push_now(task.op)
    }

    /// Takes the oldest ready op.
    pub fn pop_ready(&self) -> Option<ReadyOp> {
        self.ready.0.lock().pop_front().map(ReadyOp)
    }

    /// Runs a ready op on this thread (with a [`NoStream`]) and completes it; ops it releases
    /// join the ready list. An async op completes when its completion is called.
    pub fn run(&self, op: ReadyOp) {
        let mut scratch = Scratch::default();
        if self.core.execute(op.0, &mut NoStream, &mut scratch) {
            self.core.pending.sub(1);
        }
        self.core.exec.dispatch_many(&self.core, &mut scratch.ready);
    }

    /// Runs ready ops until none is left; returns how many ran.
    pub fn run_all(&self) -> usize {
        let mut n = 0;
        while let Some(op) = self.pop_ready() {
            self.run(op);
            n += 1;
        }
        n
    }

    /// Ops pushed and not completed.
    pub fn pending(&self) -> usize {
        self.core.pending.get()
    }

    /// Reports `var`'s undelivered error (MXNet's `Throw`).
    ///
    /// # Errors
    /// The failure the variable carries, delivered once.
    pub fn throw(&self, var: &Var) -> Result<()> {
        self.core.throw(var)
    }

    /// Deletes `var` after its pending uses, as [`crate::Engine::delete_variable`].
    ///
    /// # Errors
    /// As [`crate::Engine::delete_variable`].
    pub fn delete_variable(&self, var: &Var) -> Result<()> {
        self.core.delete_variable(var, Context::cpu(), None)
    }
}
