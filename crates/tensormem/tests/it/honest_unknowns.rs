//! What a state-only snapshot cannot tell is said, never printed as 0 (issue 31): a dump with
//! a stray trace entry is no history (advise refuses it, replay summarizes the state), the
//! figures only a history gives are `unknown` in text and `null` in JSON, and explain uses a
//! stray `oom` entry for the request it records.

use crate::support;

use crate::support::{
    Format, MIB, Scratch, shared_snapshot, stderr, success, synthetic_value, tensormem,
};
use serde_json::Value as Json;
use tensormem_pickle::Value;

/// The synthetic dump with its history replaced by one `oom` entry: a request of 40 MiB that
/// failed with 10 MiB free on the device.
fn dump_with_a_stray_oom_entry() -> Scratch {
    let v = synthetic_value(Format::MODERN);
    let pairs: Vec<(Value, Value)> = v
        .as_dict()
        .expect("a dict")
        .iter()
        .map(|(k, val)| {
            if k.as_str() == Some("device_traces") {
                let oom = Value::dict(vec![
                    (Value::str("action"), Value::str("oom")),
                    (Value::str("device_free"), Value::Int(10 * MIB)),
                    (Value::str("size"), Value::Int(40 * MIB)),
                    (Value::str("stream"), Value::Int(0)),
                ]);
                (k.clone(), Value::list(vec![Value::list(vec![oom])]))
            } else {
                (k.clone(), val.clone())
            }
        })
        .collect();
    let dir = Scratch::new("stray");
    dir.write(
        "stray.pickle",
        &tensormem_pickle::encode(&Value::dict(pairs)),
    );
    dir
}

