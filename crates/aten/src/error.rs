//! The crate's one error type, [`Error`], and its [`Result`] alias.
//!
//! Variants are structured (they carry the offending shapes, dtypes, dims and devices) so callers
//! can match on them and tests can assert on them. The `Display` text follows the wording of the
//! matching ATen `TORCH_CHECK` message where one exists, and always names both sides of a mismatch.

use c10_core::{Device, ScalarType};

/// Formats a shape as PyTorch prints `list(t.shape)`: `[2, 3]`.
pub(crate) fn shape_str(shape: &[i64]) -> String {
    let items: Vec<String> = shape.iter().map(i64::to_string).collect();
    format!("[{}]", items.join(", "))
}

/// `[-n, n - 1]` for a tensor of `ndim` dimensions (a 0-d tensor accepts dims as if it had one).
fn dim_bounds(ndim: usize) -> String {
    let n = ndim.max(1) as i64;
    format!("[{}, {}]", -n, n - 1)
}

/// The Rust element type that stands for a scalar type (`f32` for `Float`), for messages.
pub(crate) fn rust_type_name(dtype: ScalarType) -> &'static str {
    match dtype {
        ScalarType::Byte => "u8",
        ScalarType::Char => "i8",
        ScalarType::Short => "i16",
        ScalarType::Int => "i32",
        ScalarType::Long => "i64",
        ScalarType::Half => "half::f16",
        ScalarType::Float => "f32",
        ScalarType::Double => "f64",
        ScalarType::ComplexFloat => "(complex64)",
        ScalarType::ComplexDouble => "(complex128)",
        ScalarType::Bool => "c10_core::Bool",
        ScalarType::BFloat16 => "half::bf16",
    }
}

