//! `pow(x, scalar)` and `relu` at the IEEE special values (signed zeros, infinities, NaN), bit
//! for bit as torch's CPU kernels compute them (issue 29).
//!
//! Where the values come from: a battery of 424 cases run against torch 2.15.0 outside the
//! project (issue 29) measured `pow(-inf, 0.5) = nan`, `pow(-0.0, 0.5) = -0.0` and
//! `relu(-0.0) = -0.0`, where C's `pow` gives `+inf` and `+0.0` and aten gave `+0.0`. The other
//! rows follow from the kernels those results come from, read in PyTorch's source:
//!
//! * `pow_tensor_scalar_kernel` (aten/src/ATen/native/cpu/PowKernel.cpp at pytorch 27a4844d7fb,
//!   lines 95-108) sends an exponent equal to 0.5, -0.5 or -1 (float or int scalar) of a
//!   Float/Double tensor to `sqrt_kernel`, `rsqrt_kernel` (`1 / std::sqrt(a)`) and
//!   `reciprocal_kernel` (`1 / a`); `pow_tensor_scalar_optimized_kernel` (lines 53-87) computes
//!   2, 3 and -2 as `x * x`, `x * x * x` and `1 / (x * x)`.
//! * `relu` is `at::clamp_min(self, 0)` (aten/src/ATen/native/Activation.cpp), whose CPU kernel
//!   is `std::max(a, min)` (`a < min ? min : a`, aten/src/ATen/native/cpu/TensorCompareKernel.cpp,
//!   `clamp_min_scalar_kernel_impl`; vectorized: `_mm256_max_ps(min, a)`, which returns `a` for
//!   two zeros and for NaN).

use aten::{Scalar, Tensor};
use c10_core::ScalarType;
use rstest::rstest;

type R = aten::Result<()>;

const NAN: f64 = f64::NAN;
const INF: f64 = f64::INFINITY;

/// The inputs of every row: `-inf, -0.0, +0.0, +inf, 4, -1, nan`.
const INPUTS: [f64; 7] = [-INF, -0.0, 0.0, INF, 4.0, -1.0, NAN];

/// `got` equals `want` bit for bit (any NaN matches any NaN: torch's NaN payloads are not
/// part of its contract).
fn assert_bits(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let same = (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits();
        assert!(same, "{what}[{i}]: got {g:?}, torch gives {w:?}");
    }
}

/// The tensor of `INPUTS` in `dtype`, read back as `f64` (exact for Float and Double).
fn values(t: &Tensor) -> aten::Result<Vec<f64>> {
    t.to_dtype(ScalarType::Double)?.to_vec::<f64>()
}

fn input(dtype: ScalarType) -> aten::Result<Tensor> {
    Tensor::from_slice(&INPUTS, &[INPUTS.len() as i64])?.to_dtype(dtype)
}

/// `pow(x, e)` for the special exponents, in Float and Double.
#[rstest]
// sqrt: C's pow gives +inf at -inf and +0.0 at -0.0.
#[case::half(Scalar::Float(0.5), [NAN, -0.0, 0.0, INF, 2.0, NAN, NAN])]
// rsqrt = 1 / sqrt(x): C's pow gives +0.0 at -inf and +inf at -0.0.
#[case::minus_half(Scalar::Float(-0.5), [NAN, -INF, INF, 0.0, 0.5, NAN, NAN])]
// reciprocal = 1 / x, for a float and an int exponent alike (`Scalar::equal(-1.0)`).
#[case::minus_one_float(Scalar::Float(-1.0), [-0.0, -INF, INF, 0.0, 0.25, -1.0, NAN])]
#[case::minus_one_int(Scalar::Int(-1), [-0.0, -INF, INF, 0.0, 0.25, -1.0, NAN])]
// x * x, x * x * x, 1 / (x * x).
#[case::two(Scalar::Int(2), [INF, 0.0, 0.0, INF, 16.0, 1.0, NAN])]
#[case::three(Scalar::Float(3.0), [-INF, -0.0, 0.0, INF, 64.0, -1.0, NAN])]
#[case::minus_two(Scalar::Int(-2), [0.0, INF, INF, 0.0, 0.0625, 1.0, NAN])]
// Any other exponent: std::pow (C's rules: pow(-inf, 1.5) = inf, pow(-0.0, 1.5) = +0.0).
#[case::other(Scalar::Float(1.5), [INF, 0.0, 0.0, INF, 8.0, NAN, NAN])]
fn pow_scalar_special_values(
    #[case] exponent: Scalar,
    #[case] want: [f64; 7],
    #[values(ScalarType::Float, ScalarType::Double)] dtype: ScalarType,
) -> R {
    let x = input(dtype)?;
    let y = x.pow_scalar(exponent)?;
    assert_eq!(y.dtype(), dtype);
    assert_bits(
        &values(&y)?,
        &want,
        &format!("pow({dtype:?}, {exponent:?})"),
    );
    Ok(())
}

/// An integer tensor to the power 0.5 or -0.5 computes in Float through the same kernels
/// (torch: `tensor([4, 0, -1]) ** 0.5` is `[2., 0., nan]`, `** -0.5` is `[0.5, inf, nan]`).
#[rstest]
#[case::half(0.5, [2.0, 0.0, NAN])]
#[case::minus_half(-0.5, [0.5, INF, NAN])]
fn pow_scalar_of_integers(#[case] exponent: f64, #[case] want: [f64; 3]) -> R {
    let x = Tensor::from_slice(&[4i64, 0, -1], &[3])?;
    let y = x.pow_scalar(exponent)?;
    assert_eq!(y.dtype(), ScalarType::Float);
    assert_bits(&values(&y)?, &want, "int pow");
    Ok(())
}

/// A tensor exponent goes through `std::pow` for every element (`pow_tensor_tensor_kernel` has
/// no special cases): `pow(-inf, 0.5)` is `+inf` there, as in C.
#[test]
fn pow_tensor_exponent_keeps_c_rules() -> R {
    let x = Tensor::from_slice(&[-INF, -0.0], &[2])?;
    let e = Tensor::from_slice(&[0.5, 0.5], &[2])?;
    assert_bits(&values(&x.pow(&e)?)?, &[INF, 0.0], "pow(tensor, tensor)");
    Ok(())
}

/// `relu` keeps -0.0 and NaN (`std::max(a, 0)` returns `a` unless `a < 0`).
#[rstest]
#[case::float32(ScalarType::Float)]
#[case::float64(ScalarType::Double)]
fn relu_keeps_negative_zero(#[case] dtype: ScalarType) -> R {
    let want = [0.0, -0.0, 0.0, INF, 4.0, 0.0, NAN];
    let x = input(dtype)?;
    assert_bits(&values(&x.relu()?)?, &want, "relu");
    x.relu_()?;
    assert_bits(&values(&x)?, &want, "relu_");
    Ok(())
}
