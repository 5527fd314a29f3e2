//! [`Layout`]: sizes, strides and storage offset, and every stride rule in one place
//! (contiguity, view legality as ATen's `computeStride`, broadcasting, expansion, dim wrapping,
//! and the strides of new results: `preserve_format` as `empty_like`, elementwise outputs as
//! `TensorIterator`).
//!
//! Sizes, strides and the offset are signed 64-bit integers counted in **elements**, as c10's
//! `IntArrayRef`. Sizes are never negative. Strides are never negative either: as in PyTorch,
//! `as_strided` refuses negative strides ("Negative strides are not supported at the moment"),
//! so every layout's elements lie in `[offset, offset + extent)` where the extent is
//! `1 + Σ (size_d - 1) · stride_d` (zero for an empty tensor). A stride may be 0 (an expanded
//! dimension), and strides of size-1 dimensions are arbitrary, as in PyTorch.
//!
//! This file is pure arithmetic: it never touches memory. [`crate::Tensor`] checks that a layout
//! fits its storage when the tensor is made, and the kernels rely on that.

use crate::error::{Error, Result};

/// The geometry of a tensor: sizes, strides (in elements) and storage offset (in elements), as
/// the metadata part of c10's `TensorImpl` (`sizes_and_strides_`, `storage_offset_`), or
/// candle's `Layout`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    sizes: Vec<i64>,
    strides: Vec<i64>,
    storage_offset: i64,
}

impl Layout {
    /// A contiguous (row-major) layout of `sizes` at offset 0, with the strides of
    /// [`contiguous_strides`].
    ///
    /// # Errors
    /// [`Error::NegativeSize`] if a size is negative.
    pub fn contiguous(sizes: &[i64]) -> Result<Layout> {
        check_sizes(sizes)?;
        Ok(Layout {
            sizes: sizes.to_vec(),
            strides: contiguous_strides(sizes),
            storage_offset: 0,
        })
    }

    /// A layout with explicit strides and offset, as the arguments of ATen's `as_strided`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `strides` and `sizes` differ in length, or a stride or the
    /// offset is negative ("as_strided: Negative strides are not supported at the moment");
    /// [`Error::NegativeSize`] if a size is negative.
    pub fn new(sizes: &[i64], strides: &[i64], storage_offset: i64) -> Result<Layout> {
        check_sizes(sizes)?;
        if sizes.len() != strides.len() {
            return Err(Error::InvalidArgument {
                op: "as_strided",
                message: format!(
                    "mismatch in length of strides and shape: {} sizes, {} strides",
                    sizes.len(),
                    strides.len()
                ),
            });
        }
        if strides.iter().any(|&s| s < 0) {
            return Err(Error::InvalidArgument {
                op: "as_strided",
                message: format!(
                    "negative strides are not supported at the moment, got strides: {}",
                    crate::error::shape_str(strides)
                ),
            });
        }
        if storage_offset < 0 {
            return Err(Error::InvalidArgument {
                op: "as_strided",
                message: format!("tensor: invalid storage offset {storage_offset}"),
            });
        }
        Ok(Layout {
            sizes: sizes.to_vec(),
            strides: strides.to_vec(),
            storage_offset,
        })
    }

    /// The sizes (c10's `sizes()`).
    pub fn sizes(&self) -> &[i64] {
        &self.sizes
    }

    /// The strides in elements (c10's `strides()`).
    pub fn strides(&self) -> &[i64] {
        &self.strides
    }

    /// The offset of element `[0, ..., 0]` from the start of the storage, in elements (c10's
    /// `storage_offset()`).
    pub fn storage_offset(&self) -> i64 {
        self.storage_offset
    }

    /// The number of dimensions (c10's `dim()`).
    pub fn dim(&self) -> usize {
        self.sizes.len()
    }

    /// The number of elements, the product of the sizes (1 for a 0-d tensor), as c10's `numel()`.
    pub fn numel(&self) -> usize {
        numel(&self.sizes)
    }

