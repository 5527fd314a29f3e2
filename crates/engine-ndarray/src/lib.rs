//! MXNet's `NDArray` over aten: [`NDArray`] pairs an aten [`Tensor`] with an engine [`Var`],
//! and its ops are pushed to the engine with the inputs' variables as const vars and the
//! output's as mutable var. The layer above both `engine` (which knows no tensors) and `aten`,
//! as MXNet's `src/ndarray` sits above `src/engine`.
//!
//! | MXNet (`include/mxnet/ndarray.h`) | here |
//! |---|---|
//! | `NDArray(shape, ctx)` | [`NDArray::zeros`] / [`NDArray::empty`] / [`NDArray::new`] (an existing tensor) |
//! | `WaitToRead` / `WaitToWrite` | [`NDArray::wait_to_read`] / [`NDArray::wait_to_write`] |
//! | `SyncCopyFromCPU` / `SyncCopyToCPU` | [`NDArray::sync_copy_from_cpu`] / [`NDArray::sync_copy_to_cpu`] |
//! | `asnumpy()` | [`NDArray::to_vec`] |
//! | `CopyFromTo(from, to)` / `Copy(ctx)` | [`NDArray::copy_from`] / [`NDArray::copy_to`] |
//! | `operator=(scalar)` (`SetValue`) | [`NDArray::fill_`] |
//! | `Reshape` / `Slice` (views sharing the chunk's variable) | [`NDArray::reshape`] / [`NDArray::slice`] |
//! | `Imperative::Invoke` of `elemwise_add`, `dot`, `relu`, `sum`, ... | [`NDArray::add`], [`NDArray::matmul`], [`NDArray::relu`], [`NDArray::sum`], ... |
//! | `Imperative::PushFCompute` (any kernel) | [`NDArray::push_op`] |
//! | `var()`, `ctx()`, `shape()`, `dtype()` | [`NDArray::var`], [`NDArray::context`], [`NDArray::shape`], [`NDArray::dtype`] |
//!
//! # How an op is pushed
//!
//! As MXNet's imperative invoke: the output's shape and dtype are inferred and the output is
//! allocated **at push time**, on the pushing thread (on the first input's device); then one
//! op is pushed ([`EngineExt::push_sync`]) whose closure holds clones of the input and output
//! tensors, runs aten's kernel and copies its result into the output (aten has no `out=`
//! kernels, so each out-of-place op costs one extra copy of its result). In-place ops
//! (`add_`, ...) write the array itself: its variable is the mutable var.
//!
//! Copies follow MXNet's `CopyFromTo`: CPU to device is [`FnProperty::CopyToGPU`] on the
//! destination's context, device to CPU or to another device [`FnProperty::CopyFromGPU`] on
//! the source's (device to device `Normal` when the dtypes differ), CPU to CPU `Normal`. The
//! pooled engine runs copy ops on its copy pool, the per-device engine on the device's copy
//! workers.
//!
//! # Errors: two channels, as MXNet
//!
//! * **At the call** ([`NDArrayError::Tensor`]): what the push needs to know, i.e. shape
//!   inference (shapes that do not broadcast, matrix products that do not fit, dims out of
//!   range, an in-place result that is not the array's shape), and the host buffer checks of
//!   `sync_copy_*` (dtype, "memory size do not match" naming both byte sizes), which are made
//!   before waiting. Push refusals from the engine (a deleted or foreign variable, a stopped
//!   engine) come as [`NDArrayError::Engine`].
//! * **Through the engine**: everything aten checks when the kernel runs (dtypes, devices,
//!   kernels missing for a dtype or a device, any error of a [`NDArray::push_op`] body) fails
//!   the op. As for any engine op, the failure is stored on the output's variable, later ops
//!   reading or writing it are skipped and inherit it, and it is delivered **once**, by the
//!   first [`NDArray::wait_to_read`] / [`NDArray::wait_to_write`] / `sync_copy_*` on an
//!   affected array (or `wait_for_all`), as [`EngineError::OpFailed`] whose source is the
//!   [`aten::Error`] ([`NDArrayError::tensor_error`] finds it). Skipping holds for the ops that
//!   start before the delivery: a read released together with the `wait_to_read` that
//!   delivers the error may start after it and run (as in MXNet, where the rethrow clears the
//!   shared exception). The naive engine runs ops inside the push, so there the failure is
//!   returned by the op's call itself.
//!
//! # Lifetime
//!
//! An `NDArray` is a shared handle (cloning it is cheap; views share the variable). When the
//! last handle of an array and of its views is dropped, the variable is deleted with
//! [`Engine::delete_variable`], whose function drops the array's tensor: the memory is released
//! only after every op pushed before on the variable, as MXNet's `Chunk` destructor. Pushed ops
//! also hold their own tensor handles, so no op can ever touch freed memory.
//!
//! # Direct tensor access
//!
//! [`NDArray::tensor`] gives the aten tensor. Reading it directly is only meaningful after
//! [`NDArray::wait_to_read`], writing it after [`NDArray::wait_to_write`] (aten's per-storage
//! data lock keeps every access memory-safe either way; the waits give the push-order values).
//! Do not hold one of aten's slice guards on it across a wait: a pending op that needs the
//! same storage would block on the guard while the wait blocks on the op.
//! The run context's stream is not used: aten's kernels and copies are synchronous.
//!
//! ```
//! use std::sync::Arc;
//! use engine_ndarray::NDArray;
//! use engine::{Engine, EngineConfig, EngineKind};
//! use c10_core::Device;
//!
//! let engine: Arc<dyn Engine> = EngineConfig::new(EngineKind::PerDevice).cpu_workers(2).build()?;
//! let x = NDArray::from_slice(&engine, &[1.0f32, -2.0, 3.0, -4.0], &[2, 2], Device::cpu())?;
//! let w = NDArray::from_slice(&engine, &[1.0f32, 0.0, 0.0, 1.0], &[2, 2], Device::cpu())?;
//! let y = x.matmul(&w)?.relu()?; // pushed; returns at once
//! y.add_(&x)?; // in place: y's variable is written
//! let mut out = [0f32; 4];
//! y.sync_copy_to_cpu(&mut out)?; // waits for y's pending writes
//! assert_eq!(out, [2.0, -2.0, 6.0, -4.0]);
//! # Ok::<(), engine_ndarray::NDArrayError>(())
//! ```

