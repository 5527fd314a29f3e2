//! CPU kernels, one file per family. They run on host memory: CPU tensors and tensors on a
//! host-backed simulated device (the same kernels on its bytes). Inputs may have any strides
//! (transposed, sliced, expanded); outputs are new contiguous tensors on the inputs' device, or
//! the tensor itself for the in-place variants (`add_`, ...), which bump its version counter.
//!
//! Binary operations require one dtype and one device (no implicit type promotion: convert with
//! [`crate::Tensor::to_dtype`]); shapes broadcast as in NumPy/PyTorch.

pub mod elementwise;
pub mod loss;
pub mod matmul;
pub mod reduce;
pub mod softmax;

use crate::device::normalize_device;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Checks that two operands share a dtype and a device.
pub(crate) fn check_same(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if normalize_device(a.device()) != normalize_device(b.device()) {
        return Err(Error::DeviceMismatch {
            op,
            lhs: a.device(),
            rhs: b.device(),
        });
    }
    if a.dtype() != b.dtype() {
        return Err(Error::DtypeMismatch {
            op,
            expected: a.dtype(),
            actual: b.dtype(),
        });
    }
    Ok(())
}
