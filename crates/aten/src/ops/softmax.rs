//! `softmax` and `log_softmax` along one dimension, as ATen's `_softmax` / `_log_softmax`:
//! numerically stable (the row maximum is subtracted first), accumulated in `f64`, `f32` and
//! `f64` only.

use crate::error::Result;
use crate::host::Access;
use crate::layout::wrap_dim;
use crate::scalar::{Float, dispatch};
use crate::tensor::Tensor;

/// Applies `f(row_in, row_out)` to every line along `dim` and returns the result in `t`'s shape
/// (contiguous) on `t`'s device.
fn along_dim<T: Float>(
    op: &'static str,
    t: &Tensor,
    dim: i64,
    f: impl Fn(&[T], &mut [T]),
) -> Result<Tensor> {
    let n = t.dim();
    let d = wrap_dim(op, dim, n)?;
    // Move `dim` last so each line is a contiguous run of the gathered values.
    let mut order: Vec<i64> = (0..n as i64).filter(|&i| i != d as i64).collect();
    if n > 0 {
        order.push(d as i64);
    }
    let moved = t.permute(&order)?;
    let values = {
        let access = Access::lock(op, &[&moved], &[])?;
        access.src::<T>(op, &moved)?.to_vec()
    };
    let len = if n == 0 { 1 } else { t.sizes()[d] as usize };
    let mut out = vec![T::ZERO; values.len()];
    if len > 0 {
        for (row, dst) in values.chunks_exact(len).zip(out.chunks_exact_mut(len)) {
            f(row, dst);
        }
    }
    let mut inverse = vec![0i64; order.len()];
    for (i, &o) in order.iter().enumerate() {
        inverse[o as usize] = i as i64;
    }
    Tensor::from_slice(&out, moved.sizes())?
        .permute(&inverse)?
        .contiguous()?
        .to(t.device())
}

/// The row maximum (NaN if any element is NaN, so the result is NaN as in ATen).
fn row_max<T: Float>(row: &[T]) -> f64 {
    row.iter().fold(f64::NEG_INFINITY, |m, &v| {
        let v = v.widen();
        if m.is_nan() || v.is_nan() {
            f64::NAN
        } else {
            m.max(v)
        }
    })
}

/// The value subtracted before `exp`: the row maximum, except 0 for a row of `-inf` only (whose
/// maximum would give `-inf - -inf = NaN`; with 0 the sum is 0 and the result NaN all the same,
/// as ATen's). A `+inf` maximum is subtracted, so a row holding `+inf` is NaN throughout, as
/// in ATen.
fn shift(max: f64) -> f64 {
    if max == f64::NEG_INFINITY { 0.0 } else { max }
}

fn softmax_row<T: Float>(row: &[T], out: &mut [T]) {
    let shift = shift(row_max(row));
    let sum: f64 = row.iter().map(|&v| (v.widen() - shift).exp()).sum();
    for (o, &v) in out.iter_mut().zip(row) {
        *o = T::narrow((v.widen() - shift).exp() / sum);
    }
}

fn log_softmax_row<T: Float>(row: &[T], out: &mut [T]) {
    let shift = shift(row_max(row));
    let log_sum = row
        .iter()
        .map(|&v| (v.widen() - shift).exp())
        .sum::<f64>()
        .ln();
    for (o, &v) in out.iter_mut().zip(row) {
        *o = T::narrow(v.widen() - shift - log_sum);
    }
}

impl Tensor {
    /// `exp(x_i) / Σ_j exp(x_j)` along `dim`, as `torch.softmax(t, dim)` (floating dtypes).
    ///
    /// # Errors
    /// [`crate::Error::DimOutOfRange`]; [`crate::Error::UnsupportedDtype`] for non-floating
    /// dtypes; [`crate::Error::UnsupportedDevice`].
    pub fn softmax(&self, dim: i64) -> Result<Tensor> {
        dispatch!(float, "softmax", self.dtype(), |T| {
            along_dim::<T>("softmax", self, dim, softmax_row::<T>)
        })
    }

    /// `x_i - log Σ_j exp(x_j)` along `dim`, as `torch.log_softmax(t, dim)` (floating dtypes).
    ///
    /// # Errors
    /// As [`Tensor::softmax`].
    pub fn log_softmax(&self, dim: i64) -> Result<Tensor> {
        self.log_softmax_for("log_softmax", dim)
    }

    /// [`Tensor::log_softmax`] with errors naming `op` (the operation the user called).
    pub(crate) fn log_softmax_for(&self, op: &'static str, dim: i64) -> Result<Tensor> {
        dispatch!(float, op, self.dtype(), |T| {
            along_dim::<T>(op, self, dim, log_softmax_row::<T>)
        })
    }
}