use std::fmt;
use std::sync::Arc;

use aten::layout::{broadcast_shapes, wrap_dim};
use aten::promotion::promote_integer_to_float;
use aten::{Tensor, TensorOptions};
use c10_core::{Device, DeviceType, Element, ScalarType};

use engine::{Context, Engine, EngineError, EngineExt, FnProperty, OpResult, PushOptions, Var};

/// Errors of [`NDArray`] calls.
#[derive(Debug, thiserror::Error)]
pub enum NDArrayError {
    /// From the engine: a push it refused, or an op failure delivered by a wait. An aten error
    /// raised inside a pushed op arrives as [`EngineError::OpFailed`] whose `source` is the
    /// [`aten::Error`] (see [`NDArrayError::tensor_error`]).
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// From aten, raised by the call itself: shape inference at push time, the host buffer
    /// checks and the copy of `sync_copy_*`, tensor creation.
    #[error(transparent)]
    Tensor(#[from] aten::Error),
}

impl NDArrayError {
    /// The aten error behind this one: the call's own, or the one a pushed op failed with.
    pub fn tensor_error(&self) -> Option<&aten::Error> {
        match self {
            NDArrayError::Tensor(e) => Some(e),
            NDArrayError::Engine(EngineError::OpFailed { source, .. }) => {
                source.downcast_ref::<aten::Error>()
            }
            NDArrayError::Engine(_) => None,
        }
    }

    /// Whether this is an op failure delivered by the engine (once) rather than an error of
    /// the call ([`EngineError::is_op_failure`]).
    pub fn is_op_failure(&self) -> bool {
        matches!(self, NDArrayError::Engine(e) if e.is_op_failure())
    }
}

/// Shorthand for `Result<T, NDArrayError>`.
pub type Result<T, E = NDArrayError> = std::result::Result<T, E>;

/// The engine context that runs ops on `device`'s tensors: `cpu` on [`Context::cpu`], `cuda:i`
/// on [`Context::cuda`], `sim:i` on [`Context::sim`] (MXNet's `NDArray::ctx()`).
///
/// # Errors
/// [`aten::Error::UnsupportedDevice`] for `meta`, which has no bytes to compute on.
pub fn context_of(device: Device) -> Result<Context> {
    let index = u32::from(device.index().unwrap_or(0));
    match device.device_type() {
        DeviceType::Cpu => Ok(Context::cpu()),
        DeviceType::Cuda => Ok(Context::cuda(index)),
        DeviceType::Sim => Ok(Context::sim(index)),
        DeviceType::Meta => Err(aten::Error::UnsupportedDevice {
            op: "NDArray",
            device,
            reason: "a meta tensor has no bytes, so the engine has no context to run ops on it",
        }
        .into()),
    }
}

/// What the handles of one array (and of its views) share: the variable, the engine and the
/// whole tensor (MXNet's `NDArray::Chunk`).
struct Chunk {
    var: Var,
    ctx: Context,
    engine: Arc<dyn Engine>,
    /// The whole tensor, handed to `delete_variable`'s function on drop, so the memory goes
    /// after the variable's last op.
    tensor: Option<Tensor>,
}

impl Drop for Chunk {
    fn drop(&mut self) {
        let tensor = self.tensor.take();
        // Errors (a stopped engine, a variable the user deleted) leave nothing to do: the
        // tensor is then dropped here, and pending ops hold their own handles.
        let _ =
            self.engine
                .delete_variable(&self.var, self.ctx, Some(Box::new(move |_| drop(tensor))));
    }
}

/// An n-dimensional array whose ops run on a dependency engine: an aten [`Tensor`] paired with
/// an engine [`Var`] (MXNet's `NDArray`). See the [module docs](self).
///
/// Cloning is cheap and gives the same array (MXNet's `NDArray` copy). Views
/// ([`NDArray::reshape`], [`NDArray::slice`]) share the array's variable.
#[derive(Clone)]
pub struct NDArray {
    tensor: Tensor,
    chunk: Arc<Chunk>,
}

impl fmt::Debug for NDArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NDArray")
            .field("shape", &self.shape())
            .field("dtype", &self.dtype())
            .field("device", &self.device())
            .field("var", &self.chunk.var)
            .finish()
    }
}

