//! `--since` / `--until` (issue 31): a window of the history. The peaks and the curve inside a
//! window are those of the full replay's curve restricted to it (an oracle check over every
//! window of the synthetic history, and a sample of windows of a shared one), for parity and
//! what-if replays; the commands accept event indices and times and say which window they
//! measured; bad bounds are one error line.

use crate::support::{
    Format, Scratch, shared_snapshot, stderr, stdout, success, synthetic_pickle, tensormem,
};
use rstest::rstest;
use serde_json::Value as Json;
use tensormem::load::{load_bytes, load_path};
use tensormem::model::Snapshot;
use tensormem::replay::{ReplayOptions, SeriesPoint, replay};

fn synthetic_dir() -> Scratch {
    let dir = Scratch::new("window");
    dir.write("synthetic.pickle", &synthetic_pickle(Format::MODERN));
    dir
}

/// The full replay's curve restricted to the window `[since, until)`: the state just before
/// it (after event `since - 1`, or the start state) and every point after an event inside.
fn oracle(full: &[SeriesPoint], since: usize, until: usize) -> Vec<(usize, u64, u64)> {
    let key = |p: &SeriesPoint| (p.index, p.allocated, p.reserved);
    let mut out = Vec::new();
    if since == 0 {
        out.extend(full.iter().filter(|p| p.index < until).map(key));
    } else {
        if let Some(p) = full.iter().rev().find(|p| p.index < since) {
            out.push(key(p));
        }
        out.extend(
            full.iter()
                .filter(|p| p.index >= since && p.index < until)
                .map(key),
        );
    }
    out
}

/// Every window `[since, until)` with `since` and `until` stepping by `step` (the last event
/// always an end): the windowed replay's curve, peaks and lower-bound bound match the oracle.
fn check_windows(snap: &Snapshot, from_empty: bool, step: usize) {
    let n = snap.traces[0].len();
    let opts = ReplayOptions {
        series: true,
        ..ReplayOptions::new(Default::default(), 1 << 40, from_empty)
    };
    let full = replay(snap, 0, &opts, &mut |_, _| {}).expect("replays");
    let mut checked = 0;
    let mut ends: Vec<usize> = (1..=n).step_by(step).collect();
    ends.push(n);
    for since in (0..n).step_by(step) {
        for &until in ends.iter().filter(|&&u| u > since) {
            let w = ReplayOptions {
                since_event: Some(since),
                until_event: Some(until),
                ..opts.clone()
            };
            let o = replay(snap, 0, &w, &mut |_, _| {}).expect("replays");
            let got: Vec<_> = o
                .series
                .iter()
                .map(|p| (p.index, p.allocated, p.reserved))
                .collect();
            let want = oracle(&full.series, since, until);
            assert_eq!(
                got, want,
                "window {since}..{until} (from_empty {from_empty})"
            );
            let peak = want.iter().map(|p| p.2).max().unwrap();
            assert_eq!(o.peak_reserved, peak, "{since}..{until}");
            assert_eq!(
                o.peak_allocated,
                want.iter().map(|p| p.1).max().unwrap(),
                "{since}..{until}"
            );
            // The peak's event lies inside the window (or is the state it opens on).
            assert!(
                o.peak_event_index + 1 >= since && o.peak_event_index < until,
                "{since}..{until}: {}",
                o.peak_event_index
            );
            // The live bytes inside never pass the whole history's, nor the allocated peak.
            assert!(o.lower_bound <= full.lower_bound, "{since}..{until}");
            assert!(
                o.lower_bound <= o.peak_allocated.max(512),
                "{since}..{until}"
            );
            assert_eq!(o.events, until);
            checked += 1;
        }
    }
    assert!(checked > 10, "{checked} windows");
}

#[test]
fn every_window_of_the_synthetic_history_matches_the_full_curve() {
    let snap = load_bytes(&synthetic_pickle(Format::MODERN), "synthetic").expect("loads");
    assert_eq!(snap.traces[0].len(), 16);
    check_windows(&snap, false, 1);
    check_windows(&snap, true, 1);
}