    /// Whether the layout is row-major contiguous, as c10's `compute_contiguous`: an empty
    /// tensor is contiguous, and size-1 dimensions may have any stride.
    pub fn is_contiguous(&self) -> bool {
        is_contiguous(&self.sizes, &self.strides)
    }

    /// Whether the elements fill a dense block of memory with no two sharing an address, in any
    /// dimension order, as c10's `compute_non_overlapping_and_dense`.
    pub fn is_non_overlapping_and_dense(&self) -> bool {
        is_non_overlapping_and_dense(&self.sizes, &self.strides)
    }

    /// Whether two elements certainly share an address (a stride-0 dimension of size > 1), as
    /// ATen's `has_internal_overlap` returning `MemOverlap::Yes`. Layouts it cannot decide
    /// cheaply (ATen's `TooHard`) report `false`, as ATen only refuses the certain case.
    pub fn has_internal_overlap(&self) -> bool {
        self.sizes
            .iter()
            .zip(&self.strides)
            .any(|(&size, &stride)| size > 1 && stride == 0)
    }

    /// Elements of storage the layout needs from the start of the storage: the offset of its
    /// last element plus one, or 0 for an empty tensor, as ATen's `computeStorageNbytes` (in
    /// elements). Saturates at `u64::MAX` instead of overflowing.
    pub fn required_storage_elements(&self) -> u64 {
        if self.sizes.contains(&0) {
            return 0;
        }
        let mut last = self.storage_offset as u64;
        for (&size, &stride) in self.sizes.iter().zip(&self.strides) {
            last = last.saturating_add((size as u64 - 1).saturating_mul(stride as u64));
        }
        last.saturating_add(1)
    }

    /// The storage index (in elements) of the element at multi-index `index`, or `None` if the
    /// index has the wrong length or is out of range.
    pub fn offset_of(&self, index: &[i64]) -> Option<i64> {
        if index.len() != self.dim() {
            return None;
        }
        let mut offset = self.storage_offset;
        for ((&i, &size), &stride) in index.iter().zip(&self.sizes).zip(&self.strides) {
            if i < 0 || i >= size {
                return None;
            }
            offset += i * stride;
        }
        Some(offset)
    }

    /// The same elements with dimension `i` of the result being dimension `perm[i]` of this
    /// layout (a permutation; unchecked, for the kernels' iteration order); `None` keeps it.
    pub(crate) fn permuted(self, perm: Option<&[usize]>) -> Layout {
        let Some(perm) = perm else {
            return self;
        };
        Layout {
            sizes: perm.iter().map(|&d| self.sizes[d]).collect(),
            strides: perm.iter().map(|&d| self.strides[d]).collect(),
            storage_offset: self.storage_offset,
        }
    }

    /// Builds a layout without validation, for the view functions that derive one valid layout
    /// from another.
    pub(crate) fn from_parts(sizes: Vec<i64>, strides: Vec<i64>, storage_offset: i64) -> Layout {
        debug_assert_eq!(sizes.len(), strides.len());
        Layout {
            sizes,
            strides,
            storage_offset,
        }
    }
}

/// The number of elements of a shape: the product of its sizes, 1 for `[]` (saturating at
/// `usize::MAX`).
pub fn numel(sizes: &[i64]) -> usize {
    // Saturating, so an absurd shape is refused by the allocation-size checks instead of
    // overflowing.
    sizes
        .iter()
        .fold(1usize, |n, &s| n.saturating_mul(s.max(0) as usize))
}

/// Checks that no size is negative, as ATen's `check_size_nonnegative`.
///
/// # Errors
/// [`Error::NegativeSize`] naming the first negative size and the shape.
pub fn check_sizes(sizes: &[i64]) -> Result<()> {
    match sizes.iter().find(|&&s| s < 0) {
        Some(&size) => Err(Error::NegativeSize {
            size,
            shape: sizes.to_vec(),
        }),
        None => Ok(()),
    }
}

