//! Typed access to elements through bytemuck: [`Tensor::to_vec`], [`Tensor::item`], and checked,
//! locked slices of contiguous host tensors ([`Tensor::as_slice`], [`Tensor::as_slice_mut`]).
//!
//! The requested Rust type must be the tensor's element type exactly (`f32` for `Float`, `i64`
//! for `Long`, [`c10_core::Bool`] for `Bool`, ...); anything else is
//! [`Error::DtypeMismatch`], naming both dtypes and both Rust types. No conversion happens here:
//! use [`Tensor::to_dtype`] first.

use std::ops::{Deref, DerefMut};

use c10_core::Element;
use parking_lot::{RwLockReadGuard, RwLockWriteGuard};

use crate::error::{Error, Result};
use crate::host::{self, Access};
use crate::tensor::Tensor;

/// A contiguous host tensor's elements as `&[T]`, holding the storage's data lock for reading
/// (other readers proceed; in-place operations on the same storage wait until it drops).
///
/// Do not start an in-place operation on the same storage from the same thread while holding
/// one: it would wait for this guard forever.
pub struct SliceGuard<'a, T> {
    _guard: RwLockReadGuard<'a, ()>,
    data: &'a [T],
}

impl<'a, T> SliceGuard<'a, T> {
    pub(crate) fn new(guard: RwLockReadGuard<'a, ()>, data: &'a [T]) -> Self {
        SliceGuard {
            _guard: guard,
            data,
        }
    }
}

impl<T> Deref for SliceGuard<'_, T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        self.data
    }
}

/// A contiguous host tensor's elements as `&mut [T]`, holding the storage's data lock for
/// writing (every other access to the storage through aten waits until it drops). Taking it
/// bumps the version counter.
///
/// While it lives, do not touch the same storage through aten from the same thread (reading it,
/// another guard, an operation on a view): that access would wait for this guard forever.
pub struct SliceGuardMut<'a, T> {
    _guard: RwLockWriteGuard<'a, ()>,
    data: &'a mut [T],
}

impl<'a, T> SliceGuardMut<'a, T> {
    pub(crate) fn new(guard: RwLockWriteGuard<'a, ()>, data: &'a mut [T]) -> Self {
        SliceGuardMut {
            _guard: guard,
            data,
        }
    }
}

impl<T> Deref for SliceGuardMut<'_, T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        self.data
    }
}

impl<T> DerefMut for SliceGuardMut<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.data
    }
}

fn check_type<T: Element>(op: &'static str, t: &Tensor) -> Result<()> {
    if t.dtype() == T::SCALAR_TYPE {
        Ok(())
    } else {
        Err(Error::DtypeMismatch {
            op,
            expected: T::SCALAR_TYPE,
            actual: t.dtype(),
        })
    }
}

/// The elements of a host tensor in row-major order, typed `T` (already checked).
fn gather<T: Element>(op: &'static str, t: &Tensor) -> Result<Vec<T>> {
    let access = Access::lock(op, &[t], &[])?;
    let src = access.src::<T>(op, t)?;
    Ok(src.to_vec())
}

impl Tensor {
    /// The elements in row-major (logical) order, whatever the strides and device, as
    /// `t.flatten().tolist()`. A tensor on another device is copied to the CPU first.
    ///
    /// # Errors
    /// [`Error::DtypeMismatch`] unless `T` is the tensor's element type (`f32` for `Float`);
    /// device copy errors.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        check_type::<T>("to_vec", self)?;
        let host = if host::is_host_accessible(self) {
            self.clone()
        } else {
            self.to(c10_core::Device::cpu())?
        };
        gather::<T>("to_vec", &host)
    }

    /// The only element, as `t.item()`.
    ///
    /// # Errors
    /// [`Error::NotAScalar`] unless the tensor has exactly one element; those of
    /// [`Tensor::to_vec`].
    pub fn item<T: Element>(&self) -> Result<T> {
        check_type::<T>("item", self)?;
        if self.numel() != 1 {
            return Err(Error::NotAScalar {
                numel: self.numel(),
            });
        }
        Ok(self.to_vec::<T>()?[0])
    }

    /// The elements of a contiguous host tensor (CPU or host-backed sim) as a slice, holding the
    /// storage's data lock for reading while the guard lives.
    ///
    /// # Errors
    /// [`Error::DtypeMismatch`]; [`Error::NotContiguous`]; [`Error::UnsupportedDevice`] for a
    /// device whose bytes are not host memory.
    pub fn as_slice<T: Element>(&self) -> Result<SliceGuard<'_, T>> {
        host::slice::<T>("as_slice", self)
    }

    /// The elements of a contiguous host tensor as a mutable slice, holding the storage's data
    /// lock for writing while the guard lives; bumps the version counter (an in-place write).
    ///
    /// # Errors
    /// As [`Tensor::as_slice`].
    pub fn as_slice_mut<T: Element>(&self) -> Result<SliceGuardMut<'_, T>> {
        host::slice_mut::<T>("as_slice_mut", self)
    }
}
