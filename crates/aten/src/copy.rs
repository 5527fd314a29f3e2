//! Copies between tensors: [`Tensor::copy_`] (broadcasting and dtype conversion, as ATen's
//! `copy_`), [`Tensor::contiguous`], [`Tensor::deep_clone`] (PyTorch's `clone()`),
//! [`Tensor::to_dtype`], and the in-place fills [`Tensor::fill_`] and [`Tensor::zero_`].
//!
//! Conversions follow `c10::convert`: between integer types exactly (wrapping when narrowing),
//! otherwise through `f64`; anything to Bool is `value != 0`. Float to integer truncates toward
//! zero; to `uint8` it goes through `int64` as in c10 (`-1.5` gives 255, `300.7` gives 44, both
//! defined in C++). Out of the target's range (and for NaN) C++ leaves the conversion undefined;
//! aten saturates (NaN gives 0) where PyTorch 2.15.0 on x86 gives the `INT_MIN` of a 32-bit
//! intermediate for `int8`/`int16`/`int32` (`-200.0` to `int8` is 56 there, -128 here; NaN to
//! `int32` is -2147483648 there, 0 here) and of a 64-bit one for `int64`/`uint8` (`inf` to
//! `uint8` is 0 there, 255 here).

use c10_core::{Device, ScalarType};

use crate::error::{Error, Result};
use crate::host::{self, Access, map1};
use crate::layout::{self, Layout, Overlap};
use crate::scalar::{Elem, dispatch};
use crate::tensor::Tensor;

/// Refuses to write into `dst` when two of its elements share memory, as ATen's
/// `assert_no_internal_overlap`.
pub(crate) fn check_no_internal_overlap(op: &'static str, dst: &Tensor) -> Result<()> {
    if dst.layout().has_internal_overlap() {
        return Err(Error::MemoryOverlap {
            op,
            what: "more than one element of the written-to tensor refers to a single memory \
                   location",
        });
    }
    Ok(())
}

/// How `src` overlaps `dst` (the same storage and dtype compared element-wise), as ATen's
/// `get_overlap_status`; refuses a partial overlap, as `assert_no_partial_overlap`.
pub(crate) fn check_no_partial_overlap(
    op: &'static str,
    dst: &Tensor,
    src: &Tensor,
) -> Result<Overlap> {
    if !std::sync::Arc::ptr_eq(dst.cell(), src.cell()) {
        return Ok(Overlap::No);
    }
    let status = if dst.dtype() == src.dtype() {
        layout::overlap(dst.layout(), src.layout())
    } else {
        Overlap::TooHard
    };
    if status == Overlap::Partial {
        return Err(Error::MemoryOverlap {
            op,
            what: "some elements of the input tensor and the written-to tensor refer to a single \
                   memory location",
        });
    }
    Ok(status)
}

/// The layout of a new copy, as ATen's `MemoryFormat` argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// Row-major (`torch.contiguous_format`).
    Contiguous,
    /// Like the source (`torch.preserve_format`, as `empty_like`).
    Preserve,
}

/// `dst[i] = convert(src[i])` through `src_layout` (already expanded to `dst`'s sizes), on host
/// tensors.
pub(crate) fn copy_kernel(
    op: &'static str,
    dst: &Tensor,
    src: &Tensor,
    src_layout: Layout,
) -> Result<()> {
    let access = Access::lock(op, &[src], &[dst])?;
    dispatch!(all, op, dst.dtype(), |D| {
        let d = access.dst::<D>(op, dst)?;
        dispatch!(all, op, src.dtype(), |S| {
            let s = access.src_as::<S>(op, src, src_layout.clone())?;
            map1(&d, &s, |x: S| x.cast::<D>());
            Ok(())
        })
    })
}

