//! The `tensormem` command end to end: bad input gives one error line and exit status 2, the
//! reports (text and `--json`), the demo, `--plot` and `--dump`, and `tensormem train`.
//!
//! Inputs are written into scratch folders and the binary runs there, so messages show
//! relative paths. Tests on the real snapshots skip without `../shared` (fail under `CI=true`).

use std::collections::BTreeSet;
use std::path::Path;

use crate::support::{
    Format, SYNTH_ALLOCS, SYNTH_PEAK_RESERVED, SYNTH_SEGMENT_ALLOCS, Scratch, shared_snapshot,
    stderr, stdout, success, synthetic_pickle, tensormem,
};
use rstest::rstest;
use serde_json::Value as Json;
use tensormem::load::load_path;
use tensormem::replay::ReplayOptions;
use tensormem_pickle::Value;

// ---------------------------------------------------------------------------------------------
// Bad input: one line on stderr, `tensormem: error: ...`, exit status 2, never a panic.

/// What a bad-input case puts at its path.
enum Input {
    File(Vec<u8>),
    Folder,
    Nothing,
}

fn pickle(v: Value) -> Vec<u8> {
    tensormem_pickle::encode(&v)
}

fn kv(pairs: Vec<(&str, Value)>) -> Value {
    Value::dict(pairs.into_iter().map(|(k, v)| (Value::str(k), v)).collect())
}

fn one_segment(pairs: Vec<(&str, Value)>) -> Vec<u8> {
    pickle(kv(vec![("segments", Value::list(vec![kv(pairs)]))]))
}

fn one_event(pairs: Vec<(&str, Value)>) -> Vec<u8> {
    pickle(kv(vec![
        ("segments", Value::list(vec![])),
        (
            "device_traces",
            Value::list(vec![Value::list(vec![kv(pairs)])]),
        ),
    ]))
}

/// Every bad-input case, by name, in the order of the snapshot.
const BAD_INPUTS: [&str; 33] = [
    "empty_file",
    "blank_json",
    "truncated_pickle",
    "global_reduce",
    "stack_global",
    "reduce_without_global",
    "not_a_snapshot",
    "missing_segments",
    "segments_not_a_list",
    "segment_missing_blocks",
    "address_is_a_string",
    "negative_size",
    "negative_event_size",
    "float_requested_size",
    "string_time",
    "address_beyond_64_bits",
    "bad_block_state",
    "bad_segment_type",
    "unknown_trace_action",
    "trace_entry_without_addr",
    "unusable_allocator_settings",
    "malformed_json",
    "json_wrong_types",
    "nonexistent_file",
    "folder_instead_of_file",
    "bad_alloc_conf_value",
    "unknown_alloc_conf_key",
    "bad_device_memory",
    "zero_device_memory",
    "device_out_of_range",
    "png_plot",
    "plot_into_missing_folder",
    "dump_into_missing_folder",
];