/// Where a copy from `from` to `to` runs and as what, as MXNet's `CopyFromTo`.
fn copy_placement(from: Context, to: Context, same_dtype: bool) -> (Context, FnProperty) {
    match (from.is_cpu(), to.is_cpu()) {
        (true, true) => (from, FnProperty::Normal),
        (true, false) => (to, FnProperty::CopyToGPU),
        (false, true) => (from, FnProperty::CopyFromGPU),
        (false, false) if same_dtype => (from, FnProperty::CopyFromGPU),
        (false, false) => (from, FnProperty::Normal),
    }
}

/// The output shape of `matmul` with NumPy's rules, as aten's `Tensor::matmul` computes it.
fn matmul_shape(a: &[i64], b: &[i64]) -> aten::Result<Vec<i64>> {
    let (d1, d2) = (a.len(), b.len());
    if d1 == 0 || d2 == 0 {
        return Err(aten::Error::InvalidArgument {
            op: "matmul",
            message: format!(
                "both arguments to matmul need to be at least 1D, but they are {d1}D and {d2}D"
            ),
        });
    }
    let sa: Vec<i64> = if d1 == 1 { vec![1, a[0]] } else { a.to_vec() };
    let sb: Vec<i64> = if d2 == 1 { vec![b[0], 1] } else { b.to_vec() };
    let (na, nb) = (sa.len(), sb.len());
    if sa[na - 1] != sb[nb - 2] {
        return Err(aten::Error::ShapeMismatch {
            op: "matmul",
            lhs: a.to_vec(),
            rhs: b.to_vec(),
            reason: format!(
                "mat1 and mat2 shapes cannot be multiplied ({}x{} and {}x{})",
                sa[na - 2],
                sa[na - 1],
                sb[nb - 2],
                sb[nb - 1]
            ),
        });
    }
    let mut out = broadcast_shapes("matmul", &sa[..na - 2], &sb[..nb - 2])?;
    if d1 > 1 {
        out.push(sa[na - 2]);
    }
    if d2 > 1 {
        out.push(sb[nb - 1]);
    }
    Ok(out)
}

