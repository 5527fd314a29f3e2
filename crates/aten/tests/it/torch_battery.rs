//! The differential battery: every case of `tests/torch/battery.json`, whose expected values
//! real torch produced (`tests/torch/battery.py`; the file names the torch version, 2.15.0),
//! run through aten. Each case rebuilds its inputs with aten's view functions (transposed,
//! sliced, offset, expanded, permuted and `as_strided` layouts), runs the operation and compares
//! the result's dtype, shape and strides exactly and its values (integers, Bool, Half and
//! BFloat16 exactly; `float32` within `1.3e-6 * |torch| + 1e-6`, `float64` within
//! `1e-12 * |torch| + 1e-12`: torch computes `float32` softmax and GELU in `float32`, aten
//! accumulates in `float64`, so near cancellations torch is the less accurate one), or, where
//! torch raised, checks that aten returns an error that names the operation.
//!
//! To regenerate the fixture after changing the generator, see CONTRIBUTING.md ("The torch
//! battery"); CI needs no torch.

use aten::promotion::{Operand, promote_types, result_type};
use aten::{Reduction, RoundingMode, Scalar, Tensor};
use c10_core::{Bool, ScalarType};
use serde_json::Value;

const BATTERY: &str = include_str!("../torch/battery.json");

type Res<T> = std::result::Result<T, String>;

/// A JSON number (or "nan"/"inf"/"-inf", or a bool) as `f64`.
fn num(v: &Value) -> Res<f64> {
    match v {
        Value::Bool(b) => Ok(f64::from(u8::from(*b))),
        Value::Number(n) => n.as_f64().ok_or_else(|| format!("bad number {n}")),
        Value::String(s) => match s.as_str() {
            "nan" => Ok(f64::NAN),
            "inf" => Ok(f64::INFINITY),
            "-inf" => Ok(f64::NEG_INFINITY),
            other => Err(format!("bad value {other:?}")),
        },
        other => Err(format!("bad value {other}")),
    }
}

fn ints(v: &Value) -> Res<Vec<i64>> {
    v.as_array()
        .ok_or("expected a list")?
        .iter()
        .map(|x| {
            x.as_i64()
                .ok_or_else(|| format!("expected an integer, got {x}"))
        })
        .collect()
}

fn dtype(v: &Value) -> Res<ScalarType> {
    v.as_str()
        .ok_or("expected a dtype name")?
        .parse()
        .map_err(|e| format!("{e}"))
}

fn err(e: aten::Error) -> String {
    format!("aten error: {e}")
}

/// The input tensor a spec describes (`[dtype, base shape, base values, views]`): a contiguous
/// base, then the views.
fn build(spec: &[Value]) -> Res<Tensor> {
    let [dt, shape, data, views] = spec else {
        return Err(format!("a tensor argument has 4 fields, got {spec:?}"));
    };
    let dt = dtype(dt)?;
    let shape = ints(shape)?;
    let data: Vec<f64> = data
        .as_array()
        .ok_or("data")?
        .iter()
        .map(num)
        .collect::<Res<_>>()?;
    let base = match dt {
        ScalarType::Bool => {
            Tensor::from_vec(data.iter().map(|&v| Bool::from(v != 0.0)).collect(), &shape)
        }
        ScalarType::Float => Tensor::from_vec(data.iter().map(|&v| v as f32).collect(), &shape),
        ScalarType::Double => Tensor::from_vec(data, &shape),
        t if t.is_integral(false) => {
            Tensor::from_vec(data.iter().map(|&v| v as i64).collect(), &shape)
                .and_then(|l| l.to_dtype(t))
        }
        t => Tensor::from_vec(data, &shape).and_then(|d| d.to_dtype(t)),
    }
    .map_err(err)?;
    let mut t = base;
    for view in views.as_array().ok_or("views")? {
        let v = view.as_array().ok_or("view entry")?;
        let name = v[0].as_str().ok_or("view name")?;
        let i = |k: usize| v[k].as_i64().ok_or_else(|| format!("{name}: argument {k}"));
        t = match name {
            "permute" => t.permute(&ints(&v[1])?),
            "slice" => t.slice(i(1)?, Some(i(2)?), v[3].as_i64(), i(4)?),
            "narrow" => t.narrow(i(1)?, i(2)?, i(3)?),
            "expand" => t.expand(&ints(&v[1])?),
            "as_strided" => t.as_strided(&ints(&v[1])?, &ints(&v[2])?, Some(i(3)?)),
            "select" => t.select(i(1)?, i(2)?),
            "unsqueeze" => t.unsqueeze(i(1)?),
            other => return Err(format!("unknown view {other}")),
        }
        .map_err(err)?;
    }
    Ok(t)
}