/// The input file, its content, and the arguments after `replay FILE`.
fn bad_input(name: &str) -> (&'static str, Input, Vec<&'static str>) {
    let two_mib = Value::Int(2 << 20);
    let synthetic = || Input::File(synthetic_pickle(Format::MODERN));
    match name {
        "empty_file" => ("empty.pickle", Input::File(Vec::new()), vec![]),
        "blank_json" => ("blank.json", Input::File(b" \n\t\n".to_vec()), vec![]),
        "truncated_pickle" => {
            let bytes = synthetic_pickle(Format::MODERN);
            let half = bytes[..bytes.len() / 2].to_vec();
            ("truncated.pickle", Input::File(half), vec![])
        }
        // CPython would run `os.system('echo pwned')`.
        "global_reduce" => (
            "os_system.pickle",
            Input::File(b"cos\nsystem\n(S'echo pwned'\ntR.".to_vec()),
            vec![],
        ),
        "stack_global" => (
            "stack_global.pickle",
            Input::File(b"\x80\x04\x8c\x02os\x94\x8c\x06system\x94\x93\x94.".to_vec()),
            vec![],
        ),
        "reduce_without_global" => (
            "reduce.pickle",
            Input::File(b"\x80\x02N)R.".to_vec()),
            vec![],
        ),
        "not_a_snapshot" => ("int.pickle", Input::File(pickle(Value::Int(42))), vec![]),
        "missing_segments" => (
            "no_segments.pickle",
            Input::File(pickle(kv(vec![("device_traces", Value::list(vec![]))]))),
            vec![],
        ),
        "segments_not_a_list" => (
            "segments_int.pickle",
            Input::File(pickle(kv(vec![("segments", Value::Int(5))]))),
            vec![],
        ),
        "segment_missing_blocks" => (
            "no_blocks.pickle",
            Input::File(one_segment(vec![
                ("address", Value::Int(0)),
                ("total_size", two_mib),
                ("segment_type", Value::str("small")),
            ])),
            vec![],
        ),
        "address_is_a_string" => (
            "address_str.pickle",
            Input::File(one_segment(vec![
                ("address", Value::str("0x7f0000000000")),
                ("total_size", two_mib),
                ("segment_type", Value::str("small")),
                ("blocks", Value::list(vec![])),
            ])),
            vec![],
        ),
        "negative_size" => (
            "negative.pickle",
            Input::File(one_segment(vec![
                ("address", Value::Int(0)),
                ("total_size", Value::Int(-1)),
                ("segment_type", Value::str("large")),
                ("blocks", Value::list(vec![])),
            ])),
            vec![],
        ),
        // Optional fields too: a negative or non-integer value is an error, not 0.
        "negative_event_size" => (
            "negative_event.pickle",
            Input::File(one_event(vec![
                ("action", Value::str("alloc")),
                ("addr", Value::Int(0)),
                ("size", Value::Int(-512)),
            ])),
            vec![],
        ),
        "float_requested_size" => (
            "float_requested.pickle",
            Input::File(one_segment(vec![
                ("address", Value::Int(0)),
                ("total_size", two_mib.clone()),
                ("segment_type", Value::str("small")),
                (
                    "blocks",
                    Value::list(vec![kv(vec![
                        ("address", Value::Int(0)),
                        ("size", two_mib.clone()),
                        ("requested_size", Value::Float(512.5)),
                        ("state", Value::str("active_allocated")),
                    ])]),
                ),
            ])),
            vec![],
        ),
        "string_time" => (
            "string_time.pickle",
            Input::File(one_event(vec![
                ("action", Value::str("alloc")),
                ("addr", Value::Int(0)),
                ("size", Value::Int(512)),
                ("time_us", Value::str("soon")),
            ])),
            vec![],
        ),
        "address_beyond_64_bits" => (
            "huge_address.pickle",
            Input::File(one_segment(vec![
                (
                    "address",
                    Value::int_from_le_bytes(&[0, 0, 0, 0, 0, 0, 0, 0, 1]),
                ),
                ("total_size", two_mib),
                ("segment_type", Value::str("small")),
                ("blocks", Value::list(vec![])),
            ])),
            vec![],
        ),
        "bad_block_state" => (
            "block_state.pickle",
            Input::File(one_segment(vec![
                ("address", Value::Int(0)),
                ("total_size", two_mib.clone()),
                ("segment_type", Value::str("small")),
                (
                    "blocks",
                    Value::list(vec![kv(vec![
                        ("address", Value::Int(0)),
                        ("size", two_mib),
                        ("state", Value::str("zombie")),
                    ])]),
                ),
            ])),
            vec![],
        ),
        "bad_segment_type" => (
            "segment_type.pickle",
            Input::File(one_segment(vec![
                ("address", Value::Int(0)),
                ("total_size", two_mib),
                ("segment_type", Value::str("medium")),
                ("blocks", Value::list(vec![])),
            ])),
            vec![],
        ),
        "unknown_trace_action" => (
            "action.pickle",
            Input::File(one_event(vec![
                ("action", Value::str("teleport")),
                ("addr", Value::Int(0)),
                ("size", Value::Int(512)),
            ])),
            vec![],
        ),
        "trace_entry_without_addr" => (
            "no_addr.pickle",
            Input::File(one_event(vec![
                ("action", Value::str("alloc")),
                ("size", Value::Int(512)),
            ])),
            vec![],
        ),
        "unusable_allocator_settings" => (
            "settings.pickle",
            Input::File(pickle(kv(vec![
                ("segments", Value::list(vec![])),
                (
                    "allocator_settings",
                    kv(vec![("max_split_size", Value::Int(1))]),
                ),
            ]))),
            vec![],
        ),
        "malformed_json" => (
            "malformed.json",
            Input::File(br#"{"segments": [1,"#.to_vec()),
            vec![],
        ),
        "json_wrong_types" => (
            "types.json",
            Input::File(br#"{"segments": {"address": 1}}"#.to_vec()),
            vec![],
        ),
        "nonexistent_file" => ("missing.pickle", Input::Nothing, vec![]),
        "folder_instead_of_file" => ("folder.pickle", Input::Folder, vec![]),
        "bad_alloc_conf_value" => (
            "ok.pickle",
            synthetic(),
            vec!["--alloc-conf", "max_split_size_mb:banana"],
        ),
        "unknown_alloc_conf_key" => (
            "ok.pickle",
            synthetic(),
            vec!["--alloc-conf", "max_split_size_mib:128"],
        ),
        "bad_device_memory" => (
            "ok.pickle",
            synthetic(),
            vec!["--device-memory", "12parsecs"],
        ),
        "zero_device_memory" => ("ok.pickle", synthetic(), vec!["--device-memory", "0"]),
        "device_out_of_range" => ("ok.pickle", synthetic(), vec!["--device", "3"]),
        "png_plot" => ("ok.pickle", synthetic(), vec!["--plot", "out.png"]),
        "plot_into_missing_folder" => (
            "ok.pickle",
            synthetic(),
            vec!["--plot", "no/such/folder/out.svg"],
        ),
        "dump_into_missing_folder" => (
            "ok.pickle",
            synthetic(),
            vec!["--dump", "no/such/folder/out.pickle"],
        ),
        other => panic!("unknown case {other}"),
    }
}

/// Runs one bad-input case in `dir`; asserts the contract and returns the error line.
fn run_bad_input(dir: &Scratch, name: &str) -> String {
    let (file, input, extra) = bad_input(name);
    match input {
        Input::File(bytes) => {
            dir.write(file, &bytes);
        }
        Input::Folder => std::fs::create_dir_all(dir.path().join(file)).expect("mkdir"),
        Input::Nothing => {}
    }
    let mut args = vec!["replay", file];
    args.extend(extra);
    let out = tensormem(dir.path(), &args);
    let err = stderr(&out);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{name}: exit status; stderr: {err}"
    );
    assert!(!err.contains("panicked"), "{name}: {err}");
    assert!(err.starts_with("tensormem: error: "), "{name}: {err:?}");
    assert!(
        err.ends_with('\n') && err.matches('\n').count() == 1,
        "{name}: one line expected: {err:?}"
    );
    assert_eq!(stdout(&out), "", "{name}: nothing on stdout");
    let line = err.trim_end().to_string();
    line.replace(&dir.path().display().to_string(), "[TMP]")
}

#[rstest]
#[case::empty_file("empty_file")]
#[case::blank_json("blank_json")]
#[case::truncated_pickle("truncated_pickle")]
#[case::global_reduce("global_reduce")]
#[case::stack_global("stack_global")]
#[case::reduce_without_global("reduce_without_global")]
#[case::not_a_snapshot("not_a_snapshot")]
#[case::missing_segments("missing_segments")]
#[case::segments_not_a_list("segments_not_a_list")]
#[case::segment_missing_blocks("segment_missing_blocks")]
#[case::address_is_a_string("address_is_a_string")]
#[case::negative_size("negative_size")]
#[case::negative_event_size("negative_event_size")]
#[case::float_requested_size("float_requested_size")]
#[case::string_time("string_time")]
#[case::address_beyond_64_bits("address_beyond_64_bits")]
#[case::bad_block_state("bad_block_state")]
#[case::bad_segment_type("bad_segment_type")]
#[case::unknown_trace_action("unknown_trace_action")]
#[case::trace_entry_without_addr("trace_entry_without_addr")]
#[case::unusable_allocator_settings("unusable_allocator_settings")]
#[case::malformed_json("malformed_json")]
#[case::json_wrong_types("json_wrong_types")]
#[case::nonexistent_file("nonexistent_file")]
#[case::folder_instead_of_file("folder_instead_of_file")]
#[case::bad_alloc_conf_value("bad_alloc_conf_value")]
#[case::unknown_alloc_conf_key("unknown_alloc_conf_key")]
#[case::bad_device_memory("bad_device_memory")]
#[case::zero_device_memory("zero_device_memory")]
#[case::device_out_of_range("device_out_of_range")]
#[case::png_plot("png_plot")]
#[case::plot_into_missing_folder("plot_into_missing_folder")]
#[case::dump_into_missing_folder("dump_into_missing_folder")]
fn bad_input_is_one_error_line_and_exit_2(#[case] name: &str) {
    let dir = Scratch::new(name);
    let line = run_bad_input(&dir, name);
    let (file, ..) = bad_input(name);
    // The message names what it is about: the file, or the option.
    assert!(
        line.contains(file) || line.contains("--"),
        "{name}: the message names neither the file nor the option: {line}"
    );
}

#[test]
fn bad_input_error_lines() {
    let dir = Scratch::new("error-lines");
    let lines: Vec<String> = BAD_INPUTS
        .iter()
        .map(|name| format!("{name}:\n  {}", run_bad_input(&dir, name)))
        .collect();
    insta::assert_snapshot!(lines.join("\n"));
}

/// The options that need a history fail on a state-only file instead of doing nothing.
#[rstest]
#[case::sweep(&["--sweep"])]
#[case::from_empty(&["--from-empty"])]
#[case::plot(&["--plot", "out.svg"])]
#[case::dump(&["--dump", "out.pickle"])]
fn history_options_on_state_only_file_fail(#[case] extra: &[&str]) {
    let dir = Scratch::new("state-only-options");
    dir.write(
        "state.pickle",
        &synthetic_pickle(Format {
            bare_list: true,
            ..Format::MODERN
        }),
    );
    let mut args = vec!["replay", "state.pickle"];
    args.extend(extra);
    let out = tensormem(dir.path(), &args);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        format!(
            "tensormem: error: {}: state.pickle holds state only (no memory history to replay)\n",
            extra[0]
        )
    );
    assert!(!dir.path().join("out.svg").exists());
    assert!(!dir.path().join("out.pickle").exists());
}

