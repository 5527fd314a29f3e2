//! The shared core of the threaded engines (MXNet's `ThreadedEngine`): registering ops on
//! their variables, executing and completing them (errors, skips, versions), dispatching the
//! ops a completion releases from the completing thread (no scheduler thread), waits, bulk and
//! stop/start. Where ready ops go is the [`Executor`]'s business: worker pools
//! (`worker.rs`, routed by `pooled.rs` or `per_device.rs`) or the caller (`tracker.rs`).

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use crate::bulk::Bulk;
use crate::context::Context;
use crate::engine::{DeleteFn, Engine, EngineConfig, EngineKind, FnProperty};
use crate::error::{EngineError, ErrorList, ErrorSlot, OpResult, Result};
use crate::latch::{Latch, PendingOps};
use crate::opr::{Completion, CompletionSink, OpRef, Operator, OperatorFn, Task, op_error};
use crate::stream::{NoStream, RunContext, Stream};
use crate::sync::{AtomicBool, AtomicUsize, Mutex, Ordering};
use crate::var::{Grant, Var};
use crate::worker::Pools;

/// Where ready ops go.
pub(crate) trait Executor: Send + Sync + 'static {
    /// Refuses contexts the executor cannot serve.
    fn check_ctx(&self, ctx: Context) -> Result<()>;
    /// Hands one ready op over.
    fn dispatch(&self, core: &Arc<Core>, op: OpRef);
    /// Hands ready ops over, draining `ops`.
    fn dispatch_many(&self, core: &Arc<Core>, ops: &mut Vec<OpRef>) {
        for op in ops.drain(..) {
            self.dispatch(core, op);
        }
    }
    /// Stops the workers once their queues are empty; joins them unless `join` is false.
    fn stop(&self, join: bool);
    /// Restarts the workers.
    fn start(&self, core: &Arc<Core>);
}

/// Reusable buffers of one executing thread.
#[derive(Default)]
pub(crate) struct Scratch {
    pub(crate) ready: Vec<OpRef>,
    /// Emptied blocks for the graveyard (workers only).
    pub(crate) dead: Vec<OpRef>,
    grants: Vec<Grant<OpRef, Arc<Latch>>>,
}

impl Scratch {
    /// A worker scratch keeps emptied blocks for the graveyard; others just drop them.
    pub(crate) fn worker() -> Self {
        Scratch {
            dead: Vec::with_capacity(64),
            ..Scratch::default()
        }
    }

    fn retire(&mut self, op: OpRef) {
        if self.dead.capacity() > 0
            && let Some(block) = crate::opr::OprBlock::retire(op)
        {
            self.dead.push(block);
        }
    }
}

crate::sync::thread_local! {
    /// The id of the engine whose op this thread is running (0: none).
    #[allow(clippy::missing_const_for_thread_local)] // loom's macro takes no `const {}`
    static IN_OP: Cell<u64> = Cell::new(0);
}

/// Runs `f` marked as "inside an op of engine `id`".
fn in_op<R>(id: u64, f: impl FnOnce() -> R) -> R {
    let prev = IN_OP.with(|c| c.replace(id));
    let r = f();
    IN_OP.with(|c| c.set(prev));
    r
}

fn inside_op_of(id: u64) -> bool {
    IN_OP.with(|c| c.get() == id)
}

/// A process-wide id source for engines and variables (not part of any loom model).
pub(crate) fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The dependency engine's state shared by pushers, workers and completion handles.
pub(crate) struct Core {
    pub(crate) id: u64,
    pub(crate) kind: EngineKind,
    /// Serialises the registration of multi-variable ops (and deletions), so that the
    /// per-variable FIFOs agree on one order and concurrent pushers cannot build a cycle.
    push_lock: Mutex<()>,
    pub(crate) pending: PendingOps,
    pub(crate) errors: ErrorList,
    stopped: AtomicBool,
    lifecycle: Mutex<()>,
    pub(crate) bulk: Bulk,
    pub(crate) exec: Arc<dyn Executor>,
    /// Op blocks emptied by workers, freed by the next pushing thread (see
    /// `OprBlock::retire`); `graveyard_len` is a hint read without the lock.
    graveyard: Mutex<Vec<OpRef>>,
    graveyard_len: AtomicUsize,
}

/// A pushing thread frees the graveyard once it holds this many blocks.
const GRAVEYARD_DRAIN: usize = 256;

