//! What a PyTorch user with an OOM asks of tensormem: the dump keeps the recorded stacks,
//! times and metadata; `--top` says who holds the memory; `advise` finds the setting and the
//! smallest device memory; `explain` says why an allocation failed; `--html` writes one
//! self-contained page. Text reports are insta snapshots; real snapshots come from
//! `../shared/data` (skipped with a message when absent, a failure under `CI=true`).

use crate::support;

use std::path::Path;

use crate::support::{
    Format, Scratch, shared_snapshot, stdout, success, synthetic_value, tensormem,
};
use serde_json::Value as Json;
use tensormem::load::load_path;
use tensormem_pickle::Value;

fn s(key: &str, v: Value) -> (Value, Value) {
    (Value::str(key), v)
}

/// The synthetic snapshot with a distinct stack, `compile_context` and `user_metadata` on
/// every entry, and `external_annotations`.
fn annotated_synthetic() -> Value {
    let v = synthetic_value(Format::MODERN);
    let top = v.as_dict().expect("a dict");
    let mut out = Vec::new();
    for (k, val) in top.iter() {
        let val = match k.as_str() {
            Some("device_traces") => {
                let trace = val.as_list().expect("list")[0].as_list().expect("list");
                let entries = trace
                    .iter()
                    .enumerate()
                    .map(|(i, e)| {
                        let mut pairs: Vec<(Value, Value)> = e
                            .as_dict()
                            .expect("dict")
                            .iter()
                            .filter(|(k, _)| k.as_str() != Some("frames"))
                            .cloned()
                            .collect();
                        let frames = Value::list(vec![
                            Value::dict(vec![
                                s("name", Value::str("at::empty")),
                                s("filename", Value::str("??")),
                                s("line", Value::Int(0)),
                            ]),
                            Value::dict(vec![
                                s("name", Value::str(&format!("layer{}", i % 3))),
                                s("filename", Value::str("/home/me/model.py")),
                                s("line", Value::Int(10 + (i % 3) as i64)),
                            ]),
                        ]);
                        pairs.push(s("frames", frames));
                        pairs.push(s("compile_context", Value::str(&format!("cc{i}"))));
                        pairs.push(s("user_metadata", Value::str(&format!("um{i}"))));
                        Value::dict(pairs)
                    })
                    .collect();
                Value::list(vec![Value::list(entries)])
            }
            Some("external_annotations") => Value::list(vec![Value::dict(vec![
                s("stage", Value::str("START")),
                s("name", Value::str("forward")),
                s("device", Value::Int(0)),
                s("time_us", Value::Int(1_700_000_000_000_000)),
            ])]),
            _ => val.clone(),
        };
        out.push((k.clone(), val));
    }
    Value::dict(out)
}

fn annotated_dir() -> Scratch {
    let dir = Scratch::new("annotated");
    dir.write(
        "annotated.pickle",
        &tensormem_pickle::encode(&annotated_synthetic()),
    );
    dir
}

/// (action, frames as strings, time, compile_context, user_metadata) of each `alloc`,
/// `free_requested` and `segment_alloc` entry.
type EntryFacts = (
    String,
    Vec<String>,
    Option<u64>,
    Option<String>,
    Option<String>,
);

fn facts(path: &Path, actions: &[&str]) -> Vec<EntryFacts> {
    let snap = load_path(path).expect("loads");
    snap.traces[0]
        .iter()
        .filter(|e| actions.contains(&e.action.as_str()))
        .map(|e| {
            (
                e.action.as_str().to_string(),
                e.frames
                    .iter()
                    .flat_map(|f| f.iter())
                    .map(tensormem::top_sites::format_frame)
                    .collect(),
                e.time_us,
                e.compile_context.clone(),
                e.user_metadata.clone(),
            )
        })
        .collect()
}

/// Dump -> reload: the frames, times, compile_context and user_metadata of every replayed
/// entry (allocations and frees; with parity also segment allocations), and the external
/// annotations, equal the input's.
fn assert_dump_keeps_what_the_input_carries(dir: &Path, file: &str, extra: &[&str]) {
    let mut args = vec!["replay", file, "--dump", "dump.pickle"];
    args.extend(extra);
    success(&tensormem(dir, &args));
    let actions: &[&str] = if extra.contains(&"--from-empty") {
        &["alloc", "free_requested"]
    } else {
        &["alloc", "free_requested", "segment_alloc"]
    };
    let input = facts(&dir.join(file), actions);
    let dumped = facts(&dir.join("dump.pickle"), actions);
    assert!(!input.is_empty());
    assert_eq!(dumped, input, "entry by entry");
    let annotations = |p: &Path| load_path(p).expect("loads").external_annotations;
    assert_eq!(
        annotations(&dir.join("dump.pickle")),
        annotations(&dir.join(file))
    );
}

