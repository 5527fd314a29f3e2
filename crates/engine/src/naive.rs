//! The naive engine (MXNet's `NaiveEngine`): every op runs inline in `push`, synchronously, on
//! the pushing thread, under one engine-wide re-entrant lock so that pushes from several
//! threads run one op at a time; errors are returned by the push itself (and therefore never
//! stored on variables). For debugging and as the no-scheduling baseline.

use std::cell::RefCell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use crate::context::Context;
use crate::engine::{DeleteFn, Engine, EngineConfig, EngineKind, FnProperty};
use crate::error::{EngineError, ErrorSlot, OpResult, Result};
use crate::latch::Latch;
use crate::opr::{Completion, CompletionSink, OpRef, Operator, OperatorFn, Task, op_error};
use crate::stream::{RunContext, Stream, StreamKind, StreamProvider};
use crate::sync::{AtomicBool, AtomicUsize, Mutex, Ordering, ReentrantMutex};
use crate::threaded::next_id;
use crate::var::{Grant, Var};

/// The naive engine: runs each op inline in `push`, on the pushing thread (MXNet's
/// `NaiveEngine`).
///
/// `push_async` blocks until the op's [`Completion`] is called (from any thread).
/// `set_bulk_size` is recorded but changes nothing.
///
/// # Threads
///
/// MXNet's naive engine is single-threaded; this one may be used from many threads at once
/// (the [`Engine`] promise). An op runs while its pushing thread holds the engine's one lock,
/// so at most one op body runs at any moment (readers of a variable never run in parallel
/// here): ops pushed from different threads are serialised, each thread's in its push order,
/// and a push blocks while another thread's op runs. A wait (`wait_for_var`, `wait_to_write`,
/// `wait_for_all`) or `stop` from another thread blocks until the op running now is done;
/// nothing else is ever pending.
///
/// An op body may push to the same engine (the nested op runs at once, inline, as in MXNet)
/// and may call its waits, which return at once: its thread holds the lock already. What
/// deadlocks here (and not on the threaded engines, whose pushes never block): an op body
/// that blocks on another thread which pushes to or waits on this engine first, an async op
/// whose completion is called only after such a push or wait, and two threads whose ops on two
/// naive engines push to each other's engine (two locks taken in opposite orders).
pub struct NaiveEngine {
    id: u64,
    /// Held while an op runs (and taken by waits, to wait for the op another thread runs);
    /// it guards one stream per context, taken out while an op uses it (a nested op makes its
    /// own).
    lock: ReentrantMutex<RefCell<Vec<StreamSlot>>>,
    bulk_size: AtomicUsize,
    stopped: AtomicBool,
    provider: Arc<dyn StreamProvider>,
}

impl std::fmt::Debug for NaiveEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NaiveEngine").field("id", &self.id).finish()
    }
}

impl Default for NaiveEngine {
    fn default() -> Self {
        Self::new()
    }
}

/// A context's stream, absent while an op uses it.
type StreamSlot = (Context, Option<Box<dyn Stream>>);

/// Where a naive async op's completion lands.
struct NaiveDone {
    latch: Latch,
    result: Mutex<Option<OpResult>>,
}

impl CompletionSink for NaiveDone {
    fn on_complete(
        self: Arc<Self>,
        _op: OpRef,
        _inherited: Option<Arc<ErrorSlot>>,
        result: OpResult,
    ) {
        *self.result.lock() = Some(result);
        self.latch.set();
    }
}

impl NaiveEngine {
    /// A naive engine with the default stream provider.
    pub fn new() -> Self {
        Self::with_config(&EngineConfig::new(EngineKind::Naive))
    }

    /// A naive engine using `config.streams` (the other settings do not apply).
    pub fn with_config(config: &EngineConfig) -> Self {
        NaiveEngine {
            id: next_id(),
            lock: ReentrantMutex::new(RefCell::new(Vec::new())),
            bulk_size: AtomicUsize::new(config.bulk_size),
            stopped: AtomicBool::new(false),
            provider: Arc::clone(&config.streams),
        }
    }

    fn check(&self, vars: &[Var]) -> Result<()> {
        if self.stopped.load(Ordering::Acquire) {
            return Err(EngineError::Stopped);
        }
        for v in vars {
            if v.0.owner != self.id {
                return Err(EngineError::ForeignVar { var: v.id() });
            }
            if v.0.deleted.load(Ordering::Acquire) {
                return Err(EngineError::VarDeleted { var: v.id() });
            }
        }
        Ok(())
    }

    /// `ctx`'s stream, or a new one while it is in use (by an outer op of this thread).
    fn take_stream(&self, streams: &RefCell<Vec<StreamSlot>>, ctx: Context) -> Box<dyn Stream> {
        let taken = {
            let mut streams = streams.borrow_mut();
            match streams.iter_mut().find(|(c, _)| *c == ctx) {
                Some((_, slot)) => slot.take(),
                None => {
                    streams.push((ctx, None));
                    None
                }
            }
        };
        // The provider runs with no borrow held.
        taken.unwrap_or_else(|| self.provider.new_stream(ctx, StreamKind::Compute))
    }