impl Core {
    pub(crate) fn new(kind: EngineKind, exec: Arc<dyn Executor>) -> Arc<Self> {
        Arc::new(Core {
            id: next_id(),
            kind,
            push_lock: Mutex::new(()),
            pending: PendingOps::new(),
            errors: ErrorList::new(),
            stopped: AtomicBool::new(false),
            lifecycle: Mutex::new(()),
            bulk: Bulk::new(),
            exec,
            graveyard: Mutex::new(Vec::new()),
            graveyard_len: AtomicUsize::new(0),
        })
    }

    pub(crate) fn new_var(&self) -> Var {
        Var::new(next_id(), self.id)
    }

    fn check_owner(&self, var: &Var) -> Result<()> {
        if var.0.owner == self.id {
            Ok(())
        } else {
            Err(EngineError::ForeignVar { var: var.id() })
        }
    }

    /// Checks that every variable belongs here and is not deleted (the deleted flag is only
    /// stable under the push lock or the variable's lock: see `register`).
    pub(crate) fn check_vars(&self, vars: &[Var]) -> Result<()> {
        for v in vars {
            self.check_owner(v)?;
            if v.0.deleted.load(Ordering::Acquire) {
                return Err(EngineError::VarDeleted { var: v.id() });
            }
        }
        Ok(())
    }

    /// `push_task`: bulks what can be bulked, flushes the bulk before anything else.
    pub(crate) fn push(self: &Arc<Self>, task: Task) -> Result<()> {
        let op = task.op;
        if self.bulk.limit() > 0 {
            if !op.f.is_async() && op.prop == FnProperty::Normal && op.priority == 0 {
                self.exec.check_ctx(op.ctx)?;
                self.check_vars(op.vars.as_slice())?;
                return self.bulk.append(op, |merged| self.push_now(merged));
            }
            self.flush_bulk()?;
        }
        self.push_now(op)
    }

    pub(crate) fn flush_bulk(self: &Arc<Self>) -> Result<()> {
        self.bulk.flush(|merged| self.push_now(merged))
    }

    /// Moves a worker's emptied blocks to the graveyard.
    pub(crate) fn bury(&self, dead: &mut Vec<OpRef>) {
        if dead.is_empty() {
            return;
        }
        let mut g = self.graveyard.lock();
        g.append(dead);
        self.graveyard_len.store(g.len(), Ordering::Relaxed);
    }

    /// Frees the graveyard on this (pushing) thread.
    fn drain_graveyard(&self) {
        let dead = {
            let Some(mut g) = self.graveyard.try_lock() else {
                return;
            };
            self.graveyard_len.store(0, Ordering::Relaxed);
            std::mem::take(&mut *g)
        };
        drop(dead);
    }

    /// Registers `op` on its variables and dispatches it if it is ready at once.
    pub(crate) fn push_now(self: &Arc<Self>, op: OpRef) -> Result<()> {
        if self.graveyard_len.load(Ordering::Relaxed) >= GRAVEYARD_DRAIN {
            self.drain_graveyard();
        }
        self.exec.check_ctx(op.ctx)?;
        self.pending.add(1);
        if self.stopped.load(Ordering::SeqCst) {
            self.pending.sub(1);
            return Err(EngineError::Stopped);
        }
        let granted = match self.register(&op) {
            Ok(n) => n,
            Err(e) => {
                self.pending.sub(1);
                return Err(e);
            }
        };
        // Release the guard together with the grants made at once.
        if op.release(granted + 1) {
            self.dispatch_from_pusher(op);
        }
        Ok(())
    }

    /// Appends `op` to each of its variables; returns how many granted it at once. Nothing is
    /// appended when an error is returned.
    fn register(&self, op: &OpRef) -> Result<usize> {
        let vars = op.vars.as_slice();
        for v in vars {
            self.check_owner(v)?;
        }
        match vars {
            [] => Ok(0),
            [v] => {
                let mut st = v.0.state.lock();
                if v.0.deleted.load(Ordering::Relaxed) {
                    return Err(EngineError::VarDeleted { var: v.id() });
                }
                let granted = if op.n_writes == 1 {
                    st.queue.append_write(|| Arc::clone(op))
                } else {
                    st.queue.append_read(|| Arc::clone(op))
                };
                Ok(usize::from(granted))
            }
            _ => {
                let _order = self.push_lock.lock();
                for v in vars {
                    if v.0.deleted.load(Ordering::Relaxed) {
                        return Err(EngineError::VarDeleted { var: v.id() });
                    }
                }
                let mut granted = 0;
                for (i, v) in vars.iter().enumerate() {
                    let mut st = v.0.state.lock();
                    let now = if i < op.n_writes {
                        st.queue.append_write(|| Arc::clone(op))
                    } else {
                        st.queue.append_read(|| Arc::clone(op))
                    };
                    granted += usize::from(now);
                }
                Ok(granted)
            }
        }
    }

