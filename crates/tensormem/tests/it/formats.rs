//! Every snapshot format PyTorch has written loads: today's dict, entries without `time_us`,
//! no `allocator_settings`, blocks with `history` and no `address`, a bare list of segments,
//! and a JSON export; the history-bearing ones replay with full parity.

use crate::support::{
    Format, HUGE_SEG, LARGE_SEG, SMALL_SEG, SYNTH_ALLOCS, SYNTH_PEAK_RESERVED,
    SYNTH_SEGMENT_ALLOCS, shared_snapshot, synthetic_pickle, synthetic_value,
};
use c10_cuda::config::AllocatorConfig;
use c10_cuda::snapshot::BlockState;
use rstest::rstest;
use tensormem::load::{load_bytes, load_path};
use tensormem::model::{FormatNotes, RecordedSettings, Snapshot};
use tensormem::replay::{Outcome, ReplayOptions, replay};
use tensormem::state::state_stats;

fn load(format: Format) -> Snapshot {
    load_bytes(&synthetic_pickle(format), "synthetic.pickle").expect("the synthetic snapshot loads")
}

fn parity(snap: &Snapshot) -> Outcome {
    let opts = ReplayOptions::new(snap.config(), 1 << 40, false);
    let device = snap.main_device().expect("history");
    replay(snap, device, &opts, &mut |_, _| {}).expect("replays")
}

fn assert_full_parity(o: &Outcome) {
    let p = o.parity.as_ref().expect("parity mode");
    assert_eq!(
        (
            p.alloc_address_match,
            p.alloc_total,
            p.segment_decision_match,
            p.segment_decision_total
        ),
        (
            SYNTH_ALLOCS,
            SYNTH_ALLOCS,
            SYNTH_SEGMENT_ALLOCS,
            SYNTH_SEGMENT_ALLOCS
        ),
        "first divergence: {:?}",
        p.first_divergence
    );
    assert_eq!(p.first_divergence, None);
    assert_eq!(o.peak_reserved, SYNTH_PEAK_RESERVED);
    assert_eq!(o.recorded_peak_reserved, Some(SYNTH_PEAK_RESERVED));
    assert_eq!((o.failed_allocs, o.skipped_frees), (0, 0));
}

#[test]
fn modern_format_loads_and_replays_with_full_parity() {
    let snap = load(Format::MODERN);
    assert_eq!(
        snap.format,
        FormatNotes {
            encoding: "pickle",
            ..FormatNotes::default()
        }
    );
    assert_eq!(
        snap.settings,
        RecordedSettings::Recorded(AllocatorConfig::default())
    );
    assert_eq!(snap.segments.len(), 3);
    assert_eq!(
        snap.segments.iter().map(|s| s.address).collect::<Vec<_>>(),
        [SMALL_SEG as u64, LARGE_SEG as u64, HUGE_SEG as u64]
    );
    assert_eq!(
        snap.segments.iter().map(|s| s.is_large).collect::<Vec<_>>(),
        [false, true, true]
    );
    assert_eq!(snap.traces.len(), 1);
    assert_eq!(snap.traces[0].len(), 16);
    assert!(snap.traces[0].iter().all(|e| e.time_us.is_some()));
    assert_eq!(snap.reserved_bytes(), SYNTH_PEAK_RESERVED);
    assert_eq!(snap.allocated_bytes(), 1024 + 4096 + (8 << 20));
    let o = parity(&snap);
    assert_full_parity(&o);
    let st = o
        .start
        .as_ref()
        .expect("parity mode rebuilds the start state");
    assert_eq!((st.segments.len(), st.live_blocks, st.unplaced), (0, 0, 0));
}

/// Each older format detail, alone and all together: loads to the same segments and trace
/// (bar the times), notes what it saw, and replays with the same parity.
#[rstest]
#[case::no_time_us(Format { time_us: false, ..Format::MODERN })]
#[case::no_allocator_settings(Format { settings: false, ..Format::MODERN })]
#[case::history_key_no_block_address(Format { old_blocks: true, ..Format::MODERN })]
#[case::all_old(Format { time_us: false, settings: false, old_blocks: true, bare_list: false })]
fn older_formats_load_and_replay(#[case] format: Format) {
    let modern = load(Format::MODERN);
    let snap = load(format);
    assert_eq!(
        snap.format,
        FormatNotes {
            encoding: "pickle",
            bare_segment_list: false,
            missing_time: !format.time_us,
            history_key: format.old_blocks,
            blocks_without_address: format.old_blocks,
        }
    );
    assert_eq!(snap.segments, modern.segments);
    let strip = |s: &Snapshot| -> Vec<_> {
        s.traces[0]
            .iter()
            .map(|e| (e.action, e.addr, e.size, e.stream))
            .collect()
    };
    assert_eq!(strip(&snap), strip(&modern));
    assert_eq!(
        snap.traces[0].iter().all(|e| e.time_us.is_none()),
        !format.time_us
    );
    if format.settings {
        assert!(matches!(snap.settings, RecordedSettings::Recorded(_)));
    } else {
        assert_eq!(snap.settings, RecordedSettings::Absent);
    }
    assert_eq!(snap.config(), AllocatorConfig::default());
    assert_full_parity(&parity(&snap));
}

