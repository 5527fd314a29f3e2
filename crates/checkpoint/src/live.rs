//! Live DTR over `aten` tensors: the DTR prototype's `CheckpointTensorImpl` in Rust, on the
//! runtime core ([`Runtime`]) with the live backend ([`LiveBackend`]).
//!
//! A [`LiveRuntime`] owns the graph and the tensors of one device of a caching allocator (the
//! host-backed simulated device of [`aten::sim::install`], say). Programs hold
//! [`CheckpointTensor`] handles (the prototype's `CheckpointTensorImpl`: a reference to a
//! runtime tensor) and run operators through [`LiveRuntime::call`] (any closure with declared
//! outputs) or the ops in [`crate::live_ops`] (`mm`, `relu`, `softmax`, ..., with shape
//! inference). Each call is recorded with its rematerializer (the closure and its inputs) and
//! rerun when an evicted output is needed again. The rules are the core's:
//! - storages (alias pools: a tensor and its views) are the unit of eviction; a multi-output
//!   call recomputes all its outputs together;
//! - constants ([`LiveRuntime::checkpoint`]) and pinned tensors ([`CheckpointTensor::pin`])
//!   are never evicted; the inputs of the running call are locked;
//! - when the last handle of a tensor is dropped its storage is evicted at once (eager
//!   eviction), or banished ([`crate::ReleasePolicy::Banish`]);
//! - in-place updates ([`LiveRuntime::mutate`]) are copy-on-write, and refused while another
//!   live tensor shares the storage ([`Error::AliasedMutation`]).
//!
//! # The hard budget
//!
//! The budget applies to the caching allocator's `allocated_bytes.all.current` for the device,
//! as the prototype's accounting does, so every allocation on the device counts, inside the
//! runtime or not. Before a call runs, the core evicts until the allocated bytes plus what the
//! allocator will charge for the call's declared outputs (`round_size`, plus the unsplit
//! remainder a large block may keep) fit; after it runs, the backend checks that the
//! allocator's allocated bytes (current, and the peak if it rose during the call) stayed
//! under the budget and fails with [`LiveError::BudgetExceeded`] otherwise. So a closure must
//! allocate nothing on the device beyond its declared outputs (one kernel per call, as the ops
//! in [`crate::live_ops`]). Call `reset_peak_stats` on the allocator before a budgeted run for
//! the peak check to see everything. Reserved bytes (segments) are not budgeted; they are
//! reported ([`LiveProfile::counters`]).
//!
//! # A device-memory budget
//!
//! With [`LiveConfig::device_budget`] the budget is the device's capacity (a host-backed
//! simulated device made with the budget as its size, say) and nothing is counted: before a
//! call runs, each declared output is reserved with the allocator's `try_malloc`; a miss makes
//! the core evict ([`crate::device_budget`]: the heuristic's choice, or the allocator's
//! cheapest window over blocks tagged with their storages) and retry; the reserved blocks are
//! handed back just before the closure runs, so its allocations (the same sizes, in order) are
//! served from them. Reserved bytes can never pass the capacity; the same rule holds: a closure
//! allocates only its declared outputs.
//!
//! Eviction happens before the allocation, not in the allocator's free-memory callback
//! (`CachingAllocator::register_free_memory_callback`): the callback runs inside the kernel's
//! allocation, while the runtime is in the middle of a call, and it fires on a cache miss, not
//! when allocated bytes pass a budget.
//!
//! # Handles and values
//!
//! Handles borrow the runtime (`CheckpointTensor<'rt>`), so closures (which are `'static`)
//! cannot capture them and no handle outlives its runtime. Cloning a handle is a handle copy
//! (the same `CheckpointTensorImpl`, like copying a C++ `at::Tensor`): an in-place update
//! through one is seen through all. [`CheckpointTensor::shallow_copy`] makes a new one sharing
//! the value (the log's `COPY`). A value returned by [`CheckpointTensor::value`] or
//! [`CheckpointTensor::decheckpoint`] shares the runtime's bytes: while it is held, evicting
//! that storage frees nothing.
//!
//! ```
//! use checkpoint::live::{LiveConfig, LiveRuntime};
//! use aten::{Tensor, TensorOptions};
//! use c10_core::Device;
//!
//! let front = aten::sim::install(1, 64 << 20)?;
//! let rt = LiveRuntime::new(front, Device::sim(0), LiveConfig::default())?;
//! let x = rt.checkpoint(Tensor::ones(&[4, 4], TensorOptions::new())?)?; // copied to sim:0
//! let y = x.mm(&x)?.relu()?;
//! assert_eq!(y.value()?.to_vec::<f32>()?[0], 4.0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::cell::{Cell, RefCell};
use std::fmt;
use std::io::{self, Write};
use std::rc::Rc;
use std::sync::Arc;

