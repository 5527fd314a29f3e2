//! MXNet's dependency engine in Rust: push ops with the variables they read (const vars) and
//! write (mutable vars); ops that share a variable, at least one of them writing it, run in
//! push order; readers run in parallel; push returns at once.
//!
//! Engines ([`EngineConfig::build`], or `TENSORMEM_ENGINE_TYPE` through
//! [`EngineConfig::from_env`]): [`NaiveEngine`] (inline, synchronous), and [`ThreadedEngine`]
//! pooled or per device (a CPU pool; per device, copy and compute workers each owning a
//! stream). The thread that completes an op dispatches what it releases; there is no
//! scheduler thread. [`Tracker`] is the same core with the caller as executor.
//!
//! | MXNet (`include/mxnet/engine.h`) | here |
//! |---|---|
//! | `NewVariable` / `DeleteVariable` | [`Engine::new_variable`] / [`Engine::delete_variable`] |
//! | `PushAsync` / `PushSync` | [`EngineExt::push_async`] / [`EngineExt::push_sync`] ([`Engine::push_task`]) |
//! | `NewOperator` / `Push` / `DeleteOperator` | [`Engine::new_operator`] / [`Engine::push`] / [`Engine::delete_operator`] |
//! | `WaitForVar` / `WaitForAll` / `Throw` | [`Engine::wait_for_var`] / [`Engine::wait_for_all`] / [`Engine::throw`] |
//! | `NDArray::WaitToWrite` | [`Engine::wait_to_write`] |
//! | `set_bulk_size` / `Stop` / `Start` | [`Engine::set_bulk_size`] / [`Engine::stop`] / [`Engine::start`] |
//! | `CallbackOnComplete` / `RunContext` / `Context` | [`Completion`] / [`RunContext`] / [`Context`] |
//! | `FnProperty`, `VarHandle`, `OprHandle` | [`FnProperty`], [`Var`], [`Operator`] |
//!
//! The engine is tensor-agnostic and depends on no crate of this workspace; MXNet's `NDArray`
//! over aten's `Tensor` (an array paired with a variable, whose ops are pushed with the
//! inputs' variables as const vars and the output's as mutable var) is the `engine-ndarray`
//! crate.
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use engine::{EngineConfig, EngineExt, EngineKind, PushOptions};
//!
//! let engine = EngineConfig::new(EngineKind::PerDevice).cpu_workers(2).build()?;
//! let (a, b) = (engine.new_variable(), engine.new_variable());
//! let value = Arc::new(AtomicU64::new(1));
//! let v = Arc::clone(&value);
//! engine.push_sync(move |_| { v.fetch_add(1, Ordering::SeqCst); Ok(()) }, &[], &[a.clone()], PushOptions::default())?;
//! let v = Arc::clone(&value);
//! engine.push_sync(move |_| { v.fetch_add(10, Ordering::SeqCst); Ok(()) }, &[a.clone()], &[b.clone()], PushOptions::default())?;
//! engine.wait_for_var(&b)?;
//! assert_eq!(value.load(Ordering::SeqCst), 12);
//! assert_eq!((a.version(), b.version()), (1, 1));
//! # Ok::<(), engine::EngineError>(())
//! ```

mod bulk;
mod context;
mod engine;
mod error;
mod latch;
mod naive;
mod opr;
mod per_device;
mod pooled;
mod stream;
mod sync;
mod threaded;
mod tracker;
pub mod var;
mod worker;
pub mod workloads;

pub use crate::context::{Context, DevType, MAX_DEVICES};
pub use crate::engine::{
    DeleteFn, ENV_ENGINE_TYPE, ENV_WORKER_COUNTS, Engine, EngineConfig, EngineExt, EngineKind,
    FnProperty, PushOptions,
};
pub use crate::error::{EngineError, OpResult, Result};
pub use crate::naive::NaiveEngine;
pub use crate::opr::{AsyncFn, Completion, Operator, OperatorFn, SyncFn, Task};
pub use crate::stream::{NoStream, NoStreams, RunContext, Stream, StreamKind, StreamProvider};
pub use crate::threaded::ThreadedEngine;
pub use crate::tracker::{ReadyOp, Tracker};
pub use crate::var::Var;
