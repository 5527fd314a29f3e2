//! Op blocks (MXNet's `OprBlock` + `ThreadedOpr`): the function, the deduplicated variable
//! lists and the counter guard `reads + writes + 1`; the public [`Task`] (one op ready to
//! push), [`Operator`] (a pre-built op pushed many times) and [`Completion`] (the async
//! completion callback).

use std::fmt;
use std::sync::Arc;

use crate::context::Context;
use crate::engine::{FnProperty, PushOptions};
use crate::error::{EngineError, ErrorSlot, OpResult};
use crate::stream::RunContext;
use crate::sync::{AtomicBool, AtomicUsize, Mutex, Ordering};
use crate::var::Var;

/// A shared reference to an op block.
pub(crate) type OpRef = Arc<OprBlock>;

/// An op body, type-erased.
pub(crate) trait OpFn: Send + Sync + 'static {
    /// Whether the body completes through a [`Completion`] (push_async) rather than by
    /// returning (push_sync).
    fn is_async(&self) -> bool;

    /// Runs the body. A sync body gets `done == None` and returns its result; an async body
    /// gets the completion (and returns `Ok(())`).
    fn call(&self, rctx: &mut RunContext<'_>, done: Option<Completion>) -> OpResult;
}

/// One pushed op (MXNet's `OprBlock`).
///
/// `wait` starts at `vars.len() + 1`: one per variable, released when that variable grants the
/// op, plus the guard released by the pusher once the op is registered on every variable, so a
/// half-registered op can never start. The thread that brings it to zero dispatches the op.
pub(crate) struct OprBlock<F: ?Sized = dyn OpFn> {
    pub(crate) wait: AtomicUsize,
    /// Written variables first (`..n_writes`), then read ones; no duplicates.
    pub(crate) vars: VarList,
    pub(crate) n_writes: usize,
    pub(crate) ctx: Context,
    pub(crate) prop: FnProperty,
    pub(crate) priority: i32,
    pub(crate) name: &'static str,
    pub(crate) f: F,
}

impl OprBlock {
    pub(crate) fn writes(&self) -> &[Var] {
        &self.vars.as_slice()[..self.n_writes]
    }

    pub(crate) fn reads(&self) -> &[Var] {
        &self.vars.as_slice()[self.n_writes..]
    }

    /// Releases `n` counts; `true` when this call brought the counter to zero (the caller
    /// must dispatch the op).
    pub(crate) fn release(&self, n: usize) -> bool {
        let before = self.wait.fetch_sub(n, Ordering::AcqRel);
        debug_assert!(before >= n, "op counter underflow");
        before == n
    }

    /// Called by a worker when it is done with an op: if it holds the last reference, drops the
    /// op's variable references here (their cache lines are hot on this thread) and returns
    /// the emptied block for the pushing thread to free (`Core::graveyard`: the allocator then
    /// frees on the thread that allocated, instead of contending for its arena).
    pub(crate) fn retire(mut op: OpRef) -> Option<OpRef> {
        let block = Arc::get_mut(&mut op)?;
        match &mut block.vars {
            VarList::Own(vs) => vs.clear(),
            VarList::One(_) => block.vars = VarList::None,
            _ => {}
        }
        Some(op)
    }

    /// The first undelivered error on any of the op's variables (written ones first), which
    /// the op inherits (MXNet's check in `ExecuteOprBlock`).
    pub(crate) fn inherited_error(&self) -> Option<Arc<ErrorSlot>> {
        self.vars.as_slice().iter().find_map(Var::current_error)
    }
}

impl fmt::Debug for OprBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OprBlock")
            .field("name", &self.name)
            .field("writes", &self.writes())
            .field("reads", &self.reads())
            .field("prop", &self.prop)
            .field("priority", &self.priority)
            .finish_non_exhaustive()
    }
}

/// An op's variables: one inline (the common case costs no allocation), an owned list (whose
/// references a worker drops in place: see `OprBlock::retire`), or an operator's shared list.
#[derive(Clone)]
pub(crate) enum VarList {
    None,
    One(Var),
    Own(Vec<Var>),
    Shared(Arc<[Var]>),
}

impl VarList {
    pub(crate) fn as_slice(&self) -> &[Var] {
        match self {
            VarList::None => &[],
            VarList::One(v) => std::slice::from_ref(v),
            VarList::Own(vs) => vs,
            VarList::Shared(vs) => vs,
        }
    }

    /// The same list, shareable (for operators pushed many times).
    pub(crate) fn into_shared(self) -> VarList {
        match self {
            VarList::Own(vs) => VarList::Shared(vs.into()),
            other => other,
        }
    }

