//! Every CPU op against hand-computed or high-precision (`f64`) reference values, on
//! contiguous, transposed, sliced, offset and broadcast inputs, for `f32` and `f64` (and the
//! integer types where the op is defined).

use aten::{Error, Generator, Reduction, Tensor, TensorOptions};
use c10_core::ScalarType;

type R = aten::Result<()>;

const X: [f64; 6] = [0.5, -1.25, 2.0, 3.5, -0.75, 1.0];
const Y: [f64; 6] = [1.5, 2.0, -0.5, 0.25, 4.0, -2.0];

/// The values of a tensor as `f64`, whatever its floating dtype.
fn vals(t: &Tensor) -> Vec<f64> {
    t.to_dtype(ScalarType::Double)
        .unwrap()
        .to_vec::<f64>()
        .unwrap()
}

#[track_caller]
fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "lengths: got {got:?}, want {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= tol * (1.0 + w.abs());
        assert!(
            ok,
            "element {i}: got {g}, want {w} (tol {tol}); got {got:?}"
        );
    }
}

fn tol(dtype: ScalarType) -> f64 {
    if dtype == ScalarType::Double {
        1e-14
    } else {
        2e-6
    }
}

/// The logical 2x3 matrix `v` in four layouts: contiguous, transposed, column-sliced with step
/// 2, and narrowed at an offset.
fn layouts(v: &[f64; 6], dtype: ScalarType) -> Vec<(&'static str, Tensor)> {
    let mk = |data: Vec<f64>, shape: &[i64]| {
        Tensor::from_vec(data, shape)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    };
    let junk = 99.0;
    let transposed = vec![v[0], v[3], v[1], v[4], v[2], v[5]];
    let mut strided = Vec::new();
    for &x in v {
        strided.extend([x, junk]);
    }
    let offset = vec![junk, v[0], v[1], v[2], junk, v[3], v[4], v[5]];
    let out = vec![
        ("contiguous", mk(v.to_vec(), &[2, 3])),
        ("transposed", mk(transposed, &[3, 2]).t().unwrap()),
        (
            "sliced",
            mk(strided, &[2, 6]).slice(1, None, None, 2).unwrap(),
        ),
        ("offset", mk(offset, &[2, 4]).narrow(1, 1, 3).unwrap()),
    ];
    for (name, t) in &out {
        assert_close(&vals(t), v, 0.0);
        assert_eq!(t.sizes(), [2, 3], "{name}");
    }
    out
}

fn check_unary(op: impl Fn(&Tensor) -> aten::Result<Tensor>, reference: impl Fn(f64) -> f64) {
    for dtype in [ScalarType::Float, ScalarType::Double] {
        for (name, t) in layouts(&X, dtype) {
            let out = op(&t).unwrap();
            assert_eq!((out.sizes(), out.dtype()), (&[2, 3][..], dtype), "{name}");
            // TensorIterator's layout (torch 2.15.0): a transposed input stays transposed; the
            // sliced and offset inputs are not dense, so their results are contiguous.
            let strides: &[i64] = if name == "transposed" {
                &[1, 2]
            } else {
                &[3, 1]
            };
            assert_eq!(out.strides(), strides, "{name}");
            // The reference sees the input as stored (f32-rounded for Float).
            let want: Vec<f64> = vals(&t).into_iter().map(&reference).collect();
            println!("{name} {dtype}");
            assert_close(&vals(&out), &want, tol(dtype));
        }
        // A broadcast (stride-0) input: the row X[..3] repeated twice.
        let row = Tensor::from_vec(X[..3].to_vec(), &[1, 3])
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let expanded = row.expand(&[2, 3]).unwrap();
        let want: Vec<f64> = vals(&expanded).into_iter().map(&reference).collect();
        assert_close(&vals(&op(&expanded).unwrap()), &want, tol(dtype));
    }
}

