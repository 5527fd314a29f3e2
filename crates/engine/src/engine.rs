//! The [`Engine`] trait every engine implements, the push options ([`FnProperty`],
//! [`PushOptions`]) and the configuration that picks an engine ([`EngineConfig`], with
//! `TENSORMEM_ENGINE_TYPE` as MXNet's `MXNET_ENGINE_TYPE`).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::context::Context;
use crate::error::{EngineError, Result};
use crate::naive::NaiveEngine;
use crate::opr::{AsyncFn, Completion, Operator, OperatorFn, SyncFn, Task};
use crate::stream::{NoStreams, RunContext, StreamProvider};
use crate::threaded::ThreadedEngine;
use crate::var::Var;

/// What kind of work an op is, which decides the worker that runs it (MXNet's `FnProperty`,
/// all eight kinds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FnProperty {
    /// Ordinary computation (MXNet's `kNormal`): the device's compute workers, or the CPU pool.
    #[default]
    Normal,
    /// A copy from a device to the host (`kCopyFromGPU`): the device's copy workers.
    CopyFromGPU,
    /// A copy from the host to a device (`kCopyToGPU`): the device's copy workers.
    CopyToGPU,
    /// CPU work that should not queue behind normal CPU work (`kCPUPrioritized`): the CPU
    /// priority worker (per-device engine).
    CPUPrioritized,
    /// A function that only launches work and completes later (`kAsync`): run inline in the
    /// pushing thread when it is ready at push time; otherwise dispatched like `Normal`.
    Async,
    /// The op `delete_variable` pushes (`kDeleteVar`).
    DeleteVar,
    /// Device work that should not queue behind normal work (`kGPUPrioritized`): the device's
    /// priority worker (per-device engine).
    GPUPrioritized,
    /// Runs even when a variable it uses carries an error (`kNoSkip`); every other kind is
    /// skipped then.
    NoSkip,
}

/// Where, how and how urgently to run a pushed op (MXNet's trailing `PushAsync` arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PushOptions {
    /// Execution context (`exec_ctx`). Default: the CPU.
    pub ctx: Context,
    /// The kind of op (`prop`). Default: [`FnProperty::Normal`].
    pub prop: FnProperty,
    /// Larger runs first among ready ops in the same worker queue (`priority`; MXNet's FIFO
    /// queues ignore it, ours honour it in every worker queue). Default 0.
    pub priority: i32,
    /// A name for error messages (`opr_name`). Default `"op"`.
    pub name: &'static str,
}

impl Default for PushOptions {
    fn default() -> Self {
        PushOptions {
            ctx: Context::cpu(),
            prop: FnProperty::Normal,
            priority: 0,
            name: "op",
        }
    }
}

impl PushOptions {
    /// Default options on context `ctx`.
    pub fn on(ctx: Context) -> Self {
        PushOptions {
            ctx,
            ..Self::default()
        }
    }

    /// With property `prop`.
    pub fn prop(mut self, prop: FnProperty) -> Self {
        self.prop = prop;
        self
    }

    /// With priority `priority`.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// With name `name`.
    pub fn name(mut self, name: &'static str) -> Self {
        self.name = name;
        self
    }
}

/// Which engine (MXNet's `MXNET_ENGINE_TYPE` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EngineKind {
    /// `NaiveEngine`: every op runs inline in `push`, synchronously, on the pushing thread;
    /// pushes from several threads run one op at a time; errors are returned by the push
    /// itself.
    Naive,
    /// `ThreadedEngine` (MXNet's `ThreadedEnginePooled`): one shared worker pool for all ops,
    /// plus one copy worker for `CopyFromGPU` / `CopyToGPU` ops.
    Pooled,
    /// `ThreadedEnginePerDevice` (MXNet's default): a CPU worker pool and a CPU priority
    /// worker; per device, compute workers, copy workers and a priority worker, each owning a
    /// stream.
    PerDevice,
}

impl EngineKind {
    /// MXNet's name for it (`NaiveEngine`, `ThreadedEngine`, `ThreadedEnginePerDevice`).
    pub fn mxnet_name(self) -> &'static str {
        match self {
            EngineKind::Naive => "NaiveEngine",
            EngineKind::Pooled => "ThreadedEngine",
            EngineKind::PerDevice => "ThreadedEnginePerDevice",
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.mxnet_name())
    }
}

impl FromStr for EngineKind {
    type Err = EngineError;