    /// Deduplicates MXNet-style: a variable in both lists is a write; repeats are dropped.
    /// Returns the list (writes first) and the number of writes.
    pub(crate) fn build(const_vars: &[Var], mutable_vars: &[Var]) -> (VarList, usize) {
        let has_dup = if const_vars.len() + mutable_vars.len() <= 32 {
            let dup_w = mutable_vars
                .iter()
                .enumerate()
                .any(|(i, a)| mutable_vars[..i].iter().any(|b| a.ptr_eq(b)));
            dup_w
                || const_vars.iter().enumerate().any(|(i, a)| {
                    const_vars[..i].iter().any(|b| a.ptr_eq(b))
                        || mutable_vars.iter().any(|b| a.ptr_eq(b))
                })
        } else {
            true
        };
        if !has_dup {
            let n_writes = mutable_vars.len();
            let list = match (mutable_vars, const_vars) {
                ([], []) => VarList::None,
                ([v], []) | ([], [v]) => VarList::One(v.clone()),
                _ => {
                    let mut all = Vec::with_capacity(mutable_vars.len() + const_vars.len());
                    all.extend_from_slice(mutable_vars);
                    all.extend_from_slice(const_vars);
                    VarList::Own(all)
                }
            };
            return (list, n_writes);
        }
        let mut seen =
            std::collections::HashSet::with_capacity(const_vars.len() + mutable_vars.len());
        let mut all: Vec<Var> = Vec::with_capacity(const_vars.len() + mutable_vars.len());
        for v in mutable_vars {
            if seen.insert(v.0.as_ptr()) {
                all.push(v.clone());
            }
        }
        let n_writes = all.len();
        for v in const_vars {
            if seen.insert(v.0.as_ptr()) {
                all.push(v.clone());
            }
        }
        let list = match all.len() {
            0 => VarList::None,
            1 => VarList::One(all.pop().expect("one element")),
            _ => VarList::Own(all),
        };
        (list, n_writes)
    }
}

/// A sync body: `FnOnce`, taken out once.
pub(crate) struct SyncBody<F>(Mutex<Option<F>>);

