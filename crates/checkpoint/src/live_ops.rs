//! Tensor operations on [`CheckpointTensor`]s, as the prototype's checkpointed ATen
//! overloads: each op is one aten kernel recorded as a live call (its rematerializer), with its
//! output shape inferred before it runs so the hard budget can make room for it, and its
//! estimated cost (ns under [`crate::live::CostModel::Estimated`]: `2mkn` for matrix products,
//! a few per element otherwise).
//!
//! Views (`t`, `transpose`, `view`, `unsqueeze`, `expand`) share their input's storage (alias
//! pool); everything else allocates one fresh contiguous output (two for `max_dim`). Shape
//! errors found by inference are [`LiveError::InvalidArgument`]; everything else is the
//! kernel's ([`LiveError::Op`]).

use aten::layout::{broadcast_shapes, infer_size, wrap_dim};
use aten::{Reduction, Tensor};
use c10_core::ScalarType;

use crate::live::{CheckpointTensor, LiveError, LiveResult, OutputMeta};

fn numel(shape: &[i64]) -> u64 {
    shape.iter().map(|&s| s.max(0) as u64).product()
}

fn aten_err(op: &'static str) -> impl FnOnce(aten::Error) -> LiveError {
    move |source| LiveError::Op {
        op: op.into(),
        source,
    }
}

fn invalid(op: &str, message: String) -> LiveError {
    LiveError::InvalidArgument(format!("{op}: {message}"))
}

/// The shape of a reduction over `dims` (all when empty).
fn reduced_shape(
    op: &'static str,
    shape: &[i64],
    dims: &[i64],
    keepdim: bool,
) -> LiveResult<Vec<i64>> {
    let nd = shape.len();
    let mut mark = vec![dims.is_empty(); nd];
    for &d in dims {
        let w = wrap_dim(op, d, nd).map_err(aten_err(op))?;
        if w < nd {
            if mark[w] {
                return Err(invalid(op, format!("dim {d} appears twice")));
            }
            mark[w] = true;
        }
    }
    Ok(shape
        .iter()
        .zip(&mark)
        .filter_map(|(&s, &m)| if m { keepdim.then_some(1) } else { Some(s) })
        .collect())
}

