//! The cases of issue 19, each holding the value real torch 2.15.0 (CPU) gave for it: four
//! bugs (float -> uint8, a `+inf` logit, the layout of `to(dtype)` and of `clone()`), type
//! promotion, the layout of elementwise results, error messages that name the op called, and
//! the differences aten keeps on purpose, with torch's value beside aten's.
//!
//! The broad check is the generated battery (`torch_battery.rs`); these are the named cases.

use aten::promotion::{can_cast, promote_types, result_type};
use aten::{Error, Reduction, RoundingMode, Tensor, TensorOptions};
use c10_core::{Bool, ScalarType};
use rstest::rstest;

type R = aten::Result<()>;

fn f32s(v: &[f32], shape: &[i64]) -> Tensor {
    Tensor::from_slice(v, shape).unwrap()
}

fn i64s(v: &[i64], shape: &[i64]) -> Tensor {
    Tensor::from_slice(v, shape).unwrap()
}

fn bools(v: &[bool]) -> Tensor {
    let b: Vec<Bool> = v.iter().map(|&x| Bool::from(x)).collect();
    Tensor::from_slice(&b, &[v.len() as i64]).unwrap()
}

/// Bug 1: float -> uint8 goes through int64 in c10 (defined in C++), so out-of-range values
/// wrap. torch 2.15.0: `tensor([-1, -1.5, -200, 256, 300.7]).to(torch.uint8)` is
/// `[255, 255, 56, 0, 44]`.
#[rstest]
#[case::float32(ScalarType::Float)]
#[case::float64(ScalarType::Double)]
#[case::float16(ScalarType::Half)]
fn float_to_uint8_wraps_through_int64(#[case] from: ScalarType) -> R {
    let x = f32s(&[-1.0, -1.5, -200.0, 256.0, 300.7], &[5]).to_dtype(from)?;
    assert_eq!(
        x.to_dtype(ScalarType::Byte)?.to_vec::<u8>()?,
        [255, 255, 56, 0, 44]
    );
    // In range, truncation toward zero (torch: [0, 0, 2]).
    let y = f32s(&[0.7, -0.7, 2.9], &[3]);
    assert_eq!(y.to_dtype(ScalarType::Byte)?.to_vec::<u8>()?, [0, 0, 2]);
    Ok(())
}

/// Bug 2: a `+inf` logit makes the row NaN, as in ATen (the max is subtracted: inf - inf).
/// torch 2.15.0 for rows `[inf, 0]`, `[-inf, 0]`, `[-inf, -inf]`: softmax `[nan, nan]`,
/// `[0, 1]`, `[nan, nan]`; log_softmax `[nan, nan]`, `[-inf, 0]`, `[nan, nan]`;
/// cross_entropy (none) for targets 0 and 1: `nan, nan`; `inf, -0.0`; `nan, nan`.
#[rstest]
#[case::plus_inf([f32::INFINITY, 0.0], [f32::NAN, f32::NAN], [f32::NAN, f32::NAN], [f32::NAN, f32::NAN])]
#[case::minus_inf([f32::NEG_INFINITY, 0.0], [0.0, 1.0], [f32::NEG_INFINITY, 0.0], [f32::INFINITY, -0.0])]
#[case::all_minus_inf([f32::NEG_INFINITY; 2], [f32::NAN, f32::NAN], [f32::NAN, f32::NAN], [f32::NAN, f32::NAN])]
fn infinite_logits(
    #[case] row: [f32; 2],
    #[case] softmax: [f32; 2],
    #[case] log_softmax: [f32; 2],
    #[case] cross_entropy: [f32; 2],
) -> R {
    let same = |got: Vec<f32>, want: [f32; 2]| {
        got.iter()
            .zip(want)
            .all(|(&g, w)| (g.is_nan() && w.is_nan()) || g == w)
    };
    let x = f32s(&row, &[2]);
    let s = x.softmax(0)?.to_vec::<f32>()?;
    assert!(same(s.clone(), softmax), "softmax {s:?}");
    let l = x.log_softmax(0)?.to_vec::<f32>()?;
    assert!(same(l.clone(), log_softmax), "log_softmax {l:?}");
    let ce: Vec<f32> = [0, 1]
        .into_iter()
        .map(|t| {
            x.view(&[1, 2])?
                .cross_entropy(&i64s(&[t], &[1]), Reduction::None)?
                .item::<f32>()
        })
        .collect::<aten::Result<_>>()?;
    assert!(same(ce.clone(), cross_entropy), "cross_entropy {ce:?}");
    Ok(())
}

