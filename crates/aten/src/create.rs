//! Creation on any device through that device's allocator ([`crate::device_allocator`]):
//! `empty`, `zeros`, `ones`, `full`, `arange`, `from_vec`/`from_slice`, seeded `rand`/`randn`,
//! as `torch.empty`, `torch.zeros`, ... with [`TensorOptions`] for dtype and device.
//!
//! One difference from PyTorch on purpose: [`Tensor::empty`] returns **zeroed** memory. Reading
//! uninitialised memory as numbers is undefined behaviour in Rust, and `empty` is safe; the
//! kernels allocate their outputs without filling them (they write every element first).

use c10_core::{Device, Element, ScalarType};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal, StandardUniform};

use crate::error::{Error, Result};
use crate::host::Access;
use crate::layout::{self, Layout, contiguous_strides};
use crate::scalar::{Elem, dispatch};
use crate::tensor::Tensor;

/// The dtype and device of a new tensor, as c10's `TensorOptions`. The default is `float32` on
/// the CPU (`torch.get_default_dtype()`, `torch.get_default_device()`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorOptions {
    /// The element type.
    pub dtype: ScalarType,
    /// The device.
    pub device: Device,
}

impl Default for TensorOptions {
    fn default() -> Self {
        TensorOptions {
            dtype: ScalarType::Float,
            device: Device::cpu(),
        }
    }
}

impl TensorOptions {
    /// `float32` on the CPU.
    pub fn new() -> Self {
        TensorOptions::default()
    }

    /// These options with another dtype, as `TensorOptions::dtype`.
    pub fn dtype(self, dtype: ScalarType) -> Self {
        TensorOptions { dtype, ..self }
    }

    /// These options with another device, as `TensorOptions::device`.
    pub fn device(self, device: Device) -> Self {
        TensorOptions { device, ..self }
    }
}

impl From<ScalarType> for TensorOptions {
    fn from(dtype: ScalarType) -> Self {
        TensorOptions::new().dtype(dtype)
    }
}

impl From<Device> for TensorOptions {
    fn from(device: Device) -> Self {
        TensorOptions::new().device(device)
    }
}

/// A seeded random number generator for [`Tensor::rand`] and [`Tensor::randn`], as
/// `torch.Generator().manual_seed(seed)`. ChaCha8 (`rand_chacha`): the same seed gives the same
/// numbers on every platform and version of this crate. The sequence differs from PyTorch's
/// Mersenne Twister.
#[derive(Clone, Debug)]
pub struct Generator {
    rng: ChaCha8Rng,
}

impl Generator {
    /// A generator seeded with `seed`, as `torch.Generator().manual_seed(seed)`.
    pub fn new(seed: u64) -> Self {
        Generator {
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }
}

/// The byte size of `numel` elements of `dtype`, checked (errors naming `op`).
fn byte_size(op: &'static str, shape: &[i64], dtype: ScalarType) -> Result<usize> {
    layout::numel(shape)
        .checked_mul(dtype.item_size())
        .ok_or(Error::InvalidArgument {
            op,
            message: format!(
                "a tensor of shape {} and dtype {dtype} does not fit in memory",
                crate::error::shape_str(shape)
            ),
        })
}

impl Tensor {
    /// A contiguous tensor whose bytes are not initialised yet. Every caller writes every
    /// element before the tensor is shared or read.
    pub(crate) fn empty_uninit(shape: &[i64], dtype: ScalarType, device: Device) -> Result<Tensor> {
        Tensor::empty_uninit_for("empty", shape, dtype, device)
    }

    /// [`Tensor::empty_uninit`] with errors naming `op`.
    fn empty_uninit_for(
        op: &'static str,
        shape: &[i64],
        dtype: ScalarType,
        device: Device,
    ) -> Result<Tensor> {
        let layout = Layout::contiguous(shape)?;
        let storage = crate::device::allocate(device, byte_size(op, shape, dtype)?)?;
        Tensor::from_new_storage(storage, layout, dtype)
    }

    /// A tensor of `sizes` with explicit `strides` whose bytes are not initialised yet (its
    /// storage holds exactly the elements the layout reaches). Every caller writes every element
    /// before the tensor is shared or read.
    pub(crate) fn empty_strided_uninit(
        op: &'static str,
        sizes: &[i64],
        strides: &[i64],
        dtype: ScalarType,
        device: Device,
    ) -> Result<Tensor> {
        let layout = Layout::new(sizes, strides, 0)?;
        if layout.is_contiguous() && strides == contiguous_strides(sizes) {
            return Tensor::empty_uninit(sizes, dtype, device);
        }
        let elements = i64::try_from(layout.required_storage_elements()).map_err(|_| {
            Error::InvalidArgument {
                op,
                message: format!(
                    "a tensor of shape {} and strides {} does not fit in memory",
                    crate::error::shape_str(sizes),
                    crate::error::shape_str(strides)
                ),
            }
        })?;
        let storage = crate::device::allocate(device, byte_size(op, &[elements], dtype)?)?;
        Tensor::from_cell(
            op,
            crate::tensor::StorageCell::new(storage),
            layout,
            dtype,
            crate::tensor::VersionCounter::new(),
        )
    }