#[test]
fn dump_keeps_frames_times_and_metadata_parity() {
    let dir = annotated_dir();
    assert_dump_keeps_what_the_input_carries(dir.path(), "annotated.pickle", &[]);
}

#[test]
fn dump_keeps_frames_times_and_metadata_from_empty() {
    let dir = annotated_dir();
    assert_dump_keeps_what_the_input_carries(dir.path(), "annotated.pickle", &["--from-empty"]);
}

/// A what-if replay under another setting still carries each allocation's recorded stack:
/// the n-th alloc of our dump has the n-th recorded alloc's frames and time, and blocks
/// allocated at the end carry their allocation's stack.
#[test]
fn a_what_if_dump_attaches_the_original_frames() {
    let dir = annotated_dir();
    success(&tensormem(
        dir.path(),
        &[
            "replay",
            "annotated.pickle",
            "--from-empty",
            "--alloc-conf",
            "expandable_segments:True",
            "--dump",
            "dump.pickle",
        ],
    ));
    let allocs = |p: &Path| -> Vec<EntryFacts> { facts(p, &["alloc"]) };
    assert_eq!(
        allocs(&dir.path().join("dump.pickle")),
        allocs(&dir.path().join("annotated.pickle"))
    );
    let dump = load_path(&dir.path().join("dump.pickle")).expect("loads");
    let held: Vec<_> = dump
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == c10_cuda::snapshot::BlockState::ActiveAllocated)
        .collect();
    assert!(!held.is_empty());
    assert!(
        held.iter().all(|b| b.frames.is_some()),
        "every held block has its stack"
    );
}

#[rstest::rstest]
#[case::gpt2small_with_compile_context("gpt2small_trainstep_steady.pickle")]
#[case::lm2_7b_with_annotations("lm2.7b_ctx128_trainstep_fp32.pickle")]
fn dump_of_a_shared_snapshot_keeps_what_it_carries(#[case] file: &str) {
    let Some(path) = shared_snapshot(file) else {
        return;
    };
    let dir = Scratch::new("dump-keeps");
    std::fs::copy(&path, dir.path().join(file)).expect("copy");
    assert_dump_keeps_what_the_input_carries(dir.path(), file, &[]);
}

/// A whole-job what-if replay places the blocks live before recording with our own decisions:
/// its dump (those blocks as the dump's start state, then our history) replays back under
/// the same setting with every decision identical.
#[test]
fn a_whole_job_dump_replays_back_with_full_parity() {
    let Some(path) = shared_snapshot("gpt2small_trainstep_steady.pickle") else {
        return;
    };
    let dir = Scratch::new("whole-job-dump");
    let conf = "max_split_size_mb:128";
    let text = success(&tensormem(
        dir.path(),
        &[
            "replay",
            path.to_str().unwrap(),
            "--from-empty",
            "--alloc-conf",
            conf,
            "--dump",
            "wj.pickle",
        ],
    ));
    assert!(text.contains("whole job: the 229 blocks"), "{text}");
    let back: Json = serde_json::from_str(&success(&tensormem(
        dir.path(),
        &["replay", "wj.pickle", "--alloc-conf", conf, "--json"],
    )))
    .expect("json");
    let p = &back["parity"];
    assert_eq!(p["alloc_address_match"], p["alloc_total"]);
    assert_eq!(p["segment_decision_match"], p["segment_decision_total"]);
    assert!(p["first_divergence"].is_null());
    assert_eq!(
        back["peak_reserved_bytes"],
        back["recorded_peak_reserved_bytes"]
    );
}