#[test]
fn windows_of_a_shared_history_match_the_full_curve() {
    let Some(path) = shared_snapshot("lm_small_forward_from_empty.pickle") else {
        return;
    };
    let snap = load_path(&path).expect("loads");
    check_windows(&snap, false, 9);
    check_windows(&snap, true, 13);
}

fn json(dir: &Scratch, args: &[&str]) -> Json {
    serde_json::from_str(&success(&tensormem(dir.path(), args))).expect("json")
}

/// The synthetic history's reserved bytes: 2 MiB (event 0), 22 MiB (event 3), 62 MiB (event
/// 12, the 40 MiB segment), never released.
#[test]
fn replay_advise_explain_and_diff_take_a_window() {
    let dir = synthetic_dir();
    let whole = json(&dir, &["replay", "synthetic.pickle", "--json"]);
    assert_eq!(whole["peak_reserved_bytes"], 62 << 20);
    assert!(whole.get("window").is_none(), "no window: no key");
    let early = json(
        &dir,
        &["replay", "synthetic.pickle", "--until", "12", "--json"],
    );
    assert_eq!(early["peak_reserved_bytes"], 22 << 20);
    assert_eq!(early["events"], 12);
    assert_eq!(early["window"]["since_event"], 0);
    assert_eq!(early["window"]["until_event"], 12);
    // The same window by time: the synthetic's entries are 10 us apart.
    let t12 = early["window"]["until_us"].as_u64().unwrap();
    let by_time = json(
        &dir,
        &[
            "replay",
            "synthetic.pickle",
            "--until",
            &format!("{t12}us"),
            "--json",
        ],
    );
    assert_eq!(by_time["window"], early["window"]);
    assert_eq!(by_time["peak_reserved_bytes"], 22 << 20);
    let late = json(
        &dir,
        &[
            "replay",
            "synthetic.pickle",
            "--since",
            "13",
            "--from-empty",
            "--sweep",
            "--json",
        ],
    );
    // The 40 MiB segment is already there when the window opens.
    assert_eq!(late["peak_reserved_bytes"], 62 << 20);
    assert!(late["peak_event_index"].as_u64() >= Some(12));
    for row in late["sweep"].as_array().unwrap() {
        assert!(row["peak_event_index"].as_u64() >= Some(12), "{row}");
    }
    let text = success(&tensormem(
        dir.path(),
        &[
            "replay",
            "synthetic.pickle",
            "--since",
            "2",
            "--until",
            "12",
        ],
    ));
    assert!(
        text.contains("  window: events 2..11 of 16 (t+"),
        "the report names its window:\n{text}"
    );
    // advise: the job up to the window's end must fit, measured inside the window.
    let a = json(
        &dir,
        &["advise", "synthetic.pickle", "--until", "12", "--json"],
    );
    assert_eq!(a["window"]["until_event"], 12);
    let best = &a["candidates"][0];
    assert!(
        best["min_device_memory_bytes"].as_u64() < Some(40 << 20),
        "{best}"
    );
    let all = json(&dir, &["advise", "synthetic.pickle", "--json"]);
    assert!(all["candidates"][0]["min_device_memory_bytes"].as_u64() >= Some(40 << 20));
    // diff: each history measured inside the window; the HTML page has the same rows.
    let d = json(
        &dir,
        &[
            "diff",
            "synthetic.pickle",
            "synthetic.pickle",
            "--until",
            "12",
            "--json",
            "--html",
            "d.html",
        ],
    );
    assert_eq!(d["a"]["peak_reserved_bytes"], 22 << 20);
    assert_eq!(d["b"]["window"]["until_event"], 12);
    let page = std::fs::read_to_string(dir.path().join("d.html")).expect("page");
    assert!(page.starts_with("<!DOCTYPE html>"));
    assert!(page.contains("<h2>Side by side</h2>"), "{page}");
    assert!(
        page.contains("<td>22.00 MiB</td><td>22.00 MiB</td><td>0 bytes</td>"),
        "{page}"
    );
    // explain: no oom entry in the synthetic history.
    let o = tensormem(dir.path(), &["explain", "synthetic.pickle", "--since", "3"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o),
        "tensormem: error: --since: no oom entry in the window: events 3..15 of 16 (t+30 us .. t+150 us) \
         (the history records none)\n"
    );
}