/// Row-major strides for `sizes`, as c10's `contiguous_strides` / `empty_tensor_restride`: the
/// last stride is 1 and each other is the next one times `max(next size, 1)` (so size-0
/// dimensions do not zero the strides before them).
pub fn contiguous_strides(sizes: &[i64]) -> Vec<i64> {
    let mut strides = vec![1i64; sizes.len()];
    for d in (0..sizes.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * sizes[d + 1].max(1);
    }
    strides
}

/// Whether `sizes`/`strides` are row-major contiguous, as c10's `compute_contiguous`.
pub fn is_contiguous(sizes: &[i64], strides: &[i64]) -> bool {
    if sizes.contains(&0) {
        return true;
    }
    let mut expected = 1i64;
    for (&size, &stride) in sizes.iter().zip(strides).rev() {
        if size != 1 {
            if stride != expected {
                return false;
            }
            expected *= size;
        }
    }
    true
}

/// Whether `sizes`/`strides` describe a dense, non-overlapping block in some dimension order, as
/// c10's `compute_non_overlapping_and_dense`.
pub fn is_non_overlapping_and_dense(sizes: &[i64], strides: &[i64]) -> bool {
    if sizes.len() == 1 {
        return sizes[0] < 2 || strides[0] == 1;
    }
    let mut perm: Vec<usize> = (0..sizes.len()).collect();
    // Sort by stride, leaving size-0 and size-1 dims at the end (c10's comparator).
    perm.sort_by(|&a, &b| match (sizes[a] < 2, sizes[b] < 2) {
        (true, true) => std::cmp::Ordering::Equal,
        (true, false) => std::cmp::Ordering::Greater,
        (false, true) => std::cmp::Ordering::Less,
        (false, false) => strides[a].cmp(&strides[b]),
    });
    let mut required = 1i64;
    for &d in &perm {
        if sizes[d] < 2 {
            return true;
        }
        if strides[d] != required {
            return false;
        }
        required *= sizes[d];
    }
    true
}

/// Whether a 4-d layout is channels-last (NHWC) contiguous, as c10's
/// `compute_channels_last_contiguous_2d` (`t.is_contiguous(memory_format=torch.channels_last)`):
/// dimensions 1, 3, 2, 0 are dense in that order, size-1 dimensions skipped. Any other rank is
/// not.
pub fn is_channels_last_contiguous(sizes: &[i64], strides: &[i64]) -> bool {
    if sizes.len() != 4 {
        return false;
    }
    let mut expected = 1i64;
    for d in [1, 3, 2, 0] {
        if sizes[d] != 1 {
            if strides[d] != expected {
                return false;
            }
            expected *= sizes[d];
        }
    }
    true
}

/// The channels-last (NHWC) strides of a 4-d shape, as c10's `get_channels_last_strides_2d`:
/// channels fastest, then width, height and batch.
///
/// # Panics
/// Unless `sizes` has 4 dimensions (an internal bug: callers check
/// [`is_channels_last_contiguous`] first).
pub fn channels_last_strides(sizes: &[i64]) -> Vec<i64> {
    assert_eq!(sizes.len(), 4, "channels_last_strides: not a 4-d shape");
    let mut strides = vec![0i64; 4];
    strides[1] = 1;
    strides[3] = sizes[1].max(1);
    strides[2] = strides[3] * sizes[3].max(1);
    strides[0] = strides[2] * sizes[2].max(1);
    strides
}

/// Sorts `perm` (dimensions, fastest first once sorted) by insertion with a comparison that may
/// be ambiguous (0), as the insertion sort of TensorIterator's `reorder_dimensions` and ATen's
/// `infer_dense_strides`: a dimension moves towards the front past every dimension it should
/// come before, stops at the first it should come after, and passes ambiguous ones.
fn sort_dims(perm: &mut [usize], should_swap: impl Fn(usize, usize) -> i8) {
    for i in 1..perm.len() {
        let mut dim1 = i;
        for dim0 in (0..i).rev() {
            match should_swap(perm[dim0], perm[dim1]) {
                c if c > 0 => {
                    perm.swap(dim0, dim1);
                    dim1 = dim0;
                }
                c if c < 0 => break,
                _ => {}
            }
        }
    }
}