use aten::Tensor;
use c10_core::{Device, ScalarType};
use c10_cuda::CachingAllocator;
use c10_cuda::device::DeviceMemory;

use crate::error::Error;
use crate::graph::{StorageState, TensorId};
use crate::live_backend::{LiveOp, OpFn};
use crate::profile::Profile;
use crate::runtime::{Config, OpSpec, OutputSpec, Runtime};

pub use crate::live_backend::{LiveBackend, LiveCounters, MemoryFigures, OutputMeta, hash_tensor};

/// Where a live call's cost comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CostModel {
    /// Each call's wall-clock time, measured when it first runs (ns), as the prototype does.
    /// Eviction choices then vary from run to run with timing noise.
    #[default]
    Measured,
    /// The estimate the call declares (the ops in [`crate::live_ops`] declare their
    /// arithmetic work: `2mkn` for a matrix product, one per element otherwise), taken as ns.
    /// Deterministic: the same program makes the same choices.
    Estimated,
}

/// Settings of a [`LiveRuntime`].
#[derive(Clone, Debug, Default)]
pub struct LiveConfig {
    /// The core's settings: budget (bytes of the allocator's `allocated_bytes`), heuristic,
    /// sampling, small-tensor filter, release policy, rematerialization limit, seed.
    pub runtime: Config,
    /// The debug check: hash every output when first computed and compare each recomputed
    /// value with it ([`LiveError::RematMismatch`]).
    pub check_remat: bool,
    /// Measured or declared costs.
    pub cost: CostModel,
    /// The device's capacity is the budget (a device-memory budget, see
    /// [`crate::device_budget`]): nothing is counted, every call's outputs are reserved with
    /// the allocator's `try_malloc` before it runs, and a miss evicts as
    /// [`Config::strategy`] says. `runtime.budget` must then be `None`.
    pub device_budget: bool,
}

/// What can go wrong in live mode.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    /// The runtime core refused or failed ([`Error::OutOfMemory`] when nothing is left to
    /// evict, [`Error::AliasedMutation`], [`Error::Thrashing`], ...).
    #[error(transparent)]
    Runtime(Error),
    /// An operator (or reading a value) failed in `aten`.
    #[error("{op}: {source}")]
    Op {
        /// The call's name.
        op: String,
        /// aten's error.
        #[source]
        source: aten::Error,
    },
    /// The allocator's allocated bytes passed the budget during a call: its closure allocated
    /// more than its declared outputs, or something outside the runtime allocated.
    #[error(
        "hard budget exceeded by {op}: the allocator reached {allocated} allocated bytes over a budget of {budget} bytes"
    )]
    BudgetExceeded {
        /// The call during which it happened.
        op: String,
        /// Allocated bytes seen (current, or the peak that rose during the call).
        allocated: u64,
        /// The budget, bytes.
        budget: u64,
    },
    /// The debug check: a recomputed value is not bit-identical to the first computation.
    #[error(
        "rematerialized output {tensor} of {op} differs from its first computation (hash {first:#018x}, now {now:#018x})"
    )]
    RematMismatch {
        /// The call.
        op: String,
        /// The tensor.
        tensor: TensorId,
        /// Hash of the first value.
        first: u64,
        /// Hash of the recomputed value.
        now: u64,
    },
    /// A closure returned something other than what the call declared.
    #[error("{op}: output {output}: {message}")]
    OutputMismatch {
        /// The call.
        op: String,
        /// The output's position.
        output: usize,
        /// What differs.
        message: String,
    },
    /// A handle of another runtime was passed.
    #[error("{op}: a tensor of another runtime was passed")]
    ForeignTensor {
        /// The call.
        op: String,
    },
    /// Bad arguments (a device the allocator does not have, an alias index out of range, ...).
    #[error("{0}")]
    InvalidArgument(String),
    /// Writing the operator log failed.
    #[error("operator log: {0}")]
    Log(#[from] io::Error),
    /// A broken invariant of the live driver (a bug).
    #[error("internal error: {message}")]
    Internal {
        /// What broke.
        message: String,
    },
}