impl Tensor {
    /// Copies `src` into this tensor in place, broadcasting `src` to this shape and converting
    /// its dtype, across devices if needed, as `t.copy_(src)`. Bumps the version counter.
    ///
    /// A CUDA destination must be contiguous (it is written with one host-to-device copy).
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when `src` does not broadcast to this shape;
    /// [`Error::MemoryOverlap`] when this tensor has self-overlapping elements or `src` partly
    /// overlaps it; device errors ([`Error::CudaUnavailable`], [`Error::UnsupportedDevice`]).
    pub fn copy_(&self, src: &Tensor) -> Result<()> {
        let (sizes, strides) = layout::expand_geometry(src.sizes(), src.strides(), self.sizes())
            .map_err(|e| Error::ShapeMismatch {
                op: "copy_",
                lhs: self.sizes().to_vec(),
                rhs: src.sizes().to_vec(),
                reason: format!("the source does not broadcast to the destination ({e})"),
            })?;
        check_no_internal_overlap("copy_", self)?;
        let src_layout = Layout::from_parts(sizes, strides, src.storage_offset());
        if host::is_host_accessible(self) && host::is_host_accessible(src) {
            let overlap = check_no_partial_overlap("copy_", self, src)?;
            if overlap != Overlap::Full {
                copy_kernel("copy_", self, src, src_layout)?;
            }
        } else {
            crate::device_copy::copy_across("copy_", self, src, src_layout)?;
        }
        self.bump_version();
        Ok(())
    }

    /// This tensor if it is contiguous, else a contiguous copy, as `t.contiguous()`.
    ///
    /// # Errors
    /// Allocation and device errors of the copy.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        self.copy_into_new("contiguous", self.dtype(), Format::Contiguous)
    }

    /// A deep copy with its own storage and version counter, as PyTorch's `t.clone()` (named
    /// differently because Rust's [`Clone::clone`] is the reference-count bump). As
    /// `memory_format=torch.preserve_format`: a non-overlapping and dense tensor keeps its
    /// strides exactly (size-1 dimensions included: `as_strided([3, 1], [1, 0])` stays `[1, 0]`),
    /// any other gets dense strides in its own dimension order
    /// ([`crate::layout::infer_dense_strides`]: a sliced transpose stays transposed).
    ///
    /// # Errors
    /// Allocation and device errors.
    pub fn deep_clone(&self) -> Result<Tensor> {
        self.copy_into_new("clone", self.dtype(), Format::Preserve)
    }

    /// The values converted to `dtype` (this tensor itself if it already has it), as
    /// `t.to(dtype)`, whose `memory_format=torch.preserve_format` keeps the layout as
    /// [`Tensor::deep_clone`] does (a transposed tensor gives a transposed result).
    ///
    /// Conversions follow `c10::convert` (see the [module docs](self)).
    ///
    /// # Errors
    /// Allocation and device errors.
    pub fn to_dtype(&self, dtype: ScalarType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        self.copy_into_new("to", dtype, Format::Preserve)
    }

    /// A new tensor on this device with this shape and `dtype` holding a copy of the values, in
    /// `format`'s layout.
    pub(crate) fn copy_into_new(
        &self,
        op: &'static str,
        dtype: ScalarType,
        format: Format,
    ) -> Result<Tensor> {
        if !host::is_host_accessible(self) {
            // CUDA: through the host (aten has no device kernels).
            let host = self.to(Device::cpu())?.copy_into_new(op, dtype, format)?;
            return host.to(self.device());
        }
        let out = match format {
            Format::Contiguous => Tensor::empty_uninit(self.sizes(), dtype, self.device())?,
            Format::Preserve => Tensor::empty_strided_uninit(
                op,
                self.sizes(),
                &layout::preserve_format_strides(self.sizes(), self.strides()),
                dtype,
                self.device(),
            )?,
        };
        copy_kernel(op, &out, self, self.layout().clone())?;
        // A fresh tensor: its own version counter starts at 0.
        Ok(out)
    }

    /// Sets every element to `value` (converted to the dtype), in place, as `t.fill_(value)`.
    /// Bumps the version counter.
    ///
    /// # Errors
    /// [`Error::MemoryOverlap`] for a tensor with self-overlapping elements;
    /// [`Error::UnsupportedDevice`] off the host.
    pub fn fill_(&self, value: f64) -> Result<()> {
        self.fill_for("fill_", value)
    }

    /// [`Tensor::fill_`] with errors naming `op`.
    fn fill_for(&self, op: &'static str, value: f64) -> Result<()> {
        check_no_internal_overlap(op, self)?;
        if host::is_host_accessible(self) {
            self.fill_raw(op, value)?;
        } else {
            let host = Tensor::full(self.sizes(), value, self.options().device(Device::cpu()))?;
            crate::device_copy::copy_across(op, self, &host, host.layout().clone())?;
        }
        self.bump_version();
        Ok(())
    }

    /// Sets every element to zero, in place, as `t.zero_()`. Bumps the version counter.
    ///
    /// # Errors
    /// As [`Tensor::fill_`].
    pub fn zero_(&self) -> Result<()> {
        self.fill_for("zero_", 0.0)
    }
}