// ---------------------------------------------------------------------------------------------
// Reports.

fn synthetic_dir() -> Scratch {
    let dir = Scratch::new("synthetic");
    dir.write("synthetic.pickle", &synthetic_pickle(Format::MODERN));
    dir
}

#[test]
fn synthetic_parity_report() {
    let dir = synthetic_dir();
    let text = success(&tensormem(dir.path(), &["replay", "synthetic.pickle"]));
    assert!(text.contains("allocations at PyTorch's address: 7 / 7 (100.00%)"));
    assert!(text.contains("segment decisions identical:      3 / 3 (100.00%)"));
    insta::assert_snapshot!(text);
}

#[test]
fn state_only_report() {
    let dir = Scratch::new("state-only");
    dir.write(
        "segments.pickle",
        &synthetic_pickle(Format {
            bare_list: true,
            ..Format::MODERN
        }),
    );
    let text = success(&tensormem(dir.path(), &["replay", "segments.pickle"]));
    assert!(text.contains("state only: no history to replay"));
    insta::assert_snapshot!(text);
}

/// Runs the binary on a shared snapshot, in the snapshots folder (so the report shows the
/// bare file name).
fn on_shared(file: &str, extra: &[&str]) -> Option<String> {
    let path = shared_snapshot(file)?;
    let mut args = vec!["replay", file];
    args.extend(extra);
    Some(success(&tensormem(path.parent().expect("a folder"), &args)))
}

#[test]
fn small_snapshot_parity_report() {
    let Some(text) = on_shared("lm_small_forward_from_empty.pickle", &[]) else {
        return;
    };
    assert!(text.contains("allocations at PyTorch's address: 36 / 36 (100.00%)"));
    insta::assert_snapshot!(text);
}

#[test]
fn small_snapshot_from_empty_sweep_report() {
    let Some(text) = on_shared(
        "lm_small_forward_from_empty.pickle",
        &["--from-empty", "--sweep"],
    ) else {
        return;
    };
    assert!(!text.contains("Parity with PyTorch"));
    insta::assert_snapshot!(text);
}

// ---------------------------------------------------------------------------------------------
// `--json`.

