//! Printing like PyTorch's `repr(tensor)` and the text of error messages, as insta snapshots.
//! The display snapshots were checked against PyTorch 2.x output for the same tensors.

use aten::{Reduction, RoundingMode, Tensor, TensorOptions};
use c10_core::{Bool, Device, ScalarType};
use half::f16;

fn show(cases: &[(&str, aten::Result<Tensor>)]) -> String {
    cases
        .iter()
        .map(|(code, t)| match t {
            Ok(t) => format!(">>> {code}\n{t}\n"),
            Err(e) => format!(">>> {code}\nerror: {e}\n"),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn f32s(v: &[f32], shape: &[i64]) -> aten::Result<Tensor> {
    Tensor::from_slice(v, shape)
}

#[test]
fn display_like_pytorch() {
    let opts = TensorOptions::new();
    let cases = [
        (
            "torch.tensor([[1., 2.], [3., 4.]])",
            f32s(&[1.0, 2.0, 3.0, 4.0], &[2, 2]),
        ),
        (
            "torch.tensor([0.1, 2.5], dtype=torch.float64)",
            Tensor::from_slice(&[0.1f64, 2.5], &[2]),
        ),
        (
            "torch.tensor([-1.5, 10.25, 0.])",
            f32s(&[-1.5, 10.25, 0.0], &[3]),
        ),
        ("torch.tensor([1e-5, 1.])", f32s(&[1e-5, 1.0], &[2])),
        ("torch.tensor([1e9, 1.])", f32s(&[1e9, 1.0], &[2])),
        (
            "torch.tensor([123456.789, 0.5])",
            f32s(&[123456.79, 0.5], &[2]),
        ),
        (
            "torch.tensor([nan, inf, -inf, 1.])",
            f32s(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.0], &[4]),
        ),
        ("torch.tensor([nan, 0.5])", f32s(&[f32::NAN, 0.5], &[2])),
        ("torch.zeros(3)", Tensor::zeros(&[3], opts)),
        (
            "torch.tensor([1, -20, 300])",
            Tensor::from_slice(&[1i64, -20, 300], &[3]),
        ),
        (
            "torch.tensor([1, 2], dtype=torch.int32)",
            Tensor::from_slice(&[1i32, 2], &[2]),
        ),
        (
            "torch.tensor([7], dtype=torch.uint8)",
            Tensor::from_slice(&[7u8], &[1]),
        ),
        (
            "torch.tensor([True, False])",
            Tensor::from_slice(&[Bool(1), Bool(0)], &[2]),
        ),
        ("torch.tensor(3.)", Tensor::scalar(3.0f32)),
        ("torch.tensor(0.5)", Tensor::scalar(0.5f32)),
        ("torch.tensor(7)", Tensor::scalar(7i64)),
        (
            "torch.tensor([1.5, 2.], dtype=torch.float16)",
            Tensor::from_slice(&[f16::from_f32(1.5), f16::from_f32(2.0)], &[2]),
        ),
        ("torch.tensor([])", Tensor::zeros(&[0], opts)),
        ("torch.zeros(0, 3)", Tensor::zeros(&[0, 3], opts)),
        (
            "torch.zeros(0, dtype=torch.int64)",
            Tensor::zeros(&[0], ScalarType::Long),
        ),
        (
            "torch.arange(24.).view(2, 3, 4)",
            Tensor::arange(0.0, 24.0, 1.0, opts).and_then(|t| t.view(&[2, 3, 4])),
        ),
        (
            "torch.arange(6.).view(2, 3).t()",
            Tensor::arange(0.0, 6.0, 1.0, opts).and_then(|t| t.view(&[2, 3])?.t()),
        ),
        ("torch.arange(30.)", Tensor::arange(0.0, 30.0, 1.0, opts)),
        (
            "torch.arange(30.) / 7",
            Tensor::arange(0.0, 30.0, 1.0, ScalarType::Double).and_then(|t| t.div_scalar(7.0)),
        ),
        (
            "torch.arange(2000.)",
            Tensor::arange(0.0, 2000.0, 1.0, opts),
        ),
        (
            "torch.arange(2000).view(40, 50)",
            Tensor::arange(0.0, 2000.0, 1.0, ScalarType::Long).and_then(|t| t.view(&[40, 50])),
        ),
        (
            "torch.ones(2, 1, 2, dtype=torch.int16)",
            Tensor::ones(&[2, 1, 2], ScalarType::Short),
        ),
    ];
    insta::assert_snapshot!(show(&cases));
}

#[test]
fn debug_equals_display() {
    let t = f32s(&[1.0, 2.0], &[2]).unwrap();
    assert_eq!(format!("{t:?}"), "tensor([1., 2.])");
    assert_eq!(format!("{t}"), format!("{t:?}"));
}

#[test]
fn error_messages() {
    let a = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let d = Tensor::ones(&[2, 3], ScalarType::Double).unwrap();
    let l = Tensor::ones(&[2], ScalarType::Long).unwrap();
    let b = Tensor::ones(&[2], ScalarType::Bool).unwrap();
    let errors: Vec<(&str, aten::Error)> = vec![
        (
            "a.add(&ones([4]))",
            a.add(&Tensor::ones(&[4], TensorOptions::new()).unwrap())
                .unwrap_err(),
        ),
        ("a.mm(&double.t())", a.mm(&d.t().unwrap()).unwrap_err()),
        ("a.to_vec::<f64>()", a.to_vec::<f64>().unwrap_err()),
        ("a.item::<i64>()", a.item::<i64>().unwrap_err()),
        ("a.item::<f32>()", a.item::<f32>().unwrap_err()),
        ("a.sum(&[2])", a.sum(&[2], false).unwrap_err()),
        ("a.transpose(0, -3)", a.transpose(0, -3).unwrap_err()),
        ("a.select(0, 5)", a.select(0, 5).unwrap_err()),
        (
            "scalar.select(0, 0)",
            Tensor::scalar(1.0f32).unwrap().select(0, 0).unwrap_err(),
        ),
        ("a.t().view([6])", a.t().unwrap().view(&[6]).unwrap_err()),
        ("a.view([4, -1])", a.view(&[4, -1]).unwrap_err()),
        ("a.view([-1, -1])", a.view(&[-1, -1]).unwrap_err()),
        ("a.narrow(1, 2, 2)", a.narrow(1, 2, 2).unwrap_err()),
        (
            "a.slice(1, None, None, 0)",
            a.slice(1, None, None, 0).unwrap_err(),
        ),
        ("a.expand([2, 4])", a.expand(&[2, 4]).unwrap_err()),
        ("a.expand([3])", a.expand(&[3]).unwrap_err()),
        ("a.permute([0, 0])", a.permute(&[0, 0]).unwrap_err()),
        ("a.permute([0])", a.permute(&[0]).unwrap_err()),
        ("a.flatten(1, 0)", a.flatten(1, 0).unwrap_err()),
        (
            "ones([2, 3, 4]).t()",
            Tensor::ones(&[2, 3, 4], TensorOptions::new())
                .unwrap()
                .t()
                .unwrap_err(),
        ),
        (
            "a.as_strided([3, 3], [3, 1], 0)",
            a.as_strided(&[3, 3], &[3, 1], None).unwrap_err(),
        ),
        (
            "a.as_strided([2], [-1], 0)",
            a.as_strided(&[2], &[-1], None).unwrap_err(),
        ),
        (
            "zeros([2, -3])",
            Tensor::zeros(&[2, -3], TensorOptions::new()).unwrap_err(),
        ),
        ("a.mm(&a)", a.mm(&a).unwrap_err()),
        (
            "a.matmul(&ones([4]))",
            a.matmul(&Tensor::ones(&[4], TensorOptions::new()).unwrap())
                .unwrap_err(),
        ),
        ("long.div_(&long)", l.div_(&l).unwrap_err()),
        ("long.add_scalar_(0.5)", l.add_scalar_(0.5).unwrap_err()),
        ("long.pow_scalar(-1)", l.pow_scalar(-1).unwrap_err()),
        (
            "long.div_rounding(&zeros, Trunc)",
            l.div_rounding(
                &Tensor::zeros(&[2], ScalarType::Long).unwrap(),
                RoundingMode::Trunc,
            )
            .unwrap_err(),
        ),
        ("bool.sub(&bool)", b.sub(&b).unwrap_err()),
        ("bool.sub(&long)", b.sub(&l).unwrap_err()),
        ("bool.neg()", b.neg().unwrap_err()),
        ("bool.relu()", b.relu().unwrap_err()),
        ("bool.pow(&bool)", b.pow(&b).unwrap_err()),
        ("long.gelu()", l.gelu().unwrap_err()),
        (
            "half.add(&half)",
            Tensor::ones(&[2], ScalarType::Half)
                .unwrap()
                .add(&Tensor::ones(&[2], ScalarType::Half).unwrap())
                .unwrap_err(),
        ),
        (
            "zeros([0]).max()",
            Tensor::zeros(&[0], TensorOptions::new())
                .unwrap()
                .max_all()
                .unwrap_err(),
        ),
        (
            "zeros([0, 2]).max_dim(0)",
            Tensor::zeros(&[0, 2], TensorOptions::new())
                .unwrap()
                .max_dim(0, false)
                .unwrap_err(),
        ),
        ("long.softmax(0)", l.softmax(0).unwrap_err()),
        (
            "long.cross_entropy(target)",
            l.view(&[1, 2])
                .unwrap()
                .cross_entropy(
                    &Tensor::zeros(&[1], ScalarType::Long).unwrap(),
                    Reduction::Mean,
                )
                .unwrap_err(),
        ),
        ("long.mean()", l.mean_all().unwrap_err()),
        (
            "a.select(0, 0).add_(&a)",
            a.select(0, 0).unwrap().add_(&a).unwrap_err(),
        ),
        ("sq.add_(&sq.t())", {
            let sq = Tensor::zeros(&[2, 2], TensorOptions::new()).unwrap();
            sq.add_(&sq.t().unwrap()).unwrap_err()
        }),
        (
            "expanded.fill_(1)",
            Tensor::zeros(&[1], TensorOptions::new())
                .unwrap()
                .expand(&[3])
                .unwrap()
                .fill_(1.0)
                .unwrap_err(),
        ),
        (
            "a.t().as_slice::<f32>()",
            a.t().unwrap().as_slice::<f32>().map(|_| ()).unwrap_err(),
        ),
        (
            "a.sync_copy_from_cpu(&[0f32; 5])",
            a.sync_copy_from_cpu(&[0f32; 5]).unwrap_err(),
        ),
        (
            "a.amax over an empty dim",
            Tensor::zeros(&[0, 2], TensorOptions::new())
                .unwrap()
                .amax(&[0], false)
                .unwrap_err(),
        ),
        (
            "a.cross_entropy(target 7)",
            a.cross_entropy(
                &Tensor::from_slice(&[7i64, 0], &[2]).unwrap(),
                Reduction::Mean,
            )
            .unwrap_err(),
        ),
        (
            "arange(0, 1, 0)",
            Tensor::arange(0.0, 1.0, 0.0, TensorOptions::new()).unwrap_err(),
        ),
        (
            "zeros on meta",
            Tensor::zeros(&[2], Device::meta()).unwrap_err(),
        ),
    ];
    let text: Vec<String> = errors
        .iter()
        .map(|(code, e)| format!("{code}\n    {e}"))
        .collect();
    insta::assert_snapshot!(text.join("\n"));
}
