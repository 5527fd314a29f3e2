//! `Display` and `Debug` like PyTorch's `repr(tensor)` (`torch/_tensor_str.py` with the default
//! print options: precision 4, threshold 1000, edgeitems 3, linewidth 80):
//!
//! ```text
//! tensor([[1., 2.],
//!         [3., 4.]])
//! tensor([0.1000, 2.5000], dtype=torch.float64)
//! tensor([1, 2, 3], device='sim:0')
//! ```
//!
//! Floats print in integer mode (`1.`), fixed mode (`0.1000`) or scientific mode
//! (`1.0000e+08`) chosen from the non-zero finite values exactly as `_Formatter` does; every
//! value is right-aligned to the widest. The dtype is named unless it is `float32`, `int64` or
//! `bool` (for an empty tensor, unless it is `float32`); the device unless it is the CPU. More
//! than 1000 elements are summarised with `...` (three items at each edge of each dimension).
//! A tensor whose bytes cannot be read (no GPU for a CUDA tensor) prints the reason instead of
//! its values.

use std::fmt;

use c10_core::{Device, ScalarType};

use crate::error::Result;
use crate::host::{self, Access};
use crate::scalar::{Elem, dispatch};
use crate::tensor::Tensor;

/// `torch._tensor_str.PRINT_OPTS` defaults.
const PRECISION: usize = 4;
const THRESHOLD: usize = 1000;
const EDGEITEMS: usize = 3;
const LINEWIDTH: usize = 80;

/// One element as Python sees it after `.tolist()`.
#[derive(Clone, Copy, Debug)]
enum Value {
    Float(f64),
    Int(i64),
    Bool(bool),
}

/// The elements in row-major order (half types widened, as `_tensor_str` calls `.float()`).
fn values(t: &Tensor) -> Result<Vec<Value>> {
    let host = if host::is_host_accessible(t) {
        t.clone()
    } else {
        t.to(Device::cpu())?
    };
    let access = Access::lock("print", &[&host], &[])?;
    let dtype = host.dtype();
    dispatch!(all, "print", dtype, |T| {
        let mut out = Vec::with_capacity(host.numel());
        access.src::<T>("print", &host)?.for_each(|v: T| {
            out.push(if dtype == ScalarType::Bool {
                Value::Bool(v.to_i64() != 0)
            } else if T::IS_FLOATING {
                Value::Float(v.to_f64())
            } else {
                Value::Int(v.to_i64())
            });
        });
        Ok(out)
    })
}

/// Python's `f"{v:.{p}f}"`: Rust's fixed formatting is also exact and round-half-even; only the
/// NaN spelling differs.
fn py_fixed(v: f64, precision: usize) -> String {
    if v.is_nan() {
        "nan".to_owned()
    } else {
        format!("{v:.precision$}")
    }
}

/// Python's `f"{v:.{p}e}"`: a signed, at least two-digit exponent (`1.0000e+08`).
fn py_sci(v: f64, precision: usize) -> String {
    if !v.is_finite() {
        return py_fixed(v, precision);
    }
    let s = format!("{v:.precision$e}");
    let (mantissa, exp) = s.split_once('e').expect("`{:e}` output has an exponent");
    let exp: i32 = exp.parse().expect("`{:e}` exponent is an integer");
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exp.unsigned_abs())
}

/// PyTorch's `_Formatter`: the mode and the width every element is padded to.
struct Formatter {
    floating: bool,
    int_mode: bool,
    sci_mode: bool,
    width: usize,
}

impl Formatter {
    fn new(floating: bool, sample: &[Value]) -> Formatter {
        let mut f = Formatter {
            floating,
            int_mode: true,
            sci_mode: false,
            width: 1,
        };
        if !floating {
            for v in sample {
                f.width = f.width.max(Formatter::plain(*v).len());
            }
            return f;
        }
        let finite: Vec<f64> = sample
            .iter()
            .filter_map(|v| match *v {
                Value::Float(x) if x.is_finite() && x != 0.0 => Some(x),
                _ => None,
            })
            .collect();
        if finite.is_empty() {
            return f;
        }
        let min = finite.iter().fold(f64::INFINITY, |m, x| m.min(x.abs()));
        let max = finite.iter().fold(0f64, |m, x| m.max(x.abs()));
        f.int_mode = finite.iter().all(|x| *x == x.ceil());
        if f.int_mode {
            if max / min > 1000.0 || max > 1.0e8 {
                f.sci_mode = true;
                for &x in &finite {
                    f.width = f.width.max(py_sci(x, PRECISION).len());
                }
            } else {
                for &x in &finite {
                    f.width = f.width.max(py_fixed(x, 0).len() + 1);
                }
            }
        } else if max / min > 1000.0 || max > 1.0e8 || min < 1.0e-4 {
            f.sci_mode = true;
            for &x in &finite {
                f.width = f.width.max(py_sci(x, PRECISION).len());
            }
        } else {
            for &x in &finite {
                f.width = f.width.max(py_fixed(x, PRECISION).len());
            }
        }
        f
    }

    /// Python's `f"{value}"` for ints and bools.
    fn plain(v: Value) -> String {
        match v {
            Value::Int(i) => i.to_string(),
            Value::Bool(b) => if b { "True" } else { "False" }.to_owned(),
            Value::Float(x) => py_fixed(x, PRECISION),
        }
    }

    fn format(&self, v: Value) -> String {
        let s = match v {
            Value::Float(x) if self.floating => {
                if self.sci_mode {
                    py_sci(x, PRECISION)
                } else if self.int_mode {
                    let mut s = py_fixed(x, 0);
                    if x.is_finite() {
                        s.push('.');
                    }
                    s
                } else {
                    py_fixed(x, PRECISION)
                }
            }
            other => Formatter::plain(other),
        };
        format!("{s:>width$}", width = self.width)
    }
}