#[test]
fn bare_segment_list_loads_as_state_only() {
    let modern = load(Format::MODERN);
    let snap = load(Format {
        bare_list: true,
        ..Format::MODERN
    });
    assert!(snap.format.bare_segment_list);
    assert!(snap.traces.is_empty());
    assert!(!snap.has_history());
    assert_eq!(snap.settings, RecordedSettings::Absent);
    assert_eq!(snap.segments, modern.segments);
    let stats = state_stats(&snap, 0).expect("imports");
    assert_eq!(stats.reserved_bytes[0].current as u64, SYNTH_PEAK_RESERVED);
    assert_eq!(stats.segment[0].current, 3);
    assert_eq!(stats.allocation[0].current, 4);
    assert_eq!(
        stats.allocated_bytes[0].current as u64,
        modern.allocated_bytes()
    );
}

/// Old blocks without `address` tile their segment in order.
#[test]
fn blocks_without_address_tile_the_segment() {
    let snap = load(Format {
        old_blocks: true,
        ..Format::MODERN
    });
    for seg in &snap.segments {
        let mut cursor = seg.address;
        for b in &seg.blocks {
            assert_eq!(b.address, cursor);
            cursor += b.size;
        }
        assert_eq!(cursor, seg.address + seg.total_size);
    }
    assert_eq!(
        snap.segments[1]
            .blocks
            .iter()
            .map(|b| (b.address - LARGE_SEG as u64, b.state))
            .collect::<Vec<_>>(),
        [
            (0, BlockState::ActiveAllocated),
            (3 << 20, BlockState::ActiveAllocated),
            (8 << 20, BlockState::Inactive)
        ]
    );
}

/// A JSON export (Python's `json.dumps` of the pickle, which `to_json_string` writes) loads to
/// the same model and gives the same parity figures, for every format variant.
#[rstest]
#[case::modern(Format::MODERN)]
#[case::all_old(Format { time_us: false, settings: false, old_blocks: true, bare_list: false })]
#[case::bare_list(Format { bare_list: true, ..Format::MODERN })]
fn json_export_loads_like_the_pickle(#[case] format: Format) {
    let json = synthetic_value(format)
        .to_json_string()
        .expect("exports as JSON");
    let from_json = load_bytes(json.as_bytes(), "synthetic.json").expect("the JSON loads");
    let from_pickle = load(format);
    assert_eq!(from_json.format.encoding, "json");
    assert_eq!(from_json.segments, from_pickle.segments);
    assert_eq!(from_json.traces, from_pickle.traces);
    assert_eq!(from_json.settings, from_pickle.settings);
    if from_pickle.has_history() {
        let (a, b) = (parity(&from_pickle), parity(&from_json));
        assert_full_parity(&b);
        assert_eq!(a.parity, b.parity);
    }
}

/// A real file in the oldest dict format (the OPT-1.3B dump: `history` blocks without
/// addresses, no `allocator_settings`, a trace entry without `time_us`).
#[test]
fn real_old_format_file_is_recognized() {
    let Some(path) = shared_snapshot("opt1.3b_inference_at_oom_state.pickle") else {
        return;
    };
    let snap = load_path(&path).expect("loads");
    assert_eq!(
        snap.format,
        FormatNotes {
            encoding: "pickle",
            bare_segment_list: false,
            missing_time: true,
            history_key: true,
            blocks_without_address: true,
        }
    );
    assert_eq!(snap.settings, RecordedSettings::Absent);
    assert!(!snap.has_history());
    assert_eq!(snap.segments.len(), 176);
}

/// The parity check is not vacuous: a recording that puts one allocation elsewhere than
/// PyTorch's rules would is reported at that event.
#[test]
fn a_moved_allocation_is_reported_as_the_first_divergence() {
    let mut snap = load(Format::MODERN);
    // Event 10 is the 2 MiB request served by the freed 3 MiB block at the segment start.
    let e = &mut snap.traces[0][10];
    assert_eq!((e.addr, e.size), (LARGE_SEG as u64, 2 << 20));
    e.addr += 8 << 20;
    let o = parity(&snap);
    let p = o.parity.expect("parity mode");
    assert_eq!(
        (p.alloc_address_match, p.alloc_total),
        (SYNTH_ALLOCS - 1, SYNTH_ALLOCS)
    );
    assert_eq!(p.segment_decision_match, p.segment_decision_total);
    let d = p.first_divergence.expect("a divergence");
    assert_eq!(d.event_index, 10);
    assert!(d.expected.contains("alloc of 2097152 bytes"), "{d:?}");
    assert!(d.expected.contains("+ 0x800000"), "{d:?}");
}