impl<F> OpFn for SyncBody<F>
where
    F: FnOnce(&mut RunContext<'_>) -> OpResult + Send + 'static,
{
    fn is_async(&self) -> bool {
        false
    }

    fn call(&self, rctx: &mut RunContext<'_>, _done: Option<Completion>) -> OpResult {
        match self.0.lock().take() {
            Some(f) => f(rctx),
            None => Ok(()),
        }
    }
}

/// An async body: `FnOnce`, completes through its [`Completion`].
pub(crate) struct AsyncBody<F>(Mutex<Option<F>>);

impl<F> OpFn for AsyncBody<F>
where
    F: FnOnce(&mut RunContext<'_>, Completion) + Send + 'static,
{
    fn is_async(&self) -> bool {
        true
    }

    fn call(&self, rctx: &mut RunContext<'_>, done: Option<Completion>) -> OpResult {
        let f = self.0.lock().take();
        match (f, done) {
            (Some(f), Some(done)) => f(rctx, done),
            (_, Some(done)) => done.complete(Ok(())),
            _ => {}
        }
        Ok(())
    }
}

/// The body of a pushed [`Operator`].
pub(crate) struct SharedBody(Arc<OperatorInner>);

impl OpFn for SharedBody {
    fn is_async(&self) -> bool {
        true
    }

    fn call(&self, rctx: &mut RunContext<'_>, done: Option<Completion>) -> OpResult {
        if let Some(done) = done {
            (self.0.f)(rctx, done);
        }
        Ok(())
    }
}

/// The body of a bulk: the sync bodies of the bulked pushes, run in push order; the first
/// failure skips the rest.
pub(crate) struct BulkBody(pub(crate) Vec<OpRef>);

impl OpFn for BulkBody {
    fn is_async(&self) -> bool {
        false
    }

    fn call(&self, rctx: &mut RunContext<'_>, _done: Option<Completion>) -> OpResult {
        for op in &self.0 {
            op.f.call(rctx, None)?;
        }
        Ok(())
    }
}

/// The signature of a sync op body (MXNet's `SyncFn`).
pub trait SyncFn: FnOnce(&mut RunContext<'_>) -> OpResult + Send + 'static {}
impl<F: FnOnce(&mut RunContext<'_>) -> OpResult + Send + 'static> SyncFn for F {}

/// The signature of an async op body (MXNet's `AsyncFn`): it must eventually call (or drop)
/// the [`Completion`], from any thread.
pub trait AsyncFn: FnOnce(&mut RunContext<'_>, Completion) + Send + 'static {}
impl<F: FnOnce(&mut RunContext<'_>, Completion) + Send + 'static> AsyncFn for F {}

/// One op ready to be pushed: its body, its deduplicated variables and its options. Built by
/// [`Task::sync`] / [`Task::asynchronous`] (or [`crate::EngineExt::push_sync`] /
/// [`crate::EngineExt::push_async`], which build and push one), pushed with
/// [`crate::Engine::push_task`].
pub struct Task {
    pub(crate) op: OpRef,
}

impl Task {
    fn from_body<F: OpFn>(
        f: F,
        const_vars: &[Var],
        mutable_vars: &[Var],
        opts: PushOptions,
    ) -> Task {
        let (vars, n_writes) = VarList::build(const_vars, mutable_vars);
        Task::from_parts(f, vars, n_writes, opts)
    }

    pub(crate) fn from_parts<F: OpFn>(
        f: F,
        vars: VarList,
        n_writes: usize,
        opts: PushOptions,
    ) -> Task {
        let n = vars.as_slice().len();
        Task {
            op: Arc::new(OprBlock {
                wait: AtomicUsize::new(n + 1),
                vars,
                n_writes,
                ctx: opts.ctx,
                prop: opts.prop,
                priority: opts.priority,
                name: opts.name,
                f,
            }),
        }
    }

    /// The op `delete_variable` pushes (MXNet's `DeleteVariable`): it writes `var`, so it runs
    /// after every earlier use, and calls `delete_fn` (if any) in its run context.
    pub(crate) fn delete_variable(
        var: &Var,
        ctx: crate::context::Context,
        delete_fn: Option<crate::engine::DeleteFn>,
    ) -> Task {
        let opts = PushOptions {
            ctx,
            prop: crate::engine::FnProperty::DeleteVar,
            priority: 0,
            name: "DeleteVariable",
        };
        Task::sync(
            move |rctx: &mut crate::stream::RunContext<'_>| {
                if let Some(f) = delete_fn {
                    f(rctx);
                }
                Ok(())
            },
            &[],
            std::slice::from_ref(var),
            opts,
        )
    }

    /// A synchronous op (MXNet's `PushSync` body): `f` runs on a worker and its return value
    /// is the op's result. A variable in both lists is a write; repeats are ignored.
    pub fn sync<F: SyncFn>(
        f: F,
        const_vars: &[Var],
        mutable_vars: &[Var],
        opts: PushOptions,
    ) -> Task {
        Task::from_body(
            SyncBody(Mutex::new(Some(f))),
            const_vars,
            mutable_vars,
            opts,
        )
    }

    /// An asynchronous op (MXNet's `PushAsync` body): the op holds its variables until `f`'s
    /// [`Completion`] is called or dropped, from any thread.
    pub fn asynchronous<F: AsyncFn>(
        f: F,
        const_vars: &[Var],
        mutable_vars: &[Var],
        opts: PushOptions,
    ) -> Task {
        Task::from_body(
            AsyncBody(Mutex::new(Some(f))),
            const_vars,
            mutable_vars,
            opts,
        )
    }

    /// Whether the body is synchronous (only sync tasks are bulked).
    pub fn is_sync(&self) -> bool {
        !self.op.f.is_async()
    }

    /// The variables the task reads (deduplicated, without those it writes).
    pub fn const_vars(&self) -> &[Var] {
        self.op.reads()
    }

    /// The variables the task writes (deduplicated).
    pub fn mutable_vars(&self) -> &[Var] {
        self.op.writes()
    }
}

impl fmt::Debug for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.op.fmt(f)
    }
}

/// The body of an [`Operator`] (MXNet's `AsyncFn` kept by `NewOperator`).
pub type OperatorFn = Box<dyn Fn(&mut RunContext<'_>, Completion) + Send + Sync + 'static>;

pub(crate) struct OperatorInner {
    pub(crate) f: OperatorFn,
    pub(crate) vars: VarList,
    pub(crate) n_writes: usize,
    pub(crate) prop: FnProperty,
    pub(crate) name: &'static str,
    pub(crate) owner: u64,
    pub(crate) deleted: AtomicBool,
}

/// A pre-built op, pushed many times (MXNet's `OprHandle`, from `NewOperator`). Its variable
/// lists are deduplicated once. Cheap to clone.
#[derive(Clone)]
pub struct Operator(pub(crate) Arc<OperatorInner>);

impl Operator {
    pub(crate) fn new(
        f: OperatorFn,
        const_vars: &[Var],
        mutable_vars: &[Var],
        prop: FnProperty,
        name: &'static str,
        owner: u64,
    ) -> Self {
        let (vars, n_writes) = VarList::build(const_vars, mutable_vars);
        let vars = vars.into_shared();
        Operator(Arc::new(OperatorInner {
            f,
            vars,
            n_writes,
            prop,
            name,
            owner,
            deleted: AtomicBool::new(false),
        }))
    }

    /// The task of one push of this operator.
    pub(crate) fn task(&self, ctx: Context, priority: i32) -> Result<Task, EngineError> {
        if self.0.deleted.load(Ordering::Acquire) {
            return Err(EngineError::OperatorDeleted { op: self.0.name });
        }
        let opts = PushOptions {
            ctx,
            prop: self.0.prop,
            priority,
            name: self.0.name,
        };
        Ok(Task::from_parts(
            SharedBody(Arc::clone(&self.0)),
            self.0.vars.clone(),
            self.0.n_writes,
            opts,
        ))
    }

    /// The operator's name.
    pub fn name(&self) -> &'static str {
        self.0.name
    }

    /// Whether `delete_operator` was called on it.
    pub fn is_deleted(&self) -> bool {
        self.0.deleted.load(Ordering::Acquire)
    }
}

impl fmt::Debug for Operator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Operator")
            .field("name", &self.0.name)
            .field("mutable_vars", &&self.0.vars.as_slice()[..self.0.n_writes])
            .field("const_vars", &&self.0.vars.as_slice()[self.0.n_writes..])
            .finish()
    }
}

/// Where a [`Completion`] reports.
pub(crate) trait CompletionSink: Send + Sync + 'static {
    fn on_complete(self: Arc<Self>, op: OpRef, inherited: Option<Arc<ErrorSlot>>, result: OpResult);
}