/// Bug 3: `to(dtype)` keeps the layout (`memory_format=torch.preserve_format`). torch 2.15.0:
/// `arange(6.).view(2, 3).t().to(torch.float64).stride()` is `(1, 3)`, also to `int32`; a
/// sliced transpose (not dense) keeps its dimension order: strides `(1, 4)` for
/// `arange(24.).view(6, 4)[::2].t()`.
#[test]
fn to_dtype_preserves_the_layout() -> R {
    let t = Tensor::arange(0.0, 6.0, 1.0, TensorOptions::new())?
        .view(&[2, 3])?
        .t()?;
    for dtype in [ScalarType::Double, ScalarType::Int] {
        let d = t.to_dtype(dtype)?;
        assert_eq!(
            (d.sizes(), d.strides()),
            (&[3, 2][..], &[1, 3][..]),
            "{dtype}"
        );
        assert_eq!(
            d.to_dtype(ScalarType::Float)?.to_vec::<f32>()?,
            t.to_vec::<f32>()?
        );
    }
    let st = Tensor::arange(0.0, 24.0, 1.0, TensorOptions::new())?
        .view(&[6, 4])?
        .slice(0, None, None, 2)?
        .t()?;
    assert_eq!(st.to_dtype(ScalarType::Double)?.strides(), [1, 4]);
    assert_eq!(st.deep_clone()?.strides(), [1, 4]);
    // contiguous() still makes row-major strides (torch: (3, 1)).
    assert_eq!(st.contiguous()?.strides(), [3, 1]);
    Ok(())
}

/// Bug 4: `clone()` of a non-overlapping and dense tensor keeps its strides exactly, size-1
/// dimensions included. torch 2.15.0: `arange(3.).as_strided([3, 1], [1, 0]).clone().stride()`
/// is `(1, 0)`; `to(torch.float64)` too; `as_strided([2, 2, 1], [2, 1, 4])` keeps `(2, 1, 4)`.
#[rstest]
#[case::size_one_stride_zero(&[3, 1], &[1, 0])]
#[case::size_one_large_stride(&[2, 2, 1], &[2, 1, 4])]
#[case::channels_last_with_a_size_one_dim(&[2, 3, 1, 2], &[6, 1, 999, 3])]
fn clone_keeps_dense_strides(#[case] sizes: &[i64], #[case] strides: &[i64]) -> R {
    let base = Tensor::arange(0.0, 12.0, 1.0, TensorOptions::new())?;
    let x = base.as_strided(sizes, strides, Some(0))?;
    let c = x.deep_clone()?;
    assert_eq!((c.sizes(), c.strides()), (sizes, strides));
    assert_eq!(c.to_vec::<f32>()?, x.to_vec::<f32>()?);
    assert_eq!(x.to_dtype(ScalarType::Double)?.strides(), strides);
    Ok(())
}

/// `torch.result_type` and `torch.promote_types` (torch 2.15.0).
#[rstest]
#[case::float_double(ScalarType::Float, ScalarType::Double, ScalarType::Double)]
#[case::byte_char(ScalarType::Byte, ScalarType::Char, ScalarType::Short)]
#[case::half_bfloat(ScalarType::Half, ScalarType::BFloat16, ScalarType::Float)]
#[case::long_half(ScalarType::Long, ScalarType::Half, ScalarType::Half)]
#[case::bool_byte(ScalarType::Bool, ScalarType::Byte, ScalarType::Byte)]
#[case::complex_double(
    ScalarType::ComplexFloat,
    ScalarType::Double,
    ScalarType::ComplexDouble
)]
fn promote_types_table(#[case] a: ScalarType, #[case] b: ScalarType, #[case] want: ScalarType) {
    assert_eq!(promote_types(a, b), want);
    assert_eq!(promote_types(b, a), want);
}

