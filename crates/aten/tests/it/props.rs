//! Property tests: a chain of views equals the same chain on copies; composed views equal the
//! direct view; reshape round trips; strided offsets agree with `Layout::offset_of`.

use aten::layout::compute_stride;
use aten::{Layout, StridedIndex, Tensor};
use c10_core::ScalarType;
use proptest::prelude::*;

/// A tensor whose element values are their row-major indices.
fn iota(shape: &[i64]) -> Tensor {
    let n: i64 = shape.iter().product();
    Tensor::arange(0.0, n as f64, 1.0, ScalarType::Double)
        .unwrap()
        .view(shape)
        .unwrap()
}

fn shape_strategy() -> impl Strategy<Value = Vec<i64>> {
    prop::collection::vec(1i64..5, 1..5)
}

/// One view operation, its parameters drawn as fractions so they fit any shape.
#[derive(Clone, Debug)]
enum Op {
    Narrow(usize, f64, f64),
    Slice(usize, f64, i64),
    Select(usize, f64),
    Transpose(usize, usize),
    Unsqueeze(usize),
    Squeeze,
    ExpandOnes(i64),
    Flatten,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0usize..8, 0.0..1.0f64, 0.0..1.0f64).prop_map(|(d, s, l)| Op::Narrow(d, s, l)),
        (0usize..8, 0.0..1.0f64, 1i64..4).prop_map(|(d, s, k)| Op::Slice(d, s, k)),
        (0usize..8, 0.0..1.0f64).prop_map(|(d, i)| Op::Select(d, i)),
        (0usize..8, 0usize..8).prop_map(|(a, b)| Op::Transpose(a, b)),
        (0usize..8).prop_map(Op::Unsqueeze),
        Just(Op::Squeeze),
        (2i64..4).prop_map(Op::ExpandOnes),
        Just(Op::Flatten),
    ]
}

/// Applies `op` to `t` (skipping ops that do not fit, e.g. select on a 0-d tensor).
fn apply(t: &Tensor, op: &Op) -> Tensor {
    let n = t.dim();
    let pick = |d: usize| (d % n.max(1)) as i64;
    let r = match *op {
        _ if n == 0 && !matches!(op, Op::Unsqueeze(_)) => return t.clone(),
        Op::Narrow(d, s, l) => {
            let size = t.sizes()[pick(d) as usize];
            let start = (s * size as f64) as i64;
            let len = (l * (size - start + 1) as f64) as i64;
            t.narrow(pick(d), start, len.min(size - start))
        }
        Op::Slice(d, s, k) => {
            let size = t.sizes()[pick(d) as usize];
            t.slice(pick(d), Some((s * size as f64) as i64), None, k)
        }
        Op::Select(d, i) => {
            let size = t.sizes()[pick(d) as usize];
            if size == 0 {
                return t.clone();
            }
            t.select(pick(d), ((i * size as f64) as i64).min(size - 1))
        }
        Op::Transpose(a, b) => t.transpose(pick(a), pick(b)),
        Op::Unsqueeze(d) => t.unsqueeze((d % (n + 1)) as i64),
        Op::Squeeze => t.squeeze(),
        Op::ExpandOnes(k) => {
            let target: Vec<i64> = t
                .sizes()
                .iter()
                .map(|&s| if s == 1 { k } else { s })
                .collect();
            t.expand(&target)
        }
        Op::Flatten => t.flatten(0, -1),
    };
    r.unwrap()
}

/// 128 cases, or `PROPTEST_CASES` when set (`cargo xtask valgrind` asks for fewer).
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128);
    ProptestConfig::with_cases(cases)
}