#[test]
fn unary_float_ops_match_references() {
    check_unary(Tensor::exp, f64::exp);
    check_unary(|t| t.abs_log(), |x| x.abs().ln());
    check_unary(|t| t.abs_sqrt(), |x| x.abs().sqrt());
    check_unary(Tensor::neg, |x| -x);
    check_unary(Tensor::relu, |x| x.max(0.0));
    check_unary(Tensor::sigmoid, |x| 1.0 / (1.0 + (-x).exp()));
    check_unary(Tensor::tanh, f64::tanh);
    check_unary(|t| t.pow_scalar(2.0), |x| x * x);
    check_unary(|t| t.add_scalar(1.5), |x| x + 1.5);
    check_unary(|t| t.mul_scalar(-2.0), |x| x * -2.0);
    check_unary(|t| t.div_scalar(4.0), |x| x / 4.0);
    check_unary(|t| t.sub_scalar(0.5), |x| x - 0.5);
}

/// `|x|` first, so `log` and `sqrt` see positive inputs in every layout.
trait AbsThen {
    fn abs_log(&self) -> aten::Result<Tensor>;
    fn abs_sqrt(&self) -> aten::Result<Tensor>;
}

impl AbsThen for Tensor {
    fn abs_log(&self) -> aten::Result<Tensor> {
        self.mul(self)?.sqrt()?.log()
    }
    fn abs_sqrt(&self) -> aten::Result<Tensor> {
        self.mul(self)?.sqrt()?.sqrt()
    }
}

#[test]
fn known_values_of_transcendentals() -> R {
    let x = Tensor::from_vec(vec![1.0f64, -1.0, 2.0, 0.5, 0.0], &[5])?;
    // x * Phi(x), Phi the standard normal CDF.
    assert_close(
        &vals(&x.gelu()?),
        &[
            0.8413447460685429,
            -0.15865525393145707,
            1.9544997361036416,
            0.34573123063700656,
            0.0,
        ],
        1e-15,
    );
    assert_close(
        &vals(&x.sigmoid()?)[..2],
        &[0.7310585786300049, 0.2689414213699951],
        1e-15,
    );
    assert_close(&vals(&x.tanh()?)[3..4], &[0.46211715726000974], 1e-15);
    let p = Tensor::from_vec(vec![1.0f32, 2.0, 4.0, 0.0, -1.0], &[5])?;
    assert_close(&vals(&p.exp()?)[..1], &[std::f64::consts::E], 1e-7);
    assert_close(
        &vals(&p.log()?),
        &[
            0.0,
            std::f64::consts::LN_2,
            2.0 * std::f64::consts::LN_2,
            f64::NEG_INFINITY,
            f64::NAN,
        ],
        1e-7,
    );
    assert_close(
        &vals(&p.sqrt()?)[..3],
        &[1.0, std::f64::consts::SQRT_2, 2.0],
        1e-7,
    );
    assert_close(
        &vals(&p.gelu()?)[..2],
        &[0.8413447460685429, 1.9544997361036416],
        1e-6,
    );
    Ok(())
}

fn check_binary(
    op: impl Fn(&Tensor, &Tensor) -> aten::Result<Tensor>,
    reference: impl Fn(f64, f64) -> f64,
) {
    for dtype in [ScalarType::Float, ScalarType::Double] {
        let xs = layouts(&X, dtype);
        let ys = layouts(&Y, dtype);
        for (na, a) in &xs {
            for (nb, b) in &ys {
                let out = op(a, b).unwrap();
                let want: Vec<f64> = vals(a)
                    .into_iter()
                    .zip(vals(b))
                    .map(|(x, y)| reference(x, y))
                    .collect();
                println!("{na} op {nb} ({dtype})");
                assert_close(&vals(&out), &want, tol(dtype));
            }
            // Broadcast: a row [3], a column [2, 1] and a 0-d tensor.
            let a64 = vals(a);
            let row = Tensor::from_vec(vec![Y[0], Y[1], Y[2]], &[3])
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let col = Tensor::from_vec(vec![Y[3], Y[4]], &[2, 1])
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let scalar = Tensor::scalar(Y[5]).unwrap().to_dtype(dtype).unwrap();
            for (name, b, pick) in [
                ("row", &row, (|i: usize| i % 3) as fn(usize) -> usize),
                ("column", &col, |i: usize| i / 3),
                ("scalar", &scalar, |_| 0),
            ] {
                let b64 = vals(b);
                let want: Vec<f64> = (0..6).map(|i| reference(a64[i], b64[pick(i)])).collect();
                println!("{na} op {name} ({dtype})");
                assert_close(&vals(&op(a, b).unwrap()), &want, tol(dtype));
                // And with the broadcast operand on the left.
                let want: Vec<f64> = (0..6).map(|i| reference(b64[pick(i)], a64[i])).collect();
                assert_close(&vals(&op(b, a).unwrap()), &want, tol(dtype));
            }
        }
    }
}

