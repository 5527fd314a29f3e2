//! Elementwise operations with broadcasting and PyTorch's type promotion: `add`, `sub`, `mul`,
//! `div` (true division, or rounded with [`RoundingMode`]), `floor_divide`, `pow`, `neg`, `exp`,
//! `log`, `sqrt`, `relu`, `sigmoid`, `tanh`, `gelu`, `threshold_backward`, their scalar forms and
//! the in-place variants (`add_`, `sub_`, `mul_`, `div_`, `relu_`, ...), as ATen's
//! `TensorIterator` binary and unary kernels.
//!
//! # Dtypes
//!
//! The operands' dtypes combine by [`crate::promotion::result_type`] (`int64 + 2.5` is `Float`,
//! `float32 + float64` is `Double`, `int32 + 5` stays `Int`); operands of another dtype are
//! converted first, as TensorIterator's `common_dtype`. Then, as in ATen:
//!
//! * `div` (true division), `exp`, `log`, `sqrt`, `sigmoid` and `tanh` compute integer and Bool
//!   operands in the default dtype, `Float` (`-5 / -2` is 2.5);
//! * `div` with [`RoundingMode::Trunc`] / [`RoundingMode::Floor`] and `floor_divide` keep integer
//!   types (an integer division by zero is an error, "ZeroDivisionError"); `pow` keeps them too
//!   (a negative integer scalar exponent of an integer base is an error);
//! * integer arithmetic wraps, as C++ (and so ATen) on CPU;
//! * Bool: `add` is `or`, `mul` is `and`; `sub`, `neg`, `relu`, `pow`, `gelu`, the rounded
//!   divisions and `threshold_backward` refuse it, with ATen's messages;
//! * Half and BFloat16 operands (after promotion) have no kernels ([`Error::UnsupportedDtype`]):
//!   a documented difference from ATen, which computes them through `float`.
//!
//! An in-place operation computes in the promoted dtype and writes into the tensor's own dtype,
//! which must be able to hold it ([`crate::promotion::can_cast`]: `int_tensor.add_(0.5)` is
//! [`Error::ResultTypeCast`], `float_tensor.add_(double_tensor)` rounds into `Float`).
//!
//! # Layout of results
//!
//! A new output gets TensorIterator's strides ([`crate::layout::elementwise_strides`]): it
//! follows the inputs' memory order, so a transposed input gives a transposed result. Kernels
//! visit elements in the output's memory order, merging dimensions contiguous in every operand.

use c10_core::{Bool, ScalarType};

use crate::copy::{check_no_internal_overlap, check_no_partial_overlap, copy_kernel};
use crate::error::{Error, Result};
use crate::host::{Access, Dst, Src, map1, map2};
use crate::layout::{self, Layout};
use crate::ops::check_same_device;
use crate::promotion::{Operand as PromoteOperand, Scalar, can_cast, promote_integer_to_float};
use crate::scalar::{Elem, Float, Num, dispatch};
use crate::tensor::Tensor;

/// How [`Tensor::div_rounding`] rounds the quotient, as `torch.div`'s `rounding_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoundingMode {
    /// Toward zero (`rounding_mode="trunc"`, C's integer division).
    Trunc,
    /// Toward negative infinity (`rounding_mode="floor"`, Python's `//`).
    Floor,
}

/// The binary operations.
#[derive(Clone, Copy, Debug)]
enum Binary {
    Add,
    Sub,
    Mul,
    /// True division.
    Div,
    DivTrunc,
    DivFloor,
    Pow,
    /// `b <= threshold ? 0 : a` (a = grad_output, b = the forward input).
    ThresholdBackward(f64),
}

/// The unary operations.
#[derive(Clone, Copy, Debug)]
enum Unary {
    Neg,
    Relu,
    Exp,
    Log,
    Sqrt,
    Sigmoid,
    Tanh,
    Gelu,
}

impl Unary {
    /// Whether ATen computes integer inputs of this op in the default float dtype
    /// (`unary_float_op`).
    fn promotes_integers(self) -> bool {
        matches!(
            self,
            Unary::Exp | Unary::Log | Unary::Sqrt | Unary::Sigmoid | Unary::Tanh
        )
    }
}

/// The right operand of a binary operation.
#[derive(Clone, Copy)]
enum Rhs<'a> {
    Tensor(&'a Tensor),
    Scalar(Scalar),
}

impl Rhs<'_> {
    /// The dtype the operand has (a scalar's promotion dtype).
    fn dtype(self) -> ScalarType {
        match self {
            Rhs::Tensor(t) => t.dtype(),
            Rhs::Scalar(s) => s.promotion_dtype(),
        }
    }
}

/// The right operand, typed and locked.
enum Operand<'s, T> {
    Tensor(Src<'s, T>),
    Scalar(T),
}

