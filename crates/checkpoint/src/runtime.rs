//! The DTR runtime core, generic over the [`Backend`] that owns storages and runs operators.
//!
//! It follows the rules of the paper's prototype and of simrd's runtime "V2 eager optimized"
//! (the paper's simulator configuration):
//! - an operator call locks its inputs' storages, rematerializes undefined inputs (recursively,
//!   with an explicit stack, so chains of thousands of evicted tensors need no deep recursion),
//!   makes room for its fresh outputs under the hard budget, runs, and unlocks;
//! - storages (alias pools) are the unit of eviction; an evicted storage's tensors all become
//!   undefined, and a view must rerun its (cheap) view op once its storage is back;
//! - a multi-output call recomputes all outputs; outputs already in memory are computed again
//!   and discarded (they count toward memory during the run, as in simrd);
//! - constants and pinned storages are locked for good; locked storages are never evicted;
//! - when a storage's last external reference dies it is evicted at once (eager eviction), or
//!   freed for good (banishing), or kept ([`ReleasePolicy`]);
//! - released and evicted tensors stay in the graph: they can be recomputed and they count in
//!   e* and in the equivalence classes.

use std::io::Write;

use crate::backend::{Backend, RunRequest};
use crate::device_budget::Strategy;
use crate::error::{Error, Result};
use crate::estar::EStar;
use crate::graph::{NONE, Op, OpId, Storage, StorageId, StorageState, Tensor, TensorId};
use crate::heuristic::{Heuristic, SplitMix64};
use crate::log_writer::LogWriter;
use crate::profile::Profile;
use crate::union_find::UnionFind;

/// What happens when a storage's last external reference dies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ReleasePolicy {
    /// Evict it at once; it stays in the graph and can be recomputed (the paper's eager
    /// eviction; simrd's `RuntimeV2Eager*`). The default.
    #[default]
    Eager,
    /// Free it for good once no evicted tensor depends on it, and pin its children, which can
    /// no longer be recomputed (simrd's banishing, `RuntimeV1`; also constants are freed).
    Banish,
    /// Leave it in memory until the heuristic evicts it (simrd's plain `RuntimeV2`).
    Keep,
}

/// Settings of a [`Runtime`].
#[derive(Clone, Debug)]
pub struct Config {
    /// The hard budget in bytes (`None`: unlimited). Memory never exceeds it.
    pub budget: Option<u64>,
    /// The eviction heuristic.
    pub heuristic: Heuristic,
    /// Scan about sqrt(n) random candidates instead of the whole pool (the prototype's
    /// `toggle_sampling`; off in simrd).
    pub sampling: bool,
    /// Skip storages under 1% of the average storage size in the search (the prototype's
    /// `toggle_ignore_small_tensors`; off in simrd).
    pub ignore_small_tensors: bool,
    /// What a release that drops the last reference does.
    pub release: ReleasePolicy,
    /// Stop with [`Error::Thrashing`] once rematerialization compute exceeds this many ns
    /// (simrd's `remat_limit`).
    pub remat_limit_ns: Option<u64>,
    /// Refuse in-place updates of tensors whose storage has other live tensors (the
    /// prototype's rule; the simulator of logs does not refuse).
    pub refuse_aliased_mutation: bool,
    /// Seed of the random choices (sampling, the random heuristic).
    pub seed: u64,
    /// How to make room when a backend with a device-memory budget misses
    /// ([`crate::device_budget`]; default [`Strategy::WindowMoveAll`]); unused otherwise.
    pub strategy: Strategy,
    /// In-place updates keep the address under a device budget: a mutated storage whose only
    /// reference is the one being moved hands its bytes to the new version (and is evicted:
    /// it can be recomputed) instead of the new version allocating a copy.
    pub in_place: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            budget: None,
            heuristic: Heuristic::DtrEq,
            sampling: false,
            ignore_small_tensors: false,
            release: ReleasePolicy::Eager,
            remat_limit_ns: None,
            refuse_aliased_mutation: true,
            seed: 0x5eed,
            strategy: Strategy::default(),
            in_place: false,
        }
    }
}

/// One output of an operator call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputSpec {
    /// Bytes of its fresh storage (ignored for an alias).
    pub bytes: u64,
    /// `Some(i)`: a view sharing the storage of input `i`.
    pub alias: Option<usize>,
}

impl OutputSpec {
    /// An output with a fresh storage of `bytes`.
    pub fn fresh(bytes: u64) -> Self {
        OutputSpec { bytes, alias: None }
    }

    /// An output sharing the storage of input `index`.
    pub fn alias_of(index: usize) -> Self {
        OutputSpec {
            bytes: 0,
            alias: Some(index),
        }
    }
}

/// An operator call to record and run.
#[derive(Clone, Copy, Debug)]
pub struct OpSpec<'a> {
    /// The operator's cost in ns if known (the log's TIME), else 0: the backend's first run
    /// measures it.
    pub cost: u64,
    /// Input tensors.
    pub args: &'a [TensorId],
    /// Outputs.
    pub outputs: &'a [OutputSpec],
}

/// The outputs of one call: consecutive tensor ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outputs {
    first: u32,
    count: u32,
}

impl Outputs {
    /// Number of outputs.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Whether the call has no outputs.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Output `i`.
    ///
    /// # Panics
    /// When `i` is out of range.
    pub fn get(&self, i: usize) -> TensorId {
        assert!(i < self.count as usize, "output {i} of {}", self.count);
        TensorId(self.first + i as u32)
    }