    /// Accepts MXNet's names (`NaiveEngine`, `ThreadedEngine`, `ThreadedEnginePooled`,
    /// `ThreadedEnginePerDevice`) and the short ones (`naive`, `pooled`, `per-device`).
    ///
    /// # Errors
    /// [`EngineError::Config`] naming `TENSORMEM_ENGINE_TYPE` for anything else.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "NaiveEngine" | "naive" => Ok(EngineKind::Naive),
            "ThreadedEngine" | "ThreadedEnginePooled" | "pooled" => Ok(EngineKind::Pooled),
            "ThreadedEnginePerDevice" | "per-device" | "perdevice" => Ok(EngineKind::PerDevice),
            _ => Err(EngineError::Config {
                key: ENV_ENGINE_TYPE.to_string(),
                value: s.to_string(),
                reason: "expected NaiveEngine, ThreadedEngine or ThreadedEnginePerDevice",
            }),
        }
    }
}

/// The environment variable [`EngineConfig::from_env`] reads for the engine kind (MXNet's
/// `MXNET_ENGINE_TYPE`).
pub const ENV_ENGINE_TYPE: &str = "TENSORMEM_ENGINE_TYPE";

/// Environment variables for the worker counts (MXNet's `MXNET_CPU_WORKER_NTHREADS`,
/// `MXNET_CPU_PRIORITY_NTHREADS`, `MXNET_GPU_WORKER_NTHREADS`, `MXNET_GPU_COPY_NTHREADS`) and
/// the bulk size (`MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN`'s role).
pub const ENV_WORKER_COUNTS: [&str; 5] = [
    "TENSORMEM_CPU_WORKER_NTHREADS",
    "TENSORMEM_CPU_PRIORITY_NTHREADS",
    "TENSORMEM_GPU_WORKER_NTHREADS",
    "TENSORMEM_GPU_COPY_NTHREADS",
    "TENSORMEM_ENGINE_BULK_SIZE",
];

/// How to build an engine.
#[derive(Clone)]
pub struct EngineConfig {
    /// Which engine. Default: [`EngineKind::PerDevice`] (MXNet's default).
    pub kind: EngineKind,
    /// CPU pool workers (per-device) or shared pool workers (pooled). Default: the available
    /// parallelism, at most 8 (MXNet's default is 1).
    pub cpu_workers: usize,
    /// CPU priority workers (per-device). Default 1 (MXNet: 4).
    pub cpu_priority_workers: usize,
    /// Compute workers per device (per-device). Default 2 (MXNet's default).
    pub device_compute_workers: usize,
    /// Copy workers per device (per-device), and the pooled engine's copy workers. Default 1.
    pub device_copy_workers: usize,
    /// Priority workers per device (per-device). Default 1.
    pub device_priority_workers: usize,
    /// Initial bulk size (0 = no bulking; see [`Engine::set_bulk_size`]). Default 0.
    pub bulk_size: usize,
    /// Makes each device worker's stream. Default: [`NoStreams`].
    pub streams: Arc<dyn StreamProvider>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        EngineConfig {
            kind: EngineKind::PerDevice,
            cpu_workers: cpus.clamp(1, 8),
            cpu_priority_workers: 1,
            device_compute_workers: 2,
            device_copy_workers: 1,
            device_priority_workers: 1,
            bulk_size: 0,
            streams: Arc::new(NoStreams),
        }
    }
}

impl fmt::Debug for EngineConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineConfig")
            .field("kind", &self.kind)
            .field("cpu_workers", &self.cpu_workers)
            .field("cpu_priority_workers", &self.cpu_priority_workers)
            .field("device_compute_workers", &self.device_compute_workers)
            .field("device_copy_workers", &self.device_copy_workers)
            .field("device_priority_workers", &self.device_priority_workers)
            .field("bulk_size", &self.bulk_size)
            .finish_non_exhaustive()
    }
}

impl EngineConfig {
    /// The default configuration of `kind`.
    pub fn new(kind: EngineKind) -> Self {
        EngineConfig {
            kind,
            ..Self::default()
        }
    }

    /// With `n` CPU (or pool) workers.
    pub fn cpu_workers(mut self, n: usize) -> Self {
        self.cpu_workers = n;
        self
    }

    /// With streams from `provider`.
    pub fn streams(mut self, provider: Arc<dyn StreamProvider>) -> Self {
        self.streams = provider;
        self
    }