#[test]
fn binary_ops_match_references() {
    check_binary(Tensor::add, |x, y| x + y);
    check_binary(Tensor::sub, |x, y| x - y);
    check_binary(Tensor::mul, |x, y| x * y);
    check_binary(Tensor::div, |x, y| x / y);
    check_binary(|a, b| a.abs_sqrt()?.pow(b), |x, y| x.abs().sqrt().powf(y));
    check_binary(
        |g, x| g.threshold_backward(x, 0.0),
        |g, x| if x <= 0.0 { 0.0 } else { g },
    );
    check_binary(
        |g, x| g.threshold_backward(x, 1.0),
        |g, x| if x <= 1.0 { 0.0 } else { g },
    );
}

#[test]
fn broadcast_output_shape() -> R {
    let a = Tensor::ones(&[2, 1, 3], TensorOptions::new())?;
    let b = Tensor::arange(0.0, 4.0, 1.0, TensorOptions::new())?.view(&[4, 1])?;
    let c = a.add(&b)?;
    assert_eq!(c.sizes(), [2, 4, 3]);
    assert_eq!(c.to_vec::<f32>()?[..6], [1.0, 1.0, 1.0, 2.0, 2.0, 2.0]);
    let e = Tensor::zeros(&[0, 3], TensorOptions::new())?;
    assert_eq!(
        e.add(&Tensor::ones(&[3], TensorOptions::new())?)?.sizes(),
        [0, 3]
    );
    Ok(())
}

#[test]
fn in_place_ops_match_out_of_place() -> R {
    for (name, a) in layouts(&X, ScalarType::Double) {
        let b = Tensor::from_vec(Y.to_vec(), &[2, 3])?;
        let want = vals(&a.add(&b)?.mul(&b)?.sub(&b)?.div(&b)?);
        a.add_(&b)?;
        a.mul_(&b)?;
        a.sub_(&b)?;
        a.div_(&b)?;
        println!("{name}");
        assert_close(&vals(&a), &want, 1e-15);
        a.relu_()?;
        assert!(vals(&a).iter().all(|&v| v >= 0.0));
    }
    Ok(())
}

#[test]
fn integer_ops_wrap_like_cpp() -> R {
    let a = Tensor::from_vec(vec![250u8, 3, 7], &[3])?;
    let b = Tensor::from_vec(vec![10u8, 5, 2], &[3])?;
    assert_eq!(a.add(&b)?.to_vec::<u8>()?, [4, 8, 9]);
    assert_eq!(a.sub(&b)?.to_vec::<u8>()?, [240, 254, 5]);
    assert_eq!(a.mul(&b)?.to_vec::<u8>()?, [196, 15, 14]);
    let i = Tensor::from_vec(vec![i32::MAX, -4, 0], &[3])?;
    // An integer scalar keeps the tensor's integer dtype (torch 2.15.0: int32 + 1 is int32).
    assert_eq!(i.add_scalar(1)?.to_vec::<i32>()?, [i32::MIN, -3, 1]);
    assert_eq!(i.neg()?.to_vec::<i32>()?, [-i32::MAX, 4, 0]);
    assert_eq!(i.relu()?.to_vec::<i32>()?, [i32::MAX, 0, 0]);
    let l = Tensor::from_vec(vec![1i64, 2, 3, 4, 5, 6], &[2, 3])?.t()?;
    assert_eq!(l.mul(&l)?.to_vec::<i64>()?, [1, 16, 4, 25, 9, 36]);
    let g = Tensor::from_vec(vec![5i16, 6], &[2])?;
    assert_eq!(
        g.threshold_backward(&Tensor::from_vec(vec![-1i16, 1], &[2])?, 0.0)?
            .to_vec::<i16>()?,
        [0, 6]
    );
    let c = Tensor::from_vec(vec![-128i8, 1], &[2])?;
    assert_eq!(c.neg()?.to_vec::<i8>()?, [-128, -1]);
    // uint8 + 300 wraps (torch 2.15.0: tensor([1, 2], dtype=uint8) + 300 is [45, 46]).
    let u = Tensor::from_vec(vec![1u8, 2], &[2])?;
    assert_eq!(u.add_scalar(300)?.to_vec::<u8>()?, [45, 46]);
    // Division, exp and a fractional scalar promote to Float (torch 2.15.0).
    let q = i.div(&i)?;
    assert_eq!(q.dtype(), ScalarType::Float);
    assert_eq!(q.to_vec::<f32>()?[..2], [1.0, 1.0]);
    assert!(q.to_vec::<f32>()?[2].is_nan());
    assert_eq!(i.exp()?.dtype(), ScalarType::Float);
    assert_eq!(
        i.add_scalar(0.5)?.to_vec::<f32>()?,
        [i32::MAX as f32 + 0.5, -3.5, 0.5]
    );
    assert!(matches!(
        i.add_scalar_(0.5),
        Err(Error::ResultTypeCast {
            op: "add_",
            result: ScalarType::Float,
            output: ScalarType::Int
        })
    ));
    Ok(())
}