    fn put_stream(streams: &RefCell<Vec<StreamSlot>>, ctx: Context, stream: Box<dyn Stream>) {
        let mut streams = streams.borrow_mut();
        if let Some((_, slot)) = streams.iter_mut().find(|(c, _)| *c == ctx)
            && slot.is_none()
        {
            *slot = Some(stream);
        }
    }

    /// Runs an op inline and bumps the versions of what it wrote; the caller holds the lock
    /// and lends its streams.
    fn run(&self, streams: &RefCell<Vec<StreamSlot>>, op: OpRef) -> Result<()> {
        let mut stream = self.take_stream(streams, op.ctx);
        let mut rctx = RunContext {
            ctx: op.ctx,
            stream: &mut *stream,
        };
        let result: std::result::Result<(), EngineError> = if op.f.is_async() {
            let done = Arc::new(NaiveDone {
                latch: Latch::new(),
                result: Mutex::new(None),
            });
            let sink: Arc<dyn CompletionSink> = Arc::clone(&done) as Arc<dyn CompletionSink>;
            let completion = Completion::new(Arc::clone(&op), sink, None);
            let _ = catch_unwind(AssertUnwindSafe(|| op.f.call(&mut rctx, Some(completion))));
            done.latch.wait();
            let result = done.result.lock().take().unwrap_or(Ok(()));
            result.map_err(|e| op_error(op.name, e))
        } else {
            match catch_unwind(AssertUnwindSafe(|| op.f.call(&mut rctx, None))) {
                Ok(Ok(())) => rctx.stream.synchronize().map_err(|e| op_error(op.name, e)),
                Ok(Err(e)) => Err(op_error(op.name, e)),
                Err(panic) => Err(EngineError::from_panic(op.name, panic)),
            }
        };
        Self::put_stream(streams, op.ctx, stream);
        let mut none: Vec<Grant<OpRef, Arc<Latch>>> = Vec::new();
        for v in op.writes() {
            let mut st = v.0.state.lock();
            if st.queue.append_write(|| Arc::clone(&op)) {
                st.queue.complete_write(&mut none);
            }
        }
        result
    }
}

impl Engine for NaiveEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Naive
    }

    fn new_variable(&self) -> Var {
        Var::new(next_id(), self.id)
    }

    fn push_task(&self, task: Task) -> Result<()> {
        // The checks run under the lock: a deletion or a stop by another thread is ordered
        // before or after this push, never between its check and its run.
        let streams = self.lock.lock();
        self.check(task.op.vars.as_slice())?;
        self.run(&streams, task.op)
    }

    fn delete_variable(&self, var: &Var, ctx: Context, delete_fn: Option<DeleteFn>) -> Result<()> {
        let streams = self.lock.lock();
        self.check(std::slice::from_ref(var))?;
        var.0.deleted.store(true, Ordering::Release);
        let task = Task::delete_variable(var, ctx, delete_fn);
        self.run(&streams, task.op)
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
            if v.0.owner != self.id {
                return Err(EngineError::ForeignVar { var: v.id() });
            }
        }
        Ok(Operator::new(
            f,
            const_vars,
            mutable_vars,
            prop,
            name,
            self.id,
        ))
    }

    fn push(&self, op: &Operator, ctx: Context, priority: i32) -> Result<()> {
        self.push_task(op.task(ctx, priority)?)
    }

    fn wait_for_var(&self, var: &Var) -> Result<()> {
        self.check_owner(var)?;
        self.wait_running();
        Ok(())
    }

    fn wait_to_write(&self, var: &Var) -> Result<()> {
        self.check_owner(var)?;
        self.wait_running();
        Ok(())
    }

    fn wait_for_all(&self) -> Result<()> {
        self.wait_running();
        Ok(())
    }

    fn throw(&self, var: &Var) -> Result<()> {
        self.check_owner(var)
    }

    fn set_bulk_size(&self, n: usize) -> usize {
        self.bulk_size.swap(n, Ordering::Relaxed)
    }

    fn bulk_size(&self) -> usize {
        self.bulk_size.load(Ordering::Relaxed)
    }

    fn stop(&self) -> Result<()> {
        self.stopped.store(true, Ordering::Release);
        self.wait_running();
        Ok(())
    }

    fn start(&self) {
        self.stopped.store(false, Ordering::Release);
    }

    /// 1 while an op runs (on any thread), else 0. Pushes blocked behind the running op are
    /// not counted: the naive engine takes a push when it runs it.
    fn num_pending(&self) -> usize {
        usize::from(self.lock.is_locked())
    }
}

impl NaiveEngine {
    /// Waits until the op another thread runs now (if any) is done; returns at once inside an
    /// op of this engine (this thread holds the lock already).
    fn wait_running(&self) {
        drop(self.lock.lock());
    }

    fn check_owner(&self, var: &Var) -> Result<()> {
        if var.0.owner == self.id {
            Ok(())
        } else {
            Err(EngineError::ForeignVar { var: var.id() })
        }
    }
}