/// The keys of `torch.cuda.memory_stats()`: torch 2.7's 122, and with `newest` torch 2.15's
/// `num_oom_rejections`.
fn memory_stats_keys(newest: bool) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    let fields = ["current", "peak", "allocated", "freed"];
    for array in [
        "allocation",
        "segment",
        "active",
        "inactive_split",
        "allocated_bytes",
        "reserved_bytes",
        "active_bytes",
        "inactive_split_bytes",
        "requested_bytes",
    ] {
        for pool in ["all", "small_pool", "large_pool"] {
            for f in fields {
                keys.insert(format!("{array}.{pool}.{f}"));
            }
        }
    }
    for stat in ["oversize_allocations", "oversize_segments"] {
        for f in fields {
            keys.insert(format!("{stat}.{f}"));
        }
    }
    for scalar in [
        "num_alloc_retries",
        "num_ooms",
        "max_split_size",
        "num_sync_all_streams",
        "num_device_alloc",
        "num_device_free",
    ] {
        keys.insert(scalar.to_string());
    }
    if newest {
        keys.insert("num_oom_rejections".to_string());
    }
    keys
}

#[derive(Clone, Copy, Debug)]
enum Ty {
    U64,
    I64,
    F64,
    Bool,
    Str,
    Array,
    Object,
}

fn has_type(v: &Json, ty: Ty) -> bool {
    match ty {
        Ty::U64 => v.is_u64(),
        Ty::I64 => v.is_i64(),
        Ty::F64 => v.is_f64(),
        Ty::Bool => v.is_boolean(),
        Ty::Str => v.is_string(),
        Ty::Array => v.is_array(),
        Ty::Object => v.is_object(),
    }
}

/// Asserts `obj` has exactly `schema`'s keys (`nullable` ones may be null) with those types.
fn assert_schema(obj: &Json, schema: &[(&str, Ty, bool)], at: &str) {
    let map = obj.as_object().unwrap_or_else(|| panic!("{at}: an object"));
    let keys: BTreeSet<&str> = map.keys().map(String::as_str).collect();
    let want: BTreeSet<&str> = schema.iter().map(|s| s.0).collect();
    assert_eq!(keys, want, "{at}: keys");
    for &(key, ty, nullable) in schema {
        let v = &map[key];
        assert!(
            has_type(v, ty) || (nullable && v.is_null()),
            "{at}.{key}: expected {ty:?}{}, found {v}",
            if nullable { " or null" } else { "" }
        );
    }
}

/// Checks the `--json` document against the schema documented on `report::JsonReport`.
fn assert_report_schema(doc: &Json) {
    use Ty::*;
    assert_schema(
        doc,
        &[
            ("file", Str, false),
            ("device", U64, false),
            ("events", U64, false),
            ("config", Str, false),
            ("alloc_conf", Str, false),
            ("torch_version", Str, false),
            ("torch_version_detected", Bool, false),
            ("parity_by_version", Array, true),
            ("parity", Object, true),
            ("peak_reserved_bytes", U64, false),
            ("peak_event_index", U64, false),
            ("peak_allocated_bytes", U64, false),
            ("recorded_peak_reserved_bytes", U64, true),
            ("lower_bound_bytes", U64, false),
            ("device_mallocs", I64, false),
            ("num_alloc_retries", I64, false),
            ("num_ooms", I64, false),
            ("failed_allocs", U64, false),
            ("skipped_frees", U64, false),
            ("empty_cache_calls", U64, false),
            ("sweep", Array, false),
            ("memory_stats", Object, false),
        ],
        "report",
    );
    for (i, row) in doc["parity_by_version"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        assert_schema(
            row,
            &[
                ("torch_version", Str, false),
                ("alloc_address_match", U64, true),
                ("alloc_total", U64, true),
                ("segment_decision_match", U64, true),
                ("segment_decision_total", U64, true),
            ],
            &format!("parity_by_version[{i}]"),
        );
    }
    assert!(["2.7", "2.15"].contains(&doc["torch_version"].as_str().unwrap()));
    if !doc["parity"].is_null() {
        assert_schema(
            &doc["parity"],
            &[
                ("alloc_address_match", U64, false),
                ("alloc_total", U64, false),
                ("segment_decision_match", U64, false),
                ("segment_decision_total", U64, false),
                ("first_divergence", Object, true),
            ],
            "parity",
        );
    }
    for (i, row) in doc["sweep"].as_array().into_iter().flatten().enumerate() {
        assert_schema(
            row,
            &[
                ("config", Str, false),
                ("alloc_conf", Str, false),
                ("torch_version", Str, false),
                ("peak_reserved_bytes", U64, false),
                ("peak_event_index", U64, false),
                ("peak_allocated_bytes", U64, false),
                ("lower_bound_bytes", U64, false),
                ("fragmentation", F64, false),
                ("device_mallocs", I64, false),
                ("num_alloc_retries", I64, false),
                ("num_ooms", I64, false),
            ],
            &format!("sweep[{i}]"),
        );
    }
    assert_memory_stats(&doc["memory_stats"], doc["torch_version"] == "2.15");
}

fn assert_memory_stats(stats: &Json, newest: bool) {
    let map = stats.as_object().expect("memory_stats is an object");
    let keys: BTreeSet<String> = map.keys().cloned().collect();
    assert_eq!(keys.len(), if newest { 123 } else { 122 });
    assert_eq!(keys, memory_stats_keys(newest));
    for (k, v) in map {
        assert!(v.is_i64(), "memory_stats.{k}: an integer, found {v}");
    }
}

fn json_of(text: &str) -> Json {
    serde_json::from_str(text).expect("--json prints one JSON document")
}