#[test]
fn nan_propagation() -> R {
    let x = Tensor::from_vec(vec![f32::NAN, -1.0, 2.0], &[3])?;
    let r = x.relu()?.to_vec::<f32>()?;
    assert!(r[0].is_nan());
    assert_eq!(&r[1..], &[0.0, 2.0]);
    assert!(x.max_all()?.item::<f32>()?.is_nan());
    assert!(x.sum_all()?.item::<f32>()?.is_nan());
    let (v, i) = Tensor::from_vec(vec![1.0f32, f32::NAN, 5.0], &[3])?.max_dim(0, false)?;
    assert!(v.item::<f32>()?.is_nan());
    assert_eq!(i.item::<i64>()?, 1);
    Ok(())
}

#[test]
fn reductions_match_hand_computed_values() -> R {
    // X = [[0.5, -1.25, 2.0], [3.5, -0.75, 1.0]]
    for dtype in [ScalarType::Float, ScalarType::Double] {
        for (name, t) in layouts(&X, dtype) {
            println!("{name} {dtype}");
            let s0 = t.sum(&[0], false)?;
            assert_eq!((s0.sizes(), s0.dtype()), (&[3][..], dtype));
            assert_close(&vals(&s0), &[4.0, -2.0, 3.0], 0.0);
            let s1 = t.sum(&[-1], true)?;
            assert_eq!(s1.sizes(), [2, 1]);
            assert_close(&vals(&s1), &[1.25, 3.75], 0.0);
            assert_close(&vals(&t.sum(&[0, 1], false)?), &[5.0], 0.0);
            assert_eq!(t.sum_all()?.sizes(), [] as [i64; 0]);
            assert_eq!(t.sum(&[1, 0], true)?.sizes(), [1, 1]);
            assert_close(
                &vals(&t.mean(&[1], false)?),
                &[1.25 / 3.0, 1.25],
                tol(dtype),
            );
            assert_close(&vals(&t.mean(&[0], true)?), &[2.0, -1.0, 1.5], 0.0);
            assert_close(&vals(&t.mean_all()?), &[5.0 / 6.0], tol(dtype));
            assert_close(&vals(&t.amax(&[0], false)?), &[3.5, -0.75, 2.0], 0.0);
            assert_close(&vals(&t.amax(&[1], true)?), &[2.0, 3.5], 0.0);
            assert_close(&vals(&t.max_all()?), &[3.5], 0.0);
            let (v, i) = t.max_dim(1, false)?;
            assert_close(&vals(&v), &[2.0, 3.5], 0.0);
            assert_eq!(i.to_vec::<i64>()?, [2, 0]);
            let (v, i) = t.max_dim(0, true)?;
            assert_eq!(v.sizes(), [1, 3]);
            assert_close(&vals(&v), &[3.5, -0.75, 2.0], 0.0);
            assert_eq!(i.to_vec::<i64>()?, [1, 1, 0]);
        }
    }
    // Broadcast (expanded) input: every row is [1, 2, 3].
    let e = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3])?.expand(&[4, 3])?;
    assert_eq!(e.sum(&[0], false)?.to_vec::<f32>()?, [4.0, 8.0, 12.0]);
    assert_eq!(e.sum(&[], false)?.item::<f32>()?, 24.0);
    // Integer and bool sums are Long; the first maximum wins.
    let i = Tensor::from_vec(vec![3i32, 7, 7, -2], &[2, 2])?;
    let s = i.sum(&[1], false)?;
    assert_eq!(
        (s.dtype(), s.to_vec::<i64>()?),
        (ScalarType::Long, vec![10, 5])
    );
    assert_eq!(i.amax(&[0], false)?.to_vec::<i32>()?, [7, 7]);
    assert_eq!(i.flatten(0, 1)?.max_dim(0, false)?.1.item::<i64>()?, 1);
    let b = Tensor::from_vec(
        vec![c10_core::Bool(1), c10_core::Bool(0), c10_core::Bool(1)],
        &[3],
    )?;
    assert_eq!(b.sum_all()?.item::<i64>()?, 2);
    // Empty reductions: a sum is 0, a mean NaN, a max an error.
    let z = Tensor::zeros(&[0, 3], TensorOptions::new())?;
    assert_eq!(z.sum(&[0], false)?.to_vec::<f32>()?, [0.0; 3]);
    assert!(
        z.mean(&[0], false)?
            .to_vec::<f32>()?
            .iter()
            .all(|v| v.is_nan())
    );
    assert!(matches!(
        z.amax(&[0], false),
        Err(Error::InvalidArgument { .. })
    ));
    assert_eq!(z.amax(&[1], false)?.sizes(), [0]);
    assert!(matches!(
        i.mean(&[0], false),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        i.sum(&[0, -2], false),
        Err(Error::InvalidArgument { .. })
    ));
    // 0-d tensors reduce over dim 0 / -1 to themselves.
    let s = Tensor::scalar(2.5f64)?;
    assert_eq!(s.sum(&[0], true)?.item::<f64>()?, 2.5);
    assert_eq!(s.max_dim(-1, false)?.0.item::<f64>()?, 2.5);
    Ok(())
}