/// An argument: a tensor or a scalar.
enum Arg {
    Tensor(Tensor),
    Scalar(Scalar),
}

/// A tensor argument (a list) or a scalar (`{"int": 2}`, `{"float": 2.5}`, `{"bool": true}`).
fn arg(spec: &Value) -> Res<Arg> {
    if let Some(list) = spec.as_array() {
        return build(list).map(Arg::Tensor);
    }
    let s = if let Some(v) = spec.get("int") {
        v.as_i64().map(Scalar::Int).ok_or("int scalar")?
    } else if let Some(v) = spec.get("float") {
        Scalar::Float(num(v)?)
    } else if let Some(v) = spec.get("bool") {
        v.as_bool().map(Scalar::Bool).ok_or("bool scalar")?
    } else {
        return Err(format!("bad argument {spec}"));
    };
    Ok(Arg::Scalar(s))
}

/// What aten returned for a case.
enum Outcome {
    Tensors(Vec<Tensor>),
    Dtype(ScalarType),
}

fn reduction(kw: &Value) -> Res<Reduction> {
    Ok(match kw["reduction"].as_str() {
        Some("none") => Reduction::None,
        Some("mean") => Reduction::Mean,
        Some("sum") => Reduction::Sum,
        other => return Err(format!("bad reduction {other:?}")),
    })
}