    /// All outputs in order.
    pub fn iter(&self) -> impl Iterator<Item = TensorId> + use<> {
        let first = self.first;
        (first..first + self.count).map(TensorId)
    }
}

/// Why a storage leaves memory (for the counters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EvictReason {
    Heuristic,
    Eager,
}

/// A pending materialization on the explicit stack.
#[derive(Clone, Copy, Debug)]
struct Frame {
    tensor: TensorId,
    remat: bool,
    /// Undefined inputs (snapshot) in `pending[undef_start..undef_end]`.
    undef_start: u32,
    undef_end: u32,
    /// Next undefined input to handle.
    next: u32,
    /// Locks this frame holds: `lock_stack[lock_start..]` (for unwinding on errors).
    lock_start: u32,
}

/// The DTR runtime: graph, pool, budget, heuristic and counters over a [`Backend`].
pub struct Runtime<B: Backend> {
    pub(crate) backend: B,
    pub(crate) config: Config,
    pub(crate) ops: Vec<Op>,
    pub(crate) tensors: Vec<Tensor>,
    pub(crate) storages: Vec<Storage>,
    /// The eviction pool: material, unlocked, unpinned storages (unordered; `pool_seq` keeps
    /// the order simrd's list would have).
    pub(crate) pool: Vec<StorageId>,
    pub(crate) pool_seq: u64,
    pub(crate) eq: UnionFind,
    /// Per storage, its union-find node while it counts as an evicted neighbour for
    /// h_DTR^eq (evicted or pending, with a class), else `NONE`: [`Storage::eq_node`] and
    /// [`Storage::state`] folded into one compact array, so that scoring a storage reads 4
    /// bytes per neighbour instead of the neighbour's whole record. Kept in step by
    /// [`Runtime::sync_eq_live`] at every change of either field.
    pub(crate) eq_live: Vec<u32>,
    /// Per storage, how many entries of its neighbour lists (parents and children) have an
    /// `eq_live` node: 0 lets h_DTR^eq score it by its own compute without reading the lists.
    /// Exact because every edge is pushed to both lists or to neither (see
    /// [`Runtime::record`]).
    pub(crate) eq_nbrs: Vec<u32>,
    pub(crate) estar: EStar,
    /// Simulated time in ns: 1 + all compute so far, rematerialization included (simrd's
    /// `clock`).
    pub(crate) clock: u64,
    /// Bytes in memory (material storages plus duplicates during a run).
    pub(crate) memory: u64,
    pub(crate) profile: Profile,
    pub(crate) rng: SplitMix64,
    /// Sum and count of fresh storage sizes (for the small-tensor filter).
    pub(crate) size_sum: u128,
    pub(crate) size_count: u64,
    pub(crate) log: Option<LogWriter<Box<dyn Write + Send>>>,
    frames: Vec<Frame>,
    pending: Vec<TensorId>,
    lock_stack: Vec<StorageId>,
    scratch_dups: Vec<TensorId>,
    scratch_new: Vec<TensorId>,
    scratch_storages: Vec<StorageId>,
    scratch_outs: Vec<TensorId>,
    scratch_out_storages: Vec<StorageId>,
    pub(crate) scratch_roots: Vec<u32>,
    /// Window costs by storage index during a plan (NaN: not evictable).
    pub(crate) room_costs: Vec<f64>,
    pub(crate) room_victims: Vec<StorageId>,
    /// Move plans made for the allocation being served (the moving strategies try a few,
    /// then evict).
    pub(crate) room_moves: u32,
    /// Whether the current allocation has spent its one last-resort move plan (copies that may
    /// take new segments, when nothing is left to evict).
    pub(crate) room_last_resort: bool,
    /// Bytes of the next large-pool request known to follow ([`Runtime::set_ahead`]).
    pub(crate) ahead: u64,
    /// In-place updates being run: (new storage, old storage whose bytes it takes).
    in_place: Vec<(StorageId, StorageId)>,
}