#[test]
fn a_stray_entry_is_no_history_for_advise() {
    let dir = dump_with_a_stray_oom_entry();
    let o = tensormem(dir.path(), &["advise", "stray.pickle"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o),
        "tensormem: error: advise: stray.pickle holds state only (no memory history to replay)\n"
    );
    insta::assert_snapshot!("advise_a_stray_entry", stderr(&o));
    let o = tensormem(dir.path(), &["replay", "stray.pickle", "--from-empty"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn a_state_only_replay_says_what_it_cannot_know() {
    let dir = dump_with_a_stray_oom_entry();
    let text = success(&tensormem(dir.path(), &["replay", "stray.pickle"]));
    assert!(text.contains("1 trace entry without any allocation or free: not a history"));
    assert!(text.contains("CUDA OOMs: unknown"), "{text}");
    assert!(!text.contains("CUDA OOMs: 0"), "{text}");
    insta::assert_snapshot!("state_only_with_a_stray_entry", text);
    let doc: Json = serde_json::from_str(&success(&tensormem(
        dir.path(),
        &["replay", "stray.pickle", "--json"],
    )))
    .expect("json");
    assert_eq!(doc["state_only"], true);
    assert_eq!(doc["stray_trace_entries"], 1);
    let stats = &doc["memory_stats"];
    for key in [
        "num_ooms",
        "num_alloc_retries",
        "num_device_alloc",
        "allocated_bytes.all.peak",
        "allocation.all.allocated",
    ] {
        assert!(stats[key].is_null(), "{key}: {}", stats[key]);
    }
    assert_eq!(stats["reserved_bytes.all.current"], 62 * MIB);
    assert!(!doc["unknown"].as_array().unwrap().is_empty());
}

/// The shared snapshot taken at an OOM: its OOM count is unknown, not 0.
#[test]
fn the_at_oom_dump_does_not_claim_zero_ooms() {
    let Some(path) = shared_snapshot("opt1.3b_inference_at_oom_state.pickle") else {
        return;
    };
    let dir = Scratch::new("at-oom");
    let doc: Json = serde_json::from_str(&success(&tensormem(
        dir.path(),
        &["replay", path.to_str().unwrap(), "--json"],
    )))
    .expect("json");
    assert!(doc["memory_stats"]["num_ooms"].is_null());
    assert_eq!(
        doc["memory_stats"]["allocated_bytes.all.current"].as_u64(),
        doc["allocated_bytes"].as_u64()
    );
    let text = success(&tensormem(dir.path(), &["replay", path.to_str().unwrap()]));
    assert!(text.contains("CUDA OOMs: unknown"));
}

/// A dump whose only trace entry is its `oom`: explain reports the recorded request against the
/// dump's state, and the advice replays the dump's live blocks plus the failed request.
#[test]
fn explain_uses_a_stray_oom_entry() {
    let dir = dump_with_a_stray_oom_entry();
    let doc: Json = serde_json::from_str(&success(&tensormem(
        dir.path(),
        &["explain", "stray.pickle", "--json"],
    )))
    .expect("json");
    assert_eq!(doc["moment"], "oom_entry");
    assert_eq!(doc["request"]["size"], 40 * MIB);
    assert_eq!(doc["request"]["device_free"], 10 * MIB);
    assert_eq!(doc["reserved_bytes"], 62 * MIB);
    let advice = &doc["advice"];
    assert_eq!(advice["mode"], "whole job");
    assert_eq!(advice["start_blocks"], 4);
    assert_eq!(advice["device_memory_bytes"], 72 * MIB);
    let text = success(&tensormem(dir.path(), &["explain", "stray.pickle"]));
    insta::assert_snapshot!("explain_a_stray_oom_entry", text);
}

/// A parity replay on a device smaller than the recording needed says so in its header, with
/// its OOM count, and exits with status 1 (the report still prints).
#[test]
fn a_parity_replay_that_runs_out_says_so_first() {
    let Some(path) = shared_snapshot("lm_small_forward_from_empty.pickle") else {
        return;
    };
    let dir = Scratch::new("parity-oom");
    let o = tensormem(
        dir.path(),
        &["replay", path.to_str().unwrap(), "--device-memory", "3GiB"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let text = support::stdout(&o);
    let header: Vec<&str> = text.lines().take(5).collect();
    assert_eq!(
        header[4],
        "  out of memory in our replay:      2 OOMs on 3.00 GiB of device memory (2 allocations failed, \
         2 retries; the recording reserved up to 3.52 GiB): the decisions below diverge from it",
        "{text}"
    );
    let o = tensormem(dir.path(), &["replay", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    assert!(!support::stdout(&o).contains("out of memory in our replay"));
}

/// `--html` on a state-only snapshot writes the page of its dump: what it holds and cannot
/// tell, who holds the memory, and the segment map (the at-OOM snapshots' one picture).
#[test]
fn a_state_only_snapshot_gets_an_html_page() {
    let dir = dump_with_a_stray_oom_entry();
    let text = success(&tensormem(
        dir.path(),
        &["replay", "stray.pickle", "--html", "state.html"],
    ));
    assert!(text.contains("HTML report written to state.html"));
    let html = std::fs::read_to_string(dir.path().join("state.html")).expect("written");
    let html = html.replace("<wbr>", "");
    assert!(html.starts_with("<!DOCTYPE html>") && html.trim_end().ends_with("</html>"));
    assert!(!html.contains("<script"));
    for part in [
        "state only (no history to replay): 3 segments, 62.00 MiB reserved",
        "unknown: peaks and totals",
        // What an at-OOM dump can tell: how much of the reserved memory was handed out.
        "12.91% of the reserved bytes allocated; 54.00 MiB reserved but not allocated",
        "Top call sites holding the dump&#39;s allocated blocks",
        "train.py:42:forward",
        "Segments at the dump",
    ] {
        assert!(html.contains(part), "{part}");
    }
    // --plot still needs a history.
    let o = tensormem(
        dir.path(),
        &[
            "replay",
            "stray.pickle",
            "--html",
            "s.html",
            "--plot",
            "p.svg",
        ],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--plot: stray.pickle holds state only"));
}
