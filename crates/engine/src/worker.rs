//! Worker pools of the threaded engines: priority task queues with spin-then-sleep, worker
//! threads that each own their streams, and the worker loop, which runs the first op its own
//! completion releases directly (a continuation) and queues the rest, from the completing
//! thread (MXNet's dispatch-on-completion; there is no scheduler thread).
//!
//! Which group an op goes to is a [`Topology`]'s decision (`pooled.rs`, `per_device.rs`).
//! Groups are created, and their threads started, the first time an op is routed to them.

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use crate::context::Context;
use crate::engine::{EngineConfig, FnProperty};
use crate::error::Result;
use crate::opr::OpRef;
use crate::stream::{Stream, StreamKind, StreamProvider};
use crate::sync::{AtomicI64, AtomicUsize, Condvar, Mutex, Ordering, SPIN_ALLOWED};
use crate::threaded::{Core, Executor, Scratch};

/// How many `spin_loop` rounds, then `yield_now` rounds, an idle worker polls before sleeping.
const SPIN_ROUNDS: u32 = 64;
const YIELD_ROUNDS: u32 = 64;
/// A worker publishes its completed-op count to `pending` at least this often.
const FLUSH_EVERY: usize = 256;

/// One worker group's description.
#[derive(Debug, Clone)]
pub(crate) struct GroupSpec {
    pub(crate) name: String,
    pub(crate) threads: usize,
    pub(crate) kind: StreamKind,
}

/// Maps an op's context and property to a worker group ("slot").
pub(crate) trait Topology: Send + Sync + 'static {
    /// Number of slots.
    fn slots(&self) -> usize;
    /// Refuses contexts it cannot route.
    fn check(&self, ctx: Context) -> Result<()>;
    /// The slot of an op (`ctx` already checked).
    fn route(&self, ctx: Context, prop: FnProperty) -> usize;
    /// The group serving `slot`.
    fn spec(&self, slot: usize, config: &EngineConfig) -> GroupSpec;
}

/// Ready ops of one priority, FIFO.
struct Level {
    priority: i32,
    ops: VecDeque<OpRef>,
}

struct QueueState {
    /// Sorted by priority, highest first; empty levels are kept (there are few).
    levels: Vec<Level>,
    len: usize,
    sleepers: usize,
    stop: bool,
}

impl QueueState {
    fn push(&mut self, op: OpRef) {
        let p = op.priority;
        let i = match self.levels.iter().position(|l| l.priority <= p) {
            Some(i) if self.levels[i].priority == p => i,
            Some(i) => {
                self.levels.insert(
                    i,
                    Level {
                        priority: p,
                        ops: VecDeque::new(),
                    },
                );
                i
            }
            None => {
                self.levels.push(Level {
                    priority: p,
                    ops: VecDeque::new(),
                });
                self.levels.len() - 1
            }
        };
        self.levels[i].ops.push_back(op);
        self.len += 1;
    }

    fn pop(&mut self) -> Option<OpRef> {
        if self.len == 0 {
            return None;
        }
        let op = self.levels.iter_mut().find_map(|l| l.ops.pop_front())?;
        self.len -= 1;
        Some(op)
    }

    fn top(&self) -> i64 {
        self.levels
            .iter()
            .find(|l| !l.ops.is_empty())
            .map_or(i64::MIN, |l| i64::from(l.priority))
    }
}

/// A priority task queue shared by the workers of one group.
struct TaskQueue {
    state: Mutex<QueueState>,
    cv: Condvar,
    /// Hints readable without the lock: queued ops, highest queued priority.
    len: AtomicUsize,
    top: AtomicI64,
}

impl TaskQueue {
    fn new() -> Self {
        TaskQueue {
            state: Mutex::new(QueueState {
                levels: Vec::new(),
                len: 0,
                sleepers: 0,
                stop: false,
            }),
            cv: Condvar::new(),
            len: AtomicUsize::new(0),
            top: AtomicI64::new(i64::MIN),
        }
    }

