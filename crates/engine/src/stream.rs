//! What an op's function receives: [`RunContext`] (MXNet's `RunContext`) and the per-worker
//! [`Stream`] made by a caller-supplied [`StreamProvider`]. The engine never depends on CUDA: a
//! CUDA stream is one implementation of [`Stream`], supplied by the caller.

use std::any::Any;
use std::fmt;

use crate::context::Context;

/// Which worker a stream belongs to (MXNet's per-device compute, copy and priority workers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamKind {
    /// A compute worker (`FnProperty::Normal` and friends on a device), or any CPU worker.
    Compute,
    /// A copy worker (`FnProperty::CopyFromGPU` / `CopyToGPU`).
    Copy,
    /// The high-priority worker (`FnProperty::GPUPrioritized` / `CPUPrioritized`).
    Priority,
}

/// A worker's stream context (MXNet's `mshadow::Stream<gpu>*` in `RunContext::stream`).
///
/// Each device worker owns one, created on the worker's own thread by the engine's
/// [`StreamProvider`]. For the CPU and the simulated device it is [`NoStream`].
pub trait Stream: Send + 'static {
    /// Blocks until the work queued on this stream is done. The threaded engines call it after
    /// every synchronous op (`push_sync`) that ran on this stream, so a sync op's writes are
    /// complete when its variables are released. An error fails the op.
    ///
    /// # Errors
    /// Whatever the device reports.
    fn synchronize(&mut self) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        Ok(())
    }

    /// The stream as `Any`, so an op can downcast to the concrete type it expects.
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// Makes the streams of device workers (MXNet's `StreamManager` / `mshadow::NewStream`).
///
/// Called on the worker's thread, once per worker and context, the first time the worker runs
/// an op of that context.
pub trait StreamProvider: Send + Sync + 'static {
    /// A new stream for a worker of `kind` serving `ctx`.
    fn new_stream(&self, ctx: Context, kind: StreamKind) -> Box<dyn Stream>;
}

/// The stream of the CPU and of simulated devices: does nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoStream;

impl Stream for NoStream {
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// The default provider: [`NoStream`] everywhere.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoStreams;

impl StreamProvider for NoStreams {
    fn new_stream(&self, _ctx: Context, _kind: StreamKind) -> Box<dyn Stream> {
        Box::new(NoStream)
    }
}

/// What an op's function receives (MXNet's `RunContext`): where it runs and the worker's
/// stream.
pub struct RunContext<'a> {
    pub(crate) ctx: Context,
    pub(crate) stream: &'a mut dyn Stream,
}

impl<'a> RunContext<'a> {
    /// A run context, for callers that run op bodies themselves (tests, custom executors).
    pub fn new(ctx: Context, stream: &'a mut dyn Stream) -> Self {
        RunContext { ctx, stream }
    }

    /// The context the op was pushed with (MXNet's `RunContext::ctx`).
    pub fn ctx(&self) -> Context {
        self.ctx
    }

    /// The worker's stream (MXNet's `RunContext::get_stream`).
    pub fn stream(&mut self) -> &mut dyn Stream {
        self.stream
    }
}

impl fmt::Debug for RunContext<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunContext")
            .field("ctx", &self.ctx)
            .finish_non_exhaustive()
    }
}
