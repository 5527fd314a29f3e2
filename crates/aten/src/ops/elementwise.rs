//! Elementwise operations with broadcasting: `add`, `sub`, `mul`, `div`, `pow`, `neg`, `exp`,
//! `log`, `sqrt`, `relu`, `sigmoid`, `tanh`, `gelu`, `threshold_backward`, their scalar forms and
//! the in-place variants (`add_`, `sub_`, `mul_`, `div_`, `relu_`, ...), as ATen's
//! `TensorIterator` binary and unary kernels.
//!
//! Dtypes: `add`, `sub`, `mul`, `neg`, `relu` and `threshold_backward` on every integer type and
//! on `f32`/`f64` (integer arithmetic wraps, as in ATen); the others on `f32`/`f64` only (ATen
//! would promote integers to float; aten refuses with [`Error::UnsupportedDtype`]).

use c10_core::ScalarType;

use crate::copy::{check_no_internal_overlap, check_no_partial_overlap};
use crate::error::{Error, Result};
use crate::host::{Access, Dst, Src, map1, map2};
use crate::layout::{self, Layout};
use crate::ops::check_same;
use crate::scalar::{Float, Num, Scalar, dispatch};
use crate::tensor::Tensor;

/// The binary operations.
#[derive(Clone, Copy, Debug)]
enum Binary {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    /// `b <= threshold ? 0 : a` (a = grad_output, b = the forward input).
    ThresholdBackward(f64),
}

impl Binary {
    fn float_only(self) -> bool {
        matches!(self, Binary::Div | Binary::Pow)
    }
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
    fn float_only(self) -> bool {
        !matches!(self, Unary::Neg | Unary::Relu)
    }
}

/// The right operand of a binary operation.
#[derive(Clone, Copy)]
enum Rhs<'a> {
    Tensor(&'a Tensor),
    Scalar(f64),
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
        Binary::ThresholdBackward(threshold) => {
            let threshold = T::from_f64(threshold);
            apply2!(out, a, b, |g, x| if x <= threshold { T::ZERO } else { g })
        }
        Binary::Div | Binary::Pow => {
            unreachable!("floating point operations dispatch to binary_float")
        }
    }
}

/// The typed kernels of the floating point operations.
fn binary_float<T: Float>(op: Binary, out: &Dst<'_, T>, a: &Src<'_, T>, b: &Operand<'_, T>) {
    match op {
        Binary::Div => apply2!(out, a, b, |x, y| x.div(y)),
        Binary::Pow => apply2!(out, a, b, |x, y| x.powf(y)),
        other => binary_num(other, out, a, b),
    }
}

