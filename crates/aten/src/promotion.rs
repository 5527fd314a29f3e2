//! Type promotion, as PyTorch's: [`Scalar`] (a Python number, c10's `Scalar`),
//! [`promote_types`] (c10's `promoteTypes` table), [`result_type`] (`torch.result_type`, ATen's
//! `ResultTypeState`) and [`can_cast`] (c10's `canCast`, the rule for writing a result into an
//! existing tensor).
//!
//! # The rules
//!
//! * Dtypes fall into ordered categories: bool < integer < floating < complex.
//! * Operands have three priorities: tensors with at least one dimension, zero-dim tensors, and
//!   scalars (Python numbers, here [`Scalar`]: a Rust `f64` is a Python `float`, `i64` an `int`,
//!   `bool` a `bool`). Within each priority the dtypes are combined with [`promote_types`]; a
//!   lower priority only matters when its category is higher than every higher priority's.
//!   So `int64_tensor + 2.5` is `Float` (a floating scalar lifts the integer tensor to the
//!   default dtype), `float32_tensor + float64_zero_dim_tensor` stays `Float`, and
//!   `int32_tensor + 5` stays `Int`.
//! * A floating scalar counts as the default dtype (`Float`, `torch.get_default_dtype()`), an
//!   integer scalar as `Long`, a bool scalar as `Bool`.
//!
//! ```
//! use aten::promotion::{promote_types, result_type, Operand};
//! use aten::Tensor;
//! use c10_core::ScalarType;
//!
//! assert_eq!(promote_types(ScalarType::Byte, ScalarType::Char), ScalarType::Short);
//! let longs = Tensor::from_vec(vec![1i64, 2], &[2])?;
//! assert_eq!(result_type(&[(&longs).into(), 2.5.into()]), ScalarType::Float);
//! assert_eq!(result_type(&[(&longs).into(), 2i64.into()]), ScalarType::Long);
//! # Ok::<(), aten::Error>(())
//! ```

use c10_core::ScalarType;

use crate::tensor::Tensor;

/// A number that is not a tensor, as c10's `Scalar` (what a Python `int`, `float` or `bool`
/// becomes in an ATen call). Its kind decides type promotion (see the [module docs](self)).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    /// A Python `bool`.
    Bool(bool),
    /// A Python `int` (c10 stores it as `int64_t`).
    Int(i64),
    /// A Python `float` (c10 stores it as `double`).
    Float(f64),
}

impl Scalar {
    /// The dtype this scalar counts as in type promotion: `Bool`, `Long`, or the default dtype
    /// `Float` for a floating scalar, as ATen's `update_result_type_state` for wrapped numbers.
    pub fn promotion_dtype(self) -> ScalarType {
        match self {
            Scalar::Bool(_) => ScalarType::Bool,
            Scalar::Int(_) => ScalarType::Long,
            Scalar::Float(_) => DEFAULT_DTYPE,
        }
    }

    /// The value as `f64` (exact except for integers beyond 2^53).
    pub fn to_f64(self) -> f64 {
        match self {
            Scalar::Bool(b) => f64::from(u8::from(b)),
            Scalar::Int(i) => i as f64,
            Scalar::Float(f) => f,
        }
    }

    /// Whether this is an integer (or bool) scalar whose value is negative, the case ATen's
    /// `pow` refuses for an integer base.
    pub(crate) fn is_negative_integer(self) -> bool {
        matches!(self, Scalar::Int(i) if i < 0)
    }
}

impl From<f64> for Scalar {
    fn from(v: f64) -> Self {
        Scalar::Float(v)
    }
}

impl From<f32> for Scalar {
    fn from(v: f32) -> Self {
        Scalar::Float(f64::from(v))
    }
}

impl From<i64> for Scalar {
    fn from(v: i64) -> Self {
        Scalar::Int(v)
    }
}

impl From<i32> for Scalar {
    fn from(v: i32) -> Self {
        Scalar::Int(i64::from(v))
    }
}

impl From<bool> for Scalar {
    fn from(v: bool) -> Self {
        Scalar::Bool(v)
    }
}

/// The default floating dtype, as `torch.get_default_dtype()` (aten has no setter).
pub const DEFAULT_DTYPE: ScalarType = ScalarType::Float;

/// One operand of [`result_type`]: a tensor (its dimensions decide its priority) or a scalar.
#[derive(Clone, Copy, Debug)]
pub enum Operand<'a> {
    /// A tensor: one with dimensions outranks a zero-dim one.
    Tensor(&'a Tensor),
    /// A Python-style number.
    Scalar(Scalar),
}

impl<'a> From<&'a Tensor> for Operand<'a> {
    fn from(t: &'a Tensor) -> Self {
        Operand::Tensor(t)
    }
}

impl<T: Into<Scalar>> From<T> for Operand<'_> {
    fn from(v: T) -> Self {
        Operand::Scalar(v.into())
    }
}

/// The category rank of a dtype: bool 0, integer 1, floating 2, complex 3.
fn category(t: ScalarType) -> u8 {
    if t == ScalarType::Bool {
        0
    } else if t.is_integral(false) {
        1
    } else if t.is_floating_point() {
        2
    } else {
        3
    }
}

