//! Fuzzing the log reader and the simulator with mutated logs: any text gives a log or a
//! line-numbered error, and any log that parses runs to OK, OOM, THRASH or a line-numbered
//! error under every heuristic, never a panic, and never above its budget; and under a
//! device-memory budget every strategy keeps reserved bytes under the device's capacity.

use c10_cuda::config::AllocatorConfig;
use checkpoint::sim::{self, SimOptions};
use checkpoint::{AllocatorBackend, Heuristic, NullBackend, ReleasePolicy, log};
use proptest::prelude::*;

/// A seed log exercising every instruction: constants, copies, views, a multi-output call,
/// an in-place update of a view, COPY_FROM and releases.
const SEED: &str = r#"{"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}
{"INSTRUCTION":"CONSTANT","NAME":"x1"}
{"INSTRUCTION":"MEMORY","MEMORY":"64","NAME":"x1"}
{"DST":"x2","INSTRUCTION":"COPY","SRC":"x1"}
{"INSTRUCTION":"RELEASE","NAME":"x1"}
{"ARGS":["x2"],"INSTRUCTION":"CALL","NAME":"conv","RESULT":["x3"],"TIME":"100"}
{"INSTRUCTION":"MEMORY","MEMORY":"256","NAME":"x3"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"x3"}
{"ARGS":["x3","x2"],"INSTRUCTION":"CALL","NAME":"bn","RESULT":["x4","x5","x6"],"TIME":"40"}
{"INSTRUCTION":"MEMORY","MEMORY":"256","NAME":"x4"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"x4"}
{"INSTRUCTION":"MEMORY","MEMORY":"8","NAME":"x5"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"x5"}
{"INSTRUCTION":"MEMORY","MEMORY":"256","NAME":"x6"}
{"ALIAS":"0","INSTRUCTION":"ALIAS","NAME":"x6"}
{"ARGS":["x4"],"INSTRUCTION":"CALL","NAME":"view","RESULT":["x7"],"TIME":"3"}
{"INSTRUCTION":"MEMORY","MEMORY":"256","NAME":"x7"}
{"ALIAS":"0","INSTRUCTION":"ALIAS","NAME":"x7"}
{"ARGS":["x7"],"INSTRUCTION":"MUTATE","MUTATE":[0],"NAME":"relu_","TIME":"30"}
{"INSTRUCTION":"RELEASE","NAME":"x3"}
{"ARGS":["x7","x5"],"INSTRUCTION":"CALL","NAME":"mul","RESULT":["x8"],"TIME":"50"}
{"INSTRUCTION":"MEMORY","MEMORY":"256","NAME":"x8"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"x8"}
{"INSTRUCTION":"RELEASE","NAME":"x4"}
{"ANNOTATION":"BACKWARD","INSTRUCTION":"ANNOTATE"}
{"ARGS":["x8","x7"],"INSTRUCTION":"CALL","NAME":"mul_backward","RESULT":["x9"],"TIME":"70"}
{"INSTRUCTION":"MEMORY","MEMORY":"256","NAME":"x9"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"x9"}
{"DST":"x7","INSTRUCTION":"COPY_FROM","SRC":"x9"}
{"INSTRUCTION":"RELEASE","NAME":"x8"}
{"INSTRUCTION":"RELEASE","NAME":"x5"}
{"INSTRUCTION":"RELEASE","NAME":"x6"}
"#;

