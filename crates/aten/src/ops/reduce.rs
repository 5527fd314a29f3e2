//! Reductions over dimensions with `keepdim`: `sum`, `mean`, `amax`/`max_all`, and `max_dim`
//! (values and indices), as ATen's `sum.dim_IntList`, `mean.dim`, `amax`, `max.dim`.
//!
//! An empty `dims` list reduces every dimension (ATen's `dim=[]`/`None`). Accumulation is in
//! `f64` for floating types (ATen's CPU `acc_type<float>` is `double`) and in wrapping `i64` for
//! integers and Bool, whose sums are `Long` tensors, as in PyTorch.

use c10_core::ScalarType;

use crate::error::{Error, Result};
use crate::host::Access;
use crate::layout::{contiguous_strides, wrap_dim};
use crate::scalar::{Elem, Num, dispatch};
use crate::tensor::Tensor;

/// Which dimensions a reduction removes, and the shapes and accumulator strides that follow.
struct Plan {
    /// Whether each input dimension is reduced.
    reduced: Vec<bool>,
    /// The output shape.
    out_shape: Vec<i64>,
    /// For each input dimension, its stride in the accumulator (0 when reduced).
    acc_strides: Vec<i64>,
    /// The number of outputs.
    out_numel: usize,
    /// How many inputs each output combines.
    count: usize,
}

fn plan(op: &'static str, sizes: &[i64], dims: &[i64], keepdim: bool) -> Result<Plan> {
    let n = sizes.len();
    let mut reduced = vec![dims.is_empty(); n];
    let mut seen = vec![false; n.max(1)];
    for &dim in dims {
        let d = wrap_dim(op, dim, n)?;
        if std::mem::replace(&mut seen[d], true) {
            return Err(Error::InvalidArgument {
                op,
                message: format!("dim {d} appears multiple times in the list of dims"),
            });
        }
        if n > 0 {
            reduced[d] = true;
        }
    }
    let keep_shape: Vec<i64> = sizes
        .iter()
        .zip(&reduced)
        .map(|(&s, &r)| if r { 1 } else { s })
        .collect();
    let out_shape = if keepdim {
        keep_shape.clone()
    } else {
        sizes
            .iter()
            .zip(&reduced)
            .filter(|&(_, &r)| !r)
            .map(|(&s, _)| s)
            .collect()
    };
    let acc_strides = contiguous_strides(&keep_shape)
        .into_iter()
        .zip(&reduced)
        .map(|(s, &r)| if r { 0 } else { s })
        .collect();
    let count = sizes
        .iter()
        .zip(&reduced)
        .filter(|&(_, &r)| r)
        .map(|(&s, _)| s as usize)
        .product();
    Ok(Plan {
        reduced,
        out_numel: crate::layout::numel(&keep_shape),
        out_shape,
        acc_strides,
        count,
    })
}

/// Refuses a max over an empty dimension, as ATen's "Expected reduction dim 0 to have non-zero
/// size".
fn check_nonempty(op: &'static str, t: &Tensor, plan: &Plan) -> Result<()> {
    for (d, (&size, &r)) in t.sizes().iter().zip(&plan.reduced).enumerate() {
        if r && size == 0 {
            return Err(Error::InvalidArgument {
                op,
                message: format!("Expected reduction dim {d} to have non-zero size."),
            });
        }
    }
    Ok(())
}

/// The new max under ATen's rules: NaN wins and stays; otherwise the larger value.
#[inline]
fn max_step<T: Num>(current: T, value: T) -> bool {
    !current.is_nan() && (value.is_nan() || value > current)
}

impl Tensor {
    /// The sum over `dims` (all of them when empty), keeping them as size 1 if `keepdim`, as
    /// `t.sum(dims, keepdim)`. Integer and Bool inputs give a `Long` result.
    ///
    /// # Errors
    /// [`Error::DimOutOfRange`]; [`Error::InvalidArgument`] for a repeated dim;
    /// [`Error::UnsupportedDevice`].
    pub fn sum(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        let plan = plan("sum", self.sizes(), dims, keepdim)?;
        let access = Access::lock("sum", &[self], &[])?;
        let host = dispatch!(all, "sum", self.dtype(), |T| {
            let src = access.src::<T>("sum", self)?;
            if T::IS_FLOATING {
                let mut acc = vec![0f64; plan.out_numel];
                src.for_each_with(&plan.acc_strides, |v, k| acc[k] += v.to_f64());
                let values: Vec<T> = acc.into_iter().map(T::from_f64).collect();
                Tensor::from_slice(&values, &plan.out_shape)
            } else {
                let mut acc = vec![0i64; plan.out_numel];
                src.for_each_with(&plan.acc_strides, |v, k| {
                    acc[k] = acc[k].wrapping_add(v.to_i64());
                });
                Tensor::from_slice(&acc, &plan.out_shape)
            }
        })?;
        drop(access);
        host.to(self.device())
    }

    /// The sum of every element as a 0-d tensor, as `t.sum()`.
    ///
    /// # Errors
    /// As [`Tensor::sum`].
    pub fn sum_all(&self) -> Result<Tensor> {
        self.sum(&[], false)
    }