    /// The defaults overridden by the process environment: `TENSORMEM_ENGINE_TYPE` (as
    /// `MXNET_ENGINE_TYPE`) and [`ENV_WORKER_COUNTS`]. Only this function reads the
    /// environment.
    ///
    /// # Errors
    /// [`EngineError::Config`] for an unknown engine type or a count that is not a number.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|key| std::env::var(key).ok())
    }

    /// As [`EngineConfig::from_env`], reading variables through `lookup` (for tests and for
    /// callers with their own settings store).
    ///
    /// # Errors
    /// As [`EngineConfig::from_env`].
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut config = EngineConfig::default();
        if let Some(kind) = lookup(ENV_ENGINE_TYPE) {
            config.kind = kind.trim().parse()?;
        }
        let fields: [&mut usize; 5] = [
            &mut config.cpu_workers,
            &mut config.cpu_priority_workers,
            &mut config.device_compute_workers,
            &mut config.device_copy_workers,
            &mut config.bulk_size,
        ];
        for (key, field) in ENV_WORKER_COUNTS.iter().zip(fields) {
            if let Some(value) = lookup(key) {
                *field = value.trim().parse().map_err(|_| EngineError::Config {
                    key: key.to_string(),
                    value: value.clone(),
                    reason: "expected a non-negative integer",
                })?;
            }
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks the worker counts (each threaded pool needs at least one worker).
    ///
    /// # Errors
    /// [`EngineError::Config`] naming the count that is zero.
    pub fn validate(&self) -> Result<()> {
        let counts = [
            (ENV_WORKER_COUNTS[0], self.cpu_workers),
            (ENV_WORKER_COUNTS[1], self.cpu_priority_workers),
            (ENV_WORKER_COUNTS[2], self.device_compute_workers),
            (ENV_WORKER_COUNTS[3], self.device_copy_workers),
            ("device_priority_workers", self.device_priority_workers),
        ];
        for (key, n) in counts {
            if n == 0 {
                return Err(EngineError::Config {
                    key: key.to_string(),
                    value: "0".to_string(),
                    reason: "a worker pool needs at least one worker",
                });
            }
        }
        Ok(())
    }

    /// Builds the configured engine (MXNet's `Engine::Get()` after `MXNET_ENGINE_TYPE`).
    ///
    /// # Errors
    /// As [`EngineConfig::validate`].
    pub fn build(&self) -> Result<Arc<dyn Engine>> {
        self.validate()?;
        let engine: Arc<dyn Engine> = match self.kind {
            EngineKind::Naive => Arc::new(NaiveEngine::with_config(self)),
            EngineKind::Pooled | EngineKind::PerDevice => Arc::new(ThreadedEngine::new(self)?),
        };
        engine.set_bulk_size(self.bulk_size);
        Ok(engine)
    }
}