/// An expandable-segments what-if dump replays back with every decision identical. Its
/// segments grow by `segment_map` inside the trace, so what was mapped when recording began is
/// the dump's mapped bytes minus the trace's mappings, rebuilt by allocating the blocks live
/// then in address order under the setting (a plain imported segment cannot grow). Before,
/// the dump's whole segments were imported: 0 of 10 segment decisions on
/// lm_small_forward_from_empty (recorded peak 7.07 GiB for 3.54), 0 of 198 on gpt2small.
#[rstest::rstest]
#[case::from_empty("lm_small_forward_from_empty.pickle", 36, 10)]
#[case::with_a_start_state("gpt2small_trainstep_steady.pickle", 1721, 198)]
fn an_expandable_segments_dump_replays_back(
    #[case] file: &str,
    #[case] allocs: u64,
    #[case] decisions: u64,
) {
    let Some(path) = shared_snapshot(file) else {
        return;
    };
    let dir = Scratch::new("expandable-dump");
    let conf = "expandable_segments:True";
    success(&tensormem(
        dir.path(),
        &[
            "replay",
            path.to_str().unwrap(),
            "--from-empty",
            "--alloc-conf",
            conf,
            "--dump",
            "es.pickle",
        ],
    ));
    let back: Json = serde_json::from_str(&success(&tensormem(
        dir.path(),
        &["replay", "es.pickle", "--alloc-conf", conf, "--json"],
    )))
    .expect("json");
    let p = &back["parity"];
    assert_eq!(
        back["peak_reserved_bytes"], back["recorded_peak_reserved_bytes"],
        "{file}: the mapped bytes are counted once"
    );
    assert_eq!(
        (p["alloc_address_match"].as_u64(), p["alloc_total"].as_u64()),
        (Some(allocs), Some(allocs)),
        "{file}"
    );
    assert_eq!(
        (
            p["segment_decision_match"].as_u64(),
            p["segment_decision_total"].as_u64()
        ),
        (Some(decisions), Some(decisions)),
        "{file}"
    );
    assert!(p["first_divergence"].is_null(), "{file}: {p}");
}

// ---------------------------------------------------------------------------------------------
// --top

#[test]
fn top_sites_text_and_json() {
    let dir = annotated_dir();
    let text = success(&tensormem(
        dir.path(),
        &[
            "replay",
            "annotated.pickle",
            "--top",
            "3",
            "--from-empty",
            "--sweep",
        ],
    ));
    insta::assert_snapshot!("top_sites_synthetic", text);
    let doc: Json = serde_json::from_str(&success(&tensormem(
        dir.path(),
        &["replay", "annotated.pickle", "--top", "2", "--json"],
    )))
    .expect("json");
    let sites = doc["top_sites"].as_array().expect("top_sites is a list");
    assert_eq!(sites.len(), 2);
    for s in sites {
        let keys: Vec<&str> = s
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, ["bytes", "count", "site"]);
    }
    let bytes: Vec<u64> = sites.iter().map(|s| s["bytes"].as_u64().unwrap()).collect();
    assert!(bytes[0] >= bytes[1], "largest first: {bytes:?}");
    assert!(doc["top_sites_at_end"].is_array());
    // The sites sum to the live requested bytes: at the end of the synthetic history the
    // allocations 600 + 4096 + 2 MiB + 5 MiB are live (the 40 MiB one was freed).
    let at_end: u64 = doc["top_sites_at_end"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["bytes"].as_u64().unwrap())
        .sum();
    let full: Json = serde_json::from_str(&success(&tensormem(
        dir.path(),
        &["replay", "annotated.pickle", "--top", "100", "--json"],
    )))
    .expect("json");
    let all_end: u64 = full["top_sites_at_end"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["bytes"].as_u64().unwrap())
        .sum();
    assert!(at_end <= all_end);
    assert_eq!(all_end, 600 + 4096 + (2 << 20) + (5 << 20));
    // With --stack each site carries its stack.
    let doc: Json = serde_json::from_str(&success(&tensormem(
        dir.path(),
        &[
            "replay",
            "annotated.pickle",
            "--top",
            "1",
            "--stack",
            "--json",
        ],
    )))
    .expect("json");
    assert_eq!(
        doc["top_sites"][0]["stack"].as_array().map(Vec::len),
        Some(2)
    );
}

#[test]
fn top_sites_on_a_shared_snapshot() {
    let Some(path) = shared_snapshot("lm2.7b_ctx128_trainstep_fp32.pickle") else {
        return;
    };
    let dir = Scratch::new("top-shared");
    let text = success(&tensormem(
        dir.path(),
        &["replay", path.to_str().unwrap(), "--top", "5"],
    ));
    let start = text.find("\nTop call sites").expect("a top-sites section");
    let end = text.find("\nmemory_summary()").expect("then the summaries");
    insta::assert_snapshot!("top_sites_lm2.7b_trainstep", &text[start..end]);
}

// ---------------------------------------------------------------------------------------------
// advise and explain on every shared snapshot

