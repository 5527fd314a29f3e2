//! A parity replay's `--dump` keeps every recorded field of every event bit for bit (issue
//! 29): over every shared snapshot, the dump's history and the input's are compared event by
//! event (action, address, size, stream, time, frames, `compile_context`, `user_metadata`).
//! Real snapshots come from `../shared/data` (skipped with a message when absent, a failure
//! under `CI=true`).

use crate::support::{Scratch, shared_snapshot, stderr, success, tensormem};
use tensormem::load::load_path;
use tensormem::model::RecordedEvent;

/// The first event (by index) where `dumped` differs from `input`, shown with both sides.
fn first_difference(input: &[RecordedEvent], dumped: &[RecordedEvent]) -> Option<String> {
    let show = |e: &RecordedEvent| {
        format!(
            "{} addr {:#x} size {} stream {} time {:?} frames {} cc {:?} um {:?}",
            e.action,
            e.addr,
            e.size,
            e.stream,
            e.time_us,
            e.frames.as_ref().map_or(0, |f| f.len()),
            e.compile_context,
            e.user_metadata
        )
    };
    let n = input.len().max(dumped.len());
    (0..n).find_map(|i| match (input.get(i), dumped.get(i)) {
        (Some(a), Some(b)) if a == b => None,
        (a, b) => Some(format!(
            "event {i} of {}/{}: input {}, dump {}",
            input.len(),
            dumped.len(),
            a.map_or("nothing".into(), show),
            b.map_or("nothing".into(), show)
        )),
    })
}

#[rstest::rstest]
#[case::lm_small_forward_from_empty("lm_small_forward_from_empty.pickle")]
#[case::lm_small_forward_bf16("lm_small_forward_bf16.pickle")]
#[case::gpt2small_trainstep_steady("gpt2small_trainstep_steady.pickle")]
#[case::lm2_7b_ctx128_forward_fp32("lm2.7b_ctx128_forward_fp32.pickle")]
#[case::lm2_7b_ctx128_trainstep_fp32("lm2.7b_ctx128_trainstep_fp32.pickle")]
#[case::lm2_7b_ctx512_forward_bf16("lm2.7b_ctx512_forward_bf16.pickle")]
fn parity_dump_keeps_every_recorded_event(#[case] file: &str) {
    let Some(path) = shared_snapshot(file) else {
        return;
    };
    let dir = Scratch::new("dump-fidelity");
    std::fs::copy(&path, dir.path().join(file)).expect("copy");
    success(&tensormem(
        dir.path(),
        &["replay", file, "--dump", "dump.pickle"],
    ));
    let input = load_path(&dir.path().join(file)).expect("the input loads");
    let dumped = load_path(&dir.path().join("dump.pickle")).expect("the dump loads");
    assert_eq!(input.traces.len(), dumped.traces.len(), "devices");
    for (d, (a, b)) in input.traces.iter().zip(&dumped.traces).enumerate() {
        // Our dump ends with one more entry, the `snapshot` PyTorch's own dumps end with (the
        // moment it was taken: the last replayed event's time).
        let (last, b) = b.split_last().expect("the dump has a history");
        assert_eq!(last.action.as_str(), "snapshot", "{file}: the last entry");
        assert_eq!(
            last.time_us,
            a.iter().rev().find_map(|e| e.time_us),
            "{file}: the snapshot entry's time"
        );
        if let Some(diff) = first_difference(a, b) {
            panic!("{file}, device {d}: {diff}");
        }
    }
}

/// The state-only snapshots hold no history: `--dump` refuses them with one line and exit
/// code 2 (there is nothing replayed to write) and writes no file.
#[rstest::rstest]
#[case::opt1_3b_inference_at_oom_state("opt1.3b_inference_at_oom_state.pickle")]
#[case::diffusion_eval_state("diffusion_eval_state.pickle")]
#[case::expandable_segments_state("expandable_segments_state.pickle")]
fn state_only_snapshots_have_no_history_to_dump(#[case] file: &str) {
    let Some(path) = shared_snapshot(file) else {
        return;
    };
    let input = load_path(&path).expect("the input loads");
    assert!(
        input
            .traces
            .iter()
            .flatten()
            .all(|e| e.action.as_str() == "snapshot"),
        "{file} is state only"
    );
    let dir = Scratch::new("dump-state-only");
    std::fs::copy(&path, dir.path().join(file)).expect("copy");
    let out = tensormem(dir.path(), &["replay", file, "--dump", "dump.pickle"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("holds state only (no memory history to replay)"),
        "{err}"
    );
    assert!(!dir.path().join("dump.pickle").exists());
}