/// The width rank of a floating or complex dtype (Half and BFloat16 share one: neither holds
/// the other).
fn float_rank(t: ScalarType) -> u8 {
    match t {
        ScalarType::Half | ScalarType::BFloat16 => 0,
        ScalarType::Float | ScalarType::ComplexFloat => 1,
        _ => 2,
    }
}

/// The smallest dtype that holds both, as c10's `promoteTypes` (the table behind
/// `torch.promote_types`): Bool yields to anything; mixed signed and unsigned integers widen
/// (`uint8 + int8 = int16`); integers yield to floats; `float16 + bfloat16 = float32`; complex
/// keeps the wider precision of both sides (`complex64 + float64 = complex128`).
pub fn promote_types(a: ScalarType, b: ScalarType) -> ScalarType {
    use ScalarType::*;
    if a == b {
        return a;
    }
    let (ca, cb) = (category(a), category(b));
    if ca != cb && ca < 2 && cb < 2 {
        // Bool with an integer.
        return if ca > cb { a } else { b };
    }
    match (ca, cb) {
        (1, 1) => {
            // Two integer types. Byte is the only unsigned one: with Char it needs Short.
            match (a, b) {
                (Byte, Char) | (Char, Byte) => Short,
                (Byte, signed) | (signed, Byte) => signed,
                _ if a.item_size() >= b.item_size() => a,
                _ => b,
            }
        }
        (x, y) if x < 2 || y < 2 => {
            // An integer or Bool with a floating or complex type.
            if x > y { a } else { b }
        }
        (2, 2) => match (float_rank(a), float_rank(b)) {
            (0, 0) => Float, // Half with BFloat16
            (ra, rb) => {
                if ra >= rb {
                    a
                } else {
                    b
                }
            }
        },
        _ => {
            // At least one complex type: complex with the wider precision of both.
            if float_rank(a).max(float_rank(b)) == 2 {
                ComplexDouble
            } else {
                ComplexFloat
            }
        }
    }
}

/// Combines the dtype of a higher priority with that of a lower one, as ATen's
/// `combine_categories`: the lower one only counts when its category is higher (and then, for a
/// floating scalar over integers, as itself, the default dtype).
fn combine_categories(higher: Option<ScalarType>, lower: Option<ScalarType>) -> Option<ScalarType> {
    let (Some(h), Some(l)) = (higher, lower) else {
        return higher.or(lower);
    };
    if h.is_complex() {
        return Some(h);
    }
    if l.is_complex() {
        // Keep the higher priority's precision if it is floating.
        return Some(if h.is_floating_point() {
            promote_types(h, ScalarType::ComplexFloat)
        } else {
            l
        });
    }
    if h.is_floating_point() {
        return Some(h);
    }
    if h == ScalarType::Bool || l.is_floating_point() {
        return Some(promote_types(h, l));
    }
    Some(h)
}

/// The dtype of an operation's result over `operands`, as `torch.result_type` (see the
/// [module docs](self)). With no operands: the default dtype.
pub fn result_type(operands: &[Operand<'_>]) -> ScalarType {
    let mut dim: Option<ScalarType> = None;
    let mut zero_dim: Option<ScalarType> = None;
    let mut wrapped: Option<ScalarType> = None;
    for op in operands {
        let (slot, dtype) = match op {
            Operand::Tensor(t) if t.dim() > 0 => (&mut dim, t.dtype()),
            Operand::Tensor(t) => (&mut zero_dim, t.dtype()),
            Operand::Scalar(s) => (&mut wrapped, s.promotion_dtype()),
        };
        *slot = Some(match *slot {
            Some(current) => promote_types(current, dtype),
            None => dtype,
        });
    }
    combine_categories(dim, combine_categories(zero_dim, wrapped)).unwrap_or(DEFAULT_DTYPE)
}

/// The dtype an operation that always computes in floating point (true division, `exp`, `log`,
/// `sqrt`, `sigmoid`, `tanh`) uses for operands of `dtype`: Bool and integer types become the
/// default dtype, floating types stay, as TensorIterator's `promote_integer_inputs_to_float`.
pub fn promote_integer_to_float(dtype: ScalarType) -> ScalarType {
    if dtype.is_integral(true) {
        DEFAULT_DTYPE
    } else {
        dtype
    }
}

/// Whether a result of dtype `from` may be written into a tensor of dtype `to`, as c10's
/// `canCast`: not complex into non-complex, not floating into integer or Bool, not anything but
/// Bool into Bool (so `int_tensor.add_(float_tensor)` and `bool_tensor.add_(int_tensor)` are
/// refused, `float_tensor.add_(double_tensor)` is not).
pub fn can_cast(from: ScalarType, to: ScalarType) -> bool {
    if from.is_complex() && !to.is_complex() {
        return false;
    }
    if from.is_floating_point() && to.is_integral(false) {
        return false;
    }
    !(from != ScalarType::Bool && to == ScalarType::Bool)
}

impl Tensor {
    /// The result dtype of a binary operation of this tensor with `other`, as
    /// `torch.result_type(self, other)`.
    pub fn result_type(&self, other: &Tensor) -> ScalarType {
        result_type(&[self.into(), other.into()])
    }

    /// The result dtype of a binary operation of this tensor with a scalar, as
    /// `torch.result_type(self, value)`.
    pub fn result_type_scalar(&self, value: impl Into<Scalar>) -> ScalarType {
        result_type(&[self.into(), Operand::Scalar(value.into())])
    }
}