#[test]
fn json_parity_report_schema_and_values() {
    let dir = synthetic_dir();
    let doc = json_of(&success(&tensormem(
        dir.path(),
        &["replay", "synthetic.pickle", "--json"],
    )));
    assert_report_schema(&doc);
    let p = &doc["parity"];
    assert_eq!(p["alloc_address_match"], SYNTH_ALLOCS);
    assert_eq!(p["alloc_total"], SYNTH_ALLOCS);
    assert_eq!(p["segment_decision_match"], SYNTH_SEGMENT_ALLOCS);
    assert_eq!(p["segment_decision_total"], SYNTH_SEGMENT_ALLOCS);
    assert!(p["first_divergence"].is_null());
    assert_eq!(doc["peak_reserved_bytes"], SYNTH_PEAK_RESERVED);
    assert_eq!(doc["recorded_peak_reserved_bytes"], SYNTH_PEAK_RESERVED);
    assert_eq!(doc["sweep"], Json::Array(vec![]));
    assert_eq!(doc["file"], "synthetic.pickle");
    // The default is named as the text names it; the string to paste is beside it.
    assert_eq!(doc["config"], "default");
    assert_eq!(doc["alloc_conf"], "");
    assert_eq!(doc["events"], 16);
    let stats = &doc["memory_stats"];
    assert_eq!(stats["reserved_bytes.all.current"], SYNTH_PEAK_RESERVED);
    assert_eq!(stats["num_device_alloc"], 3);
    assert_eq!(stats["max_split_size"], -1);
    assert_eq!(
        stats["allocated_bytes.all.current"],
        1024 + 4096 + (8 << 20)
    );
}

/// `--torch-version`: the given rules are used and named, no detection runs; without it a
/// parity replay detects (the synthetic history has no tie, so both versions reproduce it and
/// the newest is used); what-if replays use the newest. A bad version is one error line.
#[test]
fn torch_version_option() {
    let dir = synthetic_dir();
    let json = |args: &[&str]| json_of(&success(&tensormem(dir.path(), args)));
    let detected = json(&["replay", "synthetic.pickle", "--json"]);
    assert_eq!(detected["torch_version"], "2.15");
    assert_eq!(detected["torch_version_detected"], true);
    let rows = detected["parity_by_version"].as_array().expect("a list");
    assert_eq!(rows.len(), 2);
    assert_eq!(
        (&rows[0]["torch_version"], &rows[1]["torch_version"]),
        (&Json::from("2.7"), &Json::from("2.15"))
    );
    for row in rows {
        assert_eq!(row["alloc_address_match"], SYNTH_ALLOCS);
    }
    let given = json(&[
        "replay",
        "synthetic.pickle",
        "--json",
        "--torch-version",
        "2.7.1",
    ]);
    assert_eq!(given["torch_version"], "2.7");
    assert_eq!(given["torch_version_detected"], false);
    assert!(given["parity_by_version"].is_null());
    assert_memory_stats(&given["memory_stats"], false);
    let what_if = json(&[
        "replay",
        "synthetic.pickle",
        "--json",
        "--from-empty",
        "--sweep",
    ]);
    assert_eq!(what_if["torch_version"], "2.15");
    assert_eq!(what_if["torch_version_detected"], false);
    for row in what_if["sweep"].as_array().expect("rows") {
        assert_eq!(row["torch_version"], "2.15");
    }
    let text = success(&tensormem(
        dir.path(),
        &["replay", "synthetic.pickle", "--torch-version", "2.7"],
    ));
    assert!(
        text.contains("Parity with PyTorch (torch 2.7 rules"),
        "{text}"
    );
    assert!(text.contains("torch version:                    2.7 rules (--torch-version)"));
    let out = tensormem(
        dir.path(),
        &["replay", "synthetic.pickle", "--torch-version", "2.8"],
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("tensormem: error: --torch-version:"),
        "{err}"
    );
    assert!(err.contains("expected one of 2.7, 2.15"), "{err}");
}

#[test]
fn json_sweep_report_schema_and_invariants() {
    let dir = synthetic_dir();
    let doc = json_of(&success(&tensormem(
        dir.path(),
        &[
            "replay",
            "synthetic.pickle",
            "--from-empty",
            "--sweep",
            "--json",
        ],
    )));
    assert_report_schema(&doc);
    assert!(doc["parity"].is_null());
    assert!(doc["recorded_peak_reserved_bytes"].is_null());
    let rows = doc["sweep"].as_array().expect("sweep rows");
    let configs: Vec<&str> = rows.iter().map(|r| r["config"].as_str().unwrap()).collect();
    assert_eq!(
        configs,
        [
            "default",
            "max_split_size_mb:128",
            "roundup_power2_divisions:4",
            "expandable_segments:True"
        ]
    );
    let strings: Vec<&str> = rows
        .iter()
        .map(|r| r["alloc_conf"].as_str().unwrap())
        .collect();
    assert_eq!(
        strings[0], "",
        "the default's PYTORCH_CUDA_ALLOC_CONF is empty"
    );
    assert_eq!(&strings[1..], &configs[1..]);
    for r in rows {
        let (reserved, allocated, lower) = (
            r["peak_reserved_bytes"].as_u64().unwrap(),
            r["peak_allocated_bytes"].as_u64().unwrap(),
            r["lower_bound_bytes"].as_u64().unwrap(),
        );
        assert!(reserved >= allocated && allocated >= lower, "{r}");
        assert_eq!(r["num_ooms"], 0);
    }
    // The default row is the main replay.
    assert_eq!(rows[0]["peak_reserved_bytes"], doc["peak_reserved_bytes"]);
    assert_eq!(rows[0]["peak_reserved_bytes"], SYNTH_PEAK_RESERVED);
}

