//! Bulk execution (MXNet's `BulkStatus` / `BulkAppend` / `BulkFlush`): consecutive sync
//! pushes on one context are merged into one op. Unlike MXNet (per thread), the bulk is per
//! engine behind a lock, so any thread's wait flushes it, and the merged op is pushed while
//! the lock is held, so bulks reach the engine in the order their pushes were made.

use crate::context::Context;
use crate::engine::{FnProperty, PushOptions};
use crate::error::Result;
use crate::opr::{BulkBody, OpRef, Task, VarList};
use crate::sync::{AtomicUsize, Mutex, Ordering};
use crate::var::Var;

struct BulkState {
    ctx: Context,
    ops: Vec<OpRef>,
    writes: Vec<Var>,
    reads: Vec<Var>,
}

/// The pending bulk of an engine.
pub(crate) struct Bulk {
    limit: AtomicUsize,
    state: Mutex<BulkState>,
}

impl Bulk {
    pub(crate) fn new() -> Self {
        Bulk {
            limit: AtomicUsize::new(0),
            state: Mutex::new(BulkState {
                ctx: Context::cpu(),
                ops: Vec::new(),
                writes: Vec::new(),
                reads: Vec::new(),
            }),
        }
    }

    /// The bulk size (0: bulking off).
    pub(crate) fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    /// Sets the bulk size, returning the previous one (flush first).
    pub(crate) fn set_limit(&self, n: usize) -> usize {
        self.limit.swap(n, Ordering::Relaxed)
    }

    /// Adds a sync op; flushes first on a change of context, and after it when the bulk is
    /// full. `push` registers a merged op.
    pub(crate) fn append(&self, op: OpRef, push: impl Fn(OpRef) -> Result<()>) -> Result<()> {
        let mut st = self.state.lock();
        if !st.ops.is_empty() && st.ctx != op.ctx {
            Self::flush_locked(&mut st, &push)?;
        }
        st.ctx = op.ctx;
        st.writes.extend_from_slice(op.writes());
        st.reads.extend_from_slice(op.reads());
        st.ops.push(op);
        let limit = self.limit();
        if limit == 0 || st.ops.len() >= limit {
            Self::flush_locked(&mut st, &push)?;
        }
        Ok(())
    }

    /// Pushes the pending bulk, if any, as one op.
    pub(crate) fn flush(&self, push: impl Fn(OpRef) -> Result<()>) -> Result<()> {
        let mut st = self.state.lock();
        Self::flush_locked(&mut st, &push)
    }

    fn flush_locked(st: &mut BulkState, push: &impl Fn(OpRef) -> Result<()>) -> Result<()> {
        if st.ops.is_empty() {
            return Ok(());
        }
        let ops = std::mem::take(&mut st.ops);
        let (vars, n_writes) = VarList::build(&st.reads, &st.writes);
        st.reads.clear();
        st.writes.clear();
        let opts = PushOptions {
            ctx: st.ctx,
            prop: FnProperty::Normal,
            priority: 0,
            name: "Bulk",
        };
        push(Task::from_parts(BulkBody(ops), vars, n_writes, opts).op)
    }
}
