//! Classification losses: `nll_loss` and `cross_entropy` with class-index targets, as
//! `torch.nn.functional.nll_loss` / `cross_entropy` (no class weights; `ignore_index` is
//! PyTorch's default, -100).
//!
//! Inputs are `[N, C]` (a batch) or `[C]` (one sample); targets are `Long` tensors `[N]` or `[]`.

use c10_core::ScalarType;

use crate::error::{Error, Result};
use crate::host::Access;
use crate::scalar::{Float, dispatch};
use crate::tensor::Tensor;

/// The target value that contributes nothing, as PyTorch's default `ignore_index`.
pub const IGNORE_INDEX: i64 = -100;

/// How per-sample losses are combined, as PyTorch's `reduction=` argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Reduction {
    /// One loss per sample (`'none'`): a `[N]` tensor (0 for ignored samples).
    None,
    /// The mean over the samples not ignored (`'mean'`, the default); NaN if all are ignored.
    #[default]
    Mean,
    /// The sum (`'sum'`).
    Sum,
}

fn nll<T: Float>(
    op: &'static str,
    log_probs: &[T],
    classes: usize,
    targets: &[i64],
    reduction: Reduction,
) -> Result<(Vec<T>, bool)> {
    let mut losses = Vec::with_capacity(targets.len());
    let (mut total, mut count) = (0f64, 0usize);
    for (row, &target) in log_probs.chunks_exact(classes.max(1)).zip(targets) {
        if target == IGNORE_INDEX {
            losses.push(T::ZERO);
            continue;
        }
        if target < 0 || target as usize >= classes {
            return Err(Error::InvalidArgument {
                op,
                message: format!("Target {target} is out of bounds."),
            });
        }
        let loss = -row[target as usize].widen();
        losses.push(T::narrow(loss));
        total += loss;
        count += 1;
    }
    Ok(match reduction {
        Reduction::None => (losses, false),
        Reduction::Sum => (vec![T::narrow(total)], true),
        Reduction::Mean => (vec![T::narrow(total / count as f64)], true),
    })
}

impl Tensor {
    /// The negative log likelihood loss of log-probabilities `self` (`[N, C]` or `[C]`) against
    /// class indices `target` (`Long`, `[N]` or `[]`), as `torch.nn.functional.nll_loss(input,
    /// target, reduction=...)` with `ignore_index=-100`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an input that is not 1-d or 2-d, or a target out of
    /// `[0, C)` ("Target 5 is out of bounds."); [`Error::DtypeMismatch`] for a non-`Long`
    /// target; [`Error::ShapeMismatch`] when the batch sizes differ; [`Error::DeviceMismatch`];
    /// [`Error::UnsupportedDtype`] for a non-floating input.
    pub fn nll_loss(&self, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
        self.nll_loss_for("nll_loss", target, reduction)
    }

    /// Checks the input's rank, the target's dtype, device and shape for `nll_loss` and
    /// `cross_entropy` (errors naming `op`); returns the target's expected shape.
    fn check_nll_args(&self, op: &'static str, target: &Tensor) -> Result<Vec<i64>> {
        if self.dim() != 1 && self.dim() != 2 {
            return Err(Error::InvalidArgument {
                op,
                message: format!("input tensor should be 1D or 2D, got {}D", self.dim()),
            });
        }
        if target.dtype() != ScalarType::Long {
            return Err(Error::DtypeMismatch {
                op,
                expected: ScalarType::Long,
                actual: target.dtype(),
            });
        }
        if crate::device::normalize_device(self.device())
            != crate::device::normalize_device(target.device())
        {
            return Err(Error::DeviceMismatch {
                op,
                lhs: self.device(),
                rhs: target.device(),
            });
        }
        let batched = self.dim() == 2;
        let expected_target: Vec<i64> = if batched {
            vec![self.sizes()[0]]
        } else {
            vec![]
        };
        if target.sizes() != expected_target {
            return Err(Error::ShapeMismatch {
                op,
                lhs: self.sizes().to_vec(),
                rhs: target.sizes().to_vec(),
                reason: format!(
                    "expected a target of shape {} for an input of shape {}",
                    crate::error::shape_str(&expected_target),
                    crate::error::shape_str(self.sizes())
                ),
            });
        }
        Ok(expected_target)
    }

    /// [`Tensor::nll_loss`] with errors naming `op` (the operation the user called).
    fn nll_loss_for(
        &self,
        op: &'static str,
        target: &Tensor,
        reduction: Reduction,
    ) -> Result<Tensor> {
        let expected_target = self.check_nll_args(op, target)?;
        let classes = *self.sizes().last().expect("1-d or 2-d") as usize;
        let access = Access::lock(op, &[self, target], &[])?;
        let targets = access.src::<i64>(op, target)?.to_vec();
        let out = dispatch!(float, op, self.dtype(), |T| {
            let log_probs = access.src::<T>(op, self)?.to_vec();
            let (values, reduced) = nll::<T>(op, &log_probs, classes, &targets, reduction)?;
            let shape: &[i64] = if reduced { &[] } else { &expected_target };
            Tensor::from_slice(&values, shape)
        })?;
        drop(access);
        out.to(self.device())
    }

    /// The cross-entropy loss of logits `self` (`[N, C]` or `[C]`) against class indices,
    /// `nll_loss(log_softmax(self, class dim), target)`, as
    /// `torch.nn.functional.cross_entropy(input, target, reduction=...)`.
    ///
    /// # Errors
    /// As [`Tensor::nll_loss`], naming `cross_entropy`.
    pub fn cross_entropy(&self, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
        let op = "cross_entropy";
        self.check_nll_args(op, target)?;
        self.log_softmax_for(op, -1)?
            .nll_loss_for(op, target, reduction)
    }
}