#[test]
fn result_type_priorities() -> R {
    let f = f32s(&[1.0, 2.0], &[2]);
    let l = i64s(&[1, 2], &[2]);
    let i = l.to_dtype(ScalarType::Int)?;
    let b = bools(&[true, false]);
    let d0 = Tensor::scalar(2.5f64)?;
    let l0 = Tensor::scalar(2i64)?;
    let cases: [(&str, ScalarType, ScalarType); 9] = [
        // A floating scalar lifts an integer tensor to the default dtype: int64 + 2.5.
        ("long + 2.5", l.result_type_scalar(2.5), ScalarType::Float),
        // Within a category, a dimensioned tensor wins over scalars and zero-dim tensors.
        ("int + 2", i.result_type_scalar(2i64), ScalarType::Int),
        ("float + 0-d double", f.result_type(&d0), ScalarType::Float),
        ("int + 0-d long", i.result_type(&l0), ScalarType::Int),
        // ... but a higher category wins: int32 + 0-d float64 is float64.
        ("int + 0-d double", i.result_type(&d0), ScalarType::Double),
        (
            "float + double",
            f.result_type(&l.to_dtype(ScalarType::Double)?),
            ScalarType::Double,
        ),
        ("bool + 1", b.result_type_scalar(1i64), ScalarType::Long),
        ("bool + true", b.result_type_scalar(true), ScalarType::Bool),
        (
            "0-d int + 0-d long",
            result_type(&[(&Tensor::scalar(1i32)?).into(), (&l0).into()]),
            ScalarType::Long,
        ),
    ];
    for (what, got, want) in cases {
        assert_eq!(got, want, "{what}");
    }
    assert!(can_cast(ScalarType::Double, ScalarType::Float));
    assert!(!can_cast(ScalarType::Float, ScalarType::Long));
    assert!(!can_cast(ScalarType::Long, ScalarType::Bool));
    Ok(())
}

/// Promotion in the ops themselves (torch 2.15.0 values).
#[test]
fn arithmetic_promotes_like_torch() -> R {
    let f = f32s(&[1.0, 2.0], &[2]);
    let d = f.to_dtype(ScalarType::Double)?;
    let sum = f.add(&d)?;
    assert_eq!(
        (sum.dtype(), sum.to_vec::<f64>()?),
        (ScalarType::Double, vec![2.0, 4.0])
    );
    // tensor([1, 2, 3]) + 2.5 is tensor([3.5, 4.5, 5.5]) (float32).
    let l = i64s(&[1, 2, 3], &[3]);
    let r = l.add_scalar(2.5)?;
    assert_eq!(
        (r.dtype(), r.to_vec::<f32>()?),
        (ScalarType::Float, vec![3.5, 4.5, 5.5])
    );
    // int32 + 2 stays int32.
    assert_eq!(
        l.to_dtype(ScalarType::Int)?.add_scalar(2)?.dtype(),
        ScalarType::Int
    );
    // float32 + 0-d float64 stays float32.
    assert_eq!(f.add(&Tensor::scalar(2.5f64)?)?.dtype(), ScalarType::Float);
    // exp of an int tensor is float32: [2.7182817, 7.389056, 20.085537].
    let e = l.exp()?;
    assert_eq!(e.dtype(), ScalarType::Float);
    assert_eq!(e.to_vec::<f32>()?, [2.718_281_7, 7.389_056, 20.085_537]);
    // bool + bool is bool (or), bool * bool is and; bool + 1 is int64.
    let b = bools(&[true, false]);
    assert_eq!(b.add(&b)?.to_vec::<Bool>()?, [Bool(1), Bool(0)]);
    assert_eq!(
        b.mul(&bools(&[true, true]))?.to_vec::<Bool>()?,
        [Bool(1), Bool(0)]
    );
    assert_eq!(b.add_scalar(1)?.to_vec::<i64>()?, [2, 1]);
    // In place: float32.add_(float64) rounds into float32; int64.add_(2.5) is refused.
    let g = f.deep_clone()?;
    g.add_(&d)?;
    assert_eq!(
        (g.dtype(), g.to_vec::<f32>()?),
        (ScalarType::Float, vec![2.0, 4.0])
    );
    assert_eq!(
        l.add_scalar_(2.5).unwrap_err().to_string(),
        "add_: result type Float can't be cast to the desired output type Long"
    );
    Ok(())
}