    /// A ready op seen by a pushing (or completing non-worker) thread: `Async` ops run inline
    /// when ready at push time, everything else goes to the executor.
    fn dispatch_from_pusher(self: &Arc<Self>, op: OpRef) {
        if op.prop == FnProperty::Async {
            let mut scratch = Scratch::default();
            if self.execute(op, &mut NoStream, &mut scratch) {
                self.pending.sub(1);
            }
            self.exec.dispatch_many(self, &mut scratch.ready);
        } else {
            self.exec.dispatch(self, op);
        }
    }

    /// Runs a ready op: skips it when it inherits an error (unless `NoSkip`), else calls its
    /// body under `catch_unwind`. A sync op is completed here (returns `true`; the caller
    /// counts it done in `pending`); an async one when its [`Completion`] is called (returns
    /// `false`). Ops released by the completion are appended to `scratch.ready`.
    pub(crate) fn execute(
        self: &Arc<Self>,
        op: OpRef,
        stream: &mut dyn Stream,
        scratch: &mut Scratch,
    ) -> bool {
        let inherited = op.inherited_error();
        if inherited.is_some() && op.prop != FnProperty::NoSkip {
            self.complete(&op, inherited, scratch);
            scratch.retire(op);
            return true;
        }
        let mut rctx = RunContext {
            ctx: op.ctx,
            stream,
        };
        if op.f.is_async() {
            let sink: Arc<dyn CompletionSink> = Arc::clone(self) as Arc<dyn CompletionSink>;
            let done = Completion::new(Arc::clone(&op), sink, inherited);
            // A panic drops the completion during unwinding, which reports `OpPanicked`.
            let _ = in_op(self.id, || {
                catch_unwind(AssertUnwindSafe(|| op.f.call(&mut rctx, Some(done))))
            });
            false
        } else {
            let outcome = in_op(self.id, || {
                catch_unwind(AssertUnwindSafe(|| op.f.call(&mut rctx, None)))
            });
            let error = match outcome {
                Ok(Ok(())) => match rctx.stream.synchronize() {
                    Ok(()) => None,
                    Err(e) => Some(op_error(op.name, e)),
                },
                Ok(Err(e)) => Some(op_error(op.name, e)),
                Err(panic) => Some(EngineError::from_panic(op.name, panic)),
            };
            let slot = match error {
                Some(e) => Some(self.errors.record(e)),
                None => inherited,
            };
            self.complete(&op, slot, scratch);
            scratch.retire(op);
            true
        }
    }

    /// Releases `op`'s variables (MXNet's `OnComplete`): stores `error` on the variables it
    /// wrote, completes each read and write, wakes released waiters and appends the ops whose
    /// counter reached zero to `scratch.ready`. Never holds two locks; dispatches nothing.
    pub(crate) fn complete(
        &self,
        op: &OpRef,
        error: Option<Arc<ErrorSlot>>,
        scratch: &mut Scratch,
    ) {
        for v in op.writes() {
            if let Some(slot) = &error {
                *v.0.error.lock() = Some(Arc::clone(slot));
                v.0.error_hint.store(true, Ordering::Release);
            }
            v.0.state.lock().queue.complete_write(&mut scratch.grants);
        }
        for v in op.reads() {
            v.0.state.lock().queue.complete_read(&mut scratch.grants);
        }
        for grant in scratch.grants.drain(..) {
            match grant {
                Grant::Run(next) => {
                    if next.release(1) {
                        scratch.ready.push(next);
                    }
                }
                Grant::Wake(latch) => latch.set(),
            }
        }
    }

