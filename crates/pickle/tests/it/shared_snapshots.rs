//! Decodes every real PyTorch snapshot in `shared/data/snapshots` and checks facts about each
//! that were read with CPython's `pickle` (counts of segments, blocks, trace entries and actions,
//! and how many distinct frame dicts the memo shares), then re-encodes each and decodes it back.
//!
//! The folder is `<workspace>/../shared/data/snapshots`, or `$TENSORMEM_SHARED/data/snapshots`.
//! When it is absent the tests print "skipping: ..." and pass, except under `CI=true`, where
//! they fail.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;

use tensormem_pickle::{Value, decode, encode};

fn snapshots_dir() -> Option<PathBuf> {
    shared_data::snapshots_dir()
}

/// Facts about one file, as CPython's `pickle.load` reads it.
struct Facts {
    file: &'static str,
    keys: &'static [&'static str],
    /// Entries per device trace.
    trace_entries: &'static [usize],
    segments: usize,
    blocks: usize,
    /// Sum of the segments' `total_size`, bytes.
    total_size: i64,
    /// Trace entries per action.
    actions: &'static [(&'static str, usize)],
    /// Frame dicts referenced from trace entries, segments and blocks...
    frame_refs: usize,
    /// ...and how many distinct objects they are (the memo shares them).
    distinct_frames: usize,
}

const KEYS4: &[&str] = &[
    "segments",
    "device_traces",
    "allocator_settings",
    "external_annotations",
];
const KEYS2: &[&str] = &["segments", "device_traces"];
const FREES: [(&str, usize); 0] = [];

const FACTS: &[Facts] = &[
    Facts {
        file: "diffusion_eval_state.pickle",
        keys: KEYS2,
        trace_entries: &[0, 0],
        segments: 672,
        blocks: 6633,
        total_size: 11_276_386_304,
        actions: &FREES,
        frame_refs: 0,
        distinct_frames: 0,
    },
    Facts {
        file: "expandable_segments_state.pickle",
        keys: KEYS4,
        trace_entries: &[0],
        segments: 2,
        blocks: 7,
        total_size: 23_068_672,
        actions: &FREES,
        frame_refs: 0,
        distinct_frames: 0,
    },
    Facts {
        file: "gpt2small_trainstep_steady.pickle",
        keys: KEYS4,
        trace_entries: &[5163],
        segments: 216,
        blocks: 455,
        total_size: 14_180_941_824,
        actions: &[
            ("alloc", 1721),
            ("free_completed", 1721),
            ("free_requested", 1721),
        ],
        frame_refs: 15978,
        distinct_frames: 83,
    },
    Facts {
        file: "lm2.7b_ctx128_forward_fp32.pickle",
        keys: KEYS4,
        trace_entries: &[4657],
        segments: 516,
        blocks: 1276,
        total_size: 19_667_091_456,
        actions: &[
            ("alloc", 2058),
            ("free_completed", 1155),
            ("free_requested", 1155),
            ("segment_alloc", 289),
        ],
        frame_refs: 412_692,
        distinct_frames: 409,
    },
    Facts {
        file: "lm2.7b_ctx128_trainstep_fp32.pickle",
        keys: KEYS4,
        trace_entries: &[19342],
        segments: 1010,
        blocks: 1525,
        total_size: 61_111_009_280,
        actions: &[
            ("alloc", 6771),
            ("free_completed", 5894),
            ("free_requested", 5894),
            ("segment_alloc", 783),
        ],
        frame_refs: 768_002,
        distinct_frames: 668,
    },
    Facts {
        file: "lm2.7b_ctx512_forward_bf16.pickle",
        keys: KEYS4,
        trace_entries: &[6765],
        segments: 868,
        blocks: 1816,
        total_size: 40_514_879_488,
        actions: &[
            ("alloc", 2702),
            ("free_completed", 1414),
            ("free_requested", 1414),
            ("segment_alloc", 638),
            ("segment_free", 597),
        ],
        frame_refs: 617_866,
        distinct_frames: 432,
    },
    Facts {
        file: "lm_small_forward_bf16.pickle",
        keys: KEYS4,
        trace_entries: &[2043],
        segments: 29,
        blocks: 164,
        total_size: 610_271_232,
        actions: &[
            ("alloc", 681),
            ("free_completed", 681),
            ("free_requested", 681),
        ],
        frame_refs: 73771,
        distinct_frames: 386,
    },
    Facts {
        file: "lm_small_forward_from_empty.pickle",
        keys: KEYS4,
        trace_entries: &[97],
        segments: 9,
        blocks: 20,
        total_size: 3_781_165_056,
        actions: &[
            ("alloc", 36),
            ("free_completed", 26),
            ("free_requested", 26),
            ("segment_alloc", 9),
        ],
        frame_refs: 3375,
        distinct_frames: 276,
    },
    Facts {
        file: "opt1.3b_inference_at_oom_state.pickle",
        keys: KEYS2,
        trace_entries: &[1],
        segments: 176,
        blocks: 463,
        total_size: 11_844_714_496,
        actions: &[("snapshot", 1)],
        frame_refs: 0,
        distinct_frames: 0,
    },
];

fn list<'a>(v: &'a Value, what: &str) -> &'a [Value] {
    v.as_list()
        .unwrap_or_else(|| panic!("{what} is a {}, not a list", v.type_name()))
}