/// `get_summarized_data`: the elements that remain visible after summarising (3 at each edge of
/// every dimension longer than 6).
fn summarized(data: &[Value], sizes: &[i64]) -> Vec<Value> {
    let Some((&first, rest)) = sizes.split_first() else {
        return data.to_vec();
    };
    let n = first as usize;
    let inner = data.len().checked_div(n).unwrap_or(0);
    let rows: Vec<usize> = if n > 2 * EDGEITEMS {
        (0..EDGEITEMS).chain(n - EDGEITEMS..n).collect()
    } else {
        (0..n).collect()
    };
    rows.into_iter()
        .flat_map(|i| summarized(&data[i * inner..(i + 1) * inner], rest))
        .collect()
}

/// `_tensor_str_with_formatter`.
fn tensor_str(
    data: &[Value],
    sizes: &[i64],
    indent: usize,
    summarize: bool,
    f: &Formatter,
) -> String {
    match sizes.len() {
        0 => f.format(data[0]),
        1 => vector_str(data, indent, summarize, f),
        dim => {
            let n = sizes[0] as usize;
            let inner = data.len() / n.max(1);
            let sub = |i: usize| {
                tensor_str(
                    &data[i * inner..(i + 1) * inner],
                    &sizes[1..],
                    indent + 1,
                    summarize,
                    f,
                )
            };
            let slices: Vec<String> = if summarize && n > 2 * EDGEITEMS {
                (0..EDGEITEMS)
                    .map(sub)
                    .chain(std::iter::once("...".to_owned()))
                    .chain((n - EDGEITEMS..n).map(sub))
                    .collect()
            } else {
                (0..n).map(sub).collect()
            };
            let sep = format!(",{}{}", "\n".repeat(dim - 1), " ".repeat(indent + 1));
            format!("[{}]", slices.join(&sep))
        }
    }
}

/// `_vector_str`.
fn vector_str(data: &[Value], indent: usize, summarize: bool, f: &Formatter) -> String {
    let element_length = f.width + 2;
    let per_line = (LINEWIDTH.saturating_sub(indent) / element_length).max(1);
    let items: Vec<String> = if summarize && data.len() > 2 * EDGEITEMS {
        let n = data.len();
        data[..EDGEITEMS]
            .iter()
            .map(|&v| f.format(v))
            .chain(std::iter::once(" ...".to_owned()))
            .chain(data[n - EDGEITEMS..].iter().map(|&v| f.format(v)))
            .collect()
    } else {
        data.iter().map(|&v| f.format(v)).collect()
    };
    let lines: Vec<String> = items.chunks(per_line).map(|line| line.join(", ")).collect();
    format!(
        "[{}]",
        lines.join(&format!(",\n{}", " ".repeat(indent + 1)))
    )
}

/// `_add_suffixes`: each suffix after `, ` on the last line, or on a new line when it would pass
/// the line width.
fn add_suffixes(body: String, suffixes: &[String], indent: usize) -> String {
    let mut out = body;
    // Python: len(s) - s.rfind("\n") + 1, with rfind giving -1 when there is no newline.
    let last_newline = out.rfind('\n').map_or(-1, |i| i as isize);
    let mut last_line_len = (out.len() as isize - last_newline + 1) as usize;
    for suffix in suffixes {
        if last_line_len + suffix.len() + 2 > LINEWIDTH {
            out.push_str(&format!(",\n{}{suffix}", " ".repeat(indent)));
            last_line_len = indent + suffix.len();
        } else {
            out.push_str(&format!(", {suffix}"));
            last_line_len += suffix.len() + 2;
        }
    }
    out.push(')');
    out
}

/// Python's `str(tuple(shape))`.
fn py_tuple(sizes: &[i64]) -> String {
    match sizes {
        [one] => format!("({one},)"),
        _ => {
            let items: Vec<String> = sizes.iter().map(i64::to_string).collect();
            format!("({})", items.join(", "))
        }
    }
}

/// `_str_intern` for a dense tensor.
fn repr(t: &Tensor) -> String {
    const PREFIX: &str = "tensor(";
    let indent = PREFIX.len();
    let mut suffixes = Vec::new();
    if !t.device().is_cpu() {
        suffixes.push(format!(
            "device='{}'",
            crate::device::normalize_device(t.device())
        ));
    }
    let dtype = t.dtype();
    let body = if t.numel() == 0 {
        if t.dim() != 1 {
            suffixes.push(format!("size={}", py_tuple(t.sizes())));
        }
        if dtype != ScalarType::Float {
            suffixes.push(format!("dtype=torch.{}", dtype.torch_name()));
        }
        "[]".to_owned()
    } else {
        if !matches!(
            dtype,
            ScalarType::Float | ScalarType::Long | ScalarType::Bool
        ) {
            suffixes.push(format!("dtype=torch.{}", dtype.torch_name()));
        }
        match values(t) {
            Ok(data) => {
                let summarize = t.numel() > THRESHOLD;
                let sample = if summarize {
                    summarized(&data, t.sizes())
                } else {
                    data.clone()
                };
                let f = Formatter::new(dtype.is_floating_point(), &sample);
                tensor_str(&data, t.sizes(), indent, summarize, &f)
            }
            Err(e) => format!("<values unavailable: {e}>"),
        }
    };
    add_suffixes(format!("{PREFIX}{body}"), &suffixes, indent)
}

impl fmt::Display for Tensor {
    /// PyTorch's `repr(t)` (see the [module docs](crate::display)).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&repr(self))
    }
}

impl fmt::Debug for Tensor {
    /// The same text as `Display`, as Python's `repr` and `str` of a tensor agree.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&repr(self))
    }
}