/// Applies `|x, y| expr` elementwise with a tensor or a scalar as `y`.
macro_rules! apply2 {
    ($out:expr, $a:expr, $b:expr, |$x:ident, $y:ident| $e:expr) => {
        match $b {
            Operand::Tensor(b) => map2($out, $a, b, |$x, $y| $e),
            Operand::Scalar(s) => {
                let $y = *s;
                map1($out, $a, |$x| $e)
            }
        }
    };
}

/// The typed kernels of the operations defined for every numeric type.
fn binary_num<T: Num>(op: Binary, out: &Dst<'_, T>, a: &Src<'_, T>, b: &Operand<'_, T>) {
    match op {
        Binary::Add => apply2!(out, a, b, |x, y| x.add(y)),
        Binary::Sub => apply2!(out, a, b, |x, y| x.sub(y)),
        Binary::Mul => apply2!(out, a, b, |x, y| x.mul(y)),
        Binary::DivTrunc => apply2!(out, a, b, |x, y| x.div_trunc(y)),
        Binary::DivFloor => apply2!(out, a, b, |x, y| x.div_floor(y)),
        Binary::Pow => apply2!(out, a, b, |x, y| x.pow(y)),
        Binary::ThresholdBackward(threshold) => {
            let threshold = T::from_f64(threshold);
            apply2!(out, a, b, |g, x| if x <= threshold { T::ZERO } else { g })
        }
        Binary::Div => unreachable!("true division computes in a floating dtype"),
    }
}

/// The typed kernels of the floating point operations.
fn binary_float<T: Float>(op: Binary, out: &Dst<'_, T>, a: &Src<'_, T>, b: &Operand<'_, T>) {
    match op {
        Binary::Div => apply2!(out, a, b, |x, y| x.div(y)),
        other => binary_num(other, out, a, b),
    }
}

/// The Bool kernels: `add` is `or`, `mul` is `and` (C++'s `bool` arithmetic converted back).
fn binary_bool(op: Binary, out: &Dst<'_, Bool>, a: &Src<'_, Bool>, b: &Operand<'_, Bool>) {
    match op {
        Binary::Add => apply2!(out, a, b, |x, y| Bool::from(x.get() || y.get())),
        Binary::Mul => apply2!(out, a, b, |x, y| Bool::from(x.get() && y.get())),
        other => unreachable!("{other:?} is refused for Bool before dispatch"),
    }
}

fn unary_num<T: Num>(op: Unary, out: &Dst<'_, T>, a: &Src<'_, T>) {
    match op {
        Unary::Neg => map1(out, a, |x| x.neg()),
        // ATen's relu is `clamp_min(self, 0)` (aten/src/ATen/native/Activation.cpp, `relu`),
        // whose CPU kernel is `std::max(a, min)`, i.e. `a < min ? min : a`
        // (aten/src/ATen/native/cpu/TensorCompareKernel.cpp, `clamp_min_scalar_kernel_impl`;
        // the vectorized `clamp_min` is `_mm256_max_ps(min, a)`, which also returns `a` for
        // two zeros and for NaN): NaN and -0.0 come out unchanged.
        Unary::Relu => map1(out, a, |x| if x < T::ZERO { T::ZERO } else { x }),
        _ => unreachable!("floating point operations dispatch to unary_float"),
    }
}

fn unary_float<T: Float>(op: Unary, out: &Dst<'_, T>, a: &Src<'_, T>) {
    let half = T::from_f64(0.5);
    let sqrt1_2 = T::from_f64(std::f64::consts::FRAC_1_SQRT_2);
    match op {
        Unary::Exp => map1(out, a, |x| x.exp()),
        Unary::Log => map1(out, a, |x| x.ln()),
        Unary::Sqrt => map1(out, a, |x| x.sqrt()),
        Unary::Sigmoid => map1(out, a, |x| T::ONE.div(T::ONE.add(x.neg().exp()))),
        Unary::Tanh => map1(out, a, |x| x.tanh()),
        // ATen's exact GELU (approximate='none'): x * 0.5 * (1 + erf(x / sqrt(2))).
        Unary::Gelu => map1(out, a, |x| {
            x.mul(half).mul(T::ONE.add(x.mul(sqrt1_2).erf()))
        }),
        other => unary_num(other, out, a),
    }
}