/// Counts frame dicts under `frames` of `entry` (if any), and records their addresses.
fn count_frames(entry: &Value, refs: &mut usize, distinct: &mut HashSet<*const ()>) {
    if let Some(frames) = entry.get("frames") {
        for frame in list(frames, "frames") {
            let dict = frame.as_dict().expect("a frame is a dict");
            assert!(dict.get("filename").and_then(Value::as_str).is_some());
            assert!(dict.get("name").and_then(Value::as_str).is_some());
            assert!(dict.get("line").and_then(Value::as_i64).is_some());
            *refs += 1;
            distinct.insert(dict.entries().as_ptr() as *const ());
        }
    }
}

fn check_facts(facts: &Facts, snapshot: &Value) {
    let file = facts.file;
    let top = snapshot.as_dict().expect("top level is a dict");
    let keys: Vec<&str> = top.keys().map(|k| k.as_str().expect("str key")).collect();
    assert_eq!(keys, facts.keys, "{file}: top-level keys");

    let traces = list(snapshot.get("device_traces").unwrap(), "device_traces");
    let lens: Vec<usize> = traces.iter().map(|t| list(t, "trace").len()).collect();
    assert_eq!(
        lens, facts.trace_entries,
        "{file}: trace entries per device"
    );

    let segments = list(snapshot.get("segments").unwrap(), "segments");
    assert_eq!(segments.len(), facts.segments, "{file}: segments");
    let mut blocks = 0;
    let mut total = 0;
    let mut refs = 0;
    let mut distinct = HashSet::new();
    for segment in segments {
        total += segment
            .get("total_size")
            .and_then(Value::as_i64)
            .expect("total_size");
        // Absent in older files (opt1.3b).
        if let Some(pool) = segment.get("segment_pool_id") {
            assert!(
                matches!(pool, Value::Tuple(t) if t.len() == 2),
                "{file}: pool id"
            );
        }
        count_frames(segment, &mut refs, &mut distinct);
        for block in list(segment.get("blocks").expect("blocks"), "blocks") {
            blocks += 1;
            assert!(block.get("size").and_then(Value::as_i64).is_some());
            assert!(block.get("state").and_then(Value::as_str).is_some());
            count_frames(block, &mut refs, &mut distinct);
        }
    }
    assert_eq!(blocks, facts.blocks, "{file}: blocks");
    assert_eq!(total, facts.total_size, "{file}: total_size");

    let mut actions = BTreeMap::new();
    for trace in traces {
        for entry in list(trace, "trace") {
            let action = entry.get("action").and_then(Value::as_str).expect("action");
            *actions.entry(action.to_string()).or_insert(0usize) += 1;
            count_frames(entry, &mut refs, &mut distinct);
        }
    }
    let expected: BTreeMap<String, usize> = facts
        .actions
        .iter()
        .map(|(a, n)| (a.to_string(), *n))
        .collect();
    assert_eq!(actions, expected, "{file}: actions");
    assert_eq!(refs, facts.frame_refs, "{file}: frame references");
    assert_eq!(
        distinct.len(),
        facts.distinct_frames,
        "{file}: distinct frame dicts (memo sharing)"
    );
}

#[test]
fn every_shared_snapshot_decodes_with_cpython_facts() {
    let Some(dir) = snapshots_dir() else { return };
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".pickle"))
        .collect();
    files.sort();
    let known: Vec<&str> = FACTS.iter().map(|f| f.file).collect();
    assert_eq!(
        files, known,
        "the snapshot folder holds other files than the table knows"
    );
    for facts in FACTS {
        let bytes = std::fs::read(dir.join(facts.file)).unwrap();
        let snapshot = decode(&bytes).unwrap_or_else(|e| panic!("{}: {e}", facts.file));
        check_facts(facts, &snapshot);
    }
}

#[test]
fn every_shared_snapshot_round_trips_through_encode() {
    let Some(dir) = snapshots_dir() else { return };
    for facts in FACTS {
        let bytes = std::fs::read(dir.join(facts.file)).unwrap();
        let snapshot = decode(&bytes).unwrap();
        let encoded = encode(&snapshot);
        let back = decode(&encoded).unwrap_or_else(|e| panic!("{}: {e}", facts.file));
        assert_eq!(back, snapshot, "{}: decode(encode(x)) == x", facts.file);
        // The same facts hold, sharing included.
        check_facts(facts, &back);
        // Sharing is kept, so the file stays about as small as PyTorch's.
        assert!(
            encoded.len() <= bytes.len() * 11 / 10,
            "{}: re-encoded to {} bytes from {}",
            facts.file,
            encoded.len(),
            bytes.len()
        );
    }
}

#[test]
fn snapshot_exports_to_json_and_back() {
    let Some(dir) = snapshots_dir() else { return };
    let bytes = std::fs::read(dir.join("lm_small_forward_from_empty.pickle")).unwrap();
    let snapshot = decode(&bytes).unwrap();
    let json = snapshot.to_json_string().unwrap();
    let back = tensormem_pickle::from_json(&json).unwrap();
    // JSON turns tuples into lists and NaN/inf into null; the rest of this file survives.
    let traces = list(back.get("device_traces").unwrap(), "device_traces");
    assert_eq!(list(&traces[0], "trace").len(), 97);
    assert_eq!(list(back.get("segments").unwrap(), "segments").len(), 9);
    let first = &list(&traces[0], "trace")[0];
    let original = &list(&list(snapshot.get("device_traces").unwrap(), "t")[0], "t")[0];
    assert_eq!(first, original);
}