#[test]
fn json_state_only_schema() {
    let dir = Scratch::new("json-state");
    dir.write(
        "segments.pickle",
        &synthetic_pickle(Format {
            bare_list: true,
            ..Format::MODERN
        }),
    );
    let doc = json_of(&success(&tensormem(
        dir.path(),
        &["replay", "segments.pickle", "--json"],
    )));
    use Ty::*;
    assert_schema(
        &doc,
        &[
            ("file", Str, false),
            ("state_only", Bool, false),
            ("segments", U64, false),
            ("reserved_bytes", U64, false),
            ("allocated_bytes", U64, false),
            ("stray_trace_entries", U64, false),
            ("memory_stats", Object, false),
            ("unknown", Array, false),
        ],
        "state-only report",
    );
    assert_eq!(doc["state_only"], true);
    assert_eq!(doc["segments"], 3);
    assert_eq!(doc["reserved_bytes"], SYNTH_PEAK_RESERVED);
    // A state-only dump is counted under the newest rules; a dump gives the current values
    // only, the rest is unknown (null), never 0.
    let map = doc["memory_stats"].as_object().expect("an object");
    let keys: BTreeSet<String> = map.keys().cloned().collect();
    assert_eq!(keys, memory_stats_keys(true));
    for (k, v) in map {
        if k.ends_with(".current") {
            assert!(v.is_i64(), "memory_stats.{k}: {v}");
        } else {
            assert!(
                v.is_null(),
                "memory_stats.{k}: unknown in a dump, found {v}"
            );
        }
    }
    assert_eq!(
        doc["memory_stats"]["reserved_bytes.all.current"],
        SYNTH_PEAK_RESERVED
    );
}

#[test]
fn json_on_small_shared_snapshot() {
    let Some(text) = on_shared(
        "lm_small_forward_from_empty.pickle",
        &["--from-empty", "--sweep", "--json"],
    ) else {
        return;
    };
    let doc = json_of(&text);
    assert_report_schema(&doc);
    assert_eq!(doc["sweep"].as_array().map(Vec::len), Some(4));
    let Some(text) = on_shared("lm_small_forward_from_empty.pickle", &["--json"]) else {
        return;
    };
    let doc = json_of(&text);
    assert_report_schema(&doc);
    assert_eq!(doc["parity"]["alloc_address_match"], 36);
    assert_eq!(doc["parity"]["alloc_total"], 36);
    assert_eq!(doc["parity"]["segment_decision_match"], 9);
    assert_eq!(doc["parity"]["segment_decision_total"], 9);
    assert_eq!(
        doc["peak_reserved_bytes"],
        doc["recorded_peak_reserved_bytes"]
    );
}

// ---------------------------------------------------------------------------------------------
// The demo.

/// The rows of a what-if table: (config label, peak reserved, peak allocated, lower bound),
/// in GiB as printed.
fn sweep_rows(text: &str) -> Vec<(String, f64, f64, f64)> {
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("config ") {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        if t.starts_with("(frag") {
            break;
        }
        let cols: Vec<&str> = t.split_whitespace().collect();
        // label, reserved, GiB, allocated, GiB, lower bound, GiB, frag, mallocs, retries, OOMs
        assert_eq!(cols.len(), 11, "a table row: {line}");
        assert_eq!((cols[2], cols[4], cols[6]), ("GiB", "GiB", "GiB"), "{line}");
        let num = |s: &str| s.parse::<f64>().expect("a number");
        rows.push((
            cols[0].to_string(),
            num(cols[1]),
            num(cols[3]),
            num(cols[5]),
        ));
    }
    rows
}

#[test]
fn demo_runs_without_data_files() {
    let dir = Scratch::new("demo");
    let text = success(&tensormem(dir.path(), &[]));
    assert_eq!(
        std::fs::read_dir(dir.path()).expect("readable").count(),
        0,
        "the demo writes no files"
    );
    let rows = sweep_rows(&text);
    let labels: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(
        labels,
        [
            "default",
            "max_split_size_mb:128",
            "roundup_power2_divisions:4",
            "expandable_segments:True"
        ]
    );
    for (label, reserved, allocated, lower) in &rows {
        assert!(reserved >= lower, "{label}: reserved below the lower bound");
        assert!(reserved >= allocated && allocated >= lower, "{label}");
        assert!(*lower > 0.0, "{label}");
    }
    // `tensormem demo` is the same.
    assert_eq!(success(&tensormem(dir.path(), &["demo"])), text);
    insta::assert_snapshot!(text);
}

/// The demo's sweep, exactly, through the library.
#[test]
fn demo_sweep_invariants_in_bytes() {
    use tensormem::demo::{DemoModel, workload};
    use tensormem::sweep::{standard_configs, sweep};
    let snap = workload(&DemoModel::default());
    let base = tensormem::replay::ReplayOptions::new(Default::default(), 24 << 30, true);
    let rows = sweep(&snap, 0, &standard_configs(), &base, &mut |_, _, _| {})
        .expect("the demo sweep runs");
    assert_eq!(rows.len(), 4);
    let lower = rows[0].lower_bound;
    for o in &rows {
        assert_eq!(
            o.lower_bound, lower,
            "the lower bound does not depend on the config"
        );
        assert!(o.peak_reserved >= o.peak_allocated, "{}", o.config);
        assert!(o.peak_allocated >= o.lower_bound, "{}", o.config);
        assert_eq!((o.ooms, o.failed_allocs, o.skipped_frees), (0, 0, 0));
    }
}

// ---------------------------------------------------------------------------------------------
// `--plot` and `--dump`.

fn svg_in(dir: &Path, args: &[&str]) -> String {
    let text = success(&tensormem(dir, args));
    assert!(text.contains("plot written to out.svg"), "{text}");
    std::fs::read_to_string(dir.join("out.svg")).expect("the SVG was written")
}

#[test]
fn plot_writes_an_svg_with_the_config_labels() {
    let dir = synthetic_dir();
    let svg = svg_in(
        dir.path(),
        &["replay", "synthetic.pickle", "--sweep", "--plot", "out.svg"],
    );
    assert!(svg.contains("<svg"));
    for label in [
        "default: reserved",
        "default: allocated",
        "max_split_size_mb:128: reserved",
        "roundup_power2_divisions:4: reserved",
        "expandable_segments:True: reserved",
    ] {
        assert!(svg.contains(label), "the SVG lacks the label {label:?}");
    }
    assert!(svg.contains("synthetic.pickle"), "the title names the file");
    // The recorded times are the x axis when every entry has one.
    assert!(svg.contains("time (s)"));
}