/// Dense strides that keep the dimension order of `sizes`/`strides` (which may overlap or have
/// gaps), as ATen's `infer_dense_strides`: dimensions sorted by stride (a stride 0 is
/// ambiguous and stays in place; equal strides put the smaller size first), then laid out
/// densely in that order, size-0 and size-1 dimensions counting as 1.
pub fn infer_dense_strides(sizes: &[i64], strides: &[i64]) -> Vec<i64> {
    let n = sizes.len();
    if n <= 1 {
        return vec![1; n];
    }
    let mut perm: Vec<usize> = (0..n).rev().collect();
    sort_dims(&mut perm, |d0, d1| {
        let (s0, s1) = (strides[d0], strides[d1]);
        if s0 == 0 || s1 == 0 {
            0
        } else if s0 != s1 {
            if s0 < s1 { -1 } else { 1 }
        } else if sizes[d0] > sizes[d1] {
            1
        } else {
            0
        }
    });
    let mut out = vec![0i64; n];
    let mut next = 1i64;
    for &d in &perm {
        out[d] = next;
        if sizes[d] > 1 {
            next *= sizes[d];
        }
    }
    out
}

/// The strides of a new tensor like `sizes`/`strides` under `memory_format=torch.preserve_format`,
/// as ATen's `empty_like` (used by `clone()` and `to(dtype)`): the same strides for a
/// non-overlapping and dense layout, else [`infer_dense_strides`].
pub fn preserve_format_strides(sizes: &[i64], strides: &[i64]) -> Vec<i64> {
    if is_non_overlapping_and_dense(sizes, strides) {
        strides.to_vec()
    } else {
        infer_dense_strides(sizes, strides)
    }
}

/// The strides of an operand broadcast to `shape`, as TensorIterator's `compute_strides`: new
/// leading dimensions and size-1 dimensions that broadcast get stride 0.
fn broadcast_strides(shape: &[i64], sizes: &[i64], strides: &[i64]) -> Vec<i64> {
    let offset = shape.len() - sizes.len();
    let mut out = vec![0i64; shape.len()];
    for (i, (&size, &stride)) in sizes.iter().zip(strides).enumerate() {
        out[offset + i] = if size == 1 && shape[offset + i] != 1 {
            0
        } else {
            stride
        };
    }
    out
}

/// The strides of the new output of an elementwise operation of broadcast shape `shape` over
/// `inputs` (each one's sizes and strides, in operand order; a scalar is a 0-d input), as ATen's
/// `TensorIterator` decides them:
///
/// 1. Inputs of one shape (no broadcasting, no scalar beside a tensor): all contiguous gives a
///    contiguous output; all channels-last contiguous (4-d) a channels-last one; all
///    non-overlapping and dense with equal strides the same strides (`fast_set_up`).
/// 2. Otherwise dimensions are sorted by the inputs' strides (`reorder_dimensions`: the first
///    input whose strides differ decides, broadcast dimensions are ambiguous, equal strides put
///    the smaller size first) and the output is dense in that order (`compatible_stride`, in
///    which a size-0 dimension zeroes the strides after it); the row-major order gives plain
///    contiguous strides.
///
/// So `exp(t.t())` and `t.t() + row` are transposed like `t.t()`.
///
/// # Panics
/// If an input has more dimensions than `shape` (an internal bug: `shape` is their broadcast).
pub fn elementwise_strides(shape: &[i64], inputs: &[(&[i64], &[i64])]) -> Vec<i64> {
    elementwise_strides_unless_contiguous(shape, inputs)
        .unwrap_or_else(|| contiguous_strides(shape))
}