#[test]
fn float_sums_accumulate_in_double() -> R {
    // 1e8 + 1 + ... + 1 (1000 ones) - 1e8: float32 accumulation would lose every 1.
    let mut v = vec![1.0f32; 1002];
    v[0] = 1.0e8;
    v[1001] = -1.0e8;
    assert_eq!(
        Tensor::from_vec(v, &[1002])?.sum_all()?.item::<f32>()?,
        1000.0
    );
    Ok(())
}

/// `a @ b` in f64 with a plain triple loop (the reference), for row-major data.
fn naive_mm(a: &[f64], b: &[f64], n: usize, k: usize, m: usize) -> Vec<f64> {
    let mut c = vec![0.0; n * m];
    for i in 0..n {
        for j in 0..m {
            c[i * m + j] = (0..k).map(|p| a[i * k + p] * b[p * m + j]).sum();
        }
    }
    c
}

#[test]
fn mm_on_every_layout() -> R {
    // [[1, 2, 3], [4, 5, 6]] @ [[7, 8], [9, 10], [11, 12]] = [[58, 64], [139, 154]]
    let av = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let bv = [7.0, 9.0, 11.0, 8.0, 10.0, 12.0]; // B^T, so B = layouts(bv)^T
    for dtype in [ScalarType::Float, ScalarType::Double] {
        for (na, a) in layouts(&av, dtype) {
            for (nb, bt) in layouts(&bv, dtype) {
                let b = bt.t()?;
                println!("{na} @ {nb}^T ({dtype})");
                let c = a.mm(&b)?;
                assert_eq!((c.sizes(), c.dtype()), (&[2, 2][..], dtype));
                assert_close(&vals(&c), &[58.0, 64.0, 139.0, 154.0], 0.0);
                assert_close(&vals(&a.matmul(&b)?), &[58.0, 64.0, 139.0, 154.0], 0.0);
            }
        }
    }
    // Broadcast (stride-0) operands: a matrix of equal rows.
    let row = Tensor::from_vec(vec![1.0f64, 2.0, 3.0], &[1, 3])?.expand(&[2, 3])?;
    let b = Tensor::from_vec(vec![7.0f64, 8.0, 9.0, 10.0, 11.0, 12.0], &[3, 2])?;
    assert_close(&vals(&row.mm(&b)?), &[58.0, 64.0, 58.0, 64.0], 0.0);
    Ok(())
}