/// Runs a case's operation through aten.
fn run(op: &str, args: &[Arg], kw: &Value) -> Res<aten::Result<Outcome>> {
    let one = |r: aten::Result<Tensor>| r.map(|t| Outcome::Tensors(vec![t]));
    let kw_i = |k: &str| kw[k].as_i64().ok_or_else(|| format!("kwarg {k}"));
    let kw_b = |k: &str| kw[k].as_bool().ok_or_else(|| format!("kwarg {k}"));
    if op == "promote_types" {
        return Ok(Ok(Outcome::Dtype(promote_types(
            dtype(&kw["a"])?,
            dtype(&kw["b"])?,
        ))));
    }
    if op == "result_type" {
        let operands: Vec<Operand<'_>> = args
            .iter()
            .map(|a| match a {
                Arg::Tensor(t) => Operand::Tensor(t),
                Arg::Scalar(s) => Operand::Scalar(*s),
            })
            .collect();
        return Ok(Ok(Outcome::Dtype(result_type(&operands))));
    }
    let Some(Arg::Tensor(x)) = args.first() else {
        return Err(format!("{op}: the first argument must be a tensor"));
    };
    let rounding = match kw.get("rounding_mode").and_then(Value::as_str) {
        Some("trunc") => Some(RoundingMode::Trunc),
        Some("floor") => Some(RoundingMode::Floor),
        Some(other) => return Err(format!("bad rounding mode {other}")),
        None => None,
    };
    let in_place = |r: aten::Result<()>| r.map(|()| Outcome::Tensors(vec![x.clone()]));
    Ok(match (op, args.get(1)) {
        ("add", Some(Arg::Tensor(y))) => one(x.add(y)),
        ("add", Some(Arg::Scalar(s))) => one(x.add_scalar(*s)),
        ("sub", Some(Arg::Tensor(y))) => one(x.sub(y)),
        ("sub", Some(Arg::Scalar(s))) => one(x.sub_scalar(*s)),
        ("mul", Some(Arg::Tensor(y))) => one(x.mul(y)),
        ("mul", Some(Arg::Scalar(s))) => one(x.mul_scalar(*s)),
        ("div", Some(Arg::Tensor(y))) => one(match rounding {
            Some(mode) => x.div_rounding(y, mode),
            None => x.div(y),
        }),
        ("div", Some(Arg::Scalar(s))) => one(match rounding {
            Some(mode) => x.div_scalar_rounding(*s, mode),
            None => x.div_scalar(*s),
        }),
        ("floor_divide", Some(Arg::Tensor(y))) => one(x.floor_divide(y)),
        ("floor_divide", Some(Arg::Scalar(s))) => one(x.floor_divide_scalar(*s)),
        ("pow", Some(Arg::Tensor(y))) => one(x.pow(y)),
        ("pow", Some(Arg::Scalar(s))) => one(x.pow_scalar(*s)),
        ("threshold_backward", Some(Arg::Tensor(y))) => {
            one(x.threshold_backward(y, kw["threshold"].as_f64().ok_or("threshold")?))
        }
        ("add_", Some(Arg::Tensor(y))) => in_place(x.add_(y)),
        ("add_", Some(Arg::Scalar(s))) => in_place(x.add_scalar_(*s)),
        ("sub_", Some(Arg::Tensor(y))) => in_place(x.sub_(y)),
        ("sub_", Some(Arg::Scalar(s))) => in_place(x.sub_scalar_(*s)),
        ("mul_", Some(Arg::Tensor(y))) => in_place(x.mul_(y)),
        ("mul_", Some(Arg::Scalar(s))) => in_place(x.mul_scalar_(*s)),
        ("div_", Some(Arg::Tensor(y))) => in_place(x.div_(y)),
        ("div_", Some(Arg::Scalar(s))) => in_place(x.div_scalar_(*s)),
        ("relu_", None) => in_place(x.relu_()),
        ("neg", None) => one(x.neg()),
        ("exp", None) => one(x.exp()),
        ("log", None) => one(x.log()),
        ("sqrt", None) => one(x.sqrt()),
        ("relu", None) => one(x.relu()),
        ("sigmoid", None) => one(x.sigmoid()),
        ("tanh", None) => one(x.tanh()),
        ("gelu", None) => one(x.gelu()),
        ("to", None) => one(x.to_dtype(dtype(&kw["dtype"])?)),
        ("clone", None) => one(x.deep_clone()),
        ("contiguous", None) => one(x.contiguous()),
        ("sum" | "mean" | "amax", None) => {
            let dims = ints(&kw["dims"])?;
            let keep = kw_b("keepdim")?;
            one(match op {
                "sum" => x.sum(&dims, keep),
                "mean" => x.mean(&dims, keep),
                _ => x.amax(&dims, keep),
            })
        }
        ("max", None) => one(x.max_all()),
        ("max_dim", None) => x
            .max_dim(kw_i("dim")?, kw_b("keepdim")?)
            .map(|(v, i)| Outcome::Tensors(vec![v, i])),
        ("softmax", None) => one(x.softmax(kw_i("dim")?)),
        ("log_softmax", None) => one(x.log_softmax(kw_i("dim")?)),
        ("cross_entropy", Some(Arg::Tensor(t))) => one(x.cross_entropy(t, reduction(kw)?)),
        ("nll_loss", Some(Arg::Tensor(t))) => one(x.nll_loss(t, reduction(kw)?)),
        ("mm", Some(Arg::Tensor(y))) => one(x.mm(y)),
        ("bmm", Some(Arg::Tensor(y))) => one(x.bmm(y)),
        ("matmul", Some(Arg::Tensor(y))) => one(x.matmul(y)),
        _ => {
            return Err(format!(
                "the runner does not know op {op} with these arguments"
            ));
        }
    })
}

/// The name aten's error must carry for a case's operation.
fn op_name(op: &str) -> &str {
    match op {
        "max_dim" => "max",
        other => other,
    }
}

/// Our tensor's values as `f64`, in row-major order.
fn our_values(t: &Tensor) -> Res<Vec<f64>> {
    Ok(match t.dtype() {
        ScalarType::Bool => t
            .to_vec::<Bool>()
            .map_err(err)?
            .into_iter()
            .map(|b| f64::from(u8::from(b.get())))
            .collect(),
        d if d.is_integral(false) => t
            .to_dtype(ScalarType::Long)
            .and_then(|l| l.to_vec::<i64>())
            .map_err(err)?
            .into_iter()
            .map(|v| v as f64)
            .collect(),
        _ => t
            .to_dtype(ScalarType::Double)
            .and_then(|d| d.to_vec::<f64>())
            .map_err(err)?,
    })
}

/// The largest relative and absolute differences seen on floating results, per dtype, for the
/// report.
#[derive(Default)]
struct Stats {
    float: (f64, f64),
    double: (f64, f64),
}