/// Integer division and powers (torch 2.15.0).
#[test]
fn integer_division_and_powers() -> R {
    let a = i64s(&[-5, 5], &[2]);
    let b = i64s(&[2, -2], &[2]);
    // True division: -5 / -2 = 2.5 (float32); division by zero is inf.
    let q = i64s(&[-5], &[1]).div(&i64s(&[-2], &[1]))?;
    assert_eq!((q.dtype(), q.item::<f32>()?), (ScalarType::Float, 2.5));
    assert_eq!(
        i64s(&[1, 2], &[2]).div_scalar(0)?.to_vec::<f32>()?,
        [f32::INFINITY; 2]
    );
    // rounding_mode="trunc": [-2, -2]; "floor": [-3, -3]; floor_divide: [-3, -3] (int64).
    let t = a.div_rounding(&b, RoundingMode::Trunc)?;
    assert_eq!(
        (t.dtype(), t.to_vec::<i64>()?),
        (ScalarType::Long, vec![-2, -2])
    );
    assert_eq!(
        a.div_rounding(&b, RoundingMode::Floor)?.to_vec::<i64>()?,
        [-3, -3]
    );
    assert_eq!(a.floor_divide(&b)?.to_vec::<i64>()?, [-3, -3]);
    // Floats: floor(-7 / 2) = -4, 1 // 0 = inf, -0.0 // 3 = -0.0.
    let x = f32s(&[-7.0, 1.0, -0.0], &[3]);
    let y = f32s(&[2.0, 0.0, 3.0], &[3]);
    let fl = x.floor_divide(&y)?.to_vec::<f32>()?;
    assert_eq!(fl, [-4.0, f32::INFINITY, -0.0]);
    assert!(fl[2].is_sign_negative());
    // Integer division by zero is refused (torch: RuntimeError: ZeroDivisionError).
    let zero = i64s(&[1, 0], &[2]);
    assert_eq!(
        a.div_rounding(&zero, RoundingMode::Trunc)
            .unwrap_err()
            .to_string(),
        "div: ZeroDivisionError"
    );
    // int64 pow stays int64: [2, -3] ** [3, 3] = [8, -27]; negative exponents (powi).
    let p = i64s(&[2, -3], &[2]).pow(&i64s(&[3, 3], &[2]))?;
    assert_eq!(
        (p.dtype(), p.to_vec::<i64>()?),
        (ScalarType::Long, vec![8, -27])
    );
    let bases = i64s(&[1, -1, 2, 0], &[4]);
    assert_eq!(
        bases.pow(&i64s(&[-1, -3, -2, -1], &[4]))?.to_vec::<i64>()?,
        [1, -1, 0, 0]
    );
    assert_eq!(
        i64s(&[1, 2, 3], &[3]).pow_scalar(2)?.to_vec::<i64>()?,
        [1, 4, 9]
    );
    let root = i64s(&[1, 4], &[2]).pow_scalar(0.5)?;
    assert_eq!(
        (root.dtype(), root.to_vec::<f32>()?),
        (ScalarType::Float, vec![1.0, 2.0])
    );
    assert!(matches!(
        i64s(&[2], &[1]).pow_scalar(-1),
        Err(Error::InvalidArgument { op: "pow", .. })
    ));
    Ok(())
}

/// The layout of elementwise results, as TensorIterator (torch 2.15.0 strides).
#[test]
fn elementwise_results_follow_the_inputs_memory_order() -> R {
    let a = Tensor::arange(0.0, 12.0, 1.0, TensorOptions::new())?.view(&[3, 4])?;
    let at = a.t()?; // [4, 3], strides [1, 4]
    let row = Tensor::arange(0.0, 3.0, 1.0, TensorOptions::new())?;
    let col = Tensor::arange(0.0, 4.0, 1.0, TensorOptions::new())?.view(&[4, 1])?;
    let sliced = Tensor::arange(0.0, 24.0, 1.0, TensorOptions::new())?
        .view(&[4, 6])?
        .slice(1, None, None, 2)?;
    let permuted = Tensor::arange(0.0, 24.0, 1.0, TensorOptions::new())?
        .view(&[2, 3, 4])?
        .permute(&[2, 0, 1])?;
    let cases: Vec<(&str, Tensor, Vec<i64>)> = vec![
        ("exp(at)", at.exp()?, vec![1, 4]),
        ("at + at", at.add(&at)?, vec![1, 4]),
        ("at + 1", at.add_scalar(1)?, vec![1, 4]),
        ("at + row", at.add(&row)?, vec![1, 4]),
        ("at + col", at.add(&col)?, vec![1, 4]),
        (
            "at + at.contiguous()",
            at.add(&at.contiguous()?)?,
            vec![1, 4],
        ),
        (
            "at.contiguous() + at",
            at.contiguous()?.add(&at)?,
            vec![3, 1],
        ),
        ("exp(sliced)", sliced.exp()?, vec![3, 1]),
        ("exp(permuted)", permuted.exp()?, vec![1, 12, 4]),
        ("expand + at", row.expand(&[4, 3])?.add(&at)?, vec![1, 4]),
        (
            "at.long() / at.long()",
            {
                let l = at.to_dtype(ScalarType::Long)?;
                l.div(&l)?
            },
            vec![1, 4],
        ),
    ];
    for (what, t, strides) in cases {
        assert_eq!(t.strides(), strides.as_slice(), "{what}");
        assert_eq!(
            t.is_contiguous(),
            strides.windows(2).all(|w| w[0] >= w[1]),
            "{what}"
        );
    }
    // Values do not depend on the layout.
    assert_eq!(
        at.add(&at)?.to_vec::<f32>()?,
        at.contiguous()?.mul_scalar(2)?.to_vec::<f32>()?
    );
    Ok(())
}