    /// Fills every element with `value` converted to the dtype (no version bump: used on new
    /// tensors).
    pub(crate) fn fill_raw(&self, op: &'static str, value: f64) -> Result<()> {
        let access = Access::lock(op, &[], &[self])?;
        dispatch!(all, op, self.dtype(), |T| {
            access.dst::<T>(op, self)?.fill(T::from_f64(value));
            Ok(())
        })
    }

    /// A new contiguous tensor of `shape`, as `torch.empty(shape, dtype=, device=)`, with its
    /// bytes zeroed (see the [module docs](crate::create)). On a device whose memory cannot be
    /// written from the host (CUDA) the bytes are zeroed with a copy from the host.
    ///
    /// # Errors
    /// [`Error::NegativeSize`]; allocation errors (out of memory, no allocator for the device,
    /// [`Error::CudaUnavailable`]).
    pub fn empty(shape: &[i64], options: impl Into<TensorOptions>) -> Result<Tensor> {
        Tensor::full_for("empty", shape, 0.0, options.into())
    }

    /// A tensor of zeros, as `torch.zeros`.
    ///
    /// # Errors
    /// As [`Tensor::empty`].
    pub fn zeros(shape: &[i64], options: impl Into<TensorOptions>) -> Result<Tensor> {
        Tensor::full_for("zeros", shape, 0.0, options.into())
    }

    /// A tensor of ones, as `torch.ones`.
    ///
    /// # Errors
    /// As [`Tensor::empty`].
    pub fn ones(shape: &[i64], options: impl Into<TensorOptions>) -> Result<Tensor> {
        Tensor::full_for("ones", shape, 1.0, options.into())
    }

    /// A tensor filled with `value` converted to the dtype (truncated toward zero for integer
    /// dtypes, `value != 0` for Bool), as `torch.full`.
    ///
    /// # Errors
    /// As [`Tensor::empty`].
    pub fn full(shape: &[i64], value: f64, options: impl Into<TensorOptions>) -> Result<Tensor> {
        Tensor::full_for("full", shape, value, options.into())
    }

    /// [`Tensor::full`] with errors naming `op` (the creation function the user called).
    fn full_for(
        op: &'static str,
        shape: &[i64],
        value: f64,
        options: TensorOptions,
    ) -> Result<Tensor> {
        let t = Tensor::empty_uninit_for(op, shape, options.dtype, options.device)?;
        if crate::host::is_host_accessible(&t) {
            t.fill_raw(op, value)?;
            Ok(t)
        } else {
            let host = Tensor::full_for(op, shape, value, options.device(Device::cpu()))?;
            crate::device_copy::copy_host_to_device(op, &t, &host)?;
            Ok(t)
        }
    }

    /// A tensor like `other` (same shape, dtype and device) filled with zeros, as
    /// `torch.zeros_like`.
    ///
    /// # Errors
    /// As [`Tensor::empty`].
    pub fn zeros_like(other: &Tensor) -> Result<Tensor> {
        Tensor::zeros(other.sizes(), other.options())
    }

    /// A tensor like `other` filled with ones, as `torch.ones_like`.
    ///
    /// # Errors
    /// As [`Tensor::empty`].
    pub fn ones_like(other: &Tensor) -> Result<Tensor> {
        Tensor::ones(other.sizes(), other.options())
    }

    /// This tensor's dtype and device, as `t.options()`.
    pub fn options(&self) -> TensorOptions {
        TensorOptions {
            dtype: self.dtype(),
            device: self.device(),
        }
    }