    fn wait_var(self: &Arc<Self>, var: &Var, write: bool, call: &'static str) -> Result<()> {
        self.check_owner(var)?;
        self.flush_bulk()?;
        if inside_op_of(self.id) {
            return Err(EngineError::WaitInsideOp { call });
        }
        let latch = {
            let mut st = var.0.state.lock();
            let mut made = None;
            let make = || {
                let latch = Arc::new(Latch::new());
                made = Some(Arc::clone(&latch));
                latch
            };
            if write {
                st.queue.append_wait_write(make);
            } else {
                st.queue.append_wait_read(make);
            }
            made
        };
        if let Some(latch) = latch {
            latch.wait();
        }
        match var.take_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    pub(crate) fn wait_for_var(self: &Arc<Self>, var: &Var) -> Result<()> {
        self.wait_var(var, false, "wait_for_var")
    }

    pub(crate) fn wait_to_write(self: &Arc<Self>, var: &Var) -> Result<()> {
        self.wait_var(var, true, "wait_to_write")
    }

    pub(crate) fn wait_for_all(self: &Arc<Self>) -> Result<()> {
        self.flush_bulk()?;
        if inside_op_of(self.id) {
            return Err(EngineError::WaitInsideOp {
                call: "wait_for_all",
            });
        }
        self.pending.wait_zero();
        self.drain_graveyard();
        match self.errors.take_first_and_clear() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    pub(crate) fn throw(&self, var: &Var) -> Result<()> {
        self.check_owner(var)?;
        match var.take_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    pub(crate) fn delete_variable(
        self: &Arc<Self>,
        var: &Var,
        ctx: Context,
        delete_fn: Option<DeleteFn>,
    ) -> Result<()> {
        self.check_owner(var)?;
        self.flush_bulk()?;
        self.exec.check_ctx(ctx)?;
        let op = Task::delete_variable(var, ctx, delete_fn).op;
        self.pending.add(1);
        if self.stopped.load(Ordering::SeqCst) {
            self.pending.sub(1);
            return Err(EngineError::Stopped);
        }
        let granted = {
            let _order = self.push_lock.lock();
            let mut st = var.0.state.lock();
            if var.0.deleted.load(Ordering::Relaxed) {
                drop(st);
                self.pending.sub(1);
                return Err(EngineError::VarDeleted { var: var.id() });
            }
            var.0.deleted.store(true, Ordering::Release);
            st.queue.append_write(|| Arc::clone(&op))
        };
        if op.release(usize::from(granted) + 1) {
            self.dispatch_from_pusher(op);
        }
        Ok(())
    }

    pub(crate) fn stop(self: &Arc<Self>) -> Result<()> {
        if inside_op_of(self.id) {
            return Err(EngineError::WaitInsideOp { call: "stop" });
        }
        self.flush_bulk()?;
        let _life = self.lifecycle.lock();
        self.stopped.store(true, Ordering::SeqCst);
        self.pending.wait_zero();
        self.exec.stop(true);
        Ok(())
    }

    pub(crate) fn start(self: &Arc<Self>) {
        let _life = self.lifecycle.lock();
        if self.stopped.load(Ordering::SeqCst) {
            self.exec.start(self);
            self.stopped.store(false, Ordering::SeqCst);
        }
    }

    /// Final shutdown (engine dropped): drain and join; from inside an op, only signal the
    /// workers to exit once their queues are empty (joining would wait on ourselves).
    pub(crate) fn shutdown(self: &Arc<Self>) {
        if inside_op_of(self.id) {
            self.stopped.store(true, Ordering::SeqCst);
            self.exec.stop(false);
            return;
        }
        let _ = self.flush_bulk();
        let _life = self.lifecycle.lock();
        self.stopped.store(true, Ordering::SeqCst);
        self.pending.wait_zero();
        self.exec.stop(true);
    }
}

impl CompletionSink for Core {
    /// An async op completed (from any thread): release its variables and dispatch what that
    /// releases to the workers.
    fn on_complete(
        self: Arc<Self>,
        op: OpRef,
        inherited: Option<Arc<ErrorSlot>>,
        result: OpResult,
    ) {
        let slot = match result {
            Ok(()) => inherited,
            Err(e) => Some(self.errors.record(op_error(op.name, e))),
        };
        let mut scratch = Scratch::default();
        self.complete(&op, slot, &mut scratch);
        drop(op);
        if !scratch.ready.is_empty() {
            self.exec.dispatch_many(&self, &mut scratch.ready);
        }
        self.pending.sub(1);
    }
}

/// A threaded engine: the pooled one (MXNet's `ThreadedEnginePooled`, `ThreadedEngine`) or the
/// per-device one (MXNet's `ThreadedEnginePerDevice`), by [`EngineConfig::kind`].
///
/// Push returns at once; ops run on worker threads; the thread that completes an op dispatches
/// what it releases. Dropping the engine waits for every pushed op (nothing is lost) and joins
/// the workers; undelivered op failures are dropped then (call `wait_for_all` first to see
/// them).
pub struct ThreadedEngine {
    core: Arc<Core>,
}

impl ThreadedEngine {
    /// Builds the threaded engine `config.kind` names (`Naive` builds the per-device one).
    ///
    /// # Errors
    /// As [`EngineConfig::validate`].
    pub fn new(config: &EngineConfig) -> Result<Self> {
        config.validate()?;
        let (kind, topology): (EngineKind, Box<dyn crate::worker::Topology>) = match config.kind {
            EngineKind::Pooled => (EngineKind::Pooled, Box::new(crate::pooled::PooledTopology)),
            EngineKind::PerDevice | EngineKind::Naive => (
                EngineKind::PerDevice,
                Box::new(crate::per_device::PerDeviceTopology),
            ),
        };
        let pools: Arc<dyn Executor> = Pools::new(topology, config);
        let core = Core::new(kind, pools);
        core.bulk.set_limit(config.bulk_size);
        Ok(ThreadedEngine { core })
    }

    /// The pooled engine with `config`'s worker counts.
    ///
    /// # Errors
    /// As [`EngineConfig::validate`].
    pub fn pooled(config: &EngineConfig) -> Result<Self> {
        let mut config = config.clone();
        config.kind = EngineKind::Pooled;
        Self::new(&config)
    }

    /// The per-device engine with `config`'s worker counts.
    ///
    /// # Errors
    /// As [`EngineConfig::validate`].
    pub fn per_device(config: &EngineConfig) -> Result<Self> {
        let mut config = config.clone();
        config.kind = EngineKind::PerDevice;
        Self::new(&config)
    }
}

impl std::fmt::Debug for ThreadedEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadedEngine")
            .field("kind", &self.core.kind)
            .field("pending", &self.core.pending.get())
            .finish()
    }
}

impl Drop for ThreadedEngine {
    fn drop(&mut self) {
        self.core.shutdown();
    }
}

impl Engine for ThreadedEngine {
    fn kind(&self) -> EngineKind {
        self.core.kind
    }