/// `base ^ exponent` for a floating base and a scalar exponent, as ATen's CPU
/// `pow_tensor_scalar_kernel` (aten/src/ATen/native/cpu/PowKernel.cpp at pytorch 27a4844d7fb,
/// lines 95-108, and `pow_tensor_scalar_optimized_kernel`, lines 53-87): an exponent equal to
/// 0.5, -0.5 or -1 (`Scalar::equal`: a float or an int scalar, never a bool) runs the `sqrt`,
/// `rsqrt` (`1 / sqrt(x)`) or `reciprocal` (`1 / x`) kernel, so `pow(-inf, 0.5)` is NaN and
/// `pow(-0.0, 0.5)` is -0.0 (C's `pow` gives +inf and +0.0), `pow(-0.0, -0.5)` is -inf; then 2,
/// 3 and -2 are `x * x`, `x * x * x` and `1 / (x * x)`, and any other exponent is `std::pow`
/// with the exponent as `double` (a `float` base widened to `double`, the result rounded back,
/// as the scalar loop does; the vectorized loop's Sleef `pow` is within 1 ulp of it).
fn pow_scalar_float<T: Float>(out: &Dst<'_, T>, a: &Src<'_, T>, exponent: Scalar) {
    let e = exponent.to_f64();
    let equal = |v: f64| !matches!(exponent, Scalar::Bool(_)) && e == v;
    if equal(0.5) {
        map1(out, a, |x| x.sqrt());
    } else if equal(-0.5) {
        map1(out, a, |x| T::ONE.div(x.sqrt()));
    } else if equal(-1.0) {
        map1(out, a, |x| T::ONE.div(x));
    } else if e == 2.0 {
        map1(out, a, |x| x.mul(x));
    } else if e == 3.0 {
        map1(out, a, |x| x.mul(x).mul(x));
    } else if e == -2.0 {
        map1(out, a, |x| T::ONE.div(x.mul(x)));
    } else {
        map1(out, a, |x| T::narrow(x.widen().powf(e)));
    }
}

/// `value` converted to the kernel's element type, as ATen converts a wrapped number to the
/// common dtype (integers exactly, wrapping when narrowing).
fn scalar_as<T: Elem>(value: Scalar) -> T {
    match value {
        Scalar::Bool(b) => T::from_i64(i64::from(b)),
        Scalar::Int(i) => T::from_i64(i),
        Scalar::Float(f) => T::from_f64(f),
    }
}

/// ATen's refusals of an operation for its operands' dtypes (`lhs`, `rhs`) and the dtype it
/// computes in (`dtype`), checked before anything runs.
fn check_binary_dtypes(
    op_name: &'static str,
    op: Binary,
    lhs: ScalarType,
    rhs: Rhs<'_>,
    dtype: ScalarType,
) -> Result<()> {
    let unsupported = Err(Error::UnsupportedDtype { op: op_name, dtype });
    if matches!((op, rhs), (Binary::Pow, Rhs::Scalar(e)) if trivial_exponent(e).is_some()) {
        // ATen fills or copies without a kernel, for every dtype.
        return Ok(());
    }
    if dtype.is_complex() || matches!(dtype, ScalarType::Half | ScalarType::BFloat16) {
        return unsupported;
    }
    match op {
        Binary::Sub if lhs == ScalarType::Bool && rhs.dtype() == ScalarType::Bool => {
            Err(Error::InvalidArgument {
                op: op_name,
                message: "Subtraction, the `-` operator, with two bool tensors is not supported. \
                          Use the `^` or `logical_xor()` operator instead."
                    .into(),
            })
        }
        Binary::Sub if lhs == ScalarType::Bool || rhs.dtype() == ScalarType::Bool => {
            Err(Error::InvalidArgument {
                op: op_name,
                message: "Subtraction, the `-` operator, with a bool tensor is not supported. If \
                          you are trying to invert a mask, use the `~` or `logical_not()` \
                          operator instead."
                    .into(),
            })
        }
        Binary::Pow
            if lhs.is_integral(true)
                && matches!(rhs, Rhs::Scalar(s) if s.is_negative_integer()) =>
        {
            Err(Error::InvalidArgument {
                op: op_name,
                message: "Integers to negative integer powers are not allowed.".into(),
            })
        }
        Binary::Add | Binary::Mul | Binary::Div => Ok(()),
        _ if dtype == ScalarType::Bool => unsupported,
        _ => Ok(()),
    }
}

/// `Some(0)` or `Some(1)` for an exponent of 0 or 1 (any kind), whose powers ATen's `pow`
/// computes without a kernel (`fill_(1)`, `copy_`).
fn trivial_exponent(e: Scalar) -> Option<u8> {
    let v = e.to_f64();
    if v == 0.0 {
        Some(0)
    } else if v == 1.0 {
        Some(1)
    } else {
        None
    }
}

/// `base ^ 0` (ones) and `base ^ 1` (a copy), as ATen's `pow_Tensor_Scalar_out`, which fills
/// or copies without a kernel: the output in `converted`'s dtype (the promoted one) and laid out
/// as a unary op over it; `None` for any other exponent.
fn trivial_pow(
    op: &'static str,
    base: &Tensor,
    converted: &Tensor,
    exponent: Scalar,
    in_place: bool,
) -> Result<Option<Tensor>> {
    let Some(e) = trivial_exponent(exponent) else {
        return Ok(None);
    };
    let out = if in_place {
        base.clone()
    } else {
        new_output(
            op,
            converted.sizes(),
            &[(converted.sizes(), converted.strides())],
            converted.dtype(),
            converted,
        )?
    };
    if e == 0 {
        out.fill_raw(op, 1.0)?;
    } else if !in_place {
        copy_kernel(op, &out, converted, converted.layout().clone())?;
    }
    if in_place {
        base.bump_version();
    }
    Ok(Some(out))
}