proptest! {
    #![proptest_config(config())]

    /// Views over views read the same values as the same operations on fresh copies, share the
    /// storage, and can be rebuilt directly from the base with `as_strided`.
    #[test]
    fn view_chains_equal_copies(shape in shape_strategy(), ops in prop::collection::vec(op_strategy(), 1..6)) {
        let base = iota(&shape);
        let mut view = base.clone();
        let mut copy = base.deep_clone().unwrap();
        for op in &ops {
            view = apply(&view, op);
            copy = apply(&copy, op).deep_clone().unwrap();
        }
        prop_assert_eq!(view.sizes(), copy.sizes());
        prop_assert_eq!(view.to_vec::<f64>().unwrap(), copy.to_vec::<f64>().unwrap());
        prop_assert!(view.is_alias_of(&base) || view.numel() == 0 || ops.iter().any(|o| matches!(o, Op::Flatten)));
        if view.is_alias_of(&base) {
            let direct = base.as_strided(view.sizes(), view.strides(), Some(view.storage_offset())).unwrap();
            prop_assert_eq!(direct.to_vec::<f64>().unwrap(), view.to_vec::<f64>().unwrap());
        }
    }

    /// narrow(narrow) is one narrow; slice(slice) with steps is one slice with the product step.
    #[test]
    fn composed_views_equal_the_direct_view(
        size in 1i64..40, a in 0.0..1.0f64, b in 0.0..1.0f64, k1 in 1i64..4, k2 in 1i64..4,
    ) {
        let t = iota(&[size]);
        let s1 = (a * size as f64) as i64;
        let l1 = size - s1;
        let s2 = (b * l1 as f64) as i64;
        let l2 = l1 - s2;
        let twice = t.narrow(0, s1, l1).unwrap().narrow(0, s2, l2).unwrap();
        let once = t.narrow(0, s1 + s2, l2).unwrap();
        prop_assert_eq!((twice.sizes(), twice.strides(), twice.storage_offset()),
                        (once.sizes(), once.strides(), once.storage_offset()));
        let first = t.slice(0, Some(s1), None, k1).unwrap();
        let s2 = (b * first.sizes()[0] as f64) as i64;
        let twice = first.slice(0, Some(s2), None, k2).unwrap();
        let once = t.slice(0, Some(s1 + s2 * k1), None, k1 * k2).unwrap();
        prop_assert_eq!(twice.to_vec::<f64>().unwrap(), once.to_vec::<f64>().unwrap());
        prop_assert_eq!((twice.strides(), twice.storage_offset()), (once.strides(), once.storage_offset()));
    }

    /// reshape there and back gives the same values; it is a view exactly when computeStride
    /// finds strides.
    #[test]
    fn reshape_round_trips(shape in shape_strategy(), perm_seed in 0usize..24, split in 0usize..4) {
        let base = iota(&shape);
        let n = shape.len();
        let mut perm: Vec<i64> = (0..n as i64).collect();
        perm.rotate_left(perm_seed % n);
        if perm_seed % 2 == 1 { perm.reverse(); }
        let src = base.permute(&perm).unwrap();
        let numel = src.numel() as i64;
        // Some factorisation of numel: [d, numel / d] for a divisor d, or [numel].
        let divisors: Vec<i64> = (1..=numel).filter(|d| numel % d == 0).collect();
        let target = if split == 0 { vec![numel] } else {
            let d = divisors[split % divisors.len()];
            vec![d, numel / d]
        };
        let r = src.reshape(&target).unwrap();
        prop_assert_eq!(r.sizes(), &target[..]);
        prop_assert_eq!(r.is_alias_of(&base), compute_stride(src.sizes(), src.strides(), &target).is_some());
        prop_assert_eq!(r.to_vec::<f64>().unwrap(), src.contiguous().unwrap().to_vec::<f64>().unwrap());
        let back = r.reshape(src.sizes()).unwrap();
        prop_assert_eq!(back.to_vec::<f64>().unwrap(), src.to_vec::<f64>().unwrap());
    }

    /// StridedIndex visits every multi-index in row-major order at `offset_of`.
    #[test]
    fn strided_index_agrees_with_offset_of(shape in shape_strategy(), strides in prop::collection::vec(0i64..7, 4), offset in 0i64..5) {
        let strides = &strides[..shape.len()];
        let layout = Layout::new(&shape, strides, offset).unwrap();
        let mut index = vec![0i64; shape.len()];
        for got in StridedIndex::new(&layout) {
            prop_assert_eq!(Some(got), layout.offset_of(&index));
            for d in (0..shape.len()).rev() {
                index[d] += 1;
                if index[d] < shape[d] { break; }
                index[d] = 0;
            }
        }
    }

    /// Broadcast add agrees with an explicit expand of both operands.
    #[test]
    fn broadcast_equals_explicit_expand(shape in shape_strategy(), mask in prop::collection::vec(any::<bool>(), 4)) {
        let other: Vec<i64> = shape.iter().zip(&mask).map(|(&s, &m)| if m { 1 } else { s }).collect();
        let a = iota(&shape);
        let b = iota(&other).mul_scalar(10.0).unwrap();
        let c = a.add(&b).unwrap();
        let be = b.expand(&shape).unwrap().contiguous().unwrap();
        let want: Vec<f64> = a.to_vec::<f64>().unwrap().iter().zip(be.to_vec::<f64>().unwrap()).map(|(x, y)| x + y).collect();
        prop_assert_eq!(c.to_vec::<f64>().unwrap(), want);
    }
}