/// Errors name the op the user called (torch 2.15.0 says `max(): Expected reduction dim to be
/// specified for input.numel() == 0...` and `IndexError: Target 7 is out of bounds.` from
/// `cross_entropy`).
#[test]
fn errors_name_the_op_called() -> R {
    let empty = Tensor::zeros(&[0], TensorOptions::new())?;
    assert_eq!(
        empty.max_all().unwrap_err().to_string(),
        "max: Expected reduction dim to be specified for input.numel() == 0. Specify the \
         reduction dim with the 'dim' argument."
    );
    assert!(
        empty
            .amax(&[0], false)
            .unwrap_err()
            .to_string()
            .starts_with("amax: ")
    );
    let logits = Tensor::zeros(&[2, 3], TensorOptions::new())?;
    assert_eq!(
        logits
            .cross_entropy(&i64s(&[7, 0], &[2]), Reduction::Mean)
            .unwrap_err()
            .to_string(),
        "cross_entropy: Target 7 is out of bounds."
    );
    assert!(matches!(
        i64s(&[1, 2], &[1, 2]).cross_entropy(&i64s(&[0], &[1]), Reduction::Mean),
        Err(Error::UnsupportedDtype {
            op: "cross_entropy",
            ..
        })
    ));
    assert!(matches!(
        logits.to_dtype(ScalarType::ComplexFloat),
        Err(Error::UnsupportedDtype { op: "to", .. })
    ));
    Ok(())
}

/// The differences aten keeps, each beside torch 2.15.0's value (x86 CPU).
#[test]
fn documented_differences_from_torch() -> R {
    // Float -> int out of range or NaN is undefined in C++: torch on x86 gives the INT_MIN of a
    // 32-bit intermediate (int8: -200.0 -> 56, NaN -> 0; int32: 2^31 + 5 and NaN ->
    // -2147483648) or of a 64-bit one (uint8: inf -> 0). aten saturates, NaN giving 0.
    let x = f32s(&[-200.0, f32::NAN], &[2]);
    assert_eq!(x.to_dtype(ScalarType::Char)?.to_vec::<i8>()?, [-128, 0]);
    let big = f32s(&[2_147_483_648.0, f32::NAN], &[2]);
    assert_eq!(
        big.to_dtype(ScalarType::Int)?.to_vec::<i32>()?,
        [i32::MAX, 0]
    );
    assert_eq!(
        f32s(&[f32::INFINITY], &[1])
            .to_dtype(ScalarType::Byte)?
            .to_vec::<u8>()?,
        [255]
    );
    // Half and BFloat16 arithmetic: torch computes half + half = [2., 4.] (float16); aten has
    // no kernels. Mixed with float32 they promote to float32 and work.
    let h = f32s(&[1.0, 2.0], &[2]).to_dtype(ScalarType::Half)?;
    assert!(matches!(
        h.add(&h),
        Err(Error::UnsupportedDtype {
            dtype: ScalarType::Half,
            ..
        })
    ));
    let hf = h.add(&f32s(&[1.0, 2.0], &[2]))?;
    assert_eq!(
        (hf.dtype(), hf.to_vec::<f32>()?),
        (ScalarType::Float, vec![2.0, 4.0])
    );
    // Integer matmul: torch gives [[14]] for [[1, 2, 3]] @ [[1], [2], [3]]; aten refuses.
    let m = i64s(&[1, 2, 3], &[1, 3]);
    assert!(matches!(
        m.mm(&m.t()?),
        Err(Error::UnsupportedDtype { op: "mm", .. })
    ));
    // K-dimensional cross_entropy ([N, C, d]): torch gives 2.6429314613342285 for
    // arange(12.).view(2, 3, 2) and targets [[0, 1], [2, 0]]; aten takes [N, C] or [C] only.
    let k = Tensor::arange(0.0, 12.0, 1.0, TensorOptions::new())?.view(&[2, 3, 2])?;
    assert!(matches!(
        k.cross_entropy(&i64s(&[0, 1, 2, 0], &[2, 2]), Reduction::Mean),
        Err(Error::InvalidArgument {
            op: "cross_entropy",
            ..
        })
    ));
    Ok(())
}