/// The dtype a binary operation computes in: the promoted dtype of its operands, lifted to the
/// default float dtype for true division.
fn compute_dtype(op: Binary, a: &Tensor, rhs: Rhs<'_>) -> ScalarType {
    let common = match rhs {
        Rhs::Tensor(b) => a.result_type(b),
        Rhs::Scalar(s) => crate::promotion::result_type(&[a.into(), PromoteOperand::Scalar(s)]),
    };
    match op {
        Binary::Div => promote_integer_to_float(common),
        _ => common,
    }
}

/// Refuses to write a result of dtype `result` into `out`, as TensorIterator's
/// "result type Float can't be cast to the desired output type Long".
fn check_cast(op: &'static str, result: ScalarType, out: &Tensor) -> Result<()> {
    if can_cast(result, out.dtype()) {
        Ok(())
    } else {
        Err(Error::ResultTypeCast {
            op,
            result,
            output: out.dtype(),
        })
    }
}

/// `t` in `dtype`: itself, or a converted copy in its own layout.
fn as_dtype(t: &Tensor, dtype: ScalarType) -> Result<Tensor> {
    if t.dtype() == dtype {
        Ok(t.clone())
    } else {
        t.to_dtype(dtype)
    }
}

/// A new output of `shape` in `dtype` on `like`'s device, with TensorIterator's strides for
/// `inputs`.
fn new_output(
    op: &'static str,
    shape: &[i64],
    inputs: &[(&[i64], &[i64])],
    dtype: ScalarType,
    like: &Tensor,
) -> Result<Tensor> {
    match layout::elementwise_strides_unless_contiguous(shape, inputs) {
        None => Tensor::empty_uninit(shape, dtype, like.device()),
        Some(strides) => Tensor::empty_strided_uninit(op, shape, &strides, dtype, like.device()),
    }
}

/// Refuses an integer division by zero, as ATen's "ZeroDivisionError" (checked before any
/// element is written).
fn check_no_zero_divisor(op: &'static str, divisor: &Operand<'_, impl Num>) -> Result<()> {
    let found = match divisor {
        Operand::Scalar(v) => v.is_zero(),
        Operand::Tensor(src) => {
            let mut found = false;
            src.for_each(|v| found |= v.is_zero());
            found
        }
    };
    if found {
        Err(Error::InvalidArgument {
            op,
            message: "ZeroDivisionError".into(),
        })
    } else {
        Ok(())
    }
}