    /// The mean over `dims` (all when empty), as `t.mean(dims, keepdim)`; floating dtypes only.
    /// A mean over zero elements is NaN.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a non-floating dtype ("could not infer output dtype.
    /// Input dtype must be either a floating point or complex dtype. Got: Long"); as
    /// [`Tensor::sum`].
    pub fn mean(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        if !self.dtype().is_floating_point() {
            return Err(Error::InvalidArgument {
                op: "mean",
                message: format!(
                    "could not infer output dtype. Input dtype must be either a floating point or \
                     complex dtype. Got: {}",
                    self.dtype()
                ),
            });
        }
        let plan = plan("mean", self.sizes(), dims, keepdim)?;
        let access = Access::lock("mean", &[self], &[])?;
        let host = dispatch!(all, "mean", self.dtype(), |T| {
            let src = access.src::<T>("mean", self)?;
            let mut acc = vec![0f64; plan.out_numel];
            src.for_each_with(&plan.acc_strides, |v, k| acc[k] += v.to_f64());
            let count = plan.count as f64;
            let values: Vec<T> = acc.into_iter().map(|s| T::from_f64(s / count)).collect();
            Tensor::from_slice(&values, &plan.out_shape)
        })?;
        drop(access);
        host.to(self.device())
    }

    /// The mean of every element as a 0-d tensor, as `t.mean()`.
    ///
    /// # Errors
    /// As [`Tensor::mean`].
    pub fn mean_all(&self) -> Result<Tensor> {
        self.mean(&[], false)
    }

    /// The maximum over `dims` (all when empty), as `torch.amax(t, dims, keepdim)`. NaN
    /// propagates.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a reduced dimension is empty; as [`Tensor::sum`];
    /// [`Error::UnsupportedDtype`] for half and bool.
    pub fn amax(&self, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        self.amax_for("amax", dims, keepdim)
    }

    /// [`Tensor::amax`] with errors naming `op` (the operation the user called).
    fn amax_for(&self, op: &'static str, dims: &[i64], keepdim: bool) -> Result<Tensor> {
        let plan = plan(op, self.sizes(), dims, keepdim)?;
        check_nonempty(op, self, &plan)?;
        let access = Access::lock(op, &[self], &[])?;
        let host = dispatch!(num, op, self.dtype(), |T| {
            let src = access.src::<T>(op, self)?;
            let mut acc: Vec<Option<T>> = vec![None; plan.out_numel];
            src.for_each_with(&plan.acc_strides, |v, k| match &mut acc[k] {
                Some(current) => {
                    if max_step(*current, v) {
                        *current = v;
                    }
                }
                slot => *slot = Some(v),
            });
            let values: Vec<T> = acc.into_iter().map(Option::unwrap_or_default).collect();
            Tensor::from_slice(&values, &plan.out_shape)
        })?;
        drop(access);
        host.to(self.device())
    }

    /// The largest element as a 0-d tensor, as `t.max()`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty tensor, as ATen's "max(): Expected reduction dim
    /// to be specified for input.numel() == 0"; as [`Tensor::amax`], naming `max`.
    pub fn max_all(&self) -> Result<Tensor> {
        if self.numel() == 0 {
            return Err(Error::InvalidArgument {
                op: "max",
                message: "Expected reduction dim to be specified for input.numel() == 0. Specify \
                          the reduction dim with the 'dim' argument."
                    .into(),
            });
        }
        self.amax_for("max", &[], false)
    }

    /// The maximum along `dim` and its index (the first one, or the first NaN's), as
    /// `t.max(dim, keepdim)` returning `(values, indices)`; indices are `Long`.
    ///
    /// # Errors
    /// [`Error::DimOutOfRange`]; [`Error::InvalidArgument`] when the dimension is empty; as
    /// [`Tensor::amax`].
    pub fn max_dim(&self, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        let n = self.dim();
        let d = wrap_dim("max", dim, n)?;
        if n == 0 {
            let indices = Tensor::zeros(&[], self.options().dtype(ScalarType::Long))?;
            return Ok((self.clone(), indices));
        }
        let len = self.sizes()[d];
        if len == 0 {
            return Err(Error::InvalidArgument {
                op: "max",
                message: format!("Expected reduction dim {d} to have non-zero size."),
            });
        }
        let mut order: Vec<i64> = (0..n as i64).filter(|&i| i != d as i64).collect();
        order.push(d as i64);
        let moved = self.permute(&order)?;
        let mut out_shape = self.sizes().to_vec();
        if keepdim {
            out_shape[d] = 1;
        } else {
            out_shape.remove(d);
        }
        let access = Access::lock("max", &[&moved], &[])?;
        let (values, indices) = dispatch!(num, "max", self.dtype(), |T| {
            let data = access.src::<T>("max", &moved)?.to_vec();
            let mut values = Vec::with_capacity(data.len() / len as usize);
            let mut indices = Vec::with_capacity(values.capacity());
            for row in data.chunks_exact(len as usize) {
                let (mut best, mut at) = (row[0], 0i64);
                for (i, &v) in row.iter().enumerate().skip(1) {
                    if max_step(best, v) {
                        best = v;
                        at = i as i64;
                    }
                }
                values.push(best);
                indices.push(at);
            }
            Ok::<_, Error>((
                Tensor::from_slice(&values, &out_shape)?,
                Tensor::from_slice(&indices, &out_shape)?,
            ))
        })?;
        drop(access);
        Ok((values.to(self.device())?, indices.to(self.device())?))
    }
}