fn compare(t: &Tensor, want: &Value, stats: &mut Stats) -> Res<()> {
    let Some([wd, ws, wst, wv]) = want.as_array().map(Vec::as_slice) else {
        return Err(format!("a result has 4 fields, got {want}"));
    };
    let wd = dtype(wd)?;
    if t.dtype() != wd {
        return Err(format!("dtype: ours {}, torch {}", t.dtype(), wd));
    }
    let (ws, wst) = (ints(ws)?, ints(wst)?);
    if t.sizes() != ws.as_slice() {
        return Err(format!("shape: ours {:?}, torch {ws:?}", t.sizes()));
    }
    if t.strides() != wst.as_slice() {
        return Err(format!("strides: ours {:?}, torch {wst:?}", t.strides()));
    }
    let ours = our_values(t)?;
    let theirs: Vec<f64> = wv
        .as_array()
        .ok_or("values")?
        .iter()
        .map(num)
        .collect::<Res<_>>()?;
    if ours.len() != theirs.len() {
        return Err(format!("{} values, torch {}", ours.len(), theirs.len()));
    }
    // torch.testing's idea of close, tighter: |ours - torch| <= rtol * |torch| + atol.
    let (rtol, atol) = match wd {
        ScalarType::Float => (1.3e-6, 1e-6),
        ScalarType::Double => (1e-12, 1e-12),
        _ => (0.0, 0.0),
    };
    for (k, (&o, &w)) in ours.iter().zip(&theirs).enumerate() {
        if o == w || (o.is_nan() && w.is_nan()) {
            continue;
        }
        let diff = (o - w).abs();
        if diff.is_nan() || diff > rtol * w.abs() + atol {
            return Err(format!("value {k}: ours {o}, torch {w}; ours {ours:?}"));
        }
        let worst = if wd == ScalarType::Float {
            &mut stats.float
        } else {
            &mut stats.double
        };
        worst.0 = worst.0.max(diff / w.abs().max(f64::MIN_POSITIVE));
        worst.1 = worst.1.max(diff);
    }
    Ok(())
}

/// Runs one case (`[op, args, kwargs, expect]`) and compares with torch's answer.
fn check(case: &Value, stats: &mut Stats) -> Res<()> {
    let Some([op, args, kwargs, expect]) = case.as_array().map(Vec::as_slice) else {
        return Err("a case has 4 fields".into());
    };
    let op = op.as_str().ok_or("op")?;
    let args: Vec<Arg> = args
        .as_array()
        .ok_or("args")?
        .iter()
        .map(arg)
        .collect::<Res<_>>()?;
    let outcome = run(op, &args, kwargs)?;
    if let Some(theirs) = expect.get("error") {
        return match outcome {
            Ok(_) => Err(format!("torch raised ({theirs}), aten did not")),
            Err(e) if e.to_string().contains(op_name(op)) => Ok(()),
            Err(e) => Err(format!("aten's error does not name `{}`: {e}", op_name(op))),
        };
    }
    match outcome.map_err(|e| format!("aten failed where torch did not: {e}"))? {
        Outcome::Dtype(d) => {
            let w = dtype(&expect["dtype"])?;
            if d == w {
                Ok(())
            } else {
                Err(format!("dtype: ours {d}, torch {w}"))
            }
        }
        Outcome::Tensors(ts) => {
            let wants = expect["outputs"].as_array().ok_or("outputs")?;
            if ts.len() != wants.len() {
                return Err(format!("{} outputs, torch {}", ts.len(), wants.len()));
            }
            for (i, (t, w)) in ts.iter().zip(wants).enumerate() {
                compare(t, w, stats).map_err(|e| format!("output {i}: {e}"))?;
            }
            Ok(())
        }
    }
}

#[test]
fn aten_agrees_with_torch_on_the_battery() {
    let root: Value = serde_json::from_str(BATTERY).expect("battery.json is valid JSON");
    let version = root["torch"].as_str().expect("the torch version");
    let cases = root["cases"].as_array().expect("cases");
    assert!(cases.len() > 500, "the battery has {} cases", cases.len());
    let mut stats = Stats::default();
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        if let Err(why) = check(case, &mut stats) {
            let short: String = case.to_string().chars().take(600).collect();
            failures.push(format!("case {i}: {why}\n    {short}"));
        }
    }
    println!(
        "{} cases against torch {version}; largest differences: float32 {:.1e} relative, {:.1e} \
         absolute; float64 {:.1e} relative, {:.1e} absolute",
        cases.len(),
        stats.float.0,
        stats.float.1,
        stats.double.0,
        stats.double.1
    );
    assert!(
        failures.is_empty(),
        "{} of {} cases disagree with torch {version}:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