/// Runs a binary operation: into a new broadcast tensor, or into `a` in place.
fn binary(
    op_name: &'static str,
    op: Binary,
    a: &Tensor,
    rhs: Rhs<'_>,
    in_place: bool,
) -> Result<Tensor> {
    if let Rhs::Tensor(b) = rhs {
        check_same_device(op_name, a, b)?;
    }
    let dtype = compute_dtype(op, a, rhs);
    check_binary_dtypes(op_name, op, a.dtype(), rhs, dtype)?;
    let out_shape = match rhs {
        Rhs::Tensor(b) => layout::broadcast_shapes(op_name, a.sizes(), b.sizes())?,
        Rhs::Scalar(_) => a.sizes().to_vec(),
    };
    if in_place {
        check_cast(op_name, dtype, a)?;
        if out_shape != a.sizes() {
            return Err(Error::ShapeMismatch {
                op: op_name,
                lhs: a.sizes().to_vec(),
                rhs: match rhs {
                    Rhs::Tensor(b) => b.sizes().to_vec(),
                    Rhs::Scalar(_) => Vec::new(),
                },
                reason: format!(
                    "output with shape {} doesn't match the broadcast shape {}",
                    crate::error::shape_str(a.sizes()),
                    crate::error::shape_str(&out_shape)
                ),
            });
        }
        check_no_internal_overlap(op_name, a)?;
        if let Rhs::Tensor(b) = rhs {
            check_no_partial_overlap(op_name, a, b)?;
        }
        if a.dtype() != dtype {
            // Compute in the promoted dtype, then convert into `a` (ATen casts the result on
            // the way out).
            let result = binary(op_name, op, a, rhs, false)?;
            copy_kernel(op_name, a, &result, result.layout().clone())?;
            a.bump_version();
            return Ok(a.clone());
        }
    }
    // Operands of another dtype are converted first (TensorIterator's `compute_types` on CPU),
    // keeping their layout, and the output's layout follows the converted operands.
    let lhs = as_dtype(a, dtype)?;
    let rhs_tensor = match rhs {
        Rhs::Tensor(b) => Some(as_dtype(b, dtype)?),
        Rhs::Scalar(_) => None,
    };
    if let (Binary::Pow, Rhs::Scalar(e)) = (op, rhs) {
        if let Some(result) = trivial_pow(op_name, a, &lhs, e, in_place)? {
            return Ok(result);
        }
    }
    let out = if in_place {
        a.clone()
    } else {
        let mut inputs: Vec<(&[i64], &[i64])> = vec![(lhs.sizes(), lhs.strides())];
        match (&rhs_tensor, op) {
            (Some(b), _) => inputs.push((b.sizes(), b.strides())),
            // `pow(t, scalar)` is a unary TensorIterator over `t`; other scalars are 0-d
            // operands (ATen's wrapped numbers).
            (None, Binary::Pow) => {}
            (None, _) => inputs.push((&[], &[])),
        }
        if matches!(op, Binary::ThresholdBackward(_)) {
            // ATen's `threshold_backward` iterates over (self, grad_output): the input first.
            inputs.reverse();
        }
        new_output(op_name, &out_shape, &inputs, dtype, a)?
    };
    // Every operand visits the output's memory order (elementwise: the order changes no value).
    let order = layout::memory_order(out.strides());
    let expanded = |t: &Tensor| -> Result<Layout> {
        if t.sizes() == out_shape.as_slice() {
            return Ok(t.layout().clone().permuted(order.as_deref()));
        }
        let (sizes, strides) = layout::expand_geometry(t.sizes(), t.strides(), &out_shape)?;
        Ok(Layout::from_parts(sizes, strides, t.storage_offset()).permuted(order.as_deref()))
    };
    let a_layout = expanded(&lhs)?;
    let b_layout = rhs_tensor.as_ref().map(expanded).transpose()?;
    let out_layout = out.layout().clone().permuted(order.as_deref());
    let mut reads: Vec<&Tensor> = vec![&lhs];
    reads.extend(rhs_tensor.as_ref());
    {
        let access = Access::lock(op_name, &reads, &[&out])?;
        macro_rules! typed {
            ($T:ident, $kernel:ident) => {{
                let dst = access.dst_as::<$T>(op_name, &out, out_layout)?;
                let src = access.src_as::<$T>(op_name, &lhs, a_layout)?;
                let operand = match (&rhs_tensor, b_layout, rhs) {
                    (Some(b), Some(l), _) => Operand::Tensor(access.src_as::<$T>(op_name, b, l)?),
                    (_, _, Rhs::Scalar(s)) => Operand::Scalar(scalar_as::<$T>(s)),
                    _ => unreachable!("a tensor operand has a layout"),
                };
                $kernel(op, &dst, &src, &operand);
                Ok::<(), Error>(())
            }};
        }
        macro_rules! integer_checked {
            ($T:ident) => {{
                let dst = access.dst_as::<$T>(op_name, &out, out_layout)?;
                let src = access.src_as::<$T>(op_name, &lhs, a_layout)?;
                let operand = match (&rhs_tensor, b_layout, rhs) {
                    (Some(b), Some(l), _) => Operand::Tensor(access.src_as::<$T>(op_name, b, l)?),
                    (_, _, Rhs::Scalar(s)) => Operand::Scalar(scalar_as::<$T>(s)),
                    _ => unreachable!("a tensor operand has a layout"),
                };
                if matches!(op, Binary::DivTrunc | Binary::DivFloor) {
                    check_no_zero_divisor(op_name, &operand)?;
                }
                binary_num(op, &dst, &src, &operand);
                Ok::<(), Error>(())
            }};
        }
        if dtype == ScalarType::Bool {
            typed!(Bool, binary_bool)?;
        } else if let (true, Binary::Pow, Rhs::Scalar(e)) = (dtype.is_floating_point(), op, rhs) {
            dispatch!(float, op_name, dtype, |T| {
                let dst = access.dst_as::<T>(op_name, &out, out_layout)?;
                let src = access.src_as::<T>(op_name, &lhs, a_layout)?;
                pow_scalar_float::<T>(&dst, &src, e);
                Ok::<(), Error>(())
            })?;
        } else if dtype.is_floating_point() {
            dispatch!(float, op_name, dtype, |T| typed!(T, binary_float))?;
        } else {
            dispatch!(num, op_name, dtype, |T| integer_checked!(T))?;
        }
    }
    if in_place {
        a.bump_version();
    }
    Ok(out)
}

/// Runs a unary operation into a new tensor, or into `a` in place.
fn unary(op_name: &'static str, op: Unary, a: &Tensor, in_place: bool) -> Result<Tensor> {
    let dtype = if op.promotes_integers() {
        promote_integer_to_float(a.dtype())
    } else {
        a.dtype()
    };
    match (op, dtype) {
        (Unary::Neg, ScalarType::Bool) => {
            return Err(Error::InvalidArgument {
                op: op_name,
                message: "Negation, the `-` operator, on a bool tensor is not supported. If you \
                          are trying to invert a mask, use the `~` or `logical_not()` operator \
                          instead."
                    .into(),
            });
        }
        (Unary::Relu, ScalarType::Bool) => {
            return Err(Error::InvalidArgument {
                op: op_name,
                message: "Boolean inputs not supported for relu".into(),
            });
        }
        (Unary::Gelu, d) if !d.is_floating_point() => {
            return Err(Error::UnsupportedDtype { op: op_name, dtype });
        }
        _ => {}
    }
    let out = if in_place {
        check_cast(op_name, dtype, a)?;
        check_no_internal_overlap(op_name, a)?;
        a.clone()
    } else {
        new_output(op_name, a.sizes(), &[(a.sizes(), a.strides())], dtype, a)?
    };
    let src_tensor = as_dtype(a, dtype)?;
    let order = layout::memory_order(out.strides());
    let src_layout = src_tensor.layout().clone().permuted(order.as_deref());
    let out_layout = out.layout().clone().permuted(order.as_deref());
    {
        let access = Access::lock(op_name, &[&src_tensor], &[&out])?;
        macro_rules! typed {
            ($T:ident, $kernel:ident) => {{
                let dst = access.dst_as::<$T>(op_name, &out, out_layout)?;
                let src = access.src_as::<$T>(op_name, &src_tensor, src_layout)?;
                $kernel(op, &dst, &src);
                Ok(())
            }};
        }
        if dtype.is_floating_point() {
            dispatch!(float, op_name, dtype, |T| typed!(T, unary_float))?;
        } else {
            dispatch!(num, op_name, dtype, |T| typed!(T, unary_num))?;
        }
    }
    if in_place {
        a.bump_version();
    }
    Ok(out)
}

