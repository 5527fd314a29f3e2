//! Views: new layouts over the same storage, sharing the version counter, as ATen's view
//! functions (`view`, `reshape`, `narrow`, `slice`, `select`, `transpose`, `t`, `permute`,
//! `expand`, `squeeze`, `unsqueeze`, `as_strided`, `flatten`).
//!
//! Every function here is O(ndim) metadata work and never copies, except [`Tensor::reshape`]
//! (and so [`Tensor::flatten`]), which copies exactly when [`Tensor::view`] would fail, as in
//! PyTorch.

use crate::error::{Error, Result};
use crate::layout::{self, Layout, compute_stride, expand_geometry, infer_size, wrap_dim};
use crate::tensor::Tensor;

impl Tensor {
    /// The same elements with another shape, sharing storage, as `t.view(shape)`; one size may
    /// be `-1`. Possible exactly when ATen's `computeStride` finds strides (always for a
    /// contiguous tensor).
    ///
    /// # Errors
    /// [`Error::InvalidShape`] when the element count differs; [`Error::ViewIncompatible`]
    /// (with PyTorch's advice to use `.reshape(...)`) when the strides do not allow it.
    pub fn view(&self, shape: &[i64]) -> Result<Tensor> {
        let shape = infer_size("view", shape, self.numel())?;
        match compute_stride(self.sizes(), self.strides(), &shape) {
            Some(strides) => self.view_with_layout(
                "view",
                Layout::from_parts(shape, strides, self.storage_offset()),
            ),
            None => Err(Error::ViewIncompatible {
                sizes: self.sizes().to_vec(),
                strides: self.strides().to_vec(),
                requested: shape,
            }),
        }
    }

    /// The same elements with another shape, as `t.reshape(shape)`: a view when the strides
    /// allow it (see [`Tensor::view`]), otherwise a contiguous copy.
    ///
    /// # Errors
    /// [`Error::InvalidShape`]; errors of the copy.
    pub fn reshape(&self, shape: &[i64]) -> Result<Tensor> {
        let shape = infer_size("reshape", shape, self.numel())?;
        match compute_stride(self.sizes(), self.strides(), &shape) {
            Some(strides) => self.view_with_layout(
                "reshape",
                Layout::from_parts(shape, strides, self.storage_offset()),
            ),
            None => self.contiguous()?.view(&shape),
        }
    }

    /// `length` elements of dimension `dim` starting at `start` (negative counts from the end),
    /// as `t.narrow(dim, start, length)`.
    ///
    /// # Errors
    /// [`Error::DimOutOfRange`]; [`Error::InvalidArgument`] on a 0-d tensor, a negative length,
    /// or a range past the end ("start (3) + length (2) exceeds dimension size (4)").
    pub fn narrow(&self, dim: i64, start: i64, length: i64) -> Result<Tensor> {
        let d = self.dim_for("narrow", dim)?;
        let size = self.sizes()[d];
        let invalid = |message: String| Error::InvalidArgument {
            op: "narrow",
            message,
        };
        if length < 0 {
            return Err(invalid("length must be non-negative".into()));
        }
        if start < -size || start > size {
            return Err(Error::IndexOutOfRange {
                op: "narrow",
                index: start,
                dim: d,
                size,
            });
        }
        let start = if start < 0 { start + size } else { start };
        if start > size - length {
            return Err(invalid(format!(
                "start ({start}) + length ({length}) exceeds dimension size ({size})"
            )));
        }
        let mut sizes = self.sizes().to_vec();
        sizes[d] = length;
        let offset = self.storage_offset() + start * self.strides()[d];
        self.view_with_layout(
            "narrow",
            Layout::from_parts(sizes, self.strides().to_vec(), offset),
        )
    }

    /// Elements `start, start + step, ...` below `end` of dimension `dim`, as Python's
    /// `t[start:end:step]` (ATen's `slice`): negative bounds count from the end, bounds are
    /// clamped to the dimension, `None` means the start / the end.
    ///
    /// # Errors
    /// [`Error::DimOutOfRange`]; [`Error::InvalidArgument`] for a step below 1 ("slice step must
    /// be positive") or a 0-d tensor.
    pub fn slice(
        &self,
        dim: i64,
        start: Option<i64>,
        end: Option<i64>,
        step: i64,
    ) -> Result<Tensor> {
        let d = self.dim_for("slice", dim)?;
        if step <= 0 {
            return Err(Error::InvalidArgument {
                op: "slice",
                message: "slice step must be positive".into(),
            });
        }
        let size = self.sizes()[d];
        let mut start = start.unwrap_or(0);
        let mut end = end.unwrap_or(i64::MAX);
        if start < 0 {
            start += size;
        }
        if end < 0 {
            end += size;
        }
        start = start.clamp(0, size);
        end = end.clamp(start, size);
        let mut sizes = self.sizes().to_vec();
        let mut strides = self.strides().to_vec();
        let offset = self.storage_offset() + start * strides[d];
        sizes[d] = (end - start + step - 1) / step;
        strides[d] *= step;
        self.view_with_layout("slice", Layout::from_parts(sizes, strides, offset))
    }