#[rstest]
#[case::unit(&["--since", "5h"], "tensormem: error: --since: invalid bound '5h': expected an event index (e.g. 1200) or a time since the first event with a unit: us, ms, s or min (e.g. 1.5s)")]
#[case::negative(&["--until=-3"], "tensormem: error: --until: invalid bound '-3': expected an event index (e.g. 1200) or a time since the first event with a unit: us, ms, s or min (e.g. 1.5s)")]
#[case::past_the_end(&["--since", "16"], "tensormem: error: --since: event 16 is past the trace's last event (15)")]
#[case::empty(&["--since", "5", "--until", "5"], "tensormem: error: --until: the window holds no event (it starts at event 5 and ends before event 5)")]
#[case::too_late(&["--since", "1min"], "tensormem: error: --since: the window holds no event (it starts at event 16 and ends before event 16)")]
fn bad_windows_are_one_error_line(#[case] extra: &[&str], #[case] message: &str) {
    let dir = synthetic_dir();
    for command in ["replay", "advise"] {
        let mut args = vec![command, "synthetic.pickle"];
        args.extend(extra);
        let o = tensormem(dir.path(), &args);
        assert_eq!(o.status.code(), Some(2), "{command} {extra:?}");
        assert_eq!(stderr(&o), format!("{message}\n"), "{command}");
        assert_eq!(stdout(&o), "");
    }
}

#[test]
fn a_time_window_needs_times_and_a_state_only_file_has_no_window() {
    let dir = Scratch::new("window-untimed");
    let untimed = Format {
        time_us: false,
        ..Format::MODERN
    };
    dir.write("untimed.pickle", &synthetic_pickle(untimed));
    let o = tensormem(dir.path(), &["replay", "untimed.pickle", "--since", "2ms"]);
    assert_eq!(
        stderr(&o),
        "tensormem: error: --since: a time needs every trace entry to carry time_us, and this trace does not: give an event index\n"
    );
    success(&tensormem(
        dir.path(),
        &["replay", "untimed.pickle", "--since", "2"],
    ));
    let Some(path) = shared_snapshot("opt1.3b_inference_at_oom_state.pickle") else {
        return;
    };
    let o = tensormem(
        path.parent().unwrap(),
        &[
            "replay",
            "opt1.3b_inference_at_oom_state.pickle",
            "--until",
            "3",
        ],
    );
    assert_eq!(
        stderr(&o),
        "tensormem: error: --until: opt1.3b_inference_at_oom_state.pickle holds state only (no memory history to replay)\n"
    );
}

/// The text of advise and diff on a window, as a user reads it (insta).
#[test]
fn advise_and_diff_text_on_a_window() {
    let dir = synthetic_dir();
    let a = success(&tensormem(
        dir.path(),
        &["advise", "synthetic.pickle", "--until", "12", "--show", "3"],
    ));
    insta::assert_snapshot!("advise_synthetic_until_12", a);
    let d = success(&tensormem(
        dir.path(),
        &[
            "diff",
            "synthetic.pickle",
            "synthetic.pickle",
            "--since",
            "3",
            "--until",
            "12",
        ],
    ));
    insta::assert_snapshot!("diff_synthetic_window_3_12", d);
    let r = success(&tensormem(
        dir.path(),
        &[
            "replay",
            "synthetic.pickle",
            "--since",
            "40us",
            "--top",
            "2",
        ],
    ));
    assert!(
        r.contains("window: events 4..15 of 16 (t+40 us .. t+150 us)"),
        "{r}"
    );
    success(&tensormem(
        dir.path(),
        &[
            "replay",
            "synthetic.pickle",
            "--since",
            "4",
            "--html",
            "w.html",
        ],
    ));
    let page = std::fs::read_to_string(dir.path().join("w.html")).expect("page");
    assert!(
        page.contains("16 history events on device 0;")
            && page.contains(
                "window: events 4..15 of 16 (t+40 us .. t+150 us): peaks, call sites and curves"
            ),
        "the page names its window"
    );
}