impl<'rt> CheckpointTensor<'rt> {
    fn one(
        &self,
        name: &'static str,
        args: &[&CheckpointTensor<'rt>],
        out: OutputMeta,
        estimate: u64,
        f: impl Fn(&[Tensor]) -> aten::Result<Tensor> + 'static,
    ) -> LiveResult<Self> {
        let mut v = self
            .runtime()
            .call(name, args, &[out], estimate, move |x| Ok(vec![f(x)?]))?;
        v.pop().ok_or_else(|| LiveError::Internal {
            message: format!("{name} returned no handle"),
        })
    }

    fn unary(
        &self,
        name: &'static str,
        per_element: u64,
        f: impl Fn(&Tensor) -> aten::Result<Tensor> + 'static,
    ) -> LiveResult<Self> {
        let shape = self.shape();
        let est = numel(&shape) * per_element;
        self.one(
            name,
            &[self],
            OutputMeta::fresh(&shape, self.dtype()),
            est,
            move |x| f(&x[0]),
        )
    }

    fn binary(
        &self,
        other: &CheckpointTensor<'rt>,
        name: &'static str,
        f: impl Fn(&Tensor, &Tensor) -> aten::Result<Tensor> + 'static,
    ) -> LiveResult<Self> {
        let shape =
            broadcast_shapes(name, &self.shape(), &other.shape()).map_err(aten_err(name))?;
        let est = numel(&shape);
        self.one(
            name,
            &[self, other],
            OutputMeta::fresh(&shape, self.dtype()),
            est,
            move |x| f(&x[0], &x[1]),
        )
    }

    fn view_op(
        &self,
        name: &'static str,
        shape: Vec<i64>,
        f: impl Fn(&Tensor) -> aten::Result<Tensor> + 'static,
    ) -> LiveResult<Self> {
        self.one(
            name,
            &[self],
            OutputMeta::view_of(0, &shape, self.dtype()),
            1,
            move |x| f(&x[0]),
        )
    }

    /// `self + other` with broadcasting (`torch.add`).
    ///
    /// # Errors
    /// [`LiveError::Op`] for shapes that do not broadcast or a kernel error; as
    /// [`crate::live::LiveRuntime::call`].
    pub fn add(&self, other: &CheckpointTensor<'rt>) -> LiveResult<Self> {
        self.binary(other, "add", Tensor::add)
    }

    /// `self - other` with broadcasting (`torch.sub`).
    ///
    /// # Errors
    /// As [`CheckpointTensor::add`].
    pub fn sub(&self, other: &CheckpointTensor<'rt>) -> LiveResult<Self> {
        self.binary(other, "sub", Tensor::sub)
    }

    /// `self * other` with broadcasting (`torch.mul`).
    ///
    /// # Errors
    /// As [`CheckpointTensor::add`].
    pub fn mul(&self, other: &CheckpointTensor<'rt>) -> LiveResult<Self> {
        self.binary(other, "mul", Tensor::mul)
    }

    /// `self / other` with broadcasting (`torch.div`).
    ///
    /// # Errors
    /// As [`CheckpointTensor::add`].
    pub fn div(&self, other: &CheckpointTensor<'rt>) -> LiveResult<Self> {
        self.binary(other, "div", Tensor::div)
    }

    /// `self + value`.
    ///
    /// # Errors
    /// As [`CheckpointTensor::add`].
    pub fn add_scalar(&self, value: f64) -> LiveResult<Self> {
        self.unary("add_scalar", 1, move |x| x.add_scalar(value))
    }

    /// `self * value`.
    ///
    /// # Errors
    /// As [`CheckpointTensor::add`].
    pub fn mul_scalar(&self, value: f64) -> LiveResult<Self> {
        self.unary("mul_scalar", 1, move |x| x.mul_scalar(value))
    }

    /// `-self`.
    ///
    /// # Errors
    /// As [`CheckpointTensor::add`].
    pub fn neg(&self) -> LiveResult<Self> {
        self.unary("neg", 1, Tensor::neg)
    }

    /// `max(self, 0)` (`torch.relu`).
    ///
    /// # Errors
    /// As [`CheckpointTensor::add`].
    pub fn relu(&self) -> LiveResult<Self> {
        self.unary("relu", 1, Tensor::relu)
    }

    /// `exp(self)`.
    ///
    /// # Errors
    /// As [`CheckpointTensor::add`].
    pub fn exp(&self) -> LiveResult<Self> {
        self.unary("exp", 4, Tensor::exp)
    }

    /// `tanh(self)`.
    ///
    /// # Errors
    /// As [`CheckpointTensor::add`].
    pub fn tanh(&self) -> LiveResult<Self> {
        self.unary("tanh", 4, Tensor::tanh)
    }

    /// `sigmoid(self)`.
    ///
    /// # Errors
    /// As [`CheckpointTensor::add`].
    pub fn sigmoid(&self) -> LiveResult<Self> {
        self.unary("sigmoid", 4, Tensor::sigmoid)
    }

    /// Exact GELU (`torch.nn.functional.gelu`).
    ///
    /// # Errors
    /// As [`CheckpointTensor::add`].
    pub fn gelu(&self) -> LiveResult<Self> {
        self.unary("gelu", 8, Tensor::gelu)
    }

    /// `threshold_backward(grad = self, input, threshold)`: `input <= threshold ? 0 : grad`
    /// (ReLU's backward with threshold 0).
    ///
    /// # Errors
    /// As [`CheckpointTensor::add`].
    pub fn threshold_backward(
        &self,
        input: &CheckpointTensor<'rt>,
        threshold: f64,
    ) -> LiveResult<Self> {
        self.binary(input, "threshold_backward", move |g, x| {
            g.threshold_backward(x, threshold)
        })
    }

    /// A fresh contiguous copy (PyTorch's `clone()`, aten's `deep_clone`).
    ///
    /// # Errors
    /// As [`CheckpointTensor::add`].
    pub fn deep_clone(&self) -> LiveResult<Self> {
        self.unary("clone", 1, Tensor::deep_clone)
    }

    /// Matrix product of `[n, k]` and `[k, m]` (`torch.mm`); estimate `2nkm`.
    ///
    /// # Errors
    /// [`LiveError::InvalidArgument`] unless both are matrices with matching inner sizes; as
    /// [`CheckpointTensor::add`].
    pub fn mm(&self, other: &CheckpointTensor<'rt>) -> LiveResult<Self> {
        let (a, b) = (self.shape(), other.shape());
        if a.len() != 2 || b.len() != 2 || a[1] != b[0] {
            return Err(invalid("mm", format!("cannot multiply {a:?} and {b:?}")));
        }
        let est = 2 * numel(&a) * b[1].max(0) as u64;
        self.one(
            "mm",
            &[self, other],
            OutputMeta::fresh(&[a[0], b[1]], self.dtype()),
            est,
            |x| x[0].mm(&x[1]),
        )
    }

    /// Batched matrix product of `[b, n, k]` and `[b, k, m]` (`torch.bmm`); estimate `2bnkm`.
    ///
    /// # Errors
    /// [`LiveError::InvalidArgument`] unless the shapes match; as [`CheckpointTensor::add`].
    pub fn bmm(&self, other: &CheckpointTensor<'rt>) -> LiveResult<Self> {
        let (a, b) = (self.shape(), other.shape());
        if a.len() != 3 || b.len() != 3 || a[0] != b[0] || a[2] != b[1] {
            return Err(invalid("bmm", format!("cannot multiply {a:?} and {b:?}")));
        }
        let est = 2 * numel(&a) * b[2].max(0) as u64;
        self.one(
            "bmm",
            &[self, other],
            OutputMeta::fresh(&[a[0], a[1], b[2]], self.dtype()),
            est,
            |x| x[0].bmm(&x[1]),
        )
    }

    /// The transpose of a matrix, a view (`t.t()`; a vector is its own transpose).
    ///
    /// # Errors
    /// [`LiveError::InvalidArgument`] for more than 2 dimensions; as [`CheckpointTensor::add`].
    pub fn t(&self) -> LiveResult<Self> {
        let mut shape = self.shape();
        if shape.len() > 2 {
            return Err(invalid(
                "t",
                format!("expects a tensor with <= 2 dimensions, got {}", shape.len()),
            ));
        }
        shape.reverse();
        self.view_op("t", shape, Tensor::t)
    }

    /// Dimensions `dim0` and `dim1` swapped, a view (`t.transpose(dim0, dim1)`).
    ///
    /// # Errors
    /// [`LiveError::Op`] for a dimension out of range; as [`CheckpointTensor::add`].
    pub fn transpose(&self, dim0: i64, dim1: i64) -> LiveResult<Self> {
        let mut shape = self.shape();
        let nd = shape.len();
        let a = wrap_dim("transpose", dim0, nd).map_err(aten_err("transpose"))?;
        let b = wrap_dim("transpose", dim1, nd).map_err(aten_err("transpose"))?;
        if a < nd && b < nd {
            shape.swap(a, b);
        }
        self.view_op("transpose", shape, move |x| x.transpose(dim0, dim1))
    }

    /// The same elements with another shape (one size may be -1), a view (`t.view(shape)`).
    ///
    /// # Errors
    /// [`LiveError::Op`] when the sizes do not match or the layout cannot be viewed; as
    /// [`CheckpointTensor::add`].
    pub fn view(&self, shape: &[i64]) -> LiveResult<Self> {
        let out =
            infer_size("view", shape, numel(&self.shape()) as usize).map_err(aten_err("view"))?;
        let target = shape.to_vec();
        self.view_op("view", out, move |x| x.view(&target))
    }

    /// A size-1 dimension inserted at `dim`, a view (`t.unsqueeze(dim)`).
    ///
    /// # Errors
    /// [`LiveError::Op`] for a dimension out of range; as [`CheckpointTensor::add`].
    pub fn unsqueeze(&self, dim: i64) -> LiveResult<Self> {
        let mut shape = self.shape();
        let d = wrap_dim("unsqueeze", dim, shape.len() + 1).map_err(aten_err("unsqueeze"))?;
        shape.insert(d.min(shape.len()), 1);
        self.view_op("unsqueeze", shape, move |x| x.unsqueeze(dim))
    }

    /// Size-1 dimensions repeated to `sizes` (-1 keeps a size), a view with stride 0
    /// (`t.expand(sizes)`).
    ///
    /// # Errors
    /// [`LiveError::InvalidArgument`] for fewer sizes than dimensions; [`LiveError::Op`] when the
    /// kernel refuses; as [`CheckpointTensor::add`].
    pub fn expand(&self, sizes: &[i64]) -> LiveResult<Self> {
        let shape = self.shape();
        if sizes.len() < shape.len() {
            return Err(invalid(
                "expand",
                format!("{} sizes for a {}-d tensor", sizes.len(), shape.len()),
            ));
        }
        let lead = sizes.len() - shape.len();
        let out: Vec<i64> = sizes
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                if s == -1 && i >= lead {
                    shape[i - lead]
                } else {
                    s
                }
            })
            .collect();
        let target = sizes.to_vec();
        self.view_op("expand", out, move |x| x.expand(&target))
    }

    /// The sum over `dims` (all when empty), `keepdim` keeping them as size 1 (`t.sum(dims,
    /// keepdim)`); integers sum to `Long`.
    ///
    /// # Errors
    /// [`LiveError::Op`] or [`LiveError::InvalidArgument`] for bad dimensions; as
    /// [`CheckpointTensor::add`].
    pub fn sum(&self, dims: &[i64], keepdim: bool) -> LiveResult<Self> {
        let shape = reduced_shape("sum", &self.shape(), dims, keepdim)?;
        let dtype = if self.dtype().is_floating_point() {
            self.dtype()
        } else {
            ScalarType::Long
        };
        let dims = dims.to_vec();
        self.one(
            "sum",
            &[self],
            OutputMeta::fresh(&shape, dtype),
            self.numel(),
            move |x| x[0].sum(&dims, keepdim),
        )
    }

    /// The mean over `dims` (all when empty) (`t.mean(dims, keepdim)`); floating dtypes.
    ///
    /// # Errors
    /// As [`CheckpointTensor::sum`].
    pub fn mean(&self, dims: &[i64], keepdim: bool) -> LiveResult<Self> {
        let shape = reduced_shape("mean", &self.shape(), dims, keepdim)?;
        let dims = dims.to_vec();
        self.one(
            "mean",
            &[self],
            OutputMeta::fresh(&shape, self.dtype()),
            self.numel(),
            move |x| x[0].mean(&dims, keepdim),
        )
    }

    /// Softmax along `dim` (`torch.softmax`).
    ///
    /// # Errors
    /// As [`CheckpointTensor::add`].
    pub fn softmax(&self, dim: i64) -> LiveResult<Self> {
        self.unary("softmax", 4, move |x| x.softmax(dim))
    }

    /// Log-softmax along `dim` (`torch.log_softmax`).
    ///
    /// # Errors
    /// As [`CheckpointTensor::add`].
    pub fn log_softmax(&self, dim: i64) -> LiveResult<Self> {
        self.unary("log_softmax", 4, move |x| x.log_softmax(dim))
    }

    /// The negative log likelihood of log-probabilities `self` (`[N, C]`) against class
    /// indices `target` (`Long`, `[N]`) (`torch.nn.functional.nll_loss`).
    ///
    /// # Errors
    /// [`LiveError::InvalidArgument`] unless `self` is 1-d or 2-d; as
    /// [`CheckpointTensor::add`].
    pub fn nll_loss(
        &self,
        target: &CheckpointTensor<'rt>,
        reduction: Reduction,
    ) -> LiveResult<Self> {
        let shape = self.shape();
        if shape.is_empty() || shape.len() > 2 {
            return Err(invalid(
                "nll_loss",
                format!("input should be 1-d or 2-d, got {shape:?}"),
            ));
        }
        let out: Vec<i64> = match (reduction, shape.len()) {
            (Reduction::None, 2) => vec![shape[0]],
            _ => Vec::new(),
        };
        self.one(
            "nll_loss",
            &[self, target],
            OutputMeta::fresh(&out, self.dtype()),
            numel(&shape),
            move |x| x[0].nll_loss(&x[1], reduction),
        )
    }

    /// The maximum along `dim` and its index, two outputs of one call that are always
    /// rematerialized together (`torch.max(t, dim, keepdim)`).
    ///
    /// # Errors
    /// As [`CheckpointTensor::sum`].
    pub fn max_dim(&self, dim: i64, keepdim: bool) -> LiveResult<(Self, Self)> {
        let shape = reduced_shape("max_dim", &self.shape(), &[dim], keepdim)?;
        let outs = [
            OutputMeta::fresh(&shape, self.dtype()),
            OutputMeta::fresh(&shape, ScalarType::Long),
        ];
        let mut v = self
            .runtime()
            .call("max_dim", &[self], &outs, self.numel(), move |x| {
                let (values, indices) = x[0].max_dim(dim, keepdim)?;
                Ok(vec![values, indices])
            })?;
        let indices = v.pop();
        let values = v.pop();
        values.zip(indices).ok_or_else(|| LiveError::Internal {
            message: "max_dim returned fewer than two handles".into(),
        })
    }

    /// `self += other` in place, copy-on-write (`t.add_(other)`, the log's `MUTATE`): this
    /// handle moves to the new version.
    ///
    /// # Errors
    /// [`LiveError::Runtime`] with [`crate::Error::AliasedMutation`] while a view of `self` is
    /// alive; as [`crate::live::LiveRuntime::mutate`].
    pub fn add_(&self, other: &CheckpointTensor<'rt>) -> LiveResult<()> {
        let est = self.numel();
        self.runtime()
            .mutate("add_", &[self, other], &[0], est, |x| x[0].add_(&x[1]))
    }

    /// `self *= value` in place, copy-on-write (`t.mul_(value)`).
    ///
    /// # Errors
    /// As [`CheckpointTensor::add_`].
    pub fn mul_scalar_(&self, value: f64) -> LiveResult<()> {
        let est = self.numel();
        self.runtime()
            .mutate("mul_scalar_", &[self], &[0], est, move |x| {
                x[0].mul_scalar_(value)
            })
    }
}