/// The output shape of a reduction over `dims` (all when empty), as aten's reductions.
fn reduce_shape(
    op: &'static str,
    sizes: &[i64],
    dims: &[i64],
    keepdim: bool,
) -> aten::Result<Vec<i64>> {
    let n = sizes.len();
    let mut reduced = vec![dims.is_empty(); n];
    let mut seen = vec![false; n.max(1)];
    for &dim in dims {
        let d = wrap_dim(op, dim, n)?;
        if std::mem::replace(&mut seen[d], true) {
            return Err(aten::Error::InvalidArgument {
                op,
                message: format!("dim {d} appears multiple times in the list of dims"),
            });
        }
        if n > 0 {
            reduced[d] = true;
        }
    }
    Ok(sizes
        .iter()
        .zip(&reduced)
        .filter_map(|(&s, &r)| match (r, keepdim) {
            (false, _) => Some(s),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect())
}

/// Refuses an in-place op whose broadcast result is not the array's own shape, as aten's
/// in-place kernels.
fn check_in_place(op: &'static str, this: &[i64], other: &[i64]) -> aten::Result<()> {
    let shape = broadcast_shapes(op, this, other)?;
    if shape != this {
        return Err(aten::Error::ShapeMismatch {
            op,
            lhs: this.to_vec(),
            rhs: other.to_vec(),
            reason: format!(
                "output with shape {this:?} doesn't match the broadcast shape {shape:?}"
            ),
        });
    }
    Ok(())
}

/// Copies a kernel's `result` into the output allocated at push time.
fn write_result(op: &'static str, out: &Tensor, result: &Tensor) -> aten::Result<()> {
    if result.sizes() != out.sizes() {
        return Err(aten::Error::ShapeMismatch {
            op,
            lhs: out.sizes().to_vec(),
            rhs: result.sizes().to_vec(),
            reason: "the kernel's result does not have the shape inferred at push time".into(),
        });
    }
    out.copy_(result)
}

/// The dtype of a sum: floating dtypes keep theirs, integers and Bool give `Long`, as aten.
fn sum_dtype(dtype: ScalarType) -> ScalarType {
    if dtype.is_floating_point() {
        dtype
    } else {
        ScalarType::Long
    }
}

impl NDArray {
    /// An array over `tensor`, with a new variable of `engine` (MXNet's `NDArray(TBlob, dev_id)`
    /// constructor). From now on, access the tensor through the array's ops and waits only.
    ///
    /// # Errors
    /// As [`context_of`].
    pub fn new(engine: &Arc<dyn Engine>, tensor: Tensor) -> Result<NDArray> {
        let ctx = context_of(tensor.device())?;
        let chunk = Chunk {
            var: engine.new_variable(),
            ctx,
            engine: Arc::clone(engine),
            tensor: Some(tensor.clone()),
        };
        Ok(NDArray {
            tensor,
            chunk: Arc::new(chunk),
        })
    }

    /// A zero-filled array of `shape` with `options`' dtype and device (MXNet's
    /// `NDArray(shape, ctx, false, dtype)` followed by `= 0`).
    ///
    /// # Errors
    /// Aten's creation errors (negative sizes, allocation, CUDA unavailable); as
    /// [`context_of`].
    pub fn zeros(
        engine: &Arc<dyn Engine>,
        shape: &[i64],
        options: impl Into<TensorOptions>,
    ) -> Result<NDArray> {
        NDArray::new(engine, Tensor::zeros(shape, options)?)
    }

    /// An array of `shape` (MXNet's `NDArray(shape, ctx, false, dtype)`). Its memory is
    /// zeroed, as aten's `empty` (reading uninitialised bytes would be undefined behaviour).
    ///
    /// # Errors
    /// As [`NDArray::zeros`].
    pub fn empty(
        engine: &Arc<dyn Engine>,
        shape: &[i64],
        options: impl Into<TensorOptions>,
    ) -> Result<NDArray> {
        NDArray::new(engine, Tensor::empty(shape, options)?)
    }

    /// An array of `shape` on `device` holding `data` (row-major), as MXNet's `nd.array`.
    ///
    /// # Errors
    /// [`aten::Error::InvalidShape`] when `data` does not have `shape`'s element count; as
    /// [`NDArray::zeros`].
    pub fn from_slice<T: Element>(
        engine: &Arc<dyn Engine>,
        data: &[T],
        shape: &[i64],
        device: Device,
    ) -> Result<NDArray> {
        NDArray::new(engine, Tensor::from_slice(data, shape)?.to(device)?)
    }

    /// The aten tensor (see "Direct tensor access" in the [module docs](self)).
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// The engine variable that orders this array's ops (MXNet's `NDArray::var()`); shared by
    /// its views.
    pub fn var(&self) -> &Var {
        &self.chunk.var
    }

    /// The engine the array's ops are pushed to.
    pub fn engine(&self) -> &Arc<dyn Engine> {
        &self.chunk.engine
    }

    /// The context its ops run on (MXNet's `NDArray::ctx()`; see [`context_of`]).
    pub fn context(&self) -> Context {
        self.chunk.ctx
    }

    /// The sizes (MXNet's `NDArray::shape()`).
    pub fn shape(&self) -> &[i64] {
        self.tensor.sizes()
    }

    /// The element type (MXNet's `NDArray::dtype()`).
    pub fn dtype(&self) -> ScalarType {
        self.tensor.dtype()
    }

    /// The device of its memory.
    pub fn device(&self) -> Device {
        self.tensor.device()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.tensor.numel()
    }

    /// Waits until every write pushed before on this array is done (pending reads do not block
    /// it), then reports an undelivered op failure it carries (MXNet's `WaitToRead`;
    /// [`Engine::wait_for_var`]).
    ///
    /// # Errors
    /// The op failure (delivered once); [`EngineError::WaitInsideOp`] from inside an op.
    pub fn wait_to_read(&self) -> Result<()> {
        Ok(self.chunk.engine.wait_for_var(&self.chunk.var)?)
    }

    /// Waits until every read and write pushed before on this array is done, then reports an
    /// undelivered op failure (MXNet's `WaitToWrite`; [`Engine::wait_to_write`]).
    ///
    /// # Errors
    /// As [`NDArray::wait_to_read`].
    pub fn wait_to_write(&self) -> Result<()> {
        Ok(self.chunk.engine.wait_to_write(&self.chunk.var)?)
    }

    /// Checks a host buffer of `bytes` bytes of `T` against this array, before any wait.
    fn check_host_buffer<T: Element>(&self, op: &'static str, bytes: usize) -> Result<()> {
        if self.dtype() != T::SCALAR_TYPE {
            return Err(aten::Error::DtypeMismatch {
                op,
                expected: self.dtype(),
                actual: T::SCALAR_TYPE,
            }
            .into());
        }
        if bytes != self.tensor.nbytes() {
            return Err(aten::Error::MemorySizeMismatch {
                op,
                expected: self.tensor.nbytes(),
                actual: bytes,
            }
            .into());
        }
        Ok(())
    }

    /// Copies `data` (row-major) into the array, synchronously (MXNet's `SyncCopyFromCPU`):
    /// checks the buffer, waits for every read and write pushed before
    /// ([`NDArray::wait_to_write`]), then copies. On a device (CUDA, the simulated device) the
    /// copy goes through a pinned staging block of aten's pinned host allocator
    /// ([`aten::pinned`], PyTorch's `CachingHostAllocator`).
    ///
    /// # Errors
    /// [`aten::Error::DtypeMismatch`] unless `T` is the dtype, and
    /// [`aten::Error::MemorySizeMismatch`] ("memory size do not match", naming both byte
    /// sizes) unless `data` has exactly the array's bytes, both before waiting; a pending op
    /// failure on the array (delivered once, nothing copied); aten's copy errors.
    pub fn sync_copy_from_cpu<T: Element>(&self, data: &[T]) -> Result<()> {
        self.check_host_buffer::<T>("sync_copy_from_cpu", size_of_val(data))?;
        self.wait_to_write()?;
        Ok(self.tensor.sync_copy_from_cpu(data)?)
    }

    /// Copies the array's elements (row-major) into `out`, synchronously (MXNet's
    /// `SyncCopyToCPU`): checks the buffer, waits for every write pushed before
    /// ([`NDArray::wait_to_read`]), then copies (through a pinned staging block from a device,
    /// as [`NDArray::sync_copy_from_cpu`]).
    ///
    /// # Errors
    /// As [`NDArray::sync_copy_from_cpu`].
    pub fn sync_copy_to_cpu<T: Element>(&self, out: &mut [T]) -> Result<()> {
        self.check_host_buffer::<T>("sync_copy_to_cpu", size_of_val(out))?;
        self.wait_to_read()?;
        Ok(self.tensor.sync_copy_to_cpu(out)?)
    }

    /// The elements (row-major) once every write pushed before is done (MXNet's `asnumpy()`,
    /// through [`NDArray::sync_copy_to_cpu`]).
    ///
    /// # Errors
    /// As [`NDArray::sync_copy_to_cpu`].
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let mut out = vec![T::default(); self.numel()];
        self.sync_copy_to_cpu(&mut out)?;
        Ok(out)
    }

    /// A view with another shape sharing this array's memory and variable (MXNet's
    /// `NDArray::Reshape`; aten's `view`, so one `-1` is inferred).
    ///
    /// # Errors
    /// [`aten::Error::InvalidShape`] for a different element count;
    /// [`aten::Error::ViewIncompatible`] for a layout that cannot be viewed so.
    pub fn reshape(&self, shape: &[i64]) -> Result<NDArray> {
        Ok(NDArray {
            tensor: self.tensor.view(shape)?,
            chunk: Arc::clone(&self.chunk),
        })
    }

    /// Rows `begin..end` of the first dimension, as a view sharing this array's memory and
    /// variable (MXNet's `NDArray::Slice`).
    ///
    /// # Errors
    /// [`aten::Error::IndexOutOfRange`] / [`aten::Error::InvalidArgument`] for a range outside
    /// the first dimension; [`aten::Error::DimOutOfRange`] for a 0-d array.
    pub fn slice(&self, begin: i64, end: i64) -> Result<NDArray> {
        Ok(NDArray {
            tensor: self.tensor.narrow(0, begin, end - begin)?,
            chunk: Arc::clone(&self.chunk),
        })
    }

    /// Pushes `f` to run once every earlier write of `inputs` and every earlier read and write
    /// of `outputs` are done, with the inputs' variables as const vars and the outputs' as
    /// mutable vars, on the first output's context (the first input's when there is no
    /// output), as MXNet's `Imperative::PushFCompute`. `f` gets the inputs' and outputs'
    /// tensors, in order; its error fails the op (delivered through the engine, see the
    /// [module docs](self)). An array in both lists is written.
    ///
    /// # Errors
    /// [`aten::Error::InvalidArgument`] with no array at all; the engine's push errors (on the
    /// naive engine, also `f`'s failure).
    pub fn push_op<F>(
        name: &'static str,
        inputs: &[&NDArray],
        outputs: &[&NDArray],
        f: F,
    ) -> Result<()>
    where
        F: FnOnce(&[Tensor], &[Tensor]) -> OpResult + Send + 'static,
    {
        let Some(first) = outputs.first().or(inputs.first()) else {
            return Err(aten::Error::InvalidArgument {
                op: name,
                message: "push_op needs at least one input or output array".into(),
            }
            .into());
        };
        let ins: Vec<Tensor> = inputs.iter().map(|a| a.tensor.clone()).collect();
        let outs: Vec<Tensor> = outputs.iter().map(|a| a.tensor.clone()).collect();
        first.push_raw(
            name,
            inputs,
            outputs,
            PushOptions::on(first.context()).name(name),
            move |_| f(&ins, &outs),
        )
    }

    /// Pushes `f` on this array's engine with `reads` as const vars and `writes` as mutable
    /// vars.
    fn push_raw(
        &self,
        name: &'static str,
        reads: &[&NDArray],
        writes: &[&NDArray],
        opts: PushOptions,
        f: impl engine::SyncFn,
    ) -> Result<()> {
        let reads: Vec<Var> = reads.iter().map(|a| a.chunk.var.clone()).collect();
        let writes: Vec<Var> = writes.iter().map(|a| a.chunk.var.clone()).collect();
        self.chunk
            .engine
            .push_sync(f, &reads, &writes, opts.name(name))?;
        Ok(())
    }

    /// Pushes an aten kernel as a `Normal` op on this array's context.
    fn push_kernel(
        &self,
        name: &'static str,
        reads: &[&NDArray],
        writes: &[&NDArray],
        kernel: impl FnOnce() -> aten::Result<()> + Send + 'static,
    ) -> Result<()> {
        self.push_raw(
            name,
            reads,
            writes,
            PushOptions::on(self.context()),
            move |_| kernel().map_err(Into::into),
        )
    }

    /// Allocates the output (`shape`, `dtype`, on this array's device) now and pushes `kernel`,
    /// whose result is copied into it, reading `reads` and writing the output.
    fn map_op(
        &self,
        name: &'static str,
        reads: &[&NDArray],
        shape: &[i64],
        dtype: ScalarType,
        kernel: impl FnOnce() -> aten::Result<Tensor> + Send + 'static,
    ) -> Result<NDArray> {
        let options = TensorOptions::new().dtype(dtype).device(self.device());
        let out = NDArray::empty(&self.chunk.engine, shape, options)?;
        let dst = out.tensor.clone();
        self.push_kernel(name, reads, &[&out], move || {
            write_result(name, &dst, &kernel()?)
        })?;
        Ok(out)
    }

    /// An elementwise op of one input: same shape, the result dtype `dtype` (aten's for the op).
    fn unary(
        &self,
        name: &'static str,
        dtype: ScalarType,
        kernel: impl FnOnce(&Tensor) -> aten::Result<Tensor> + Send + 'static,
    ) -> Result<NDArray> {
        let a = self.tensor.clone();
        self.map_op(name, &[self], self.shape(), dtype, move || kernel(&a))
    }

    /// A broadcasting elementwise op of two inputs: the broadcast shape and aten's promoted
    /// dtype ([`aten::promotion::result_type`]; lifted to `Float` from integers for true
    /// division).
    fn binary(
        &self,
        other: &NDArray,
        name: &'static str,
        kernel: fn(&Tensor, &Tensor) -> aten::Result<Tensor>,
    ) -> Result<NDArray> {
        let shape = broadcast_shapes(name, self.shape(), other.shape())?;
        let mut dtype = self.tensor.result_type(&other.tensor);
        if name == "div" {
            dtype = promote_integer_to_float(dtype);
        }
        let (a, b) = (self.tensor.clone(), other.tensor.clone());
        self.map_op(name, &[self, other], &shape, dtype, move || kernel(&a, &b))
    }

    /// An in-place op with `other` broadcast to this array.
    fn binary_in_place(
        &self,
        other: &NDArray,
        name: &'static str,
        kernel: fn(&Tensor, &Tensor) -> aten::Result<()>,
    ) -> Result<()> {
        check_in_place(name, self.shape(), other.shape())?;
        let (a, b) = (self.tensor.clone(), other.tensor.clone());
        self.push_kernel(name, &[other], &[self], move || kernel(&a, &b))
    }

    /// An in-place op on this array alone.
    fn unary_in_place(
        &self,
        name: &'static str,
        kernel: impl FnOnce(&Tensor) -> aten::Result<()> + Send + 'static,
    ) -> Result<()> {
        let a = self.tensor.clone();
        self.push_kernel(name, &[], &[self], move || kernel(&a))
    }

    /// `self + other` with broadcasting, pushed (aten's `add`; MXNet's `elemwise_add` /
    /// `broadcast_add`).
    ///
    /// # Errors
    /// At the call: [`aten::Error::BroadcastMismatch`]; push errors. Through the engine:
    /// dtype, device and kernel errors.
    pub fn add(&self, other: &NDArray) -> Result<NDArray> {
        self.binary(other, "add", Tensor::add)
    }

    /// `self - other` with broadcasting, pushed (aten's `sub`).
    ///
    /// # Errors
    /// As [`NDArray::add`].
    pub fn sub(&self, other: &NDArray) -> Result<NDArray> {
        self.binary(other, "sub", Tensor::sub)
    }

    /// `self * other` with broadcasting, pushed (aten's `mul`).
    ///
    /// # Errors
    /// As [`NDArray::add`].
    pub fn mul(&self, other: &NDArray) -> Result<NDArray> {
        self.binary(other, "mul", Tensor::mul)
    }

    /// `self / other` with broadcasting, pushed (aten's `div`: true division, integers give
    /// `Float`).
    ///
    /// # Errors
    /// As [`NDArray::add`].
    pub fn div(&self, other: &NDArray) -> Result<NDArray> {
        self.binary(other, "div", Tensor::div)
    }

    /// The matrix product with NumPy's rules, pushed (aten's `matmul`; MXNet's `dot` /
    /// `batch_dot`).
    ///
    /// # Errors
    /// At the call: [`aten::Error::InvalidArgument`] for 0-d operands,
    /// [`aten::Error::ShapeMismatch`] when the inner sizes differ,
    /// [`aten::Error::BroadcastMismatch`] for batch shapes; push errors. Through the engine:
    /// dtype, device and kernel errors.
    pub fn matmul(&self, other: &NDArray) -> Result<NDArray> {
        let shape = matmul_shape(self.shape(), other.shape())?;
        let (a, b) = (self.tensor.clone(), other.tensor.clone());
        self.map_op("matmul", &[self, other], &shape, self.dtype(), move || {
            a.matmul(&b)
        })
    }

    /// `self + value`, pushed (aten's `add_scalar`; MXNet's `_plus_scalar`).
    ///
    /// `value` is a Python float for type promotion, as in aten: an integer array gives a
    /// `Float` result.
    ///
    /// # Errors
    /// Push errors; through the engine, aten's dtype and device errors.
    pub fn add_scalar(&self, value: f64) -> Result<NDArray> {
        let dtype = self.tensor.result_type_scalar(value);
        self.unary("add_scalar", dtype, move |t| t.add_scalar(value))
    }

    /// `self * value`, pushed (aten's `mul_scalar`; MXNet's `_mul_scalar`).
    ///
    /// # Errors
    /// As [`NDArray::add_scalar`].
    pub fn mul_scalar(&self, value: f64) -> Result<NDArray> {
        let dtype = self.tensor.result_type_scalar(value);
        self.unary("mul_scalar", dtype, move |t| t.mul_scalar(value))
    }

    /// `-self`, pushed.
    ///
    /// # Errors
    /// Push errors; through the engine, aten's dtype and device errors.
    pub fn neg(&self) -> Result<NDArray> {
        self.unary("neg", self.dtype(), Tensor::neg)
    }

    /// `exp(self)`, pushed (integer arrays give `Float`, as aten).
    ///
    /// # Errors
    /// As [`NDArray::neg`].
    pub fn exp(&self) -> Result<NDArray> {
        self.unary("exp", promote_integer_to_float(self.dtype()), Tensor::exp)
    }

    /// `max(self, 0)`, pushed (MXNet's `relu`).
    ///
    /// # Errors
    /// As [`NDArray::neg`].
    pub fn relu(&self) -> Result<NDArray> {
        self.unary("relu", self.dtype(), Tensor::relu)
    }

    /// `sigmoid(self)`, pushed (integer arrays give `Float`, as aten).
    ///
    /// # Errors
    /// As [`NDArray::neg`].
    pub fn sigmoid(&self) -> Result<NDArray> {
        self.unary(
            "sigmoid",
            promote_integer_to_float(self.dtype()),
            Tensor::sigmoid,
        )
    }

    /// `tanh(self)`, pushed (integer arrays give `Float`, as aten).
    ///
    /// # Errors
    /// As [`NDArray::neg`].
    pub fn tanh(&self) -> Result<NDArray> {
        self.unary("tanh", promote_integer_to_float(self.dtype()), Tensor::tanh)
    }

    /// The softmax along `dim`, pushed (aten's `softmax`; MXNet's `softmax`).
    ///
    /// # Errors
    /// At the call: [`aten::Error::DimOutOfRange`]; push errors. Through the engine: dtype and
    /// device errors.
    pub fn softmax(&self, dim: i64) -> Result<NDArray> {
        wrap_dim("softmax", dim, self.shape().len())?;
        self.unary("softmax", self.dtype(), move |t| t.softmax(dim))
    }

    /// The sum over `dims` (all when empty), keeping them as size 1 if `keepdim`, pushed
    /// (aten's `sum`: integer and Bool arrays give `Long`; MXNet's `sum`).
    ///
    /// # Errors
    /// At the call: [`aten::Error::DimOutOfRange`], [`aten::Error::InvalidArgument`] for a
    /// repeated dim; push errors. Through the engine: dtype and device errors.
    pub fn sum(&self, dims: &[i64], keepdim: bool) -> Result<NDArray> {
        let shape = reduce_shape("sum", self.shape(), dims, keepdim)?;
        let (a, dims_owned) = (self.tensor.clone(), dims.to_vec());
        let dtype = sum_dtype(self.dtype());
        self.map_op("sum", &[self], &shape, dtype, move || {
            a.sum(&dims_owned, keepdim)
        })
    }

    /// The mean over `dims` (all when empty), pushed (aten's `mean`, floating dtypes).
    ///
    /// # Errors
    /// As [`NDArray::sum`].
    pub fn mean(&self, dims: &[i64], keepdim: bool) -> Result<NDArray> {
        let shape = reduce_shape("mean", self.shape(), dims, keepdim)?;
        let (a, dims_owned) = (self.tensor.clone(), dims.to_vec());
        self.map_op("mean", &[self], &shape, self.dtype(), move || {
            a.mean(&dims_owned, keepdim)
        })
    }

    /// `self += other` in place, pushed with this array as mutable var (aten's `add_`; MXNet's
    /// `+=`). `a.add_(&a)` doubles `a`.
    ///
    /// # Errors
    /// At the call: [`aten::Error::BroadcastMismatch`], or [`aten::Error::ShapeMismatch`] when
    /// the broadcast shape is not this array's; push errors. Through the engine: dtype, device
    /// and kernel errors.
    pub fn add_(&self, other: &NDArray) -> Result<()> {
        self.binary_in_place(other, "add_", Tensor::add_)
    }

    /// `self -= other` in place, pushed (aten's `sub_`).
    ///
    /// # Errors
    /// As [`NDArray::add_`].
    pub fn sub_(&self, other: &NDArray) -> Result<()> {
        self.binary_in_place(other, "sub_", Tensor::sub_)
    }

    /// `self *= other` in place, pushed (aten's `mul_`).
    ///
    /// # Errors
    /// As [`NDArray::add_`].
    pub fn mul_(&self, other: &NDArray) -> Result<()> {
        self.binary_in_place(other, "mul_", Tensor::mul_)
    }

    /// `self += value` in place, pushed (aten's `add_scalar_`).
    ///
    /// # Errors
    /// Push errors; through the engine, aten's.
    pub fn add_scalar_(&self, value: f64) -> Result<()> {
        self.unary_in_place("add_scalar_", move |t| t.add_scalar_(value))
    }

    /// `self *= value` in place, pushed (aten's `mul_scalar_`).
    ///
    /// # Errors
    /// As [`NDArray::add_scalar_`].
    pub fn mul_scalar_(&self, value: f64) -> Result<()> {
        self.unary_in_place("mul_scalar_", move |t| t.mul_scalar_(value))
    }

    /// `max(self, 0)` in place, pushed (aten's `relu_`).
    ///
    /// # Errors
    /// As [`NDArray::add_scalar_`].
    pub fn relu_(&self) -> Result<()> {
        self.unary_in_place("relu_", Tensor::relu_)
    }

    /// Sets every element to `value`, pushed (MXNet's `NDArray::operator=(real_t)`,
    /// `SetValueOp`; aten's `fill_`).
    ///
    /// # Errors
    /// As [`NDArray::add_scalar_`].
    pub fn fill_(&self, value: f64) -> Result<()> {
        self.unary_in_place("fill_", move |t| t.fill_(value))
    }

    /// Copies `src` into this array, pushed with `src` as const var and this array as mutable
    /// var, across devices and dtypes (MXNet's `CopyFromTo(src, *this)`, placed as described in
    /// the [module docs](self)).
    ///
    /// # Errors
    /// At the call: [`aten::Error::ShapeMismatch`] unless both have the same shape (as MXNet);
    /// push errors. Through the engine: device errors.
    pub fn copy_from(&self, src: &NDArray) -> Result<()> {
        if src.shape() != self.shape() {
            return Err(aten::Error::ShapeMismatch {
                op: "CopyFromTo",
                lhs: self.shape().to_vec(),
                rhs: src.shape().to_vec(),
                reason: "the source and the destination must have the same shape".into(),
            }
            .into());
        }
        let (ctx, prop) =
            copy_placement(src.context(), self.context(), src.dtype() == self.dtype());
        let (dst, s) = (self.tensor.clone(), src.tensor.clone());
        self.push_raw(
            "CopyFromTo",
            &[src],
            &[self],
            PushOptions::on(ctx).prop(prop),
            move |_| dst.copy_(&s).map_err(Into::into),
        )
    }

    /// A copy of this array on `device`, allocated now and filled by a pushed copy (MXNet's
    /// `NDArray::Copy(ctx)`; always a new array, even on the same device).
    ///
    /// # Errors
    /// Creation errors on `device`; as [`NDArray::copy_from`].
    pub fn copy_to(&self, device: Device) -> Result<NDArray> {
        let options = TensorOptions::new().dtype(self.dtype()).device(device);
        let out = NDArray::empty(&self.chunk.engine, self.shape(), options)?;
        out.copy_from(self)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_placed_as_mxnet_copy_from_to() {
        let (cpu, gpu0, gpu1) = (Context::cpu(), Context::cuda(0), Context::cuda(1));
        let cases = [
            ((cpu, cpu, true), (cpu, FnProperty::Normal)),
            ((cpu, gpu1, true), (gpu1, FnProperty::CopyToGPU)),
            ((gpu1, cpu, true), (gpu1, FnProperty::CopyFromGPU)),
            ((gpu1, cpu, false), (gpu1, FnProperty::CopyFromGPU)),
            ((gpu0, gpu1, true), (gpu0, FnProperty::CopyFromGPU)),
            ((gpu0, gpu1, false), (gpu0, FnProperty::Normal)),
            (
                (Context::sim(0), cpu, true),
                (Context::sim(0), FnProperty::CopyFromGPU),
            ),
        ];
        for ((from, to, same), expected) in cases {
            assert_eq!(copy_placement(from, to, same), expected, "{from} -> {to}");
        }
    }

    /// The shapes inferred at push time are the shapes aten's kernels produce, and the
    /// shapes aten refuses are refused.
    #[test]
    fn inferred_shapes_agree_with_aten() {
        let shapes: [&[i64]; 9] = [
            &[],
            &[3],
            &[4],
            &[2, 3],
            &[3, 4],
            &[1, 3, 4],
            &[5, 2, 3],
            &[5, 1, 4, 3],
            &[0, 3],
        ];
        let zeros = |s: &[i64]| Tensor::zeros(s, ScalarType::Float).unwrap();
        for a in shapes {
            for b in shapes {
                let ours = matmul_shape(a, b).ok();
                let aten = zeros(a).matmul(&zeros(b)).ok().map(|t| t.sizes().to_vec());
                assert_eq!(ours, aten, "matmul {a:?} x {b:?}");
            }
            let dim_lists: [&[i64]; 6] = [&[], &[0], &[-1], &[0, 1], &[1, 1], &[3]];
            for dims in dim_lists {
                for keepdim in [false, true] {
                    let ours = reduce_shape("sum", a, dims, keepdim).ok();
                    let aten = zeros(a).sum(dims, keepdim).ok().map(|t| t.sizes().to_vec());
                    assert_eq!(ours, aten, "sum {a:?} over {dims:?}, keepdim {keepdim}");
                }
            }
        }
    }

    #[test]
    fn meta_tensors_have_no_context() {
        assert!(context_of(Device::meta()).is_err());
        assert_eq!(context_of(Device::sim(3)).unwrap(), Context::sim(3));
        assert_eq!(context_of(Device::cuda(1)).unwrap(), Context::cuda(1));
        assert_eq!(context_of(Device::cpu()).unwrap(), Context::cpu());
    }
}