const SHARED: [&str; 9] = [
    "diffusion_eval_state.pickle",
    "expandable_segments_state.pickle",
    "gpt2small_trainstep_steady.pickle",
    "lm2.7b_ctx128_forward_fp32.pickle",
    "lm2.7b_ctx128_trainstep_fp32.pickle",
    "lm2.7b_ctx512_forward_bf16.pickle",
    "lm_small_forward_bf16.pickle",
    "lm_small_forward_from_empty.pickle",
    "opt1.3b_inference_at_oom_state.pickle",
];

/// Runs `tensormem <command> FILE` in the shared folder (so reports name the file alone);
/// stdout, or the error line for a failure.
fn on_shared(command: &str, file: &str, extra: &[&str]) -> Option<String> {
    let path = shared_snapshot(file)?;
    let dir = path.parent().expect("a folder");
    let mut args = vec![command, file];
    args.extend(extra);
    let o = tensormem(dir, &args);
    Some(if o.status.success() {
        stdout(&o)
    } else {
        support::stderr(&o)
    })
}

/// advise on every shared snapshot (insta snapshots of the text), and the claim behind each
/// best setting: a full replay of the whole job (start state, then history) under it on the
/// device memory it states completes with 0 OOMs, and 4 MiB less runs out.
#[test]
fn advise_on_every_shared_snapshot() {
    use tensormem::advise::{AdviseOptions, advise};
    use tensormem::replay::{ReplayOptions, replay};
    for file in SHARED {
        let Some(path) = shared_snapshot(file) else {
            return;
        };
        let snap = load_path(&path).expect("loads");
        let advice = match advise(&snap, file, &AdviseOptions::default()) {
            Ok(a) => a,
            Err(e) => {
                insta::assert_snapshot!(format!("advise_{file}"), format!("tensormem: error: {e}"));
                continue;
            }
        };
        let text = advice.text();
        insta::assert_snapshot!(format!("advise_{file}"), text);
        let best = &advice.candidates[0];
        // A win that needs free-and-retry at its edge says so.
        if best.retries_at_min_device_memory > Some(0) {
            assert!(
                text.contains("it relies on PyTorch's free-the-cache-and-retry path"),
                "{file}: {text}"
            );
        }
        let min = best.min_device_memory_bytes.expect("the best fits");
        let config = best.alloc_conf.clone()
            + &best.memory_fraction.map_or(String::new(), |f| {
                format!(",per_process_memory_fraction:{f:?}")
            });
        let config: c10_cuda::config::AllocatorConfig =
            config.trim_start_matches(',').parse().expect("valid");
        let run = |capacity: u64| {
            let opts = ReplayOptions::new(config.clone(), capacity as usize, true);
            replay(&snap, advice.device, &opts, &mut |_, _| {}).expect("replays")
        };
        let at_min = run(min);
        assert_eq!(
            (at_min.failed_allocs, at_min.ooms),
            (0, 0),
            "{file}: {} on {min}",
            best.config
        );
        assert_eq!(at_min.start_blocks, advice.start_blocks, "{file}");
        assert!(
            run(min - (4 << 20)).failed_allocs > 0,
            "{file}: {}",
            best.config
        );
        assert!(min >= advice.lower_bound_bytes, "{file}");
    }
}

#[test]
fn explain_on_every_shared_snapshot() {
    for file in SHARED {
        let Some(text) = on_shared("explain", file, &[]) else {
            return;
        };
        insta::assert_snapshot!(format!("explain_{file}"), text);
    }
}