    fn publish(&self, st: &QueueState) {
        self.len.store(st.len, Ordering::Relaxed);
        self.top.store(st.top(), Ordering::Relaxed);
    }

    fn push_many(&self, ops: impl Iterator<Item = OpRef>) {
        let mut st = self.state.lock();
        let mut n = 0;
        for op in ops {
            st.push(op);
            n += 1;
        }
        self.publish(&st);
        let wake = st.sleepers.min(n);
        drop(st);
        for _ in 0..wake {
            self.cv.notify_one();
        }
    }

    fn try_pop(&self) -> Option<OpRef> {
        let mut st = self.state.lock();
        let op = st.pop();
        if op.is_some() {
            self.publish(&st);
        }
        op
    }

    /// The next op; polls a while, then sleeps. Calls `idle` once before polling. `None`
    /// when the group is stopped and the queue is empty.
    fn pop(&self, idle: &mut dyn FnMut()) -> Option<OpRef> {
        if self.len.load(Ordering::Relaxed) > 0
            && let Some(op) = self.try_pop()
        {
            return Some(op);
        }
        idle();
        if SPIN_ALLOWED {
            for round in 0..SPIN_ROUNDS + YIELD_ROUNDS {
                if self.len.load(Ordering::Relaxed) > 0
                    && let Some(op) = self.try_pop()
                {
                    return Some(op);
                }
                if round < SPIN_ROUNDS {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
        let mut st = self.state.lock();
        loop {
            if let Some(op) = st.pop() {
                self.publish(&st);
                return Some(op);
            }
            if st.stop {
                return None;
            }
            st.sleepers += 1;
            st = self.cv.wait(st);
            st.sleepers -= 1;
        }
    }

    fn set_stop(&self, stop: bool) {
        let mut st = self.state.lock();
        st.stop = stop;
        drop(st);
        self.cv.notify_all();
    }
}

/// One worker group: a queue and its threads.
pub(crate) struct Group {
    slot: usize,
    spec: GroupSpec,
    queue: TaskQueue,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// The worker pools of a threaded engine: one lazily created group per slot of the topology.
pub(crate) struct Pools {
    me: std::sync::Weak<Pools>,
    topology: Box<dyn Topology>,
    config: EngineConfig,
    streams: Arc<dyn StreamProvider>,
    groups: Box<[OnceLock<Arc<Group>>]>,
    /// Serialises group creation with stop/start; `true` while workers should run.
    running: Mutex<bool>,
}

impl Pools {
    pub(crate) fn new(topology: Box<dyn Topology>, config: &EngineConfig) -> Arc<Self> {
        let groups = (0..topology.slots()).map(|_| OnceLock::new()).collect();
        Arc::new_cyclic(|me| Pools {
            me: me.clone(),
            topology,
            streams: Arc::clone(&config.streams),
            config: config.clone(),
            groups,
            running: Mutex::new(true),
        })
    }

    fn group(&self, core: &Arc<Core>, slot: usize) -> &Arc<Group> {
        self.groups[slot].get_or_init(|| {
            let running = self.running.lock();
            let group = Arc::new(Group {
                slot,
                spec: self.topology.spec(slot, &self.config),
                queue: TaskQueue::new(),
                threads: Mutex::new(Vec::new()),
            });
            if *running {
                self.spawn(core, &group);
            } else {
                group.queue.set_stop(true);
            }
            group
        })
    }

    fn spawn(&self, core: &Arc<Core>, group: &Arc<Group>) {
        let Some(me) = self.me.upgrade() else { return };
        let mut threads = group.threads.lock();
        for i in threads.len()..group.spec.threads {
            let (core, pools, g) = (Arc::clone(core), Arc::clone(&me), Arc::clone(group));
            let handle = std::thread::Builder::new()
                .name(format!("engine-{}-{i}", group.spec.name))
                .spawn(move || worker_main(&core, &pools, &g))
                .expect("spawning an engine worker thread");
            threads.push(handle);
        }
    }

    /// Picks the continuation out of `ready`: the first op routed to `group` that the queue
    /// holds nothing more urgent than.
    fn take_continuation(&self, group: &Group, ready: &mut Vec<OpRef>) -> Option<OpRef> {
        let top = group.queue.top.load(Ordering::Relaxed);
        let i = ready.iter().position(|op| {
            i64::from(op.priority) >= top && self.topology.route(op.ctx, op.prop) == group.slot
        })?;
        Some(ready.remove(i))
    }
}

impl Executor for Pools {
    fn check_ctx(&self, ctx: Context) -> Result<()> {
        self.topology.check(ctx)
    }

    fn dispatch(&self, core: &Arc<Core>, op: OpRef) {
        let slot = self.topology.route(op.ctx, op.prop);
        self.group(core, slot).queue.push_many(std::iter::once(op));
    }

    fn dispatch_many(&self, core: &Arc<Core>, ops: &mut Vec<OpRef>) {
        while !ops.is_empty() {
            let slot = self.topology.route(ops[0].ctx, ops[0].prop);
            let same = ops
                .iter()
                .take_while(|op| self.topology.route(op.ctx, op.prop) == slot)
                .count();
            self.group(core, slot).queue.push_many(ops.drain(..same));
        }
    }

    fn stop(&self, join: bool) {
        let mut running = self.running.lock();
        *running = false;
        let me = std::thread::current().id();
        for group in self.groups.iter().filter_map(OnceLock::get) {
            group.queue.set_stop(true);
            if join {
                let handles = std::mem::take(&mut *group.threads.lock());
                for h in handles {
                    if h.thread().id() != me {
                        let _ = h.join();
                    }
                }
            }
        }
    }

    fn start(&self, core: &Arc<Core>) {
        let mut running = self.running.lock();
        *running = true;
        for group in self.groups.iter().filter_map(OnceLock::get) {
            group.queue.set_stop(false);
            self.spawn(core, group);
        }
    }
}

/// A worker's stream for `ctx`, created on first use on this thread.
fn stream_for<'a>(
    streams: &'a mut Vec<(Context, Box<dyn Stream>)>,
    provider: &dyn StreamProvider,
    ctx: Context,
    kind: StreamKind,
) -> &'a mut dyn Stream {
    let i = match streams.iter().position(|(c, _)| *c == ctx) {
        Some(i) => i,
        None => {
            streams.push((ctx, provider.new_stream(ctx, kind)));
            streams.len() - 1
        }
    };
    &mut *streams[i].1
}

fn worker_main(core: &Arc<Core>, pools: &Arc<Pools>, group: &Arc<Group>) {
    let mut scratch = Scratch::worker();
    let mut streams: Vec<(Context, Box<dyn Stream>)> = Vec::new();
    let mut done = 0usize;
    let mut next: Option<OpRef> = None;
    loop {
        let op = match next.take() {
            Some(op) => op,
            None => {
                let popped = group.queue.pop(&mut || {
                    core.bury(&mut scratch.dead);
                    core.pending.sub(done);
                    done = 0;
                });
                match popped {
                    Some(op) => op,
                    None => break,
                }
            }
        };
        let stream = stream_for(&mut streams, &*pools.streams, op.ctx, group.spec.kind);
        if core.execute(op, stream, &mut scratch) {
            if scratch.dead.len() >= 64 {
                core.bury(&mut scratch.dead);
            }
            done += 1;
            if done >= FLUSH_EVERY {
                core.pending.sub(done);
                done = 0;
            }
        }
        if !scratch.ready.is_empty() {
            next = pools.take_continuation(group, &mut scratch.ready);
            if !scratch.ready.is_empty() {
                pools.dispatch_many(core, &mut scratch.ready);
            }
        }
    }
    core.bury(&mut scratch.dead);
    core.pending.sub(done);
}