/// Errors raised by `aten`, as ATen raises `c10::Error` from `TORCH_CHECK`.
///
/// The enum is `#[non_exhaustive]`: new variants may be added without a breaking change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Two shapes cannot be broadcast together, as ATen's `infer_size`
    /// ("The size of tensor a (3) must match the size of tensor b (4) at non-singleton
    /// dimension 1").
    #[error(
        "{op}: shapes {} and {} cannot be broadcast: the size of tensor a ({lhs_size}) must match \
         the size of tensor b ({rhs_size}) at non-singleton dimension {dim}",
        shape_str(lhs),
        shape_str(rhs)
    )]
    BroadcastMismatch {
        /// The operation (`"add"`).
        op: &'static str,
        /// The first shape.
        lhs: Vec<i64>,
        /// The second shape.
        rhs: Vec<i64>,
        /// The dimension (counted from the left of the broadcast shape) that disagrees.
        dim: usize,
        /// The first shape's size there.
        lhs_size: i64,
        /// The second shape's size there.
        rhs_size: i64,
    },

    /// Two shapes that must agree do not, for a reason other than broadcasting (an in-place
    /// output, a matrix product, a loss target).
    #[error(
        "{op}: shape mismatch: {} vs {}: {reason}",
        shape_str(lhs),
        shape_str(rhs)
    )]
    ShapeMismatch {
        /// The operation (`"mm"`, `"add_"`).
        op: &'static str,
        /// The first shape (the output or left operand).
        lhs: Vec<i64>,
        /// The second shape.
        rhs: Vec<i64>,
        /// What was expected, in ATen's words (`mat1 and mat2 shapes cannot be multiplied
        /// (2x3 and 4x5)`).
        reason: String,
    },

    /// A shape with a `-1` or a wrong element count, as ATen's `infer_size`
    /// ("shape '[2, 3]' is invalid for input of size 5").
    #[error("{op}: shape '{}' is invalid for input of size {numel}{}", shape_str(shape),
            reason.map(|r| format!(": {r}")).unwrap_or_default())]
    InvalidShape {
        /// The operation (`"view"`, `"reshape"`).
        op: &'static str,
        /// The requested shape.
        shape: Vec<i64>,
        /// The number of elements of the input.
        numel: usize,
        /// A more precise reason, when there is one ("only one dimension can be inferred").
        reason: Option<&'static str>,
    },

    /// A negative size, as ATen's `check_size_nonnegative`
    /// ("Trying to create tensor with negative dimension -1: [-1, 2]").
    #[error(
        "trying to create tensor with negative dimension {size}: {}",
        shape_str(shape)
    )]
    NegativeSize {
        /// The negative size.
        size: i64,
        /// The whole shape.
        shape: Vec<i64>,
    },

    /// `view` on a layout that cannot be viewed with the new shape, as ATen's `view`.
    #[error(
        "view: view size is not compatible with input tensor's size and stride (at least one dimension \
         spans across two contiguous subspaces): sizes {}, strides {}, requested {}. \
         Use .reshape(...) instead.",
        shape_str(sizes),
        shape_str(strides),
        shape_str(requested)
    )]
    ViewIncompatible {
        /// The input's sizes.
        sizes: Vec<i64>,
        /// The input's strides (in elements).
        strides: Vec<i64>,
        /// The requested shape.
        requested: Vec<i64>,
    },

    /// Two dtypes that must agree do not, as ATen's "expected scalar type Float but found
    /// Double". Typed access (`to_vec::<T>()`) names the Rust type too.
    #[error("{op}: expected scalar type {expected} ({}) but found {actual} ({})",
            rust_type_name(*expected), rust_type_name(*actual))]
    DtypeMismatch {
        /// The operation (`"add"`, `"to_vec"`).
        op: &'static str,
        /// The dtype that was required (the first operand's, or the requested Rust type's).
        expected: ScalarType,
        /// The dtype that was found.
        actual: ScalarType,
    },

    /// An operation without a kernel for this dtype, as ATen's
    /// "\"exp_vml_cpu\" not implemented for 'Long'".
    #[error("\"{op}\" not implemented for '{dtype}'")]
    UnsupportedDtype {
        /// The operation.
        op: &'static str,
        /// The dtype that has no kernel.
        dtype: ScalarType,
    },

    /// A scalar that cannot be represented in a dtype. aten's own operations no longer return
    /// it: a floating scalar now promotes an integer tensor to `Float`, and writing that into an
    /// integer tensor in place is [`Error::ResultTypeCast`].
    #[error("{op}: the scalar {value} can't be cast to the tensor's dtype {dtype}")]
    ScalarCast {
        /// The operation.
        op: &'static str,
        /// The scalar given.
        value: f64,
        /// The tensor's dtype.
        dtype: ScalarType,
    },

    /// An in-place operation whose promoted result dtype cannot be written into the output's
    /// dtype (see [`crate::promotion::can_cast`]), as TensorIterator's "result type Float can't
    /// be cast to the desired output type Long".
    #[error("{op}: result type {result} can't be cast to the desired output type {output}")]
    ResultTypeCast {
        /// The operation.
        op: &'static str,
        /// The dtype the operation computes.
        result: ScalarType,
        /// The output's dtype.
        output: ScalarType,
    },

    /// A dimension outside `[-ndim, ndim - 1]`, as c10's `maybe_wrap_dim`
    /// ("Dimension out of range (expected to be in range of [-2, 1], but got 2)").
    #[error(
        "{op}: dimension out of range (expected to be in range of {}, but got {dim})",
        dim_bounds(*ndim)
    )]
    DimOutOfRange {
        /// The operation.
        op: &'static str,
        /// The dimension given.
        dim: i64,
        /// The tensor's number of dimensions.
        ndim: usize,
    },

    /// An index outside a dimension, as ATen's `select`
    /// ("index 5 is out of bounds for dimension 0 with size 3").
    #[error("{op}: index {index} is out of bounds for dimension {dim} with size {size}")]
    IndexOutOfRange {
        /// The operation.
        op: &'static str,
        /// The index given.
        index: i64,
        /// The (wrapped) dimension.
        dim: usize,
        /// The size of that dimension.
        size: i64,
    },

    /// Tensors on different devices, as ATen's "Expected all tensors to be on the same device,
    /// but found at least two devices, cpu and sim:0!".
    #[error(
        "{op}: expected all tensors to be on the same device, but found at least two devices, \
         {lhs} and {rhs}!"
    )]
    DeviceMismatch {
        /// The operation.
        op: &'static str,
        /// The first tensor's device.
        lhs: Device,
        /// The other tensor's device.
        rhs: Device,
    },

    /// An operation whose bytes must be read on the host, on a device whose bytes cannot be
    /// (CUDA, meta, an address-only simulated device).
    #[error("{op}: not supported on device {device}: {reason}")]
    UnsupportedDevice {
        /// The operation.
        op: &'static str,
        /// The device.
        device: Device,
        /// Why, and what to do instead.
        reason: &'static str,
    },

    /// CUDA was asked for but no driver or device is usable; the text is the probe's finding.
    #[error("CUDA is not available: {reason}")]
    CudaUnavailable {
        /// What the probe found (`no CUDA driver: libcuda.so could not be loaded ...`).
        reason: String,
    },

    /// A host buffer whose byte size differs from the tensor's, as MXNet's
    /// `SyncCopyFromCPU`/`SyncCopyToCPU` "Memory size do not match".
    #[error(
        "{op}: memory size do not match: the tensor holds {expected} bytes, the buffer {actual} \
         bytes"
    )]
    MemorySizeMismatch {
        /// The operation.
        op: &'static str,
        /// The tensor's size in bytes.
        expected: usize,
        /// The buffer's size in bytes.
        actual: usize,
    },

    /// An operation that needs a contiguous tensor got a strided one.
    #[error(
        "{op}: expected a contiguous tensor, got sizes {} and strides {}; call .contiguous() first",
        shape_str(sizes),
        shape_str(strides)
    )]
    NotContiguous {
        /// The operation.
        op: &'static str,
        /// The tensor's sizes.
        sizes: Vec<i64>,
        /// The tensor's strides.
        strides: Vec<i64>,
    },

    /// A write whose target has elements that share memory, or whose input partially overlaps
    /// it, as ATen's `assert_no_internal_overlap` / `assert_no_partial_overlap`.
    #[error(
        "{op}: unsupported operation: {what}. Please clone() the tensor before performing the \
         operation."
    )]
    MemoryOverlap {
        /// The operation.
        op: &'static str,
        /// Which overlap: "more than one element of the written-to tensor refers to a single
        /// memory location" or "some elements of the input tensor and the written-to tensor
        /// refer to a single memory location".
        what: &'static str,
    },

    /// Sizes, strides and offset that reach outside the storage, as ATen's `setStorage` check.
    #[error(
        "{op}: sizes {}, strides {}, storage offset {offset}, and itemsize {itemsize} requiring a \
         storage size of {required} are out of bounds for storage of size {available}",
        shape_str(sizes),
        shape_str(strides)
    )]
    OutOfStorageBounds {
        /// The operation.
        op: &'static str,
        /// The sizes.
        sizes: Vec<i64>,
        /// The strides, in elements.
        strides: Vec<i64>,
        /// The storage offset, in elements.
        offset: i64,
        /// Bytes per element.
        itemsize: usize,
        /// Bytes the layout needs.
        required: usize,
        /// Bytes the storage has.
        available: usize,
    },

    /// `item()` on a tensor that does not hold exactly one element, as ATen's "a Tensor with 6
    /// elements cannot be converted to Scalar".
    #[error("a Tensor with {numel} elements cannot be converted to Scalar")]
    NotAScalar {
        /// The number of elements.
        numel: usize,
    },

    /// Any other invalid argument, with ATen's message.
    #[error("{op}: {message}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        message: String,
    },

    /// An error from c10-core (allocation, registry, storage).
    #[error(transparent)]
    Core(#[from] c10_core::Error),

    /// An error from the caching allocator (installing it, a bad device index).
    #[error(transparent)]
    Cuda(#[from] c10_cuda::Error),

    /// A device call failed (a copy to or from device memory).
    #[error("{op}: {source}")]
    Device {
        /// The operation.
        op: &'static str,
        /// The device's error.
        source: c10_cuda::device::DeviceError,
    },

    /// Sharing a tensor with another process or opening one failed: a bad or stale handle, or
    /// memory that cannot be shared ([`crate::ipc`]).
    #[error("{op}: {source}")]
    Ipc {
        /// The operation.
        op: &'static str,
        /// What went wrong.
        source: c10_cuda_ipc::IpcError,
    },
}

/// `std::result::Result` with this crate's [`enum@Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