#[derive(Clone, Debug)]
enum Mutation {
    Delete(usize),
    Duplicate(usize),
    Swap(usize, usize),
    /// Replace the `k`-th quoted string of a line by `s`.
    Field(usize, usize, String),
    Truncate(usize, usize),
    Insert(usize, String),
    /// Set the `k`-th number-valued field (MEMORY, TIME, ALIAS) of a line.
    Number(usize, usize, i64),
    /// Replace the `k`-th name (`x..`) of a line by `x<n>`.
    Rename(usize, usize, u8),
    /// Move a line elsewhere.
    Move(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let word = prop_oneof![
        Just("x1".to_string()),
        Just("x9".to_string()),
        Just("x99".to_string()),
        Just("-1".to_string()),
        Just("0".to_string()),
        Just("5".to_string()),
        Just("18446744073709551616".to_string()),
        Just("CALL".to_string()),
        Just("MEMORY".to_string()),
        Just("ALIAS".to_string()),
        Just("RELEASE".to_string()),
        Just("COPY_FROM".to_string()),
        Just("MUTATE".to_string()),
        "[a-z0-9_]{0,6}",
    ];
    prop_oneof![
        1 => (0usize..40).prop_map(Mutation::Delete),
        1 => (0usize..40).prop_map(Mutation::Duplicate),
        1 => (0usize..40, 0usize..40).prop_map(|(a, b)| Mutation::Swap(a, b)),
        1 => (0usize..40, 0usize..12, word).prop_map(|(l, k, w)| Mutation::Field(l, k, w)),
        1 => (0usize..40, 0usize..80).prop_map(|(l, n)| Mutation::Truncate(l, n)),
        1 => (0usize..40, "\\PC{0,30}").prop_map(|(l, s)| Mutation::Insert(l, s)),
        5 => (0usize..40, 0usize..3, -2i64..600).prop_map(|(l, k, v)| Mutation::Number(l, k, v)),
        5 => (0usize..40, 0usize..4, 1u8..11).prop_map(|(l, k, n)| Mutation::Rename(l, k, n)),
        5 => (0usize..40, 0usize..40).prop_map(|(a, b)| Mutation::Move(a, b)),
    ]
}

fn apply(text: &str, muts: &[Mutation]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for m in muts {
        let n = lines.len().max(1);
        match m {
            Mutation::Delete(i) if !lines.is_empty() => {
                lines.remove(i % n);
            }
            Mutation::Duplicate(i) if !lines.is_empty() => {
                let l = lines[i % n].clone();
                lines.insert(i % n, l);
            }
            Mutation::Swap(a, b) if !lines.is_empty() => lines.swap(a % n, b % n),
            Mutation::Field(i, k, w) if !lines.is_empty() => {
                let l = &lines[i % n];
                let quotes: Vec<usize> = l.match_indices('"').map(|(p, _)| p).collect();
                let pairs = quotes.len() / 2;
                if pairs > 0 {
                    let j = k % pairs;
                    let (a, b) = (quotes[2 * j], quotes[2 * j + 1]);
                    lines[i % n] = format!("{}\"{}\"{}", &l[..a], w, &l[b + 1..]);
                }
            }
            Mutation::Truncate(i, c) if !lines.is_empty() => {
                let l = &lines[i % n];
                let cut = l.char_indices().nth(*c).map_or(l.len(), |(p, _)| p);
                lines[i % n] = l[..cut].to_string();
            }
            Mutation::Number(i, k, v) if !lines.is_empty() => {
                let l = &lines[i % n];
                let fields: Vec<usize> = ["\"MEMORY\":\"", "\"TIME\":\"", "\"ALIAS\":\""]
                    .iter()
                    .filter_map(|f| l.find(f).map(|p| p + f.len()))
                    .collect();
                if !fields.is_empty() {
                    let start = fields[k % fields.len()];
                    let end = start + l[start..].find('"').unwrap_or(0);
                    lines[i % n] = format!("{}{v}{}", &l[..start], &l[end..]);
                }
            }
            Mutation::Rename(i, k, to) if !lines.is_empty() => {
                let l = &lines[i % n];
                let names: Vec<usize> = l.match_indices("\"x").map(|(p, _)| p + 1).collect();
                if !names.is_empty() {
                    let start = names[k % names.len()];
                    let end = start + l[start..].find('"').unwrap_or(0);
                    lines[i % n] = format!("{}x{to}{}", &l[..start], &l[end..]);
                }
            }
            Mutation::Move(a, b) if !lines.is_empty() => {
                let l = lines.remove(a % n);
                let at = b % lines.len().max(1);
                lines.insert(at.min(lines.len()), l);
            }
            Mutation::Insert(i, s) => {
                let at = i % (lines.len() + 1);
                lines.insert(at, s.clone());
            }
            _ => {}
        }
    }
    lines.join("\n")
}

fn run_everything(text: &str) {
    let lg = match log::parse(text) {
        Ok(lg) => lg,
        Err(e) => {
            // Every error names its line, except a log with no instruction at all.
            assert!(
                e.line().is_some() || matches!(e, log::LogError::Empty),
                "parse errors name a line: {e}"
            );
            return;
        }
    };
    let base = match sim::baseline(&lg) {
        Ok(b) => b,
        Err(e) => {
            assert!(e.to_string().starts_with("line "), "{e}");
            return;
        }
    };
    for h in Heuristic::ALL {
        for ratio in [0.3, 0.6, 1.0] {
            for release in [
                ReleasePolicy::Eager,
                ReleasePolicy::Banish,
                ReleasePolicy::Keep,
            ] {
                let budget = (base.peak_bytes as f64 * ratio) as u64;
                let options = SimOptions {
                    budget: Some(budget),
                    heuristic: h,
                    release,
                    sampling: ratio == 0.6,
                    ignore_small_tensors: ratio == 0.3,
                    remat_limit_ns: Some(base.compute_ns),
                    ..SimOptions::default()
                };
                if let Ok((r, _)) = sim::run(&lg, &options, NullBackend) {
                    assert!(r.profile.peak_bytes <= budget, "{h} {ratio}: over budget");
                }
            }
        }
    }
    // Device budgets: one 2 MiB small segment, two, and room for many.
    for strategy in [
        checkpoint::Strategy::Callback,
        checkpoint::Strategy::Window,
        checkpoint::Strategy::WindowFirst,
    ] {
        for capacity in [2u64 << 20, 4 << 20, 64 << 20] {
            for in_place in [false, true] {
                let options = SimOptions {
                    strategy,
                    in_place,
                    remat_limit_ns: Some(base.compute_ns),
                    ..SimOptions::default()
                };
                let backend = AllocatorBackend::on_device(AllocatorConfig::default(), capacity)
                    .expect("allocator");
                if let Ok((_, b)) = sim::run(&lg, &options, backend) {
                    let a = b.report();
                    assert!(
                        a.peak_reserved_bytes <= capacity,
                        "{strategy} on {capacity}: reserved over the device"
                    );
                }
            }
        }
    }
}

#[test]
fn seed_log_runs() {
    let lg = log::parse(SEED).expect("the seed parses");
    let base = sim::baseline(&lg).expect("the seed runs");
    assert_eq!(base.compute_ns, 293);
    run_everything(SEED);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn mutated_logs_never_panic(muts in proptest::collection::vec(mutation(), 1..4)) {
        run_everything(&apply(SEED, &muts));
    }

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
        run_everything(&text);
    }
}