impl From<Error> for LiveError {
    fn from(e: Error) -> Self {
        match e {
            Error::Backend(b) => match b.downcast::<LiveError>() {
                Ok(l) => *l,
                Err(b) => LiveError::Runtime(Error::Backend(b)),
            },
            other => LiveError::Runtime(other),
        }
    }
}

/// `Result` with [`LiveError`].
pub type LiveResult<T> = Result<T, LiveError>;

/// The counters of a live runtime.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveProfile {
    /// The core's counters: base and rematerialization compute (ns), search time (ns),
    /// evictions, eager evictions, banished storages, rematerializations.
    pub runtime: Profile,
    /// The backend's: peak allocated and reserved bytes seen after calls, values hashed and
    /// checked, wall time in closures.
    pub counters: LiveCounters,
    /// The allocator's figures for the device now.
    pub memory: MemoryFigures,
}

struct Meta {
    shape: Vec<i64>,
    dtype: ScalarType,
}

struct Inner {
    rt: Runtime<LiveBackend>,
    /// Shape and dtype per tensor id.
    meta: Vec<Meta>,
    next_name: u64,
    /// An error from a handle's drop (which cannot return one), reported by the next call.
    deferred: Option<LiveError>,
}

impl Inner {
    fn take_deferred(&mut self) -> LiveResult<()> {
        match self.deferred.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn set_meta(&mut self, t: TensorId, meta: &OutputMeta) {
        let i = t.index();
        if self.meta.len() <= i {
            self.meta.resize_with(i + 1, || Meta {
                shape: Vec::new(),
                dtype: ScalarType::Float,
            });
        }
        self.meta[i] = Meta {
            shape: meta.shape.clone(),
            dtype: meta.dtype,
        };
    }

    fn name(&mut self) -> u64 {
        self.next_name += 1;
        self.next_name
    }

    /// Records `op` in the backend, runs `record` on the core, and drops the backend's entry
    /// again if the core did not record the call (a malformed call).
    fn recorded<T>(
        &mut self,
        op: LiveOp,
        record: impl FnOnce(&mut Runtime<LiveBackend>) -> crate::Result<T>,
    ) -> LiveResult<T> {
        let before = self.rt.ops.len();
        self.rt.backend_mut().ops.push(op);
        let r = record(&mut self.rt);
        self.rt.backend_mut().staged_charge = 0;
        if self.rt.ops.len() == before {
            self.rt.backend_mut().ops.pop();
        }
        r.map_err(LiveError::from)
    }
}

/// The live DTR runtime on one device (the prototype's global checkpointing state, as an
/// object). Single-threaded: handles borrow it.
pub struct LiveRuntime {
    inner: RefCell<Inner>,
    device: Device,
}

impl fmt::Debug for LiveRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LiveRuntime")
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl LiveRuntime {
    /// A runtime on `device`, whose tensors `front` allocates (the front
    /// [`aten::sim::install`] returned, for a simulated device). The budget in `config`
    /// applies to `front`'s allocated bytes for that device.
    ///
    /// # Errors
    /// [`LiveError::InvalidArgument`] for the CPU or a device index `front` does not have.
    pub fn new<D: DeviceMemory + 'static>(
        front: Arc<CachingAllocator<D>>,
        device: Device,
        config: LiveConfig,
    ) -> LiveResult<Self> {
        let device = aten::normalize_device(device);
        let index = device.index().unwrap_or(0);
        if device.is_cpu() || !front.has_device(index) {
            return Err(LiveError::InvalidArgument(format!(
                "live DTR needs a device of the caching allocator ({} device(s)), not {device}",
                front.device_count()
            )));
        }
        let mut backend = LiveBackend::new(front, device, index);
        if config.device_budget {
            if config.runtime.budget.is_some() {
                return Err(LiveError::InvalidArgument(
                    "a device-memory budget is the device's capacity: set no byte budget with it"
                        .into(),
                ));
            }
            backend = backend.on_device_budget().map_err(|e| {
                LiveError::InvalidArgument(format!("{device}: the device's capacity: {e}"))
            })?;
        }
        backend.budget = config.runtime.budget;
        backend.check = config.check_remat;
        backend.measure = config.cost == CostModel::Measured;
        Ok(LiveRuntime {
            inner: RefCell::new(Inner {
                rt: Runtime::new(backend, config.runtime),
                meta: Vec::new(),
                next_name: 0,
                deferred: None,
            }),
            device,
        })
    }