/// On lm2.7b_ctx128_trainstep_fp32, 324 blocks (12.69 GiB) stay live from before recording to
/// the end: advise counts them (its lower bound is the parity replay's peak of live bytes,
/// 51.04 GiB), so on a 40 GiB device no setting fits, where the history alone (38.35 GiB) made
/// 19 of 26 settings look as if they did (PyTorch's default among them: its history-only replay
/// completes on 40 GiB); `--history-only` still gives the old figures, and says what it leaves
/// out.
#[test]
fn advise_counts_the_blocks_live_before_recording_on_lm2_7b() {
    use tensormem::advise::{AdviseOptions, advise};
    use tensormem::replay::{ReplayOptions, replay};
    let file = "lm2.7b_ctx128_trainstep_fp32.pickle";
    let Some(parity) = on_shared("replay", file, &["--json"]) else {
        return;
    };
    let parity: Json = serde_json::from_str(&parity).expect("json");
    let live_peak = parity["lower_bound_bytes"].as_u64().unwrap();
    assert_eq!(c10_cuda::summary::format_size(live_peak), "51.04 GiB");
    let snap = load_path(&shared_snapshot(file).expect("present")).expect("loads");
    let opts = AdviseOptions {
        device_memory: Some(40 << 30),
        ..AdviseOptions::default()
    };
    let advice = advise(&snap, file, &opts).expect("advises");
    let whole = serde_json::to_value(&advice).expect("json");
    assert_eq!(whole["mode"], "whole job");
    assert_eq!(whole["lower_bound_bytes"].as_u64(), Some(live_peak));
    assert_eq!(whole["start_blocks"], 324);
    assert_eq!(
        c10_cuda::summary::format_size(whole["start_bytes"].as_u64().unwrap()),
        "12.69 GiB"
    );
    let cands = whole["candidates"].as_array().unwrap();
    assert!(
        cands
            .iter()
            .all(|c| c["fits"] == false && c["failed_allocs"].as_u64() > Some(0))
    );
    let text = advice.text();
    assert!(
        text.contains("No setting runs the whole job without OOM on the device memory 40.00 GiB"),
        "{text}"
    );
    assert!(!text.contains("export PYTORCH_CUDA_ALLOC_CONF"), "{text}");
    insta::assert_snapshot!("advise_lm2.7b_trainstep_on_40gib", text);
    // The history alone, PyTorch's default on 40 GiB: it completes, over the old lower bound.
    let old = replay(
        &snap,
        0,
        &ReplayOptions {
            history_only: true,
            ..ReplayOptions::new(Default::default(), 40 << 30, true)
        },
        &mut |_, _| {},
    )
    .expect("replays");
    assert_eq!(old.failed_allocs, 0);
    assert_eq!(c10_cuda::summary::format_size(old.lower_bound), "38.35 GiB");
    let table = tensormem::report::sweep_table(std::slice::from_ref(&old), 40 << 30);
    assert!(
        table.contains("history only (--history-only): the 324 blocks (12.69 GiB) live when recording began are left out"),
        "{table}"
    );
}

/// The advise JSON schema, and its invariants: best first, every smallest device memory at or
/// above the live-bytes lower bound, and the default among the candidates.
#[test]
fn advise_json_schema_and_invariants() {
    let dir = annotated_dir();
    let o = tensormem(
        dir.path(),
        &[
            "advise",
            "annotated.pickle",
            "--json",
            "--device-memory",
            "64MiB",
        ],
    );
    let doc: Json = serde_json::from_str(&stdout(&o)).expect("json");
    let fitting = doc["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["fits"] == true)
        .count();
    // Exit status 0 exactly when some setting fits (1 when none does).
    assert_eq!(
        o.status.code(),
        Some(i32::from(fitting == 0)),
        "{fitting} fit"
    );
    // On 64 MiB (a 47 MiB lower bound) all but one fit: both kinds of rows are checked.
    assert_eq!(fitting, doc["candidates"].as_array().unwrap().len() - 1);
    let top: Vec<&str> = doc
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        top,
        [
            "candidates",
            "device",
            "device_memory_bytes",
            "events",
            "file",
            "left_out",
            "lower_bound_bytes",
            "mode",
            "replays",
            "start_blocks",
            "start_bytes"
        ]
    );
    assert_eq!(doc["mode"], "whole job");
    assert!(doc["left_out"].is_null());
    assert_eq!(doc["device_memory_bytes"], 64 << 20);
    let lower = doc["lower_bound_bytes"].as_u64().unwrap();
    let cands = doc["candidates"].as_array().unwrap();
    assert!(cands.len() >= 25);
    let keys: Vec<&str> = cands[0]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "alloc_conf",
            "apply",
            "config",
            "device_mallocs",
            "failed_allocs",
            "fits",
            "fragmentation",
            "memory_fraction",
            "min_device_memory_bytes",
            "num_alloc_retries",
            "peak_allocated_bytes",
            "peak_reserved_bytes",
            "retries_at_min_device_memory",
            "retry_free_device_memory_bytes"
        ]
    );
    let mut seen_misfit = false;
    let mut last_min = 0;
    for c in cands {
        if c["fits"] == true {
            assert!(!seen_misfit, "settings that fit come first");
            let min = c["min_device_memory_bytes"].as_u64().unwrap();
            assert!(min >= lower, "{c}");
            assert!(min <= 64 << 20, "{c}");
            assert_eq!(min % (2 << 20), 0);
            assert!(min >= last_min, "ranked by the smallest device memory: {c}");
            last_min = min;
        } else {
            seen_misfit = true;
            assert!(c["min_device_memory_bytes"].is_null());
        }
    }
    assert!(
        cands
            .iter()
            .any(|c| c["config"] == "default" && c["alloc_conf"] == "")
    );
}