    /// The sub-tensor at `index` of dimension `dim`, which disappears, as `t.select(dim, index)`
    /// (`t[index]` for `dim == 0`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] on a 0-d tensor; [`Error::DimOutOfRange`];
    /// [`Error::IndexOutOfRange`] ("index 5 is out of bounds for dimension 0 with size 3").
    pub fn select(&self, dim: i64, index: i64) -> Result<Tensor> {
        let d = self.dim_for("select", dim)?;
        let size = self.sizes()[d];
        if index < -size || index >= size {
            return Err(Error::IndexOutOfRange {
                op: "select",
                index,
                dim: d,
                size,
            });
        }
        let index = if index < 0 { index + size } else { index };
        let mut sizes = self.sizes().to_vec();
        let mut strides = self.strides().to_vec();
        let offset = self.storage_offset() + index * strides[d];
        sizes.remove(d);
        strides.remove(d);
        self.view_with_layout("select", Layout::from_parts(sizes, strides, offset))
    }

    /// Dimensions `dim0` and `dim1` swapped, as `t.transpose(dim0, dim1)`.
    ///
    /// # Errors
    /// [`Error::DimOutOfRange`].
    pub fn transpose(&self, dim0: i64, dim1: i64) -> Result<Tensor> {
        let n = self.dim();
        let a = wrap_dim("transpose", dim0, n)?;
        let b = wrap_dim("transpose", dim1, n)?;
        if n == 0 {
            return self.view_with_layout("transpose", self.layout().clone());
        }
        let mut sizes = self.sizes().to_vec();
        let mut strides = self.strides().to_vec();
        sizes.swap(a, b);
        strides.swap(a, b);
        self.view_with_layout(
            "transpose",
            Layout::from_parts(sizes, strides, self.storage_offset()),
        )
    }

    /// The transpose of a matrix, as `t.t()`: 0-d and 1-d tensors are returned as they are.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for more than 2 dimensions ("expects a tensor with <= 2
    /// dimensions, but self is 3D").
    pub fn t(&self) -> Result<Tensor> {
        match self.dim() {
            0 | 1 => self.view_with_layout("t", self.layout().clone()),
            2 => self.transpose(0, 1),
            n => Err(Error::InvalidArgument {
                op: "t",
                message: format!("expects a tensor with <= 2 dimensions, but self is {n}D"),
            }),
        }
    }

    /// Dimensions reordered so that new dimension `i` is old dimension `dims[i]`, as
    /// `t.permute(dims)`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `dims` has the wrong length or repeats a dimension;
    /// [`Error::DimOutOfRange`].
    pub fn permute(&self, dims: &[i64]) -> Result<Tensor> {
        let n = self.dim();
        if dims.len() != n {
            return Err(Error::InvalidArgument {
                op: "permute",
                message: format!(
                    "number of dimensions in the tensor input does not match the length of the \
                     desired ordering of dimensions i.e. input.dim() = {n} is not equal to \
                     len(dims) = {}",
                    dims.len()
                ),
            });
        }
        let mut seen = vec![false; n];
        let mut sizes = Vec::with_capacity(n);
        let mut strides = Vec::with_capacity(n);
        for &dim in dims {
            let d = wrap_dim("permute", dim, n)?;
            if std::mem::replace(&mut seen[d], true) {
                return Err(Error::InvalidArgument {
                    op: "permute",
                    message: "duplicate dims are not allowed".into(),
                });
            }
            sizes.push(self.sizes()[d]);
            strides.push(self.strides()[d]);
        }
        self.view_with_layout(
            "permute",
            Layout::from_parts(sizes, strides, self.storage_offset()),
        )
    }

    /// A view with size-1 dimensions repeated (stride 0) and new leading dimensions, as
    /// `t.expand(sizes)`; `-1` keeps a size.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when a non-singleton size differs ("the expanded size of the
    /// tensor (4) must match the existing size (3) at non-singleton dimension 1");
    /// [`Error::InvalidArgument`] when `sizes` has fewer dimensions than the tensor.
    pub fn expand(&self, sizes: &[i64]) -> Result<Tensor> {
        let (sizes, strides) = expand_geometry(self.sizes(), self.strides(), sizes)?;
        self.view_with_layout(
            "expand",
            Layout::from_parts(sizes, strides, self.storage_offset()),
        )
    }