    /// A runtime on `sim:index` of the simulated devices from the latest
    /// [`aten::sim::install`].
    ///
    /// # Errors
    /// [`LiveError::InvalidArgument`] when nothing is installed or the index is out of range.
    pub fn on_sim(index: u8, config: LiveConfig) -> LiveResult<Self> {
        let front = aten::sim::installed().ok_or_else(|| {
            LiveError::InvalidArgument(
                "no simulated device is installed (call aten::sim::install first)".into(),
            )
        })?;
        Self::new(front, Device::sim(index), config)
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    fn check_own(&self, op: &str, args: &[&CheckpointTensor<'_>]) -> LiveResult<Vec<TensorId>> {
        args.iter()
            .map(|a| {
                if std::ptr::eq(a.0.rt, self) {
                    Ok(a.id())
                } else {
                    Err(LiveError::ForeignTensor { op: op.to_string() })
                }
            })
            .collect()
    }

    /// `checkpoint(t)`: wraps `t` as a checkpointed constant (an input or a weight): pinned,
    /// never evicted, no rematerializer. A tensor already on the runtime's device is adopted
    /// (its bytes are already allocated; the budget makes room as if it were allocated now);
    /// any other tensor is copied to the device under the budget.
    ///
    /// # Errors
    /// [`LiveError::Runtime`] with [`Error::OutOfMemory`] when it does not fit;
    /// [`LiveError::Op`] when the copy fails; [`LiveError::Log`].
    pub fn checkpoint(&self, t: Tensor) -> LiveResult<CheckpointTensor<'_>> {
        let mut inner = self.inner.borrow_mut();
        inner.take_deferred()?;
        let device = self.device;
        let on_device = aten::normalize_device(t.device()) == device;
        let meta = OutputMeta::fresh(t.sizes(), t.dtype());
        let (bytes, f): (u64, OpFn) = if on_device {
            let held = t.clone();
            (
                t.storage().nbytes() as u64,
                Rc::new(move |_: &[Tensor]| Ok(vec![held.clone()])),
            )
        } else {
            (
                meta.nbytes(),
                Rc::new(move |_: &[Tensor]| Ok(vec![t.to(device)?])),
            )
        };
        let charge = if on_device {
            inner.rt.backend().charge_for(bytes)
        } else {
            0
        };
        inner.rt.backend_mut().staged_charge = charge;
        let op = LiveOp {
            name: "checkpoint".into(),
            f: Some(f),
            outputs: vec![meta.clone()],
            bytes: vec![bytes],
            constant: true,
        };
        let id = inner.recorded(op, |rt| rt.checkpoint(bytes))?;
        inner.set_meta(id, &meta);
        let name = inner.name();
        if let Some(log) = inner.rt.log_mut() {
            log.constant(&format!("x{name}"), bytes)?;
        }
        drop(inner);
        Ok(CheckpointTensor::new(self, id, name))
    }

    /// Records and runs a call: `f` maps the inputs' values to the outputs declared in
    /// `outputs` (fresh tensors, or views of inputs); `estimate_ns` is its cost under
    /// [`CostModel::Estimated`] (ignored when costs are measured). The call is the outputs'
    /// rematerializer (the prototype's `Rematerializer`): `f` reruns on the same inputs, all
    /// outputs together, whenever an evicted output is needed. `f` must be deterministic and
    /// must not allocate on the device beyond its outputs.
    ///
    /// # Errors
    /// [`LiveError::ForeignTensor`]; [`LiveError::InvalidArgument`] for an alias index out of
    /// range or no outputs; [`LiveError::Runtime`] ([`Error::OutOfMemory`] when the budget
    /// cannot make room, [`Error::Thrashing`]); [`LiveError::Op`] when `f` fails;
    /// [`LiveError::OutputMismatch`] when `f` returns something else than declared;
    /// [`LiveError::BudgetExceeded`]; [`LiveError::RematMismatch`] (debug check);
    /// [`LiveError::Log`].
    pub fn call<'a>(
        &'a self,
        name: &str,
        args: &[&CheckpointTensor<'a>],
        outputs: &[OutputMeta],
        estimate_ns: u64,
        f: impl Fn(&[Tensor]) -> aten::Result<Vec<Tensor>> + 'static,
    ) -> LiveResult<Vec<CheckpointTensor<'a>>> {
        let ids = self.check_own(name, args)?;
        if outputs.is_empty() {
            return Err(LiveError::InvalidArgument(format!(
                "{name}: a call must declare at least one output"
            )));
        }
        for (k, o) in outputs.iter().enumerate() {
            if let Some(i) = o.alias {
                if i >= args.len() {
                    return Err(LiveError::InvalidArgument(format!(
                        "{name}: output {k} is declared a view of input {i}, but there are {} inputs",
                        args.len()
                    )));
                }
            }
        }
        let mut inner = self.inner.borrow_mut();
        inner.take_deferred()?;
        let specs: Vec<OutputSpec> = outputs
            .iter()
            .map(|o| match o.alias {
                Some(i) => OutputSpec::alias_of(i),
                None => OutputSpec::fresh(o.nbytes()),
            })
            .collect();
        // Measured costs: 0 until the first run measures it.
        let cost = if inner.rt.backend().measure {
            0
        } else {
            estimate_ns
        };
        let op_id = inner.rt.ops.len();
        let op = LiveOp {
            name: name.to_string(),
            f: Some(Rc::new(f)),
            outputs: outputs.to_vec(),
            bytes: outputs.iter().map(OutputMeta::nbytes).collect(),
            constant: false,
        };
        let outs = inner.recorded(op, |rt| {
            rt.compute(OpSpec {
                cost,
                args: &ids,
                outputs: &specs,
            })
        })?;
        let mut names = Vec::with_capacity(outs.len());
        for (t, meta) in outs.iter().zip(outputs) {
            inner.set_meta(t, meta);
            names.push(inner.name());
        }
        if inner.rt.log.is_some() {
            let time = inner.rt.ops[op_id].cost;
            let arg_names: Vec<String> = args.iter().map(|a| a.name()).collect();
            let result_names: Vec<String> = names.iter().map(|n| format!("x{n}")).collect();
            let results: Vec<(&str, u64, Option<u32>)> = result_names
                .iter()
                .zip(outputs)
                .zip(outs.iter())
                .map(|((n, o), t)| {
                    let bytes = inner
                        .rt
                        .storage_of(t)
                        .ok()
                        .and_then(|s| inner.rt.storage_bytes(s))
                        .unwrap_or(0);
                    (n.as_str(), bytes, o.alias.map(|i| i as u32))
                })
                .collect();
            if let Some(log) = inner.rt.log_mut() {
                log.call(name, &arg_names, &results, time)?;
            }
        }
        drop(inner);
        Ok(outs
            .iter()
            .zip(names)
            .map(|(t, n)| CheckpointTensor::new(self, t, n))
            .collect())
    }