    fn new_variable(&self) -> Var {
        self.core.new_var()
    }

    fn push_task(&self, task: Task) -> Result<()> {
        self.core.push(task)
    }

    fn delete_variable(&self, var: &Var, ctx: Context, delete_fn: Option<DeleteFn>) -> Result<()> {
        self.core.delete_variable(var, ctx, delete_fn)
    }

    fn new_operator(
        &self,
        f: OperatorFn,
        const_vars: &[Var],
        mutable_vars: &[Var],
        prop: FnProperty,
        name: &'static str,
    ) -> Result<Operator> {
        for v in const_vars.iter().chain(mutable_vars) {
            self.core.check_owner(v)?;
        }
        Ok(Operator::new(
            f,
            const_vars,
            mutable_vars,
            prop,
            name,
            self.core.id,
        ))
    }

    fn push(&self, op: &Operator, ctx: Context, priority: i32) -> Result<()> {
        if op.0.owner != self.core.id {
            let var = op.0.vars.as_slice().first().map_or(0, Var::id);
            return Err(EngineError::ForeignVar { var });
        }
        self.core.push(op.task(ctx, priority)?)
    }

    fn wait_for_var(&self, var: &Var) -> Result<()> {
        self.core.wait_for_var(var)
    }

    fn wait_to_write(&self, var: &Var) -> Result<()> {
        self.core.wait_to_write(var)
    }

    fn wait_for_all(&self) -> Result<()> {
        self.core.wait_for_all()
    }

    fn throw(&self, var: &Var) -> Result<()> {
        self.core.throw(var)
    }

    fn set_bulk_size(&self, n: usize) -> usize {
        let _ = self.core.flush_bulk();
        self.core.bulk.set_limit(n)
    }

    fn bulk_size(&self) -> usize {
        self.core.bulk.limit()
    }

    fn stop(&self) -> Result<()> {
        self.core.stop()
    }

    fn start(&self) {
        self.core.start();
    }

    fn num_pending(&self) -> usize {
        self.core.pending.get()
    }
}