#[test]
fn mm_against_a_double_reference() -> R {
    let mut g = Generator::new(3);
    let (n, k, m) = (37, 64, 29);
    let a = Tensor::randn(&[n, k], &mut g, ScalarType::Double)?;
    let b = Tensor::randn(&[k, m], &mut g, ScalarType::Double)?;
    let want = naive_mm(&vals(&a), &vals(&b), n as usize, k as usize, m as usize);
    assert_close(&vals(&a.mm(&b)?), &want, 1e-12);
    let (af, bf) = (
        a.to_dtype(ScalarType::Float)?,
        b.to_dtype(ScalarType::Float)?,
    );
    let want = naive_mm(&vals(&af), &vals(&bf), n as usize, k as usize, m as usize);
    assert_close(&vals(&af.mm(&bf)?), &want, 1e-5);
    // The transposed product through strides equals the product of copies.
    let at = a.t()?.contiguous()?.t()?;
    assert_close(&vals(&at.mm(&b)?), &vals(&a.mm(&b)?), 1e-13);
    Ok(())
}

#[test]
fn bmm_and_matmul_rules() -> R {
    let mut g = Generator::new(11);
    let a = Tensor::randn(&[3, 4, 5], &mut g, ScalarType::Double)?;
    let b = Tensor::randn(&[3, 5, 2], &mut g, ScalarType::Double)?;
    let c = a.bmm(&b)?;
    assert_eq!(c.sizes(), [3, 4, 2]);
    for i in 0..3 {
        let want = a.select(0, i)?.mm(&b.select(0, i)?)?;
        assert_close(&vals(&c.select(0, i)?), &vals(&want), 1e-14);
    }
    // bmm on a transposed batch: [3, 5, 4] viewed as [3, 4, 5].
    let at = a.transpose(1, 2)?.contiguous()?.transpose(1, 2)?;
    assert_close(&vals(&at.bmm(&b)?), &vals(&c), 1e-14);
    // matmul: batch broadcasting [2, 1, 4, 5] @ [3, 5, 2] -> [2, 3, 4, 2].
    let a4 = Tensor::randn(&[2, 1, 4, 5], &mut g, ScalarType::Double)?;
    let m = a4.matmul(&b)?;
    assert_eq!(m.sizes(), [2, 3, 4, 2]);
    for i in 0..2 {
        for j in 0..3 {
            let want = a4.select(0, i)?.select(0, 0)?.mm(&b.select(0, j)?)?;
            assert_close(&vals(&m.select(0, i)?.select(0, j)?), &vals(&want), 1e-14);
        }
    }
    // [3, 4, 5] @ [5, 2]: the matrix broadcasts over the batch.
    let w = b.select(0, 1)?;
    let m = a.matmul(&w)?;
    assert_close(
        &vals(&m.select(0, 2)?),
        &vals(&a.select(0, 2)?.mm(&w)?),
        1e-14,
    );
    // 1-d rules: dot, matrix-vector, vector-matrix, batched vector.
    let v = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3])?;
    let u = Tensor::from_vec(vec![4.0f32, 5.0, 6.0], &[3])?;
    let dot = v.matmul(&u)?;
    assert_eq!((dot.sizes(), dot.item::<f32>()?), (&[][..], 32.0));
    let mat = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    let mv = mat.matmul(&v)?;
    assert_eq!(
        (mv.sizes(), mv.to_vec::<f32>()?),
        (&[2][..], vec![14.0, 32.0])
    );
    let vm = Tensor::from_vec(vec![1.0f32, 1.0], &[2])?.matmul(&mat)?;
    assert_eq!(
        (vm.sizes(), vm.to_vec::<f32>()?),
        (&[3][..], vec![5.0, 7.0, 9.0])
    );
    let batched = mat.unsqueeze(0)?.expand(&[4, 2, 3])?.matmul(&v)?;
    assert_eq!(
        (batched.sizes(), batched.to_vec::<f32>()?),
        (&[4, 2][..], [14.0, 32.0].repeat(4))
    );
    // Empty inner dimension: zeros.
    let z = Tensor::ones(&[2, 0], TensorOptions::new())?
        .mm(&Tensor::ones(&[0, 3], TensorOptions::new())?)?;
    assert_eq!(z.to_vec::<f32>()?, [0.0; 6]);
    // Errors.
    assert!(matches!(
        mat.mm(&mat),
        Err(Error::ShapeMismatch { op: "mm", .. })
    ));
    assert!(matches!(
        v.mm(&mat),
        Err(Error::InvalidArgument { op: "mm", .. })
    ));
    assert!(matches!(
        a.bmm(&a),
        Err(Error::ShapeMismatch { op: "bmm", .. })
    ));
    assert!(matches!(
        Tensor::scalar(1.0f32)?.matmul(&v),
        Err(Error::InvalidArgument { .. })
    ));
    let l = Tensor::from_vec(vec![1i64, 2], &[1, 2])?;
    assert!(matches!(
        l.mm(&l.t()?),
        Err(Error::UnsupportedDtype { op: "mm", .. })
    ));
    assert!(matches!(
        mat.mm(&mat.to_dtype(ScalarType::Double)?.t()?),
        Err(Error::DtypeMismatch { .. })
    ));
    Ok(())
}