/// advise's exit status says whether any setting fits: 0 when one runs the job without OOM on
/// the device memory, 1 when none does (the report still prints, text and JSON), 2 on an error.
#[test]
fn advise_exit_status_says_whether_a_setting_fits() {
    let dir = annotated_dir();
    let fits = tensormem(
        dir.path(),
        &["advise", "annotated.pickle", "--device-memory", "1GiB"],
    );
    assert_eq!(fits.status.code(), Some(0), "{}", support::stderr(&fits));
    assert!(stdout(&fits).contains("Best: "), "{}", stdout(&fits));
    let tight = tensormem(
        dir.path(),
        &["advise", "annotated.pickle", "--device-memory", "1MiB"],
    );
    assert_eq!(tight.status.code(), Some(1), "{}", support::stderr(&tight));
    assert_eq!(support::stderr(&tight), "");
    let text = stdout(&tight);
    assert!(
        text.contains("No setting runs the whole job without OOM on the device memory 1024.00 KiB"),
        "{text}"
    );
    assert!(!text.contains("export PYTORCH_CUDA_ALLOC_CONF"), "{text}");
    let json = tensormem(
        dir.path(),
        &[
            "advise",
            "annotated.pickle",
            "--device-memory",
            "1MiB",
            "--json",
        ],
    );
    assert_eq!(json.status.code(), Some(1));
    let doc: Json = serde_json::from_str(&stdout(&json)).expect("the JSON still prints");
    let cands = doc["candidates"].as_array().expect("candidates");
    assert_eq!(cands.len(), tensormem::advise::candidates().len());
    assert!(cands.iter().all(|c| c["fits"] == false));
    let bad = tensormem(
        dir.path(),
        &["advise", "annotated.pickle", "--device-memory", "-1"],
    );
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn advise_on_a_state_only_snapshot_is_one_error_line() {
    let dir = Scratch::new("advise-state");
    let mut v = synthetic_value(Format::MODERN);
    if let Some(d) = v.as_dict() {
        let pairs: Vec<(Value, Value)> = d
            .iter()
            .filter(|(k, _)| k.as_str() != Some("device_traces"))
            .cloned()
            .collect();
        v = Value::dict(pairs);
    }
    dir.write("state.pickle", &tensormem_pickle::encode(&v));
    let o = tensormem(dir.path(), &["advise", "state.pickle"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        support::stderr(&o),
        "tensormem: error: advise: state.pickle holds state only (no memory history to replay)\n"
    );
}

/// The report of a replay whose own replay ran out of memory: exit status 1, the report on
/// stdout, nothing on stderr.
fn replayed_with_ooms(o: &std::process::Output) -> String {
    assert_eq!(o.status.code(), Some(1), "{}", support::stderr(o));
    assert!(o.stderr.is_empty());
    stdout(o)
}

/// An OOM made by replaying the synthetic history on a device too small for it, dumped, then
/// explained: the failed request, free space per pool, call sites and the setting that fits.
#[test]
fn explain_an_oom_entry() {
    let dir = annotated_dir();
    let replayed = replayed_with_ooms(&tensormem(
        dir.path(),
        &[
            "replay",
            "annotated.pickle",
            "--from-empty",
            "--device-memory",
            "60MiB",
            "--dump",
            "oom.pickle",
        ],
    ));
    assert!(replayed.contains("device memory 60.00 MiB"), "{replayed}");
    let text = success(&tensormem(dir.path(), &["explain", "oom.pickle"]));
    insta::assert_snapshot!("explain_synthetic_oom", text);
    let doc: Json = serde_json::from_str(&success(&tensormem(
        dir.path(),
        &["explain", "oom.pickle", "--json"],
    )))
    .expect("json");
    assert_eq!(doc["moment"], "oom_entry");
    assert_eq!(doc["request"]["size"], 40 << 20);
    assert_eq!(doc["request"]["pool"], "large");
    let large = doc["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pool"] == "large")
        .expect("a large pool");
    assert_eq!(large["fits_request"], false);
    assert!(doc["unknown"].as_array().unwrap().is_empty());
    // On 60 MiB nothing fits: PyTorch 2.7.1's own allocator (torch-oracle) fails this request
    // with expandable segments too (22 MiB reserved, 38 MiB free, 40 MiB asked for).
    let cands = doc["advice"]["candidates"].as_array().unwrap();
    assert!(cands.iter().all(|c| c["fits"] == false));
    assert!(text.contains("no allocator setting completes the whole job without OOM there"));
}

/// On a real history made to fail (lm_small on a 3 GiB device), explain names no setting: the
/// live bytes of the whole job peak at 3.03 GiB. (It used to name `max_split_size_mb:64`, found
/// on the history up to the first failure; the whole job still runs out under it, as under
/// every candidate.)
#[test]
fn explain_an_oom_of_a_shared_snapshot() {
    let Some(path) = shared_snapshot("lm_small_forward_from_empty.pickle") else {
        return;
    };
    let dir = Scratch::new("explain-shared");
    replayed_with_ooms(&tensormem(
        dir.path(),
        &[
            "replay",
            path.to_str().unwrap(),
            "--from-empty",
            "--device-memory",
            "3GiB",
            "--dump",
            "lm_small_oom.pickle",
        ],
    ));
    let text = success(&tensormem(dir.path(), &["explain", "lm_small_oom.pickle"]));
    insta::assert_snapshot!("explain_lm_small_on_3gib", text);
    let doc: Json = serde_json::from_str(&success(&tensormem(
        dir.path(),
        &["explain", "lm_small_oom.pickle", "--json"],
    )))
    .expect("json");
    let cands = doc["advice"]["candidates"].as_array().unwrap();
    assert!(cands.iter().all(|c| c["fits"] == false));
    assert!(doc["advice"]["lower_bound_bytes"].as_u64().unwrap() > 3 << 30);
    assert!(text.contains("no allocator setting fits: the live bytes alone (3.03 GiB)"));
    // The full replay of the recorded job under the setting once named: still an OOM.
    let snap = load_path(&path).expect("loads");
    let opts = tensormem::replay::ReplayOptions::new(
        "max_split_size_mb:64".parse().expect("valid"),
        3 << 30,
        true,
    );
    let o = tensormem::replay::replay(&snap, 0, &opts, &mut |_, _| {}).expect("replays");
    assert_eq!(o.failed_allocs, 1);
}

/// The 2.7B train step replayed on 38 GiB (below the whole job's 51.04 GiB of live bytes) and
/// dumped: explain names no setting (it used to name `roundup_power2_divisions:16`, which still
/// failed 10 times), and says why.
#[test]
fn explain_names_no_setting_below_the_live_bytes() {
    let Some(path) = shared_snapshot("lm2.7b_ctx128_trainstep_fp32.pickle") else {
        return;
    };
    let dir = Scratch::new("explain-38");
    replayed_with_ooms(&tensormem(
        dir.path(),
        &[
            "replay",
            path.to_str().unwrap(),
            "--from-empty",
            "--device-memory",
            "38GiB",
            "--dump",
            "oom.pickle",
        ],
    ));
    let doc: Json = serde_json::from_str(&success(&tensormem(
        dir.path(),
        &["explain", "oom.pickle", "--json"],
    )))
    .expect("json");
    let advice = &doc["advice"];
    assert_eq!(advice["start_blocks"], 324);
    assert!(advice["lower_bound_bytes"].as_u64().unwrap() > 38 << 30);
    assert!(
        advice["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["fits"] == false)
    );
    // The text, verdict first, as a user reads it.
    let text = success(&tensormem(dir.path(), &["explain", "oom.pickle"]));
    assert!(text.contains("no allocator setting fits"), "{text}");
    insta::assert_snapshot!("explain_lm2.7b_trainstep_dumped_at_38gib", text);
}

// ---------------------------------------------------------------------------------------------
// --html

fn assert_self_contained(html: &str) {
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.trim_end().ends_with("</html>"));
    for needle in ["<script", "src=", "href=", "@import", "url("] {
        assert!(
            !html.contains(needle),
            "the page loads nothing: found {needle}"
        );
    }
    // Namespaces are identifiers, not fetches; nothing else names a network location.
    let without_ns = html.replace("http://www.w3.org/2000/svg", "");
    assert!(!without_ns.contains("http://") && !without_ns.contains("https://"));
}

#[test]
fn html_report_of_a_replay_and_of_advise() {
    let dir = annotated_dir();
    let text = success(&tensormem(
        dir.path(),
        &[
            "replay",
            "annotated.pickle",
            "--from-empty",
            "--sweep",
            "--html",
            "r.html",
        ],
    ));
    assert!(text.contains("HTML report written to r.html"));
    let raw = std::fs::read_to_string(dir.path().join("r.html")).expect("written");
    assert_self_contained(&raw);
    // Long cells wrap between a path's parts, never inside a word.
    assert!(
        raw.contains("/<wbr>home/<wbr>me/<wbr>model.py:<wbr>"),
        "break opportunities"
    );
    assert!(!raw.contains("overflow-wrap:anywhere"));
    // Figures never wrap between a number and its unit ("195.32 MiB"); text cells do.
    assert!(raw.contains("text-align:right;white-space:nowrap}"));
    assert!(raw.contains("td.l,th.l{text-align:left;white-space:normal;"));
    // Every text of the timeline (legend, axes) is at least 12 px.
    let sizes: Vec<f64> = raw
        .split("font-size=\"")
        .skip(1)
        .filter_map(|r| r.split('"').next()?.parse().ok())
        .collect();
    assert!(!sizes.is_empty());
    assert!(sizes.iter().all(|&px| px >= 12.0), "{sizes:?}");
    let html = raw.replace("<wbr>", "");
    for part in [
        "Memory over time, per configuration",
        "Peaks per configuration",
        "Top call sites at the reserved peak",
        "Segments at the reserved peak",
        "expandable_segments:True: reserved",
        "/home/me/model.py:",
    ] {
        assert!(html.contains(part), "{part}");
    }
    // Full width: the timeline and the segment map scale to the page (seen in headless
    // Chromium at 1400 px: both had stopped at 1200 px).
    assert!(html.contains("div svg{width:100%;height:auto}"));
    assert!(
        html.contains("style=\"width:100%;height:auto\">"),
        "segment map"
    );
    // No curve hidden: the sweep's reserved curves are drawn 8, 6, 4, 2 px wide in that
    // order (each earlier one a rim around the later ones, where the default and
    // max_split_size_mb:128 coincide), the allocated ones dashed (many 1 px pieces) on top.
    let reserved_widths: Vec<&str> = html
        .split("<polyline fill=\"none\" opacity=\"1\" stroke=\"#")
        .skip(1)
        .filter_map(|r| r.split("stroke-width=\"").nth(1)?.split('"').next())
        .filter(|w| *w != "1")
        .collect();
    assert_eq!(
        reserved_widths,
        ["8", "6", "4", "2", "8", "6", "4", "2"],
        "the four curves, then their legend entries"
    );
    let dashes = html
        .matches("opacity=\"0.9\" stroke=\"#1F77B4\" stroke-width=\"1\"")
        .count();
    assert!(
        dashes > 5,
        "the default's allocated curve is dashed: {dashes}"
    );
    success(&tensormem(
        dir.path(),
        &["advise", "annotated.pickle", "--html", "a.html"],
    ));
    let html = std::fs::read_to_string(dir.path().join("a.html")).expect("written");
    assert_self_contained(&html);
    let html = html.replace("<wbr>", "");
    assert!(html.contains("Allocator settings, best first"));
    assert!(html.contains("export PYTORCH_CUDA_ALLOC_CONF="));
}

/// explain's first line is the verdict: on the dump taken at an OOM, not fragmentation (99.96%
/// of reserved memory allocated) and who holds it; on lm_small made to fail on 3 GiB,
/// fragmentation (enough free bytes, not in one block).
#[test]
fn explain_starts_with_a_verdict() {
    let Some(text) = on_shared("explain", "opt1.3b_inference_at_oom_state.pickle", &[]) else {
        return;
    };
    assert_eq!(
        text.lines().nth(1),
        Some(
            "  Verdict: 99.96% of reserved memory is allocated (11.03 GiB of 11.03 GiB): at most 4.34 MiB \
             (0.04%) is free for fragmentation to waste; /home/dingyiran/FlexGen/flexgen/pytorch_backend.py:190:allocate \
             holds 11.03 GiB in 460 allocations"
        )
    );
    let text = on_shared(
        "explain",
        "lm2.7b_ctx128_trainstep_fp32.pickle",
        &["--json"],
    )
    .expect("present");
    let doc: Json = serde_json::from_str(&text).expect("json");
    assert!(
        doc["verdict"].as_str().unwrap().ends_with(
            "<no stack: allocated before recording began> holds 12.69 GiB in 324 allocations"
        ),
        "{}",
        doc["verdict"]
    );
}