#[test]
fn plot_without_recorded_times_uses_the_event_index() {
    let dir = Scratch::new("plot-no-time");
    dir.write(
        "old.pickle",
        &synthetic_pickle(Format {
            time_us: false,
            ..Format::MODERN
        }),
    );
    let svg = svg_in(
        dir.path(),
        &["replay", "old.pickle", "--from-empty", "--plot", "out.svg"],
    );
    assert!(svg.contains("<svg"));
    assert!(svg.contains("event index"));
    assert!(svg.contains("default: reserved"));
    assert!(!svg.contains("max_split_size_mb:128"));
}

/// `--dump` writes a PyTorch-format pickle: our segments and our history; it decodes, its
/// segments sum to our reserved bytes, its trace has one `alloc` per replayed allocation, and
/// it replays back with full parity.
fn check_dump(dir: &Path, file: &str, extra: &[&str]) {
    let mut args = vec!["replay", file, "--json", "--dump", "dump.pickle"];
    args.extend(extra);
    let doc = json_of(&success(&tensormem(dir, &args)));
    let dump = dir.join("dump.pickle");
    let bytes = std::fs::read(&dump).expect("the dump was written");
    let v = tensormem_pickle::decode(&bytes).expect("our decoder reads the dump");
    let keys: Vec<&str> = v
        .as_dict()
        .expect("a dict")
        .keys()
        .map(|k| k.as_str().expect("str keys"))
        .collect();
    assert_eq!(
        keys,
        [
            "segments",
            "device_traces",
            "allocator_settings",
            "external_annotations"
        ]
    );
    let segments = v.get("segments").and_then(Value::as_list).expect("a list");
    let reserved: i64 = segments
        .iter()
        .map(|s| {
            s.get("total_size")
                .and_then(Value::as_i64)
                .expect("total_size")
        })
        .sum();
    assert_eq!(
        Json::from(reserved),
        doc["memory_stats"]["reserved_bytes.all.current"],
        "the dump's segments sum to our reserved bytes"
    );
    let traces = v
        .get("device_traces")
        .and_then(Value::as_list)
        .expect("a list");
    assert_eq!(traces.len(), 1);
    let trace = traces[0].as_list().expect("a list");
    let allocs = trace
        .iter()
        .filter(|e| e.get("action").and_then(Value::as_str) == Some("alloc"))
        .count();
    assert_eq!(doc["failed_allocs"], 0);
    let replayed = match doc["parity"]["alloc_total"].as_u64() {
        Some(n) => n as usize,
        // From empty: every alloc event of the recording was replayed.
        None => allocs,
    };
    assert_eq!(allocs, replayed, "one alloc entry per replayed allocation");
    assert_eq!(
        trace
            .last()
            .and_then(|e| e.get("action"))
            .and_then(Value::as_str),
        Some("snapshot")
    );
    // Our dump replays back through our loader with full parity, under the rules of the
    // version detected for the recording (the dump holds our decisions under them).
    let snap = load_path(&dump).expect("the dump loads");
    let (mut runs, best) = tensormem::versions::detect(
        &snap,
        0,
        &ReplayOptions::new(snap.config(), 1 << 40, false),
        &|_| Some(snap.config()),
        &mut |_, _, _| {},
    )
    .expect("the dump replays");
    let o = runs[best].outcome.take().expect("replayed");
    let p = o.parity.expect("parity mode");
    assert_eq!(p.alloc_total, allocs);
    assert_eq!(
        p.alloc_address_match, p.alloc_total,
        "{:?}",
        p.first_divergence
    );
    assert_eq!(p.segment_decision_match, p.segment_decision_total);
    assert_eq!(p.first_divergence, None);
    assert_eq!(o.recorded_peak_reserved, Some(o.peak_reserved));
}

#[test]
fn dump_of_a_parity_replay() {
    let dir = synthetic_dir();
    check_dump(dir.path(), "synthetic.pickle", &[]);
}

#[test]
fn dump_of_a_from_empty_replay() {
    let dir = synthetic_dir();
    check_dump(dir.path(), "synthetic.pickle", &["--from-empty"]);
}

/// On real snapshots: one from empty, one with a rebuilt start state (216 segments).
#[rstest]
#[case::lm_small_forward_from_empty("lm_small_forward_from_empty.pickle")]
#[case::gpt2small_trainstep_steady("gpt2small_trainstep_steady.pickle")]
fn dump_of_a_shared_snapshot(#[case] file: &str) {
    let Some(path) = shared_snapshot(file) else {
        return;
    };
    let dir = Scratch::new("dump-shared");
    std::fs::copy(&path, dir.path().join(file)).expect("copy");
    check_dump(dir.path(), file, &[]);
}