impl Tensor {
    /// `self + other` with broadcasting and type promotion, as `torch.add` (Bool: `or`).
    ///
    /// # Errors
    /// [`Error::BroadcastMismatch`], [`Error::DeviceMismatch`], [`Error::UnsupportedDtype`]
    /// (Half, BFloat16 and complex results), [`Error::UnsupportedDevice`] (CUDA).
    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        binary("add", Binary::Add, self, Rhs::Tensor(other), false)
    }

    /// `self - other` with broadcasting and type promotion, as `torch.sub`.
    ///
    /// # Errors
    /// As [`Tensor::add`]; [`Error::InvalidArgument`] when an operand is Bool (ATen's
    /// "Subtraction, the `-` operator, with a bool tensor is not supported...").
    pub fn sub(&self, other: &Tensor) -> Result<Tensor> {
        binary("sub", Binary::Sub, self, Rhs::Tensor(other), false)
    }

    /// `self * other` with broadcasting and type promotion, as `torch.mul` (Bool: `and`).
    ///
    /// # Errors
    /// As [`Tensor::add`].
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        binary("mul", Binary::Mul, self, Rhs::Tensor(other), false)
    }

    /// `self / other`, true division with broadcasting, as `torch.div`: integer and Bool
    /// operands are divided in the default dtype `Float` (`-5 / -2` is 2.5, `1 / 0` is inf).
    ///
    /// # Errors
    /// As [`Tensor::add`].
    pub fn div(&self, other: &Tensor) -> Result<Tensor> {
        binary("div", Binary::Div, self, Rhs::Tensor(other), false)
    }

    /// `self / other` rounded by `mode`, as `torch.div(self, other, rounding_mode=...)`: the
    /// promoted dtype is kept (integers stay integers).
    ///
    /// # Errors
    /// As [`Tensor::add`]; [`Error::InvalidArgument`] ("ZeroDivisionError") for an integer
    /// division by zero; [`Error::UnsupportedDtype`] for Bool.
    pub fn div_rounding(&self, other: &Tensor, mode: RoundingMode) -> Result<Tensor> {
        let op = match mode {
            RoundingMode::Trunc => Binary::DivTrunc,
            RoundingMode::Floor => Binary::DivFloor,
        };
        binary("div", op, self, Rhs::Tensor(other), false)
    }

    /// `self // other` (rounded toward negative infinity), as `torch.floor_divide`, the same as
    /// [`Tensor::div_rounding`] with [`RoundingMode::Floor`].
    ///
    /// # Errors
    /// As [`Tensor::div_rounding`].
    pub fn floor_divide(&self, other: &Tensor) -> Result<Tensor> {
        binary(
            "floor_divide",
            Binary::DivFloor,
            self,
            Rhs::Tensor(other),
            false,
        )
    }

    /// `self ^ exponent` elementwise with broadcasting, as `torch.pow`: integer types stay
    /// integers (a negative exponent gives 0 except for bases 1 and -1, as ATen's `powi`).
    ///
    /// # Errors
    /// As [`Tensor::add`]; [`Error::UnsupportedDtype`] for Bool.
    pub fn pow(&self, exponent: &Tensor) -> Result<Tensor> {
        binary("pow", Binary::Pow, self, Rhs::Tensor(exponent), false)
    }

    /// `self + value`, as `torch.add(t, value)`: `value` is a Python-style number (`2.5`, `2i64`,
    /// `true`) whose kind takes part in type promotion (an integer tensor plus `2.5` is `Float`,
    /// plus `2` stays integer).
    ///
    /// # Errors
    /// As [`Tensor::add`].
    pub fn add_scalar(&self, value: impl Into<Scalar>) -> Result<Tensor> {
        binary("add", Binary::Add, self, Rhs::Scalar(value.into()), false)
    }

    /// `self - value`, as `torch.sub(t, value)`.
    ///
    /// # Errors
    /// As [`Tensor::sub`].
    pub fn sub_scalar(&self, value: impl Into<Scalar>) -> Result<Tensor> {
        binary("sub", Binary::Sub, self, Rhs::Scalar(value.into()), false)
    }

    /// `self * value`, as `torch.mul(t, value)`.
    ///
    /// # Errors
    /// As [`Tensor::add_scalar`].
    pub fn mul_scalar(&self, value: impl Into<Scalar>) -> Result<Tensor> {
        binary("mul", Binary::Mul, self, Rhs::Scalar(value.into()), false)
    }

    /// `self / value`, true division, as `torch.div(t, value)`.
    ///
    /// # Errors
    /// As [`Tensor::div`].
    pub fn div_scalar(&self, value: impl Into<Scalar>) -> Result<Tensor> {
        binary("div", Binary::Div, self, Rhs::Scalar(value.into()), false)
    }

    /// `self / value` rounded by `mode`, as `torch.div(t, value, rounding_mode=...)`.
    ///
    /// # Errors
    /// As [`Tensor::div_rounding`].
    pub fn div_scalar_rounding(
        &self,
        value: impl Into<Scalar>,
        mode: RoundingMode,
    ) -> Result<Tensor> {
        let op = match mode {
            RoundingMode::Trunc => Binary::DivTrunc,
            RoundingMode::Floor => Binary::DivFloor,
        };
        binary("div", op, self, Rhs::Scalar(value.into()), false)
    }

    /// `self // value`, as `torch.floor_divide(t, value)`.
    ///
    /// # Errors
    /// As [`Tensor::div_rounding`].
    pub fn floor_divide_scalar(&self, value: impl Into<Scalar>) -> Result<Tensor> {
        binary(
            "floor_divide",
            Binary::DivFloor,
            self,
            Rhs::Scalar(value.into()),
            false,
        )
    }

    /// `self ^ exponent`, as `torch.pow(t, exponent)` (`int_tensor ** 2` stays integer,
    /// `int_tensor ** 0.5` is `Float`). A floating result is computed as ATen's CPU
    /// `pow_tensor_scalar_kernel`: exponents 0.5, -0.5 and -1 as `sqrt`, `1 / sqrt` and `1 / x`
    /// (so `pow(-inf, 0.5)` is NaN and `pow(-0.0, 0.5)` is -0.0, unlike C's `pow`), 2, 3 and -2
    /// by multiplication, others by `pow` in `double`.
    ///
    /// # Errors
    /// As [`Tensor::pow`]; [`Error::InvalidArgument`] for a negative integer exponent of an
    /// integer tensor ("Integers to negative integer powers are not allowed.").
    pub fn pow_scalar(&self, exponent: impl Into<Scalar>) -> Result<Tensor> {
        binary(
            "pow",
            Binary::Pow,
            self,
            Rhs::Scalar(exponent.into()),
            false,
        )
    }

    /// `-self`, as `torch.neg` (wrapping for integers).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for Bool; [`Error::UnsupportedDtype`] for Half and BFloat16;
    /// [`Error::UnsupportedDevice`].
    pub fn neg(&self) -> Result<Tensor> {
        unary("neg", Unary::Neg, self, false)
    }

    /// `e^self`, as `torch.exp` (integer and Bool tensors give `Float`).
    ///
    /// # Errors
    /// [`Error::UnsupportedDtype`] for Half and BFloat16; [`Error::UnsupportedDevice`].
    pub fn exp(&self) -> Result<Tensor> {
        unary("exp", Unary::Exp, self, false)
    }

    /// The natural logarithm, as `torch.log` (`log(0) = -inf`, `log(-1) = NaN`; integer and
    /// Bool tensors give `Float`).
    ///
    /// # Errors
    /// As [`Tensor::exp`].
    pub fn log(&self) -> Result<Tensor> {
        unary("log", Unary::Log, self, false)
    }

    /// The square root, as `torch.sqrt` (integer and Bool tensors give `Float`).
    ///
    /// # Errors
    /// As [`Tensor::exp`].
    pub fn sqrt(&self) -> Result<Tensor> {
        unary("sqrt", Unary::Sqrt, self, false)
    }

    /// `max(self, 0)` with NaN and -0.0 kept, as `torch.relu` (`clamp_min(self, 0)`; every
    /// numeric dtype but Bool).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for Bool ("Boolean inputs not supported for relu"); as
    /// [`Tensor::neg`].
    pub fn relu(&self) -> Result<Tensor> {
        unary("relu", Unary::Relu, self, false)
    }

    /// `1 / (1 + e^-self)`, as `torch.sigmoid` (integer and Bool tensors give `Float`).
    ///
    /// # Errors
    /// As [`Tensor::exp`].
    pub fn sigmoid(&self) -> Result<Tensor> {
        unary("sigmoid", Unary::Sigmoid, self, false)
    }

    /// The hyperbolic tangent, as `torch.tanh` (integer and Bool tensors give `Float`).
    ///
    /// # Errors
    /// As [`Tensor::exp`].
    pub fn tanh(&self) -> Result<Tensor> {
        unary("tanh", Unary::Tanh, self, false)
    }

    /// The exact GELU `x * 0.5 * (1 + erf(x / sqrt(2)))`, as `torch.nn.functional.gelu` with
    /// `approximate='none'` (floating dtypes, as in ATen).
    ///
    /// # Errors
    /// [`Error::UnsupportedDtype`] for non-floating dtypes (and Half, BFloat16);
    /// [`Error::UnsupportedDevice`].
    pub fn gelu(&self) -> Result<Tensor> {
        unary("gelu", Unary::Gelu, self, false)
    }

    /// ReLU's gradient: `self` (the incoming gradient) where `input > threshold`, else 0, with
    /// broadcasting and type promotion, as ATen's `threshold_backward(grad_output, self,
    /// threshold)` (relu's backward is `threshold_backward(grad, result, 0)`).
    ///
    /// # Errors
    /// As [`Tensor::add`]; [`Error::UnsupportedDtype`] for Bool.
    pub fn threshold_backward(&self, input: &Tensor, threshold: f64) -> Result<Tensor> {
        binary(
            "threshold_backward",
            Binary::ThresholdBackward(threshold),
            self,
            Rhs::Tensor(input),
            false,
        )
    }

    /// `self += other` in place (`other` broadcasts to this shape), as `t.add_(other)`. Bumps the
    /// version counter. `t.add_(&t)` doubles `t`. Computes in the promoted dtype and writes this
    /// tensor's dtype.
    ///
    /// # Errors
    /// As [`Tensor::add`]; [`Error::ResultTypeCast`] when the promoted dtype cannot be written
    /// into this one (`int.add_(float)`); [`Error::ShapeMismatch`] when the broadcast shape is
    /// not this shape (`output with shape [3] doesn't match the broadcast shape [2, 3]`);
    /// [`Error::MemoryOverlap`] when this tensor has self-overlapping elements or `other`
    /// partly overlaps it.
    pub fn add_(&self, other: &Tensor) -> Result<()> {
        binary("add_", Binary::Add, self, Rhs::Tensor(other), true).map(drop)
    }

    /// `self -= other` in place, as `t.sub_(other)`.
    ///
    /// # Errors
    /// As [`Tensor::add_`] and [`Tensor::sub`].
    pub fn sub_(&self, other: &Tensor) -> Result<()> {
        binary("sub_", Binary::Sub, self, Rhs::Tensor(other), true).map(drop)
    }

    /// `self *= other` in place, as `t.mul_(other)`.
    ///
    /// # Errors
    /// As [`Tensor::add_`].
    pub fn mul_(&self, other: &Tensor) -> Result<()> {
        binary("mul_", Binary::Mul, self, Rhs::Tensor(other), true).map(drop)
    }

    /// `self /= other` in place (true division), as `t.div_(other)`.
    ///
    /// # Errors
    /// As [`Tensor::add_`]; [`Error::ResultTypeCast`] for an integer tensor (the quotient is
    /// `Float`).
    pub fn div_(&self, other: &Tensor) -> Result<()> {
        binary("div_", Binary::Div, self, Rhs::Tensor(other), true).map(drop)
    }

    /// `self += value` in place, as `t.add_(value)`.
    ///
    /// # Errors
    /// [`Error::ResultTypeCast`] for a floating value on an integer tensor; as
    /// [`Tensor::add_`].
    pub fn add_scalar_(&self, value: impl Into<Scalar>) -> Result<()> {
        binary("add_", Binary::Add, self, Rhs::Scalar(value.into()), true).map(drop)
    }

    /// `self -= value` in place, as `t.sub_(value)`.
    ///
    /// # Errors
    /// As [`Tensor::add_scalar_`] and [`Tensor::sub`].
    pub fn sub_scalar_(&self, value: impl Into<Scalar>) -> Result<()> {
        binary("sub_", Binary::Sub, self, Rhs::Scalar(value.into()), true).map(drop)
    }

    /// `self /= value` in place (true division), as `t.div_(value)`.
    ///
    /// # Errors
    /// As [`Tensor::div_`].
    pub fn div_scalar_(&self, value: impl Into<Scalar>) -> Result<()> {
        binary("div_", Binary::Div, self, Rhs::Scalar(value.into()), true).map(drop)
    }

    /// `self *= value` in place, as `t.mul_(value)`.
    ///
    /// # Errors
    /// As [`Tensor::add_scalar_`].
    pub fn mul_scalar_(&self, value: impl Into<Scalar>) -> Result<()> {
        binary("mul_", Binary::Mul, self, Rhs::Scalar(value.into()), true).map(drop)
    }

    /// `self = max(self, 0)` in place, as `t.relu_()`.
    ///
    /// # Errors
    /// As [`Tensor::relu`]; [`Error::MemoryOverlap`].
    pub fn relu_(&self) -> Result<()> {
        unary("relu_", Unary::Relu, self, true).map(drop)
    }
}