/// The function `delete_variable` runs once every earlier use of the variable is done
/// (MXNet's `delete_fn`, which frees the array's memory).
pub type DeleteFn = Box<dyn FnOnce(&mut RunContext<'_>) + Send + 'static>;

/// MXNet's dependency engine: push ops with the variables they read and write; ops that share
/// a variable, at least one writing it, run in push order; readers run in parallel.
///
/// Every method may be called from any thread (MXNet's push is not thread-safe; ours is, and
/// the order promise holds per pushing thread). Generic conveniences (`push_sync`,
/// `push_async`, `new_operator_fn`) are in [`EngineExt`], implemented for every engine and for
/// `dyn Engine`.
pub trait Engine: Send + Sync {
    /// Which engine this is.
    fn kind(&self) -> EngineKind;

    /// A new variable (MXNet's `NewVariable`). Usable only with this engine.
    fn new_variable(&self) -> Var;

    /// Pushes a built op (MXNet's `PushAsync` / `PushSync`). Returns at once on threaded
    /// engines; runs the op on the naive engine (after the op another thread runs, if any).
    ///
    /// # Errors
    /// [`EngineError::VarDeleted`], [`EngineError::ForeignVar`], [`EngineError::Stopped`],
    /// [`EngineError::DeviceOutOfRange`]; on the naive engine also the op's own failure.
    fn push_task(&self, task: Task) -> Result<()>;

    /// Deletes a variable once every op pushed before on it is done, running `delete_fn` then
    /// (MXNet's `DeleteVariable`, an op with [`FnProperty::DeleteVar`] writing the variable).
    /// Later pushes on it fail with [`EngineError::VarDeleted`] (MXNet would run them on freed
    /// memory).
    ///
    /// # Errors
    /// [`EngineError::VarDeleted`] when already deleted; [`EngineError::ForeignVar`];
    /// [`EngineError::Stopped`].
    fn delete_variable(&self, var: &Var, ctx: Context, delete_fn: Option<DeleteFn>) -> Result<()>;

    /// A pre-built op to push many times (MXNet's `NewOperator`).
    ///
    /// # Errors
    /// [`EngineError::ForeignVar`].
    fn new_operator(
        &self,
        f: OperatorFn,
        const_vars: &[Var],
        mutable_vars: &[Var],
        prop: FnProperty,
        name: &'static str,
    ) -> Result<Operator>;

    /// Pushes a pre-built op (MXNet's `Push`).
    ///
    /// # Errors
    /// [`EngineError::OperatorDeleted`], and as [`Engine::push_task`].
    fn push(&self, op: &Operator, ctx: Context, priority: i32) -> Result<()>;

    /// Deletes a pre-built op (MXNet's `DeleteOperator`): pushes already made still run (they
    /// keep it alive); later pushes fail with [`EngineError::OperatorDeleted`].
    ///
    /// # Errors
    /// [`EngineError::OperatorDeleted`] when already deleted.
    fn delete_operator(&self, op: &Operator) -> Result<()> {
        if op.0.deleted.swap(true, crate::sync::Ordering::AcqRel) {
            return Err(EngineError::OperatorDeleted { op: op.name() });
        }
        Ok(())
    }

    /// Waits until every write pushed before on `var` is done (pending reads do not block it),
    /// then reports the variable's undelivered error, if any (MXNet's `WaitForVar`).
    ///
    /// # Errors
    /// The op failure the variable carries (delivered once); [`EngineError::WaitInsideOp`]
    /// when called from inside an op of this engine; [`EngineError::ForeignVar`].
    fn wait_for_var(&self, var: &Var) -> Result<()>;

    /// As [`Engine::wait_for_var`], but also waits for the reads pushed before (MXNet's
    /// `NDArray::WaitToWrite`).
    ///
    /// # Errors
    /// As [`Engine::wait_for_var`].
    fn wait_to_write(&self, var: &Var) -> Result<()>;

    /// Waits until every pushed op is done, then reports the first undelivered failure and
    /// clears all others (MXNet's `WaitForAll`).
    ///
    /// # Errors
    /// The first op failure; [`EngineError::WaitInsideOp`] from inside an op.
    fn wait_for_all(&self) -> Result<()>;

    /// Reports `var`'s undelivered error without waiting (MXNet's `Throw`).
    ///
    /// # Errors
    /// The op failure the variable carries (delivered once).
    fn throw(&self, var: &Var) -> Result<()>;

    /// Sets the bulk size and returns the previous one (MXNet's `set_bulk_size`): with `n > 0`,
    /// consecutive `push_sync`s of `Normal` ops with priority 0 on one context are merged into
    /// one op of at most `n`. Flushes the current bulk. A no-op on the naive engine.
    fn set_bulk_size(&self, n: usize) -> usize;

    /// The current bulk size.
    fn bulk_size(&self) -> usize;

    /// Waits for all work (including work pushed while stopping), then stops the workers
    /// (MXNet's `Stop`). Pushes fail with [`EngineError::Stopped`] until [`Engine::start`].
    ///
    /// # Errors
    /// [`EngineError::WaitInsideOp`] from inside an op. Op failures stay undelivered.
    fn stop(&self) -> Result<()>;

    /// Restarts the workers after [`Engine::stop`] (MXNet's `Start`); a no-op when running.
    fn start(&self);

    /// Ops pushed and not yet known to be complete (an upper bound).
    fn num_pending(&self) -> usize;
}

/// Generic conveniences over [`Engine`], for every engine including `dyn Engine`.
pub trait EngineExt: Engine {
    /// Pushes a synchronous op (MXNet's `PushSync`): `f` runs once every earlier conflicting
    /// op is done; its `Err` (or panic) is stored on `mutable_vars`.
    ///
    /// # Errors
    /// As [`Engine::push_task`].
    fn push_sync<F: SyncFn>(
        &self,
        f: F,
        const_vars: &[Var],
        mutable_vars: &[Var],
        opts: PushOptions,
    ) -> Result<()> {
        self.push_task(Task::sync(f, const_vars, mutable_vars, opts))
    }

    /// Pushes an asynchronous op (MXNet's `PushAsync`): the op holds its variables until the
    /// [`Completion`] `f` receives is called (or dropped), from any thread.
    ///
    /// # Errors
    /// As [`Engine::push_task`].
    fn push_async<F: AsyncFn>(
        &self,
        f: F,
        const_vars: &[Var],
        mutable_vars: &[Var],
        opts: PushOptions,
    ) -> Result<()> {
        self.push_task(Task::asynchronous(f, const_vars, mutable_vars, opts))
    }

    /// [`Engine::new_operator`] with an unboxed body.
    ///
    /// # Errors
    /// As [`Engine::new_operator`].
    fn new_operator_fn<F>(
        &self,
        f: F,
        const_vars: &[Var],
        mutable_vars: &[Var],
        prop: FnProperty,
        name: &'static str,
    ) -> Result<Operator>
    where
        F: Fn(&mut RunContext<'_>, Completion) + Send + Sync + 'static,
    {
        self.new_operator(Box::new(f), const_vars, mutable_vars, prop, name)
    }
}

impl<E: Engine + ?Sized> EngineExt for E {}