    /// The values `start, start + step, ...` below `end` (above it for a negative step), as
    /// `torch.arange(start, end, step)`: `ceil((end - start) / step)` elements, each computed as
    /// `start + i * step` in `f64` and converted to the dtype.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero or non-finite step, non-finite bounds, or a step
    /// whose sign disagrees with `end - start` ("upper bound and larger bound inconsistent with
    /// step sign"); allocation errors.
    pub fn arange(
        start: f64,
        end: f64,
        step: f64,
        options: impl Into<TensorOptions>,
    ) -> Result<Tensor> {
        let invalid = |message: &str| Error::InvalidArgument {
            op: "arange",
            message: message.to_owned(),
        };
        if step == 0.0 || !step.is_finite() {
            return Err(invalid("step must be nonzero and finite"));
        }
        if !start.is_finite() || !end.is_finite() {
            return Err(invalid("unsupported range: bounds must be finite"));
        }
        if (step > 0.0 && end < start) || (step < 0.0 && end > start) {
            return Err(invalid(
                "upper bound and larger bound inconsistent with step sign",
            ));
        }
        let len = ((end - start) / step).ceil() as i64;
        let options = options.into();
        let host = Tensor::empty_uninit(&[len], options.dtype, Device::cpu())?;
        {
            let access = Access::lock("arange", &[], &[&host])?;
            dispatch!(num, "arange", options.dtype, |T| {
                let mut i = 0i64;
                access.dst::<T>("arange", &host)?.assign(|| {
                    let v = start + i as f64 * step;
                    i += 1;
                    T::from_f64(v)
                });
                Ok(())
            })?;
        }
        host.to(options.device)
    }

    /// A CPU tensor of `shape` holding `data` in row-major order, as `torch.tensor(data).view(shape)`.
    /// The element type is `T`'s (`f32` -> `Float`). Move it with [`Tensor::to`].
    ///
    /// # Errors
    /// [`Error::InvalidShape`] when the shape's element count differs from `data.len()`
    /// (a `-1` is inferred).
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[i64]) -> Result<Tensor> {
        Tensor::from_slice_for("from_vec", &data, shape)
    }

    /// A CPU tensor of `shape` copied from `data`, as [`Tensor::from_vec`].
    ///
    /// # Errors
    /// As [`Tensor::from_vec`].
    pub fn from_slice<T: Element>(data: &[T], shape: &[i64]) -> Result<Tensor> {
        Tensor::from_slice_for("from_slice", data, shape)
    }

    /// [`Tensor::from_slice`] with errors naming `op`.
    fn from_slice_for<T: Element>(op: &'static str, data: &[T], shape: &[i64]) -> Result<Tensor> {
        let shape = layout::infer_size(op, shape, data.len())?;
        let t = Tensor::empty_uninit(&shape, T::SCALAR_TYPE, Device::cpu())?;
        crate::host::with_bytes_mut(op, &t, |bytes| {
            bytes.copy_from_slice(bytemuck::cast_slice(data));
        })?;
        Ok(t)
    }

    /// A 0-d CPU tensor holding `value`, as `torch.tensor(value)`.
    ///
    /// # Errors
    /// Allocation errors.
    pub fn scalar<T: Element>(value: T) -> Result<Tensor> {
        Tensor::from_slice(&[value], &[])
    }

    /// Uniform samples from `[0, 1)`, as `torch.rand(shape, generator=g)` (floating dtypes).
    ///
    /// # Errors
    /// [`Error::UnsupportedDtype`] for non-floating dtypes; allocation errors.
    pub fn rand(
        shape: &[i64],
        generator: &mut Generator,
        options: impl Into<TensorOptions>,
    ) -> Result<Tensor> {
        Tensor::random(
            "rand",
            shape,
            generator,
            options.into(),
            |rng| StandardUniform.sample(rng),
            |rng| StandardUniform.sample(rng),
        )
    }

    /// Standard normal samples, as `torch.randn(shape, generator=g)` (floating dtypes).
    ///
    /// # Errors
    /// As [`Tensor::rand`].
    pub fn randn(
        shape: &[i64],
        generator: &mut Generator,
        options: impl Into<TensorOptions>,
    ) -> Result<Tensor> {
        Tensor::random(
            "randn",
            shape,
            generator,
            options.into(),
            |rng| StandardNormal.sample(rng),
            |rng| StandardNormal.sample(rng),
        )
    }

    /// Fills a new host tensor with samples (`sample64` for `Double`, else `sample32` converted
    /// to the dtype), then moves it to the requested device.
    fn random(
        op: &'static str,
        shape: &[i64],
        generator: &mut Generator,
        options: TensorOptions,
        sample64: fn(&mut ChaCha8Rng) -> f64,
        sample32: fn(&mut ChaCha8Rng) -> f32,
    ) -> Result<Tensor> {
        if !options.dtype.is_floating_point() {
            return Err(Error::UnsupportedDtype {
                op,
                dtype: options.dtype,
            });
        }
        let host = Tensor::empty_uninit(shape, options.dtype, Device::cpu())?;
        {
            let access = Access::lock(op, &[], &[&host])?;
            let rng = &mut generator.rng;
            dispatch!(all, op, options.dtype, |T| {
                access.dst::<T>(op, &host)?.assign(|| {
                    if options.dtype == ScalarType::Double {
                        T::from_f64(sample64(rng))
                    } else {
                        T::from_f64(f64::from(sample32(rng)))
                    }
                });
                Ok(())
            })?;
        }
        host.to(options.device)
    }
}