/// `tensormem | head -1`: a reader that goes away is not an error (and never a panic).
#[test]
fn closed_stdout_is_not_an_error() {
    use std::process::{Command, Stdio};
    let dir = synthetic_dir();
    for args in [&[][..], &["replay", "synthetic.pickle", "--sweep"][..]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tensormem"))
            .args(args)
            .current_dir(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("wait");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        assert_eq!(stderr(&out), "", "{args:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// `tensormem train`: live DTR on the simulated device.

/// A small MLP, costs estimated, so that every figure but wall times is deterministic.
const SMALL_TRAIN: [&str; 13] = [
    "train",
    "--batch",
    "64",
    "--features",
    "16",
    "--width",
    "16",
    "--layers",
    "4",
    "--steps",
    "3",
    "--cost",
    "estimated",
];

#[test]
fn train_report_with_the_searched_budget() {
    let dir = Scratch::new("train");
    let text = success(&tensormem(dir.path(), &SMALL_TRAIN));
    assert!(
        text.contains("losses with and without the budget: bit-identical"),
        "{text}"
    );
    assert!(text.contains("the smallest feasible ratio found"), "{text}");
    let rows: Vec<&str> = text.lines().filter(|l| l.ends_with("  yes")).collect();
    assert_eq!(rows.len(), 3, "{text}");
    insta::with_settings!({filters => vec![
        (r"\d+\.\d ms", "[time]"),
    ]}, {
        insta::assert_snapshot!(text);
    });
}

#[test]
fn train_log_replays_with_tensormem_dtr() {
    let dir = Scratch::new("train-log");
    let mut args = SMALL_TRAIN.to_vec();
    args.extend(["--ratio", "0.8", "--log", "step.log", "--model", "mlp"]);
    let text = success(&tensormem(dir.path(), &args));
    assert!(
        text.contains("operator log of the last budgeted step written to step.log"),
        "{text}"
    );
    let replay = success(&tensormem(
        dir.path(),
        &["dtr", "step.log", "--ratio", "0.6"],
    ));
    assert!(replay.contains(" OK"), "{replay}");
}

#[test]
fn train_transformer_runs() {
    let dir = Scratch::new("train-transformer");
    let text = success(&tensormem(
        dir.path(),
        &[
            "train",
            "--model",
            "transformer",
            "--batch",
            "2",
            "--seq",
            "8",
            "--features",
            "16",
            "--steps",
            "2",
            "--ratio",
            "0.9",
            "--cost",
            "estimated",
        ],
    ));
    assert!(
        text.contains("losses with and without the budget: bit-identical"),
        "{text}"
    );
    assert!(
        text.contains("peak allocated") && text.contains("<= budget"),
        "{text}"
    );
}

#[rstest]
#[case::model(&["--model", "resnet"], "--model")]
#[case::heuristic(&["--heuristic", "best"], "--heuristic")]
#[case::cost(&["--cost", "fast"], "--cost")]
#[case::ratio(&["--ratio", "0"], "--ratio")]
#[case::budget_unit(&["--budget", "4 parsecs"], "--budget")]
#[case::infeasible(&["--budget", "1KiB"], "infeasible")]
#[case::steps(&["--steps", "0"], "--steps")]
#[case::log(&["--ratio", "0.9", "--log", "missing/dir/step.log"], "--log")]
fn train_bad_options_are_one_line(#[case] extra: &[&str], #[case] names: &str) {
    let dir = Scratch::new("train-bad");
    // SMALL_TRAIN without the options the case sets.
    let mut args = vec![SMALL_TRAIN[0]];
    for pair in SMALL_TRAIN[1..].chunks(2) {
        if !extra.contains(&pair[0]) {
            args.extend_from_slice(pair);
        }
    }
    args.extend_from_slice(extra);
    let o = tensormem(dir.path(), &args);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("tensormem: error: ") && err.contains(names),
        "{err}"
    );
}

/// Usage errors (clap's) follow the same rule as every other error: one line, exit status 2.
#[rstest]
#[case::missing_file(&["replay"], "the following required arguments were not provided: <FILE>")]
#[case::unknown_flag(&["replay", "x.pickle", "--bogus"], "unexpected argument '--bogus' found")]
#[case::unknown_subcommand(&["bogus"], "unrecognized subcommand 'bogus'")]
#[case::empty_dtr_log(&["dtr", "empty.log"], "empty.log: the log is empty: no instruction on any line")]
fn usage_errors_are_one_line(#[case] args: &[&str], #[case] message: &str) {
    let dir = Scratch::new("usage");
    dir.write("empty.log", b"");
    let out = tensormem(dir.path(), args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(stdout(&out), "");
    assert!(
        err.ends_with('\n') && err.matches('\n').count() == 1,
        "{args:?}: one line expected: {err:?}"
    );
    assert!(
        err.starts_with("tensormem: error: ") && err.contains(message),
        "{args:?}: {err:?}"
    );
}

#[test]
fn train_under_a_device_budget_stays_under_the_capacity_with_the_same_losses() {
    let dir = Scratch::new("train-device");
    // The default MLP: 256 KiB activations in the small pool's 2 MiB segments; 0.85 of its
    // 5.06 MiB peak leaves room for two segments. Without --strategy: window (train's own
    // default: its live driver cannot copy).
    for given in [Some("window"), Some("callback"), None] {
        let mut line = vec![
            "train",
            "--steps",
            "2",
            "--cost",
            "estimated",
            "--ratio",
            "0.85",
            "--device-budget",
        ];
        line.extend(given.map(|s| ["--strategy", s]).into_iter().flatten());
        let strategy = given.unwrap_or("window");
        let text = success(&tensormem(dir.path(), &line));
        assert!(
            text.contains(&format!(
                "device-memory budget: the budget is the capacity of a host-backed simulated device; evictions on the allocator's misses, strategy {strategy}"
            )),
            "{text}"
        );
        assert!(
            text.contains("budgeted run: peak reserved 4,194,304 B <= device capacity 4,508,236 B"),
            "{text}"
        );
        assert!(
            text.contains("losses with and without the budget: bit-identical"),
            "{text}"
        );
        assert!(
            text.contains("recomputed values bit-identical to their first computation"),
            "{text}"
        );
        let rows: Vec<&str> = text.lines().filter(|l| l.ends_with("  yes")).collect();
        assert_eq!(rows.len(), 2, "{text}");
    }
    let o = tensormem(dir.path(), &["train", "--strategy", "window"]);
    assert!(!o.status.success());
}