    /// [`Tensor::expand`] to `other`'s shape, as `t.expand_as(other)`.
    ///
    /// # Errors
    /// As [`Tensor::expand`].
    pub fn expand_as(&self, other: &Tensor) -> Result<Tensor> {
        self.expand(other.sizes())
    }

    /// Every size-1 dimension removed, as `t.squeeze()`.
    ///
    /// # Errors
    /// None in practice (the result always fits the storage).
    pub fn squeeze(&self) -> Result<Tensor> {
        let (sizes, strides): (Vec<i64>, Vec<i64>) = self
            .sizes()
            .iter()
            .zip(self.strides())
            .filter(|&(&size, _)| size != 1)
            .map(|(&size, &stride)| (size, stride))
            .unzip();
        self.view_with_layout(
            "squeeze",
            Layout::from_parts(sizes, strides, self.storage_offset()),
        )
    }

    /// Dimension `dim` removed if its size is 1 (otherwise the same shape), as
    /// `t.squeeze(dim)`.
    ///
    /// # Errors
    /// [`Error::DimOutOfRange`].
    pub fn squeeze_dim(&self, dim: i64) -> Result<Tensor> {
        let d = wrap_dim("squeeze", dim, self.dim())?;
        let mut sizes = self.sizes().to_vec();
        let mut strides = self.strides().to_vec();
        if self.dim() > 0 && sizes[d] == 1 {
            sizes.remove(d);
            strides.remove(d);
        }
        self.view_with_layout(
            "squeeze",
            Layout::from_parts(sizes, strides, self.storage_offset()),
        )
    }

    /// A new size-1 dimension at `dim` (in `[-dim()-1, dim()]`), as `t.unsqueeze(dim)`; its
    /// stride is ATen's (`size * stride` of the dimension it goes before, 1 at the end).
    ///
    /// # Errors
    /// [`Error::DimOutOfRange`].
    pub fn unsqueeze(&self, dim: i64) -> Result<Tensor> {
        let n = self.dim();
        let d = wrap_dim("unsqueeze", dim, n + 1)?;
        let mut sizes = self.sizes().to_vec();
        let mut strides = self.strides().to_vec();
        let stride = if d >= n { 1 } else { sizes[d] * strides[d] };
        sizes.insert(d, 1);
        strides.insert(d, stride);
        self.view_with_layout(
            "unsqueeze",
            Layout::from_parts(sizes, strides, self.storage_offset()),
        )
    }

    /// A view with explicit sizes, strides and storage offset (default: this tensor's offset),
    /// as `t.as_strided(size, stride, storage_offset)`.
    ///
    /// # Errors
    /// Those of [`Layout::new`] (negative strides are refused, as in PyTorch);
    /// [`Error::OutOfStorageBounds`] when the view reaches past the storage.
    pub fn as_strided(
        &self,
        sizes: &[i64],
        strides: &[i64],
        storage_offset: Option<i64>,
    ) -> Result<Tensor> {
        let layout = Layout::new(
            sizes,
            strides,
            storage_offset.unwrap_or(self.storage_offset()),
        )?;
        self.view_with_layout("as_strided", layout)
    }

    /// Dimensions `start_dim..=end_dim` merged into one, as `t.flatten(start_dim, end_dim)`
    /// (a view when possible, a copy otherwise, as [`Tensor::reshape`]). A 0-d tensor becomes
    /// 1-d.
    ///
    /// # Errors
    /// [`Error::DimOutOfRange`]; [`Error::InvalidArgument`] when `start_dim` comes after
    /// `end_dim`.
    pub fn flatten(&self, start_dim: i64, end_dim: i64) -> Result<Tensor> {
        let n = self.dim();
        let start = wrap_dim("flatten", start_dim, n)?;
        let end = wrap_dim("flatten", end_dim, n)?;
        if start > end {
            return Err(Error::InvalidArgument {
                op: "flatten",
                message: "invalid args: start_dim cannot come after end_dim".into(),
            });
        }
        if n == 0 {
            return self.reshape(&[1]);
        }
        if start == end {
            return self.view_with_layout("flatten", self.layout().clone());
        }
        let sizes = self.sizes();
        let merged: i64 = sizes[start..=end].iter().product();
        let mut shape = sizes[..start].to_vec();
        shape.push(merged);
        shape.extend_from_slice(&sizes[end + 1..]);
        self.reshape(&shape)
    }

    /// Wraps `dim` for an operation that needs at least one dimension.
    pub(crate) fn dim_for(&self, op: &'static str, dim: i64) -> Result<usize> {
        if self.dim() == 0 {
            return Err(Error::InvalidArgument {
                op,
                message: "cannot be applied to a 0-dim tensor".into(),
            });
        }
        layout::wrap_dim(op, dim, self.dim())
    }
}