    /// An in-place call, copy-on-write (the log's `MUTATE`): `f` updates the inputs at the
    /// `mutated` positions in place; the runtime runs it on fresh copies of them, so the old
    /// values stay valid for rematerializing their dependents, and moves each mutated handle
    /// (and every clone of it) to its new version. The old version loses the handle's
    /// reference (and is evicted at once if that was its last).
    ///
    /// # Errors
    /// [`LiveError::Runtime`] with [`Error::AliasedMutation`] when another live tensor (a view)
    /// shares a mutated input's storage, as the prototype refuses; [`LiveError::InvalidArgument`]
    /// for a position out of range or repeated, or a handle mutated twice; as
    /// [`LiveRuntime::call`] otherwise.
    pub fn mutate(
        &self,
        name: &str,
        args: &[&CheckpointTensor<'_>],
        mutated: &[usize],
        estimate_ns: u64,
        f: impl Fn(&[Tensor]) -> aten::Result<()> + 'static,
    ) -> LiveResult<()> {
        let ids = self.check_own(name, args)?;
        for (k, &m) in mutated.iter().enumerate() {
            if m >= args.len() {
                return Err(LiveError::InvalidArgument(format!(
                    "{name}: mutated position {m}, but there are {} inputs",
                    args.len()
                )));
            }
            if mutated[..k]
                .iter()
                .any(|&p| p == m || Rc::ptr_eq(&args[p].0, &args[m].0))
            {
                return Err(LiveError::InvalidArgument(format!(
                    "{name}: input {m} is mutated twice"
                )));
            }
        }
        let metas: Vec<OutputMeta> = mutated
            .iter()
            .map(|&m| OutputMeta::fresh(&args[m].shape(), args[m].dtype()))
            .collect();
        let mut inner = self.inner.borrow_mut();
        inner.take_deferred()?;
        // Measured costs: 0 until the first run measures it.
        let cost = if inner.rt.backend().measure {
            0
        } else {
            estimate_ns
        };
        let positions = mutated.to_vec();
        let run: OpFn = Rc::new(move |inputs: &[Tensor]| {
            let mut ins = inputs.to_vec();
            let mut outs = Vec::with_capacity(positions.len());
            for &m in &positions {
                let copy = inputs[m].deep_clone()?;
                ins[m] = copy.clone();
                outs.push(copy);
            }
            f(&ins)?;
            Ok(outs)
        });
        let op_id = inner.rt.ops.len();
        let op = LiveOp {
            name: name.to_string(),
            f: Some(run),
            outputs: metas.clone(),
            bytes: metas.iter().map(OutputMeta::nbytes).collect(),
            constant: false,
        };
        let outs = inner.recorded(op, |rt| rt.mutate(cost, &ids, mutated))?;
        for ((t, meta), &m) in outs.iter().zip(&metas).zip(mutated) {
            inner.set_meta(t, meta);
            args[m].0.id.set(t);
        }
        if inner.rt.log.is_some() {
            let time = inner.rt.ops[op_id].cost;
            let arg_names: Vec<String> = args.iter().map(|a| a.name()).collect();
            let positions: Vec<u32> = mutated.iter().map(|&m| m as u32).collect();
            if let Some(log) = inner.rt.log_mut() {
                log.mutate(name, &arg_names, &positions, time)?;
            }
        }
        Ok(())
    }

    /// `is_checkpoint(t)`: whether `t` is a tensor of this runtime.
    pub fn is_checkpoint(&self, t: &CheckpointTensor<'_>) -> bool {
        std::ptr::eq(t.0.rt, self)
    }

    /// `set_memory_budget(bytes)`: the hard budget on the allocator's allocated bytes; evicts
    /// at once until they fit.
    ///
    /// # Errors
    /// [`LiveError::Runtime`] with [`Error::OutOfMemory`] when they cannot fit now (the budget
    /// is set anyway).
    pub fn set_memory_budget(&self, bytes: u64) -> LiveResult<()> {
        let mut inner = self.inner.borrow_mut();
        inner.rt.backend_mut().budget = Some(bytes);
        inner.rt.set_memory_budget(bytes).map_err(LiveError::from)
    }

    /// `unset_memory_budget()`: no budget.
    pub fn unset_memory_budget(&self) {
        let mut inner = self.inner.borrow_mut();
        inner.rt.backend_mut().budget = None;
        inner.rt.unset_memory_budget();
    }

    /// The budget in bytes, if any.
    pub fn memory_budget(&self) -> Option<u64> {
        self.inner.borrow().rt.config().budget
    }

    /// `toggle_sampling(on)`: search about sqrt(n) random candidates instead of all.
    pub fn toggle_sampling(&self, on: bool) {
        self.inner.borrow_mut().rt.toggle_sampling(on);
    }

    /// `toggle_ignore_small_tensors(on)`: skip storages under 1% of the average size.
    pub fn toggle_ignore_small_tensors(&self, on: bool) {
        self.inner.borrow_mut().rt.toggle_ignore_small_tensors(on);
    }

    /// Turns the debug check (hash on first computation, compare on every recomputation) on
    /// or off. Values computed while it was off are hashed when next computed.
    pub fn toggle_remat_check(&self, on: bool) {
        self.inner.borrow_mut().rt.backend_mut().check = on;
    }

    /// `clear_checkpointpool()`: forgets the current eviction candidates (they stay in memory
    /// and become candidates again after their next use).
    pub fn clear_checkpointpool(&self) {
        self.inner.borrow_mut().rt.clear_checkpointpool();
    }

    /// The counters and the allocator's figures now.
    pub fn profile(&self) -> LiveProfile {
        let inner = self.inner.borrow();
        LiveProfile {
            runtime: *inner.rt.profile(),
            counters: inner.rt.backend().counters(),
            memory: inner.rt.backend().figures(),
        }
    }

    /// `base_compute_time()`: compute of the program's own calls, ns.
    pub fn base_compute_time(&self) -> u64 {
        self.inner.borrow().rt.base_compute_time()
    }

    /// `remat_compute_time()`: compute spent rematerializing, ns.
    pub fn remat_compute_time(&self) -> u64 {
        self.inner.borrow().rt.remat_compute_time()
    }

    /// `search_time()`: wall-clock time spent choosing victims, ns.
    pub fn search_time(&self) -> u64 {
        self.inner.borrow().rt.search_time()
    }

    /// Evictions by the heuristic so far.
    pub fn eviction_count(&self) -> u64 {
        self.inner.borrow().rt.eviction_count()
    }

    /// Rematerializations so far.
    pub fn remat_count(&self) -> u64 {
        self.inner.borrow().rt.remat_count()
    }

    /// `reset_profile()`: zeroes the core's counters.
    pub fn reset_profile(&self) {
        self.inner.borrow_mut().rt.reset_profile();
    }

    /// `new_log(out)`: from now on, writes the program's events (`CONSTANT`, `CALL`,
    /// `MUTATE`, `COPY`, `RELEASE`) in the DTR paper's format, with measured (or estimated)
    /// times, so the run can be replayed by `tensormem dtr` and simrd.
    pub fn new_log(&self, out: Box<dyn Write + Send>) {
        self.inner.borrow_mut().rt.new_log(out);
    }

    /// `annotate_log(text)`: an `ANNOTATE` line (`START`, `BACKWARD`); no-op without a log.
    ///
    /// # Errors
    /// [`LiveError::Log`].
    pub fn annotate_log(&self, text: &str) -> LiveResult<()> {
        Ok(self.inner.borrow_mut().rt.annotate_log(text)?)
    }

    /// Stops logging and flushes the log.
    ///
    /// # Errors
    /// [`LiveError::Log`] when flushing fails (or a deferred write error from a handle's drop).
    pub fn close_log(&self) -> LiveResult<()> {
        let mut inner = self.inner.borrow_mut();
        let log = inner.rt.log.take();
        inner.take_deferred()?;
        if let Some(w) = log {
            w.into_inner()?;
        }
        Ok(())
    }

    /// Runs `f` on the runtime core (for inspection: storage states, counters). A handle
    /// dropped inside `f` keeps its reference (the runtime is borrowed).
    pub fn with_runtime<R>(&self, f: impl FnOnce(&Runtime<LiveBackend>) -> R) -> R {
        f(&self.inner.borrow().rt)
    }

    fn release(&self, id: TensorId, name: u64) {
        // A drop cannot fail: errors wait for the next call.
        let Ok(mut inner) = self.inner.try_borrow_mut() else {
            return;
        };
        if let Some(log) = inner.rt.log_mut() {
            if let Err(e) = log.release(&format!("x{name}")) {
                inner.deferred.get_or_insert(LiveError::Log(e));
            }
        }
        if let Err(e) = inner.rt.release(id) {
            inner.deferred.get_or_insert(e.into());
        }
    }
}

/// One handle object (the prototype's `CheckpointTensorImpl`): a reference to a runtime
/// tensor, moved to the new version by in-place updates; `x<name>` in the log.
struct Handle<'rt> {
    rt: &'rt LiveRuntime,
    id: Cell<TensorId>,
    name: u64,
}