impl<B: Backend> Runtime<B> {
    /// A runtime with `config` over `backend`.
    pub fn new(backend: B, config: Config) -> Self {
        let rng = SplitMix64::new(config.seed);
        let estar = EStar::new(config.heuristic.uses_estar());
        Runtime {
            backend,
            config,
            ops: Vec::new(),
            tensors: Vec::new(),
            storages: Vec::new(),
            pool: Vec::new(),
            pool_seq: 0,
            eq: UnionFind::new(),
            eq_live: Vec::new(),
            eq_nbrs: Vec::new(),
            estar,
            clock: 1,
            memory: 0,
            profile: Profile::default(),
            rng,
            size_sum: 0,
            size_count: 0,
            log: None,
            frames: Vec::new(),
            pending: Vec::new(),
            lock_stack: Vec::new(),
            scratch_dups: Vec::new(),
            scratch_new: Vec::new(),
            scratch_storages: Vec::new(),
            scratch_outs: Vec::new(),
            scratch_out_storages: Vec::new(),
            scratch_roots: Vec::new(),
            room_costs: Vec::new(),
            room_victims: Vec::new(),
            room_moves: 0,
            room_last_resort: false,
            ahead: 0,
            in_place: Vec::new(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backend, mutably.
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// Consumes the runtime and returns its backend.
    pub fn into_backend(self) -> B {
        self.backend
    }

    /// The counters.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// Bytes in memory now.
    pub fn memory_bytes(&self) -> u64 {
        self.memory
    }

    /// The bytes of the large-pool request known to follow the program's next call (a replayed
    /// log's look-ahead, [`crate::Strategy::WindowMoveAhead`]; under that strategy the
    /// simulator sets it before every event, under the others it never sets it); 0 when
    /// unknown or when a free may come first. Other strategies ignore it.
    pub fn set_ahead(&mut self, bytes: u64) {
        self.ahead = bytes;
    }

    /// Simulated time in ns: 1 + all compute so far (simrd's `clock`).
    pub fn clock(&self) -> u64 {
        self.clock
    }

    /// Number of tensors ever created.
    pub fn tensor_count(&self) -> usize {
        self.tensors.len()
    }

    /// Number of storages ever created.
    pub fn storage_count(&self) -> usize {
        self.storages.len()
    }

    /// Number of storages that can be evicted now.
    pub fn pool_len(&self) -> usize {
        self.pool.len()
    }

    /// The storage of `t`.
    ///
    /// # Errors
    /// [`Error::UnknownTensor`].
    pub fn storage_of(&self, t: TensorId) -> Result<StorageId> {
        Ok(self.tensor(t)?.storage)
    }

    /// Whether `t`'s value is in memory.
    ///
    /// # Errors
    /// [`Error::UnknownTensor`].
    pub fn is_defined(&self, t: TensorId) -> Result<bool> {
        Ok(self.tensor(t)?.defined)
    }

    /// The state of `s`, or `None` for an unknown id.
    pub fn storage_state(&self, s: StorageId) -> Option<StorageState> {
        self.storages.get(s.index()).map(|x| x.state)
    }

    /// Bytes of `s`, or `None` for an unknown id.
    pub fn storage_bytes(&self, s: StorageId) -> Option<u64> {
        self.storages.get(s.index()).map(|x| x.size)
    }

    /// Whether `t` is a view sharing an existing storage.
    ///
    /// # Errors
    /// [`Error::UnknownTensor`].
    pub fn is_alias(&self, t: TensorId) -> Result<bool> {
        Ok(self.tensor(t)?.is_alias)
    }

    /// External references of `t`.
    ///
    /// # Errors
    /// [`Error::UnknownTensor`].
    pub fn ext_refs(&self, t: TensorId) -> Result<u32> {
        Ok(self.tensor(t)?.ext_refs)
    }

    pub(crate) fn tensor(&self, t: TensorId) -> Result<&Tensor> {
        self.tensors.get(t.index()).ok_or(Error::UnknownTensor(t))
    }

    // ----------------------------------------------------------------------------------------
    // Recording calls.

    /// Records the call `spec` and runs it (rematerializing evicted inputs, evicting under the
    /// budget first). Each output starts with one external reference.
    ///
    /// # Errors
    /// [`Error::NoOutputs`], [`Error::UnknownTensor`] or [`Error::BadAlias`] for a malformed
    /// call (nothing recorded);
    /// [`Error::OutOfMemory`], [`Error::Thrashing`], [`Error::Banished`] or
    /// [`Error::Backend`] when running fails (the call stays recorded but not computed).
    pub fn compute(&mut self, spec: OpSpec<'_>) -> Result<Outputs> {
        if spec.outputs.is_empty() {
            return Err(Error::NoOutputs);
        }
        for &a in spec.args {
            self.tensor(a)?;
        }
        for (i, o) in spec.outputs.iter().enumerate() {
            if let Some(index) = o.alias {
                if index >= spec.args.len() {
                    return Err(Error::BadAlias {
                        output: i,
                        index,
                        args: spec.args.len(),
                    });
                }
            }
        }
        let outputs = self.record(spec);
        self.materialize(outputs.get(0), false)?;
        for t in outputs.iter() {
            let s = self.tensors[t.index()].storage;
            self.storages[s.index()].last_access = self.clock;
        }
        Ok(outputs)
    }

    /// Adds the call and its outputs to the graph (all pending).
    fn record(&mut self, spec: OpSpec<'_>) -> Outputs {
        let op = OpId(self.ops.len() as u32);
        let first = self.tensors.len() as u32;
        let uses_eq = self.config.heuristic.uses_eq_classes();
        let mut total = 0u64;
        for o in spec.outputs {
            let storage = match o.alias {
                Some(i) => self.tensors[spec.args[i].index()].storage,
                None => {
                    let s = StorageId(self.storages.len() as u32);
                    let mut st = Storage::new(o.bytes);
                    if uses_eq {
                        // simrd gives a new storage a class of value 0 before it is computed.
                        st.eq_node = self.eq.make(0);
                    }
                    self.storages.push(st);
                    self.eq_live.push(NONE);
                    self.eq_nbrs.push(0);
                    self.sync_eq_live(s);
                    self.estar.grow(self.storages.len());
                    self.size_sum += o.bytes as u128;
                    self.size_count += 1;
                    // Saturating: `run_op` refuses a call whose bytes pass u64::MAX.
                    total = total.saturating_add(o.bytes);
                    s
                }
            };
            let t = TensorId(self.tensors.len() as u32);
            self.tensors.push(Tensor {
                op,
                storage,
                size: if o.alias.is_some() { 0 } else { o.bytes },
                defined: false,
                is_alias: o.alias.is_some(),
                ext_refs: 1,
            });
            let st = &mut self.storages[storage.index()];
            st.tensors.push(t);
            st.ext_refs += 1;
            if st.last_op != op.0 {
                st.last_op = op.0;
                st.compute += spec.cost;
                if st.state == StorageState::Evicted && self.estar.enabled() {
                    // A view of an evicted storage: regions holding it now cost more.
                    self.estar.on_state_change(storage);
                }
            }
        }
        self.ops.push(Op {
            cost: spec.cost,
            args: spec.args.to_vec(),
            first_output: first,
            outputs: spec.outputs.len() as u32,
            total_size: total,
        });
        // Storage-level edges, and the banishing counts of the new (undefined) tensors.
        let banish = self.config.release == ReleasePolicy::Banish;
        for k in 0..spec.outputs.len() {
            let so = self.tensors[first as usize + k].storage;
            for &a in spec.args {
                let sa = self.tensors[a.index()].storage;
                if sa == so {
                    continue;
                }
                // Both lists or neither, so that each storage appears in the other's lists
                // as often as the other appears in its own (`eq_nbrs` counts on it); the
                // duplicates this keeps are harmless, as every user dedups or marks visits.
                let known = crate::graph::has_recent(&self.storages[so.index()].parents, sa)
                    && crate::graph::has_recent(&self.storages[sa.index()].children, so);
                if !known {
                    self.storages[so.index()].parents.push(sa);
                    self.storages[sa.index()].children.push(so);
                    if self.eq_live[sa.index()] != NONE {
                        self.eq_nbrs[so.index()] += 1;
                    }
                    if self.eq_live[so.index()] != NONE {
                        self.eq_nbrs[sa.index()] += 1;
                    }
                }
                if self.estar.enabled() {
                    self.estar.on_edge(&self.storages, so, sa);
                }
            }
            if banish {
                self.adjust_undefined_children(TensorId(first + k as u32), 1);
            }
        }
        Outputs {
            first,
            count: spec.outputs.len() as u32,
        }
    }

    /// A checkpointed constant of `bytes` (an input or a weight): computed at no cost,
    /// counted in memory, pinned (never evicted). One external reference.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when it does not fit; [`Error::Backend`].
    pub fn constant(&mut self, bytes: u64) -> Result<TensorId> {
        let outs = self.compute(OpSpec {
            cost: 0,
            args: &[],
            outputs: &[OutputSpec::fresh(bytes)],
        })?;
        let t = outs.get(0);
        let s = self.tensors[t.index()].storage;
        self.storages[s.index()].constant = true;
        self.profile.constant_bytes = self.profile.constant_bytes.saturating_add(bytes);
        self.pin(t)?;
        Ok(t)
    }

    /// An in-place call (copy-on-write): each `mutated` input gets a new version, a fresh
    /// storage of the input's storage size computed from all `args`; the caller's reference
    /// moves from the old version to the new one (the old one is released). Returns the new
    /// versions in `mutated` order.
    ///
    /// # Errors
    /// [`Error::AliasedMutation`] when [`Config::refuse_aliased_mutation`] is on and another
    /// tensor with external references shares a mutated input's storage; [`Error::BadAlias`]
    /// for an index out of range; as [`Runtime::compute`] otherwise.
    pub fn mutate(&mut self, cost: u64, args: &[TensorId], mutated: &[usize]) -> Result<Outputs> {
        let mut outputs = Vec::with_capacity(mutated.len());
        for (i, &m) in mutated.iter().enumerate() {
            let Some(&a) = args.get(m) else {
                return Err(Error::BadAlias {
                    output: i,
                    index: m,
                    args: args.len(),
                });
            };
            let s = self.tensor(a)?.storage;
            if self.config.refuse_aliased_mutation {
                let live = self.storages[s.index()]
                    .tensors
                    .iter()
                    .filter(|&&u| u != a && self.tensors[u.index()].ext_refs > 0)
                    .count();
                if live > 0 {
                    return Err(Error::AliasedMutation {
                        tensor: a,
                        storage: s,
                        live_aliases: live,
                    });
                }
            }
            outputs.push(OutputSpec::fresh(self.storages[s.index()].size));
        }
        let in_place = self.config.in_place
            && self.config.release == ReleasePolicy::Eager
            && self.backend.device_capacity().is_some();
        let first_new = self.storages.len() as u32;
        if in_place {
            for (k, &m) in mutated.iter().enumerate() {
                let (a, s) = (args[m], self.tensors[args[m].index()].storage);
                let st = &self.storages[s.index()];
                // Only when the old version dies with this move and nothing else holds it.
                let sole = st.ext_refs == 1 && self.tensors[a.index()].ext_refs == 1;
                let dup = mutated[..k]
                    .iter()
                    .any(|&p| self.tensors[args[p].index()].storage == s);
                if sole && !dup && !st.pinned && !st.constant {
                    self.in_place.push((StorageId(first_new + k as u32), s));
                }
            }
        }
        let outs = self.compute(OpSpec {
            cost,
            args,
            outputs: &outputs,
        });
        self.in_place.clear();
        let outs = outs?;
        for &m in mutated {
            self.release(args[m])?;
        }
        Ok(outs)
    }

    /// Adds an external reference to `t` (a copy of the handle; simrd's `get`).
    ///
    /// # Errors
    /// [`Error::UnknownTensor`]; [`Error::NoReference`] when its storage has no reference left.
    pub fn get(&mut self, t: TensorId) -> Result<()> {
        let s = self.tensor(t)?.storage;
        if self.storages[s.index()].ext_refs == 0 {
            return Err(Error::NoReference(t));
        }
        self.tensors[t.index()].ext_refs += 1;
        self.storages[s.index()].ext_refs += 1;
        Ok(())
    }

    /// Drops an external reference to `t`. When its storage has none left it is evicted at
    /// once, banished or kept, as [`Config::release`] says.
    ///
    /// # Errors
    /// [`Error::UnknownTensor`]; [`Error::NoReference`] when `t` has no reference to drop;
    /// [`Error::Backend`] when freeing fails.
    pub fn release(&mut self, t: TensorId) -> Result<()> {
        let s = self.tensor(t)?.storage;
        if self.tensors[t.index()].ext_refs == 0 {
            return Err(Error::NoReference(t));
        }
        self.tensors[t.index()].ext_refs -= 1;
        let st = &mut self.storages[s.index()];
        st.ext_refs -= 1;
        if st.ext_refs > 0 {
            return Ok(());
        }
        match self.config.release {
            ReleasePolicy::Eager => {
                if st.is_material() && !st.pinned && st.locks == 0 {
                    self.evict(s, EvictReason::Eager)?;
                }
                Ok(())
            }
            ReleasePolicy::Banish => self.try_banish(s),
            ReleasePolicy::Keep => Ok(()),
        }
    }

    /// Pins `t`: rematerializes it if needed, then locks its storage for good (never evicted).
    ///
    /// # Errors
    /// As [`Runtime::compute`] when rematerializing fails.
    pub fn pin(&mut self, t: TensorId) -> Result<()> {
        if !self.tensor(t)?.defined {
            self.materialize(t, true)?;
        }
        let s = self.tensors[t.index()].storage;
        if self.storages[s.index()].pinned {
            return Ok(());
        }
        self.lock(s);
        self.storages[s.index()].pinned = true;
        Ok(())
    }

    /// Makes `t`'s value available (rematerializing it and its evicted ancestors).
    ///
    /// # Errors
    /// As [`Runtime::compute`] when rematerializing fails.
    pub fn rematerialize(&mut self, t: TensorId) -> Result<()> {
        if !self.tensor(t)?.defined {
            self.materialize(t, true)?;
        }
        Ok(())
    }

    /// Changes the budget; with a lower one, evicts until memory fits at once.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when memory cannot get under the new budget (the budget is set
    /// anyway; the next allocation keeps trying).
    pub fn set_budget(&mut self, budget: Option<u64>) -> Result<()> {
        self.config.budget = budget;
        self.make_room(0)
    }

    /// Changes the heuristic (equivalence classes and e* caches start from the current state).
    pub fn set_heuristic(&mut self, heuristic: Heuristic) {
        if heuristic.uses_eq_classes() && !self.config.heuristic.uses_eq_classes() {
            for i in 0..self.storages.len() {
                if matches!(
                    self.storages[i].state,
                    StorageState::Evicted | StorageState::Pending
                ) {
                    let value = if self.storages[i].state == StorageState::Evicted {
                        self.storages[i].compute as i64
                    } else {
                        0
                    };
                    self.storages[i].eq_node = self.eq.make(value);
                    self.sync_eq_live(StorageId(i as u32));
                }
            }
        }
        self.config.heuristic = heuristic;
        self.estar
            .set_enabled(heuristic.uses_estar(), self.storages.len());
    }

    // ----------------------------------------------------------------------------------------
    // Locks and the pool.

    pub(crate) fn lock(&mut self, s: StorageId) {
        debug_assert!(
            self.storages[s.index()].is_material(),
            "lock of immaterial {s}"
        );
        if self.storages[s.index()].locks == 0 {
            self.pool_remove(s);
        }
        self.storages[s.index()].locks += 1;
    }

    pub(crate) fn unlock(&mut self, s: StorageId) {
        let st = &mut self.storages[s.index()];
        debug_assert!(st.locks > 0, "unlock of unlocked {s}");
        st.locks -= 1;
        if st.locks == 0 && st.is_material() {
            self.pool_insert(s);
        }
    }

    /// Brings [`Runtime::eq_live`] of `s` in step with its state and union-find node.
    #[inline]
    pub(crate) fn sync_eq_live(&mut self, s: StorageId) {
        let st = &self.storages[s.index()];
        let node = if matches!(st.state, StorageState::Evicted | StorageState::Pending) {
            st.eq_node
        } else {
            NONE
        };
        let was = std::mem::replace(&mut self.eq_live[s.index()], node) != NONE;
        if was != (node != NONE) {
            // `s` appears in each neighbour's lists once per entry of that neighbour in its
            // own lists (edges are pushed in pairs).
            for &n in st.parents.iter().chain(st.children.iter()) {
                let c = &mut self.eq_nbrs[n.index()];
                *c = if was { *c - 1 } else { *c + 1 };
            }
        }
    }

    pub(crate) fn pool_insert(&mut self, s: StorageId) {
        let st = &mut self.storages[s.index()];
        if st.pool_slot != NONE {
            return;
        }
        st.pool_slot = self.pool.len() as u32;
        st.pool_seq = self.pool_seq;
        self.pool_seq += 1;
        self.pool.push(s);
    }

    pub(crate) fn pool_remove(&mut self, s: StorageId) {
        let slot = self.storages[s.index()].pool_slot;
        if slot == NONE {
            return;
        }
        self.pool.swap_remove(slot as usize);
        if let Some(&moved) = self.pool.get(slot as usize) {
            self.storages[moved.index()].pool_slot = slot;
        }
        self.storages[s.index()].pool_slot = NONE;
    }

    // ----------------------------------------------------------------------------------------
    // Materialization.

    /// Materializes `t` (which must be undefined): the iterative form of simrd's
    /// `_materialize`. On error every lock taken here is released again.
    pub(crate) fn materialize(&mut self, t: TensorId, remat: bool) -> Result<()> {
        let base = self.frames.len();
        if let Err(e) = self.push_frame(t, remat) {
            self.unwind(base);
            return Err(e);
        }
        loop {
            let top = self.frames.len() - 1;
            let f = self.frames[top];
            if f.next < f.undef_end {
                let a = self.pending[f.next as usize];
                if !self.tensors[a.index()].defined {
                    if let Err(e) = self.push_frame(a, true) {
                        self.unwind(base);
                        return Err(e);
                    }
                    continue;
                }
                let s = self.tensors[a.index()].storage;
                self.lock(s);
                self.lock_stack.push(s);
                self.frames[top].next += 1;
                continue;
            }
            if let Err(e) = self.finish_frame(f) {
                self.unwind(base);
                return Err(e);
            }
            self.frames.pop();
            self.pending.truncate(f.undef_start as usize);
            if self.frames.len() == base {
                return Ok(());
            }
            // The parent frame's current input is now defined: lock it and move on.
            let top = self.frames.len() - 1;
            let a = self.pending[self.frames[top].next as usize];
            let s = self.tensors[a.index()].storage;
            self.lock(s);
            self.lock_stack.push(s);
            self.frames[top].next += 1;
        }
    }

    /// Steps 1–2 of simrd's `_materialize`: touch the inputs, lock the defined ones, note the
    /// undefined ones.
    fn push_frame(&mut self, t: TensorId, remat: bool) -> Result<()> {
        let op = self.tensors[t.index()].op;
        let s = self.tensors[t.index()].storage;
        if self.storages[s.index()].state == StorageState::Banished {
            return Err(Error::Banished(t));
        }
        let only_referenced = self.config.release == ReleasePolicy::Banish;
        let nargs = self.ops[op.index()].args.len();
        for i in 0..nargs {
            let a = self.ops[op.index()].args[i];
            let sa = self.tensors[a.index()].storage;
            let st = &mut self.storages[sa.index()];
            if !only_referenced || st.ext_refs > 0 {
                st.last_access = self.clock;
            }
        }
        let lock_start = self.lock_stack.len() as u32;
        for i in 0..nargs {
            let a = self.ops[op.index()].args[i];
            if self.tensors[a.index()].defined {
                let sa = self.tensors[a.index()].storage;
                self.lock(sa);
                self.lock_stack.push(sa);
            }
        }
        let undef_start = self.pending.len() as u32;
        for i in 0..nargs {
            let a = self.ops[op.index()].args[i];
            if !self.tensors[a.index()].defined {
                self.pending.push(a);
            }
        }
        let undef_end = self.pending.len() as u32;
        self.frames.push(Frame {
            tensor: t,
            remat,
            undef_start,
            undef_end,
            next: undef_start,
            lock_start,
        });
        Ok(())
    }

    /// Steps 4–7: make room, run, unlock, check the rematerialization limit.
    fn finish_frame(&mut self, f: Frame) -> Result<()> {
        let op = self.tensors[f.tensor.index()].op;
        let total = self.charge_of(op);
        self.make_room(total)?;
        self.run_op(f.tensor, f.remat)?;
        let nargs = self.ops[op.index()].args.len();
        for i in 0..nargs {
            let a = self.ops[op.index()].args[i];
            let sa = self.tensors[a.index()].storage;
            self.unlock(sa);
        }
        self.lock_stack.truncate(f.lock_start as usize);
        if self.config.release == ReleasePolicy::Banish {
            for i in 0..nargs {
                let a = self.ops[op.index()].args[i];
                let sa = self.tensors[a.index()].storage;
                self.try_banish(sa)?;
            }
        }
        if let Some(limit) = self.config.remat_limit_ns {
            // Copies made to make room count with the rematerializations (0 but for the
            // moving device-budget strategies).
            let overhead = self.profile.remat_compute_ns + self.profile.move_ns;
            if overhead > limit {
                return Err(Error::Thrashing {
                    remat_ns: overhead,
                    limit_ns: limit,
                });
            }
        }
        Ok(())
    }

    /// Bytes the budget must find for `op`'s fresh outputs: their sizes, or what the
    /// backend's allocator will charge for each when it does the accounting.
    fn charge_of(&self, op: OpId) -> u64 {
        let o = &self.ops[op.index()];
        if self.backend.allocated_bytes().is_none() {
            return o.total_size;
        }
        (o.first_output..o.first_output + o.outputs)
            .map(|k| &self.tensors[k as usize])
            .filter(|t| !t.is_alias && t.size > 0)
            .map(|t| self.backend.charged_bytes(t.size))
            .sum()
    }

    /// The storage whose bytes fresh storage `s` takes over (an in-place update's first run
    /// under a device budget), if it is still in memory.
    fn in_place_source(&self, s: StorageId, remat: bool) -> Option<StorageId> {
        if remat || self.in_place.is_empty() {
            return None;
        }
        self.in_place
            .iter()
            .find(|&&(new, _)| new == s)
            .map(|&(_, old)| old)
            .filter(|old| self.storages[old.index()].is_material())
    }

    /// Releases the locks of every frame above `base` and drops those frames.
    fn unwind(&mut self, base: usize) {
        while self.frames.len() > base {
            let f = self.frames.pop().expect("frame");
            while self.lock_stack.len() > f.lock_start as usize {
                let s = self.lock_stack.pop().expect("lock");
                self.unlock(s);
            }
            self.pending.truncate(f.undef_start as usize);
        }
    }

    /// simrd's `_compute`: run the call of `t`, define `t` and its undefined siblings, account
    /// memory, make the new storages evictable, update classes and e* caches.
    fn run_op(&mut self, t: TensorId, remat: bool) -> Result<()> {
        let op = self.tensors[t.index()].op;
        let (first, count, total) = {
            let o = &self.ops[op.index()];
            (o.first_output, o.outputs, o.total_size)
        };
        if self.memory.checked_add(total).is_none() {
            // No budget or device holds more than u64::MAX bytes (a malformed log's sizes).
            return Err(Error::OutOfMemory {
                requested: total,
                used: self.memory,
                budget: self.config.budget.unwrap_or(u64::MAX),
            });
        }
        let mut dups = std::mem::take(&mut self.scratch_dups);
        let mut newly = std::mem::take(&mut self.scratch_new);
        let mut fresh = std::mem::take(&mut self.scratch_storages);
        dups.clear();
        newly.clear();
        fresh.clear();
        let mut dup_bytes = 0u64;
        for k in first..first + count {
            let u = TensorId(k);
            if u == t {
                continue;
            }
            if self.tensors[k as usize].defined {
                dups.push(u);
                dup_bytes += self.tensors[k as usize].size;
            } else {
                newly.push(u);
            }
        }
        newly.push(t);
        for &u in &newly {
            let s = self.tensors[u.index()].storage;
            if !self.storages[s.index()].is_material() && !fresh.contains(&s) {
                fresh.push(s);
            }
        }
        // Memory: every fresh output of the call, duplicates included, until the run ends.
        // Under a device budget the peak is taken once the device gave the bytes (making
        // room evicts in between).
        self.memory += total;
        let device = self.backend.device_capacity().is_some();
        if !device && self.memory > self.profile.peak_bytes {
            self.profile.peak_bytes = self.memory;
        }
        let mut result = Ok(());
        for &s in &fresh {
            let bytes = self.storages[s.index()].size;
            if device {
                let from = self.in_place_source(s, remat);
                if let Err(e) = self.allocate_on_device(s, from) {
                    result = Err(e);
                    break;
                }
            } else if let Err(e) = self.backend.allocate(s, bytes) {
                result = Err(Error::Backend(e));
                break;
            }
        }
        if result.is_ok() && device && dup_bytes > 0 {
            result = self.allocate_scratch_on_device(dup_bytes);
        }
        if result.is_ok() && device && self.memory > self.profile.peak_bytes {
            self.profile.peak_bytes = self.memory;
        }
        let mut outs = std::mem::take(&mut self.scratch_outs);
        outs.clear();
        outs.extend((first..first + count).map(TensorId));
        let mut out_storages = std::mem::take(&mut self.scratch_out_storages);
        out_storages.clear();
        out_storages.extend(outs.iter().map(|u| self.tensors[u.index()].storage));
        let cost = match result {
            Ok(()) => {
                let o = &self.ops[op.index()];
                let ran = self.backend.run(RunRequest {
                    op,
                    args: &o.args,
                    outputs: &outs,
                    output_storages: &out_storages,
                    duplicates: &dups,
                    duplicate_bytes: dup_bytes,
                    remat,
                    known_cost: o.cost,
                });
                let freed = if device && dup_bytes > 0 {
                    self.backend.free_scratch()
                } else {
                    Ok(())
                };
                ran.and_then(|c| freed.map(|()| c)).map_err(Error::Backend)
            }
            Err(e) => Err(e),
        };
        let cost = match cost {
            Ok(c) => c,
            Err(e) => {
                if device {
                    // Reservations made for a run that did not happen go back.
                    let _ = self.backend.free_scratch();
                }
                self.memory -= total;
                self.scratch_dups = dups;
                self.scratch_new = newly;
                self.scratch_storages = fresh;
                self.scratch_outs = outs;
                self.scratch_out_storages = out_storages;
                return Err(e);
            }
        };
        if !remat && cost != self.ops[op.index()].cost {
            // A live op's measured cost replaces the estimate in its storages' compute.
            let old = self.ops[op.index()].cost;
            self.ops[op.index()].cost = cost;
            let mut seen: Vec<StorageId> = Vec::new();
            for k in first..first + count {
                let s = self.tensors[k as usize].storage;
                if !seen.contains(&s) {
                    seen.push(s);
                    let st = &mut self.storages[s.index()];
                    st.compute = st.compute - old + cost;
                }
            }
        }
        self.clock += cost;
        for &u in &newly {
            self.tensors[u.index()].defined = true;
            let s = self.tensors[u.index()].storage;
            self.storages[s.index()].state = StorageState::Material;
            self.sync_eq_live(s);
        }
        self.memory -= dup_bytes;
        for &s in &fresh {
            self.pool_insert(s);
        }
        if remat {
            self.profile.remat_compute_ns += cost;
            self.profile.remats += 1;
        } else {
            self.profile.base_compute_ns += cost;
        }
        if self.config.heuristic.uses_eq_classes() {
            for &s in &fresh {
                let st = &mut self.storages[s.index()];
                if st.eq_node != NONE {
                    let (node, c) = (st.eq_node, st.compute as i64);
                    st.eq_node = NONE;
                    self.eq.add(node, -c);
                }
                self.sync_eq_live(s);
            }
        }
        if self.estar.enabled() {
            for &s in &fresh {
                self.estar.on_state_change(s);
            }
        }
        if self.config.release == ReleasePolicy::Banish {
            for &u in &newly {
                self.adjust_undefined_children(u, -1);
            }
        }
        self.scratch_dups = dups;
        self.scratch_new = newly;
        self.scratch_storages = fresh;
        self.scratch_outs = outs;
        self.scratch_out_storages = out_storages;
        Ok(())
    }

    // ----------------------------------------------------------------------------------------
    // Eviction and banishing.

    /// Evicts material, unlocked, unpinned `s` (simrd's `_evict`).
    pub(crate) fn evict(&mut self, s: StorageId, reason: EvictReason) -> Result<()> {
        let banish = self.config.release == ReleasePolicy::Banish;
        {
            let st = &mut self.storages[s.index()];
            debug_assert!(st.is_material() && st.locks == 0 && !st.pinned);
            st.state = StorageState::Evicted;
        }
        let size = self.storages[s.index()].size;
        if std::mem::take(&mut self.storages[s.index()].donated) {
            // An in-place update took its bytes; they count for the new version.
        } else {
            self.memory -= size;
        }
        self.pool_remove(s);
        let n = self.storages[s.index()].tensors.len();
        for i in 0..n {
            let t = self.storages[s.index()].tensors[i];
            if self.tensors[t.index()].defined {
                self.tensors[t.index()].defined = false;
                if banish {
                    self.adjust_undefined_children(t, 1);
                }
            }
        }
        match reason {
            EvictReason::Heuristic => self.profile.evictions += 1,
            EvictReason::Eager => self.profile.eager_evictions += 1,
        }
        if self.config.heuristic.uses_eq_classes() {
            let node = self.eq.make(self.storages[s.index()].compute as i64);
            self.storages[s.index()].eq_node = node;
            let st = &self.storages[s.index()];
            for &n in st.parents.iter().chain(st.children.iter()) {
                let ns = &self.storages[n.index()];
                if n != s
                    && matches!(ns.state, StorageState::Evicted | StorageState::Pending)
                    && ns.eq_node != NONE
                {
                    self.eq.union(ns.eq_node, node);
                }
            }
        }
        self.sync_eq_live(s);
        if self.estar.enabled() {
            self.estar.on_state_change(s);
        }
        self.backend.free(s, size).map_err(Error::Backend)
    }

    /// Adds `delta` to the evicted-dependents count of each distinct input storage of `t`
    /// other than its own (simrd V1's `evicted_dependents`).
    fn adjust_undefined_children(&mut self, t: TensorId, delta: i32) {
        let op = self.tensors[t.index()].op;
        let own = self.tensors[t.index()].storage;
        let nargs = self.ops[op.index()].args.len();
        for i in 0..nargs {
            let a = self.ops[op.index()].args[i];
            let sa = self.tensors[a.index()].storage;
            if sa == own {
                continue;
            }
            // Distinct storages only: skip if an earlier argument had the same storage.
            let dup = (0..i).any(|j| {
                let b = self.ops[op.index()].args[j];
                self.tensors[b.index()].storage == sa
            });
            if dup {
                continue;
            }
            let st = &mut self.storages[sa.index()];
            st.undefined_children = st.undefined_children.saturating_add_signed(delta);
        }
    }

    /// Frees `s` for good when it has no external reference and no evicted dependent (simrd
    /// V1's `_try_banish`); its children, no longer recomputable, are pinned.
    fn try_banish(&mut self, s: StorageId) -> Result<()> {
        let st = &self.storages[s.index()];
        if st.ext_refs > 0 || st.undefined_children > 0 || st.state == StorageState::Banished {
            return Ok(());
        }
        // Tensors of `s` that were already undefined stop counting as dependents.
        let n = st.tensors.len();
        for i in 0..n {
            let t = self.storages[s.index()].tensors[i];
            if !self.tensors[t.index()].defined {
                self.adjust_undefined_children(t, -1);
            }
        }
        let was_material = self.storages[s.index()].is_material();
        if was_material {
            let size = self.storages[s.index()].size;
            self.pool_remove(s);
            self.memory -= size;
            for i in 0..n {
                let t = self.storages[s.index()].tensors[i];
                self.tensors[t.index()].defined = false;
            }
            self.backend.free(s, size).map_err(Error::Backend)?;
        }
        let st = &mut self.storages[s.index()];
        st.locks = 0;
        st.pinned = false;
        st.state = StorageState::Banished;
        self.sync_eq_live(s);
        self.profile.banished += 1;
        let children = std::mem::take(&mut self.storages[s.index()].children);
        for &c in &children {
            if c != s && self.storages[c.index()].is_material() && !self.storages[c.index()].pinned
            {
                self.lock(c);
                self.storages[c.index()].pinned = true;
            }
        }
        self.storages[s.index()].children = children;
        if self.estar.enabled() {
            self.estar.on_state_change(s);
        }
        Ok(())
    }
}