fn unary_num<T: Num>(op: Unary, out: &Dst<'_, T>, a: &Src<'_, T>) {
    match op {
        Unary::Neg => map1(out, a, |x| x.neg()),
        // NaN propagates, as ATen's clamp_min(0).
        Unary::Relu => map1(out, a, |x| {
            if x > T::ZERO || x.is_nan() {
                x
            } else {
                T::ZERO
            }
        }),
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

/// Checks that a scalar fits the dtype (integral for integer dtypes).
fn check_scalar(op: &'static str, value: f64, dtype: ScalarType) -> Result<()> {
    if !dtype.is_floating_point() && (value.fract() != 0.0 || !value.is_finite()) {
        return Err(Error::ScalarCast { op, value, dtype });
    }
    Ok(())
}

/// Runs a binary operation: into a new broadcast tensor, or into `a` in place.
fn binary(
    op_name: &'static str,
    op: Binary,
    a: &Tensor,
    rhs: Rhs<'_>,
    in_place: bool,
) -> Result<Tensor> {
    let out_shape = match rhs {
        Rhs::Tensor(b) => {
            check_same(op_name, a, b)?;
            layout::broadcast_shapes(op_name, a.sizes(), b.sizes())?
        }
        Rhs::Scalar(value) => {
            check_scalar(op_name, value, a.dtype())?;
            a.sizes().to_vec()
        }
    };
    let out = if in_place {
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
        a.clone()
    } else {
        Tensor::empty_uninit(&out_shape, a.dtype(), a.device())?
    };
    let expanded = |t: &Tensor| -> Result<Layout> {
        let (sizes, strides) = layout::expand_geometry(t.sizes(), t.strides(), &out_shape)?;
        Ok(Layout::from_parts(sizes, strides, t.storage_offset()))
    };
    let a_layout = expanded(a)?;
    let b_layout = match rhs {
        Rhs::Tensor(b) => Some(expanded(b)?),
        Rhs::Scalar(_) => None,
    };
    let reads: Vec<&Tensor> = match rhs {
        Rhs::Tensor(b) => vec![a, b],
        Rhs::Scalar(_) => vec![a],
    };
    {
        let access = Access::lock(op_name, &reads, &[&out])?;
        macro_rules! typed {
            ($T:ident, $kernel:ident) => {{
                let dst = access.dst::<$T>(op_name, &out)?;
                let src = access.src_as::<$T>(op_name, a, a_layout.clone())?;
                let operand = match (rhs, &b_layout) {
                    (Rhs::Tensor(b), Some(l)) => {
                        Operand::Tensor(access.src_as::<$T>(op_name, b, l.clone())?)
                    }
                    (_, _) => Operand::Scalar(<$T>::from_f64(match rhs {
                        Rhs::Scalar(v) => v,
                        Rhs::Tensor(_) => 0.0,
                    })),
                };
                $kernel::<$T>(op, &dst, &src, &operand);
                Ok(())
            }};
        }
        if op.float_only() || a.dtype().is_floating_point() {
            dispatch!(float, op_name, a.dtype(), |T| typed!(T, binary_float))?;
        } else {
            dispatch!(num, op_name, a.dtype(), |T| typed!(T, binary_num))?;
        }
    }
    if in_place {
        a.bump_version();
    }
    Ok(out)
}

/// Runs a unary operation into a new tensor, or into `a` in place.
fn unary(op_name: &'static str, op: Unary, a: &Tensor, in_place: bool) -> Result<Tensor> {
    let out = if in_place {
        check_no_internal_overlap(op_name, a)?;
        a.clone()
    } else {
        Tensor::empty_uninit(a.sizes(), a.dtype(), a.device())?
    };
    {
        let access = Access::lock(op_name, &[a], &[&out])?;
        macro_rules! typed {
            ($T:ident, $kernel:ident) => {{
                let dst = access.dst::<$T>(op_name, &out)?;
                let src = access.src::<$T>(op_name, a)?;
                $kernel::<$T>(op, &dst, &src);
                Ok(())
            }};
        }
        if op.float_only() || a.dtype().is_floating_point() {
            dispatch!(float, op_name, a.dtype(), |T| typed!(T, unary_float))?;
        } else {
            dispatch!(num, op_name, a.dtype(), |T| typed!(T, unary_num))?;
        }
    }
    if in_place {
        a.bump_version();
    }
    Ok(out)
}

impl Tensor {
    /// `self + other` with broadcasting, as `torch.add`.
    ///
    /// # Errors
    /// [`Error::BroadcastMismatch`], [`Error::DtypeMismatch`], [`Error::DeviceMismatch`],
    /// [`Error::UnsupportedDtype`] (half, bool), [`Error::UnsupportedDevice`] (CUDA).
    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        binary("add", Binary::Add, self, Rhs::Tensor(other), false)
    }

    /// `self - other` with broadcasting, as `torch.sub`.
    ///
    /// # Errors
    /// As [`Tensor::add`].
    pub fn sub(&self, other: &Tensor) -> Result<Tensor> {
        binary("sub", Binary::Sub, self, Rhs::Tensor(other), false)
    }

    /// `self * other` with broadcasting, as `torch.mul`.
    ///
    /// # Errors
    /// As [`Tensor::add`].
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        binary("mul", Binary::Mul, self, Rhs::Tensor(other), false)
    }

    /// `self / other` with broadcasting (floating dtypes), as `torch.div`.
    ///
    /// # Errors
    /// As [`Tensor::add`]; [`Error::UnsupportedDtype`] for integer dtypes.
    pub fn div(&self, other: &Tensor) -> Result<Tensor> {
        binary("div", Binary::Div, self, Rhs::Tensor(other), false)
    }

    /// `self ^ exponent` elementwise with broadcasting (floating dtypes), as `torch.pow`.
    ///
    /// # Errors
    /// As [`Tensor::div`].
    pub fn pow(&self, exponent: &Tensor) -> Result<Tensor> {
        binary("pow", Binary::Pow, self, Rhs::Tensor(exponent), false)
    }

    /// `self + value`, as `torch.add(t, value)`.
    ///
    /// # Errors
    /// [`Error::ScalarCast`] for a fractional value on an integer tensor; as [`Tensor::add`].
    pub fn add_scalar(&self, value: f64) -> Result<Tensor> {
        binary("add", Binary::Add, self, Rhs::Scalar(value), false)
    }

    /// `self - value`, as `torch.sub(t, value)`.
    ///
    /// # Errors
    /// As [`Tensor::add_scalar`].
    pub fn sub_scalar(&self, value: f64) -> Result<Tensor> {
        binary("sub", Binary::Sub, self, Rhs::Scalar(value), false)
    }

    /// `self * value`, as `torch.mul(t, value)`.
    ///
    /// # Errors
    /// As [`Tensor::add_scalar`].
    pub fn mul_scalar(&self, value: f64) -> Result<Tensor> {
        binary("mul", Binary::Mul, self, Rhs::Scalar(value), false)
    }

    /// `self / value` (floating dtypes), as `torch.div(t, value)`.
    ///
    /// # Errors
    /// As [`Tensor::div`].
    pub fn div_scalar(&self, value: f64) -> Result<Tensor> {
        binary("div", Binary::Div, self, Rhs::Scalar(value), false)
    }

    /// `self ^ exponent` (floating dtypes), as `torch.pow(t, exponent)`.
    ///
    /// # Errors
    /// As [`Tensor::div`].
    pub fn pow_scalar(&self, exponent: f64) -> Result<Tensor> {
        binary("pow", Binary::Pow, self, Rhs::Scalar(exponent), false)
    }

    /// `-self`, as `torch.neg` (wrapping for integers).
    ///
    /// # Errors
    /// [`Error::UnsupportedDtype`] for half and bool; [`Error::UnsupportedDevice`].
    pub fn neg(&self) -> Result<Tensor> {
        unary("neg", Unary::Neg, self, false)
    }

    /// `e^self`, as `torch.exp` (floating dtypes).
    ///
    /// # Errors
    /// [`Error::UnsupportedDtype`] for non-floating dtypes; [`Error::UnsupportedDevice`].
    pub fn exp(&self) -> Result<Tensor> {
        unary("exp", Unary::Exp, self, false)
    }

    /// The natural logarithm, as `torch.log` (floating dtypes; `log(0) = -inf`, `log(-1) = NaN`).
    ///
    /// # Errors
    /// As [`Tensor::exp`].
    pub fn log(&self) -> Result<Tensor> {
        unary("log", Unary::Log, self, false)
    }

    /// The square root, as `torch.sqrt` (floating dtypes).
    ///
    /// # Errors
    /// As [`Tensor::exp`].
    pub fn sqrt(&self) -> Result<Tensor> {
        unary("sqrt", Unary::Sqrt, self, false)
    }

    /// `max(self, 0)` with NaN kept, as `torch.relu` (every numeric dtype).
    ///
    /// # Errors
    /// As [`Tensor::neg`].
    pub fn relu(&self) -> Result<Tensor> {
        unary("relu", Unary::Relu, self, false)
    }

    /// `1 / (1 + e^-self)`, as `torch.sigmoid` (floating dtypes).
    ///
    /// # Errors
    /// As [`Tensor::exp`].
    pub fn sigmoid(&self) -> Result<Tensor> {
        unary("sigmoid", Unary::Sigmoid, self, false)
    }

    /// The hyperbolic tangent, as `torch.tanh` (floating dtypes).
    ///
    /// # Errors
    /// As [`Tensor::exp`].
    pub fn tanh(&self) -> Result<Tensor> {
        unary("tanh", Unary::Tanh, self, false)
    }

    /// The exact GELU `x * 0.5 * (1 + erf(x / sqrt(2)))`, as `torch.nn.functional.gelu` with
    /// `approximate='none'` (floating dtypes).
    ///
    /// # Errors
    /// As [`Tensor::exp`].
    pub fn gelu(&self) -> Result<Tensor> {
        unary("gelu", Unary::Gelu, self, false)
    }

    /// ReLU's gradient: `self` (the incoming gradient) where `input > threshold`, else 0, with
    /// broadcasting, as ATen's `threshold_backward(grad_output, self, threshold)` (relu's
    /// backward is `threshold_backward(grad, result, 0)`).
    ///
    /// # Errors
    /// As [`Tensor::add`].
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
    /// version counter. `t.add_(&t)` doubles `t`.
    ///
    /// # Errors
    /// As [`Tensor::add`]; [`Error::ShapeMismatch`] when the broadcast shape is not this shape
    /// (`output with shape [3] doesn't match the broadcast shape [2, 3]`);
    /// [`Error::MemoryOverlap`] when this tensor has self-overlapping elements or `other`
    /// partly overlaps it.
    pub fn add_(&self, other: &Tensor) -> Result<()> {
        binary("add_", Binary::Add, self, Rhs::Tensor(other), true).map(drop)
    }

    /// `self -= other` in place, as `t.sub_(other)`.
    ///
    /// # Errors
    /// As [`Tensor::add_`].
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

    /// `self /= other` in place (floating dtypes), as `t.div_(other)`.
    ///
    /// # Errors
    /// As [`Tensor::add_`]; [`Error::UnsupportedDtype`] for integer dtypes.
    pub fn div_(&self, other: &Tensor) -> Result<()> {
        binary("div_", Binary::Div, self, Rhs::Tensor(other), true).map(drop)
    }

    /// `self += value` in place, as `t.add_(value)`.
    ///
    /// # Errors
    /// [`Error::ScalarCast`]; as [`Tensor::add_`].
    pub fn add_scalar_(&self, value: f64) -> Result<()> {
        binary("add_", Binary::Add, self, Rhs::Scalar(value), true).map(drop)
    }

    /// `self *= value` in place, as `t.mul_(value)`.
    ///
    /// # Errors
    /// As [`Tensor::add_scalar_`].
    pub fn mul_scalar_(&self, value: f64) -> Result<()> {
        binary("mul_", Binary::Mul, self, Rhs::Scalar(value), true).map(drop)
    }

    /// `self = max(self, 0)` in place, as `t.relu_()`.
    ///
    /// # Errors
    /// As [`Tensor::relu`]; [`Error::MemoryOverlap`].
    pub fn relu_(&self) -> Result<()> {
        unary("relu_", Unary::Relu, self, true).map(drop)
    }
}
