//! CPU kernels, one file per family. They run on host memory: CPU tensors and tensors on a
//! host-backed simulated device (the same kernels on its bytes). Inputs may have any strides
//! (transposed, sliced, expanded); outputs are new tensors on the inputs' device, or the tensor
//! itself for the in-place variants (`add_`, ...), which bump its version counter.
//!
//! Operands must share a device. Elementwise operations promote dtypes as PyTorch does
//! ([`crate::promotion`]) and lay out their results as TensorIterator does (a transposed input
//! gives a transposed result); reductions, softmax, losses and matrix products give contiguous
//! results, as ATen's CPU kernels. Matrix products need one dtype (as ATen's "expected m1 and m2
//! to have the same dtype"). Shapes broadcast as in NumPy/PyTorch.

pub mod elementwise;
pub mod loss;
pub mod matmul;
pub mod reduce;
pub mod softmax;

use crate::device::normalize_device;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Checks that two operands share a device.
pub(crate) fn check_same_device(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if normalize_device(a.device()) != normalize_device(b.device()) {
        return Err(Error::DeviceMismatch {
            op,
            lhs: a.device(),
            rhs: b.device(),
        });
    }
    Ok(())
}

/// Checks that two operands share a dtype and a device.
pub(crate) fn check_same(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    check_same_device(op, a, b)?;
    if a.dtype() != b.dtype() {
        return Err(Error::DtypeMismatch {
            op,
            expected: a.dtype(),
            actual: b.dtype(),
        });
    }
    Ok(())
}
