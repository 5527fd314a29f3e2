//! `tensormem diff A B` (issue 31): two snapshots side by side, the call sites that grew or
//! shrank, and unknown (never 0) peaks for a state-only side. Text as insta snapshots.

use crate::support::{
    Format, Scratch, shared_snapshot, stdout, success, synthetic_pickle, tensormem,
};
use serde_json::Value as Json;
use tensormem::load::load_path;

#[test]
fn diff_of_two_shared_histories() {
    let (Some(a), Some(b)) = (
        shared_snapshot("lm2.7b_ctx128_forward_fp32.pickle"),
        shared_snapshot("lm2.7b_ctx128_trainstep_fp32.pickle"),
    ) else {
        return;
    };
    let (sa, sb) = (load_path(&a).expect("loads"), load_path(&b).expect("loads"));
    let d = tensormem::diff::diff(
        &sa,
        "lm2.7b_ctx128_forward_fp32.pickle",
        &sb,
        "lm2.7b_ctx128_trainstep_fp32.pickle",
        5,
    )
    .expect("compares");
    insta::assert_snapshot!("diff_lm2.7b_forward_trainstep", d.text());
    let doc = serde_json::to_value(&d).expect("json");
    // The train step's optimizer state is new; the lower bounds are each whole job's.
    let first = &doc["sites"][0];
    assert_eq!(first["a_bytes"], 0);
    assert!(first["site"].as_str().unwrap().contains("optimizers.py"));
    assert_eq!(
        first["change_bytes"].as_i64(),
        first["b_bytes"].as_i64(),
        "{first}"
    );
    assert_eq!(
        c10_cuda::summary::format_size(doc["b"]["lower_bound_bytes"].as_u64().unwrap()),
        "51.04 GiB"
    );
    assert_eq!(doc["sites"].as_array().map(Vec::len), Some(5));
    assert!(doc["sites_changed"].as_u64().unwrap() >= 5);
}

#[test]
fn diff_with_a_state_only_side_says_unknown() {
    let dir = Scratch::new("diff");
    dir.write(
        "state.pickle",
        &synthetic_pickle(Format {
            bare_list: true,
            ..Format::MODERN
        }),
    );
    dir.write("history.pickle", &synthetic_pickle(Format::MODERN));
    let text = success(&tensormem(
        dir.path(),
        &["diff", "state.pickle", "history.pickle"],
    ));
    insta::assert_snapshot!("diff_state_only_and_history", text);
    assert!(text.contains("unknown"));
    let doc: Json = serde_json::from_str(&success(&tensormem(
        dir.path(),
        &["diff", "state.pickle", "history.pickle", "--json"],
    )))
    .expect("json");
    let keys: Vec<&str> = doc["a"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "allocated_bytes_at_dump",
            "events",
            "file",
            "fragmentation",
            "lower_bound_bytes",
            "moment",
            "peak_allocated_bytes",
            "peak_reserved_bytes",
            "reserved_bytes_at_dump",
            "segments",
            "start_blocks"
        ]
    );
    for key in ["peak_reserved_bytes", "lower_bound_bytes", "fragmentation"] {
        assert!(doc["a"][key].is_null(), "{key}");
        assert!(!doc["b"][key].is_null(), "{key}");
    }
    assert_eq!(doc["a"]["moment"], "dump");
    assert_eq!(doc["b"]["moment"], "reserved peak");
    // Same file twice: nothing changed.
    let same = success(&tensormem(
        dir.path(),
        &["diff", "history.pickle", "history.pickle"],
    ));
    assert!(
        same.contains("(none: every call site holds the same bytes)"),
        "{same}"
    );
    let o = tensormem(dir.path(), &["diff", "history.pickle", "missing.pickle"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stdout(&o).is_empty());
}