/// What a [`Completion`] carries until called: the op, where to report, the inherited error.
type Pending = (OpRef, Arc<dyn CompletionSink>, Option<Arc<ErrorSlot>>);

/// The completion callback of an async op (MXNet's `CallbackOnComplete`).
///
/// Call [`Completion::complete`] exactly once, from any thread, when the op's work is done;
/// the op's variables are released then. Dropping it without calling it completes the op with
/// [`EngineError::CompletionDropped`] (or `OpPanicked` when dropped by a panic), so a lost
/// callback never hangs the engine.
pub struct Completion {
    inner: Option<Pending>,
}

impl Completion {
    pub(crate) fn new(
        op: OpRef,
        sink: Arc<dyn CompletionSink>,
        inherited: Option<Arc<ErrorSlot>>,
    ) -> Self {
        Completion {
            inner: Some((op, sink, inherited)),
        }
    }

    /// Completes the op with `result` (an error is stored on every variable the op writes).
    pub fn complete(mut self, result: OpResult) {
        if let Some((op, sink, inherited)) = self.inner.take() {
            sink.on_complete(op, inherited, result);
        }
    }

    /// Completes the op successfully (MXNet's `on_complete()`).
    pub fn ok(self) {
        self.complete(Ok(()));
    }

    /// The name of the op this completes.
    pub fn op_name(&self) -> &'static str {
        self.inner.as_ref().map_or("", |(op, _, _)| op.name)
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if let Some((op, sink, inherited)) = self.inner.take() {
            let name = op.name;
            let error = if std::thread::panicking() {
                EngineError::OpPanicked {
                    op: name,
                    message: "panicked before completing".to_string(),
                }
            } else {
                EngineError::CompletionDropped { op: name }
            };
            sink.on_complete(op, inherited, Err(Box::new(DeliveredError(error))));
        }
    }
}

impl fmt::Debug for Completion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completion")
            .field("op", &self.op_name())
            .finish()
    }
}

/// An [`EngineError`] travelling through an op's result unchanged (so `CompletionDropped`
/// and caught panics keep their variant instead of becoming `OpFailed`).
#[derive(Debug)]
pub(crate) struct DeliveredError(pub(crate) EngineError);

impl fmt::Display for DeliveredError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for DeliveredError {}

/// Turns an op's failed result into the engine error it reports.
pub(crate) fn op_error(
    op: &'static str,
    error: Box<dyn std::error::Error + Send + Sync>,
) -> EngineError {
    match error.downcast::<DeliveredError>() {
        Ok(delivered) => delivered.0,
        Err(source) => EngineError::OpFailed { op, source },
    }
}