/// [`elementwise_strides`], or `None` when they are [`contiguous_strides`] (the common case,
/// answered without allocating).
pub(crate) fn elementwise_strides_unless_contiguous(
    shape: &[i64],
    inputs: &[(&[i64], &[i64])],
) -> Option<Vec<i64>> {
    let n = shape.len();
    if inputs.iter().all(|&(sizes, _)| sizes == shape) {
        if inputs
            .iter()
            .all(|&(sizes, strides)| is_contiguous(sizes, strides))
        {
            return None;
        }
        if inputs
            .iter()
            .all(|&(sizes, strides)| is_channels_last_contiguous(sizes, strides))
        {
            return Some(channels_last_strides(shape));
        }
        if let Some(&(_, first)) = inputs.first() {
            if inputs.iter().all(|&(sizes, strides)| {
                strides == first && is_non_overlapping_and_dense(sizes, strides)
            }) {
                return Some(first.to_vec());
            }
        }
    }
    if n <= 1 {
        return None;
    }
    let strides: Vec<Vec<i64>> = inputs
        .iter()
        .map(|&(sizes, strides)| broadcast_strides(shape, sizes, strides))
        .collect();
    let mut perm: Vec<usize> = (0..n).rev().collect();
    sort_dims(&mut perm, |d0, d1| {
        for st in &strides {
            let (s0, s1) = (st[d0], st[d1]);
            if s0 == 0 || s1 == 0 {
                continue;
            }
            if s0 != s1 {
                return if s0 < s1 { -1 } else { 1 };
            }
            if shape[d0] > shape[d1] {
                return 1;
            }
        }
        0
    });
    if perm.iter().enumerate().all(|(j, &d)| d == n - 1 - j) {
        return None;
    }
    let mut out = vec![0i64; n];
    let mut next = 1i64;
    for &d in &perm {
        out[d] = next;
        next *= shape[d];
    }
    Some(out)
}

/// The dimensions of a layout from the largest stride to the smallest (stable: ties keep
/// row-major order), the order in which a kernel visits memory sequentially; `None` when that
/// is the row-major order already (strides never increase), answered without allocating.
pub(crate) fn memory_order(strides: &[i64]) -> Option<Vec<usize>> {
    if strides.windows(2).all(|w| w[0] >= w[1]) {
        return None;
    }
    let mut perm: Vec<usize> = (0..strides.len()).collect();
    perm.sort_by(|&a, &b| strides[b].cmp(&strides[a]));
    Some(perm)
}

/// Wraps a possibly negative dimension into `0..ndim`, as c10's `maybe_wrap_dim` (a 0-d tensor
/// accepts `0` and `-1`, as if it had one dimension).
///
/// # Errors
/// [`Error::DimOutOfRange`] outside `[-max(ndim, 1), max(ndim, 1) - 1]`.
pub fn wrap_dim(op: &'static str, dim: i64, ndim: usize) -> Result<usize> {
    let n = ndim.max(1) as i64;
    if dim < -n || dim >= n {
        return Err(Error::DimOutOfRange { op, dim, ndim });
    }
    Ok(if dim < 0 { dim + n } else { dim } as usize)
}

/// Resolves a `-1` in `shape` against `numel` elements, as ATen's `infer_size`.
///
/// # Errors
/// [`Error::InvalidShape`] for two `-1`s, a size below `-1`, an ambiguous `-1` with zero
/// elements, or a product that does not match `numel`.
pub fn infer_size(op: &'static str, shape: &[i64], numel: usize) -> Result<Vec<i64>> {
    let invalid = |reason| Error::InvalidShape {
        op,
        shape: shape.to_vec(),
        numel,
        reason,
    };
    let mut product: u64 = 1;
    let mut inferred = None;
    for (d, &size) in shape.iter().enumerate() {
        if size == -1 {
            if inferred.is_some() {
                return Err(invalid(Some("only one dimension can be inferred")));
            }
            inferred = Some(d);
        } else if size >= 0 {
            product = product.saturating_mul(size as u64);
        } else {
            return Err(invalid(Some(
                "invalid shape dimension (sizes must be >= -1)",
            )));
        }
    }
    let numel64 = numel as u64;
    let mut out = shape.to_vec();
    match inferred {
        None if product == numel64 => Ok(out),
        Some(d) if product > 0 && numel64 % product == 0 => {
            out[d] = (numel64 / product) as i64;
            Ok(out)
        }
        Some(_) if product == 0 => Err(invalid(Some(
            "the unspecified dimension size -1 can be any value and is ambiguous",
        ))),
        _ => Err(invalid(None)),
    }
}