#[test]
fn softmax_and_log_softmax() -> R {
    let p = [0.09003057317038046, 0.24472847105479767, 0.6652409557748219];
    let lp = [
        -2.4076059644443806,
        -1.4076059644443806,
        -0.4076059644443806,
    ];
    for dtype in [ScalarType::Float, ScalarType::Double] {
        let x = Tensor::from_vec(vec![1.0, 2.0, 3.0, 1001.0, 1002.0, 1003.0], &[2, 3])?
            .to_dtype(dtype)?;
        let t = tol(dtype) * 10.0;
        assert_close(&vals(&x.softmax(1)?), &[p, p].concat(), t);
        assert_close(&vals(&x.log_softmax(-1)?), &[lp, lp].concat(), t);
        // Along dim 0 of the transpose is along dim 1 of the original.
        let xt = x.t()?;
        let s = x.t()?.softmax(0)?;
        assert_eq!(s.sizes(), [3, 2]);
        assert_close(&vals(&s), &vals(&x.softmax(1)?.t()?), t);
        assert_close(&vals(&xt.log_softmax(0)?.t()?), &[lp, lp].concat(), t);
        // Along dim 0: pairs (1, 1001) -> (e^-1000 / (1 + e^-1000), ...) = (0, 1).
        assert_close(&vals(&x.softmax(0)?), &[0.0, 0.0, 0.0, 1.0, 1.0, 1.0], t);
        assert_close(&vals(&x.log_softmax(0)?)[..3], &[-1000.0; 3], t);
        // Rows sum to one on random input.
        let r = Tensor::randn(&[5, 7], &mut Generator::new(2), dtype)?.softmax(1)?;
        assert_close(&vals(&r.sum(&[1], false)?), &[1.0; 5], t);
    }
    let e = Tensor::from_vec(vec![f32::NEG_INFINITY, 0.0], &[2])?;
    assert_eq!(e.softmax(0)?.to_vec::<f32>()?, [0.0, 1.0]);
    assert_eq!(Tensor::scalar(5.0f32)?.softmax(0)?.item::<f32>()?, 1.0);
    assert!(matches!(
        Tensor::from_vec(vec![1i64], &[1])?.softmax(0),
        Err(Error::UnsupportedDtype { op: "softmax", .. })
    ));
    Ok(())
}