impl Drop for Handle<'_> {
    fn drop(&mut self) {
        self.rt.release(self.id.get(), self.name);
    }
}

/// A checkpointed tensor (the prototype's `CheckpointTensorImpl` behind an `at::Tensor`): a
/// handle to a value that the runtime may evict and rematerialize. Clones are handle copies;
/// dropping the last one releases the tensor (eager eviction).
#[derive(Clone)]
pub struct CheckpointTensor<'rt>(Rc<Handle<'rt>>);

impl fmt::Debug for CheckpointTensor<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckpointTensor")
            .field("name", &self.name())
            .field("id", &self.id())
            .field("shape", &self.shape())
            .field("dtype", &self.dtype())
            .finish()
    }
}

impl<'rt> CheckpointTensor<'rt> {
    fn new(rt: &'rt LiveRuntime, id: TensorId, name: u64) -> Self {
        CheckpointTensor(Rc::new(Handle {
            rt,
            id: Cell::new(id),
            name,
        }))
    }

    /// The runtime.
    pub fn runtime(&self) -> &'rt LiveRuntime {
        self.0.rt
    }

    /// The runtime tensor this handle refers to now (in-place updates move it).
    pub fn id(&self) -> TensorId {
        self.0.id.get()
    }

    /// The handle's name in the operator log, `x<n>`.
    pub fn name(&self) -> String {
        format!("x{}", self.0.name)
    }

    /// Sizes in elements (known without materializing).
    pub fn shape(&self) -> Vec<i64> {
        let inner = self.0.rt.inner.borrow();
        inner.meta[self.id().index()].shape.clone()
    }

    /// Element type.
    pub fn dtype(&self) -> ScalarType {
        let inner = self.0.rt.inner.borrow();
        inner.meta[self.id().index()].dtype
    }

    /// Elements.
    pub fn numel(&self) -> u64 {
        self.shape().iter().map(|&s| s.max(0) as u64).product()
    }

    /// Whether the value is in memory now.
    pub fn is_defined(&self) -> bool {
        let inner = self.0.rt.inner.borrow();
        inner.rt.is_defined(self.id()).unwrap_or(false)
    }

    /// The state of the value's storage (alias pool).
    pub fn storage_state(&self) -> StorageState {
        let inner = self.0.rt.inner.borrow();
        inner
            .rt
            .storage_of(self.id())
            .ok()
            .and_then(|s| inner.rt.storage_state(s))
            .unwrap_or(StorageState::Banished)
    }

    /// `uncheckpoint(t)`: the value, rematerialized (with its evicted ancestors) if it was
    /// evicted. The returned tensor shares the runtime's bytes; drop it before the next call
    /// so that evicting it frees memory.
    ///
    /// # Errors
    /// As [`LiveRuntime::call`] when rematerializing fails; [`Error::Banished`].
    pub fn value(&self) -> LiveResult<Tensor> {
        let mut inner = self.0.rt.inner.borrow_mut();
        inner.take_deferred()?;
        let id = self.id();
        inner.rt.rematerialize(id)?;
        inner
            .rt
            .backend()
            .value(id)
            .cloned()
            .ok_or_else(|| LiveError::Internal {
                message: format!("tensor {id} is defined but has no value"),
            })
    }

    /// `decheckpoint(t)`: the plain tensor, rematerialized if needed and pinned (never evicted
    /// again, since the caller now holds its bytes).
    ///
    /// # Errors
    /// As [`CheckpointTensor::value`].
    pub fn decheckpoint(&self) -> LiveResult<Tensor> {
        self.pin()?;
        self.value()
    }

    /// `pin(t)`: rematerializes the value if needed and keeps it in memory for good.
    ///
    /// # Errors
    /// As [`CheckpointTensor::value`].
    pub fn pin(&self) -> LiveResult<()> {
        let mut inner = self.0.rt.inner.borrow_mut();
        inner.take_deferred()?;
        inner.rt.pin(self.id())?;
        Ok(())
    }

    /// A new handle object sharing this value (one more reference; the log's `COPY`).
    /// Unlike a clone, an in-place update through one does not move the other.
    ///
    /// # Errors
    /// [`LiveError::Runtime`] when the tensor has no reference left; [`LiveError::Log`].
    pub fn shallow_copy(&self) -> LiveResult<CheckpointTensor<'rt>> {
        let rt = self.0.rt;
        let mut inner = rt.inner.borrow_mut();
        inner.take_deferred()?;
        let id = self.id();
        inner.rt.get(id)?;
        let name = inner.name();
        if let Some(log) = inner.rt.log_mut() {
            log.copy(&format!("x{name}"), &self.name())?;
        }
        drop(inner);
        Ok(CheckpointTensor::new(rt, id, name))
    }
}