/// The strides that view `old_sizes`/`old_strides` as `new_sizes` without copying, or `None`
/// when no such strides exist, as ATen's `computeStride` (`TensorUtils.cpp`).
///
/// Dimensions of the old layout are grouped into chunks that are contiguous with respect to
/// each other; each chunk must be split or merged exactly by the new sizes. `new_sizes` must
/// already have the same number of elements (see [`infer_size`]).
pub fn compute_stride(
    old_sizes: &[i64],
    old_strides: &[i64],
    new_sizes: &[i64],
) -> Option<Vec<i64>> {
    if old_sizes.is_empty() {
        return Some(vec![1; new_sizes.len()]);
    }
    let numel = numel(old_sizes);
    if numel == 0 && old_sizes == new_sizes {
        return Some(old_strides.to_vec());
    }
    let mut new_strides = vec![0i64; new_sizes.len()];
    if numel == 0 {
        for d in (0..new_sizes.len()).rev() {
            new_strides[d] = if d == new_sizes.len() - 1 {
                1
            } else {
                new_sizes[d + 1].max(1) * new_strides[d + 1]
            };
        }
        return Some(new_strides);
    }
    let mut view_d = new_sizes.len() as i64 - 1;
    let mut chunk_base_stride = *old_strides.last().expect("non-empty");
    let mut tensor_numel: i64 = 1;
    let mut view_numel: i64 = 1;
    for tensor_d in (0..old_sizes.len()).rev() {
        tensor_numel *= old_sizes[tensor_d];
        let chunk_ends = tensor_d == 0
            || (old_sizes[tensor_d - 1] != 1
                && old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride);
        if chunk_ends {
            while view_d >= 0 && (view_numel < tensor_numel || new_sizes[view_d as usize] == 1) {
                new_strides[view_d as usize] = view_numel * chunk_base_stride;
                view_numel *= new_sizes[view_d as usize];
                view_d -= 1;
            }
            if view_numel != tensor_numel {
                return None;
            }
            if tensor_d > 0 {
                chunk_base_stride = old_strides[tensor_d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    if view_d != -1 {
        return None;
    }
    Some(new_strides)
}

/// The broadcast of two shapes, as ATen's `infer_size` for operands: shapes are aligned at the
/// right, and each pair of sizes must be equal or contain a 1.
///
/// # Errors
/// [`Error::BroadcastMismatch`] naming both shapes and the first dimension that disagrees.
pub fn broadcast_shapes(op: &'static str, a: &[i64], b: &[i64]) -> Result<Vec<i64>> {
    let ndim = a.len().max(b.len());
    let mut out = vec![0i64; ndim];
    for i in (0..ndim).rev() {
        let offset = ndim - 1 - i;
        let size_a = if offset < a.len() {
            a[a.len() - 1 - offset]
        } else {
            1
        };
        let size_b = if offset < b.len() {
            b[b.len() - 1 - offset]
        } else {
            1
        };
        if size_a != size_b && size_a != 1 && size_b != 1 {
            return Err(Error::BroadcastMismatch {
                op,
                lhs: a.to_vec(),
                rhs: b.to_vec(),
                dim: i,
                lhs_size: size_a,
                rhs_size: size_b,
            });
        }
        out[i] = if size_a == 1 { size_b } else { size_a };
    }
    Ok(out)
}

/// Sizes and strides of `sizes`/`strides` expanded to `target` (where `-1` keeps a size), as
/// ATen's `inferExpandGeometry`: new leading dimensions and expanded size-1 dimensions get
/// stride 0.
///
/// # Errors
/// [`Error::InvalidArgument`] when `target` has fewer dimensions than the tensor, or a `-1`
/// stands in a new leading dimension; [`Error::ShapeMismatch`] when a non-singleton size
/// differs from its target.
pub fn expand_geometry(
    sizes: &[i64],
    strides: &[i64],
    target: &[i64],
) -> Result<(Vec<i64>, Vec<i64>)> {
    let ndim = target.len();
    let tensor_dim = sizes.len();
    if ndim < tensor_dim {
        return Err(Error::InvalidArgument {
            op: "expand",
            message: format!(
                "the number of sizes provided ({ndim}) must be greater or equal to the number of \
                 dimensions in the tensor ({tensor_dim})"
            ),
        });
    }
    let mut out_sizes = vec![0i64; ndim];
    let mut out_strides = vec![0i64; ndim];
    if tensor_dim == 0 {
        // A 0-d tensor expands to any shape with all strides 0 (ATen returns zeroed strides).
        check_sizes(target)?;
        return Ok((target.to_vec(), out_strides));
    }
    for i in (0..ndim).rev() {
        let offset = ndim - 1 - i;
        let existing = offset < tensor_dim;
        let dim = tensor_dim.wrapping_sub(1).wrapping_sub(offset);
        let mut size = if existing { sizes[dim] } else { 1 };
        let mut stride = if existing {
            strides[dim]
        } else if i + 1 < ndim {
            out_sizes[i + 1] * out_strides[i + 1]
        } else {
            1
        };
        let mut target_size = target[i];
        if target_size == -1 {
            if !existing {
                return Err(Error::InvalidArgument {
                    op: "expand",
                    message: format!(
                        "the expanded size of the tensor (-1) isn't allowed in a leading, \
                         non-existing dimension {i}"
                    ),
                });
            }
            target_size = size;
        }
        if target_size < 0 {
            return Err(Error::NegativeSize {
                size: target_size,
                shape: target.to_vec(),
            });
        }
        if size != target_size {
            if size != 1 {
                return Err(Error::ShapeMismatch {
                    op: "expand",
                    lhs: target.to_vec(),
                    rhs: sizes.to_vec(),
                    reason: format!(
                        "the expanded size of the tensor ({target_size}) must match the existing \
                         size ({size}) at non-singleton dimension {i}"
                    ),
                });
            }
            size = target_size;
            stride = 0;
        }
        out_sizes[i] = size;
        out_strides[i] = stride;
    }
    Ok((out_sizes, out_strides))
}

/// Whether two layouts over the **same storage** share memory, as ATen's `get_overlap_status`
/// (`MemoryOverlap.cpp`) on element ranges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overlap {
    /// No element of one is an element of the other.
    No,
    /// Both cover the same elements in the same order (same start, same extent, same strides).
    Full,
    /// Some but not all elements are shared, or the same elements in another order.
    Partial,
    /// Not decidable cheaply (one of them is not non-overlapping and dense).
    TooHard,
}

/// The overlap of two layouts of one element type over the same storage, as ATen's
/// `get_overlap_status`.
pub fn overlap(a: &Layout, b: &Layout) -> Overlap {
    if a.numel() == 0 || b.numel() == 0 {
        return Overlap::No;
    }
    if !a.is_non_overlapping_and_dense() || !b.is_non_overlapping_and_dense() {
        return Overlap::TooHard;
    }
    let a_begin = a.storage_offset;
    let a_end = a_begin + a.numel() as i64;
    let b_begin = b.storage_offset;
    let b_end = b_begin + b.numel() as i64;
    if a_begin == b_begin && a_end == b_end {
        return if a.strides == b.strides {
            Overlap::Full
        } else {
            Overlap::Partial
        };
    }
    if a_begin < b_end && b_begin < a_end {
        return Overlap::Partial;
    }
    Overlap::No
}