#[test]
fn cross_entropy_and_nll() -> R {
    let lp = [
        -2.4076059644443806,
        -1.4076059644443806,
        -0.4076059644443806,
    ];
    for dtype in [ScalarType::Float, ScalarType::Double] {
        let t = tol(dtype) * 10.0;
        let logits =
            Tensor::from_vec(vec![1.0, 2.0, 3.0, 1.0, 2.0, 3.0], &[2, 3])?.to_dtype(dtype)?;
        let target = Tensor::from_vec(vec![2i64, 0], &[2])?;
        let none = logits.cross_entropy(&target, Reduction::None)?;
        assert_eq!((none.sizes(), none.dtype()), (&[2][..], dtype));
        assert_close(&vals(&none), &[-lp[2], -lp[0]], t);
        assert_close(
            &vals(&logits.cross_entropy(&target, Reduction::Mean)?),
            &[-(lp[2] + lp[0]) / 2.0],
            t,
        );
        assert_close(
            &vals(&logits.cross_entropy(&target, Reduction::Sum)?),
            &[-(lp[2] + lp[0])],
            t,
        );
        // Transposed logits give the same loss.
        let lt = logits.t()?.contiguous()?.t()?;
        assert_close(
            &vals(&lt.cross_entropy(&target, Reduction::Mean)?),
            &[-(lp[2] + lp[0]) / 2.0],
            t,
        );
        // nll_loss on log-probabilities; ignore_index -100 is skipped by the mean.
        let ignored = Tensor::from_vec(vec![1i64, -100], &[2])?;
        let logp = logits.log_softmax(1)?;
        assert_close(
            &vals(&logp.nll_loss(&ignored, Reduction::Mean)?),
            &[-lp[1]],
            t,
        );
        assert_close(
            &vals(&logp.nll_loss(&ignored, Reduction::None)?),
            &[-lp[1], 0.0],
            t,
        );
        // One sample: [C] with a 0-d target.
        let one = logits.select(0, 0)?;
        assert_close(
            &vals(&one.cross_entropy(&Tensor::scalar(1i64)?, Reduction::Mean)?),
            &[-lp[1]],
            t,
        );
    }
    let logits = Tensor::zeros(&[2, 3], TensorOptions::new())?;
    let all_ignored = Tensor::from_vec(vec![-100i64, -100], &[2])?;
    assert!(
        logits
            .cross_entropy(&all_ignored, Reduction::Mean)?
            .item::<f32>()?
            .is_nan()
    );
    let bad = Tensor::from_vec(vec![3i64, 0], &[2])?;
    assert_eq!(
        logits
            .cross_entropy(&bad, Reduction::Mean)
            .unwrap_err()
            .to_string(),
        "cross_entropy: Target 3 is out of bounds."
    );
    assert_eq!(
        logits
            .log_softmax(1)?
            .nll_loss(&bad, Reduction::Mean)
            .unwrap_err()
            .to_string(),
        "nll_loss: Target 3 is out of bounds."
    );
    assert!(matches!(
        logits.cross_entropy(&Tensor::from_vec(vec![0i32, 0], &[2])?, Reduction::Mean),
        Err(Error::DtypeMismatch { .. })
    ));
    assert!(matches!(
        logits.cross_entropy(&Tensor::from_vec(vec![0i64; 3], &[3])?, Reduction::Mean),
        Err(Error::ShapeMismatch { .. })
    ));
    Ok(())
}

#[test]
fn binary_ops_check_dtype_and_shape() -> R {
    let a = Tensor::ones(&[2, 3], TensorOptions::new())?;
    let d = Tensor::ones(&[2, 3], ScalarType::Double)?;
    // float32 + float64 is float64 (torch 2.15.0).
    let sum = a.add(&d)?;
    assert_eq!(
        (sum.dtype(), sum.to_vec::<f64>()?),
        (ScalarType::Double, vec![2.0; 6])
    );
    assert!(matches!(
        a.mul(&Tensor::ones(&[4], TensorOptions::new())?),
        Err(Error::BroadcastMismatch { .. })
    ));
    assert!(matches!(
        a.select(0, 0)?.add_(&a),
        Err(Error::ShapeMismatch { op: "add_", .. })
    ));
    let h = Tensor::ones(&[2], ScalarType::Half)?;
    assert!(matches!(
        h.add(&h),
        Err(Error::UnsupportedDtype {
            dtype: ScalarType::Half,
            ..
        })
    ));
    Ok(())
}
