//! Reports: the human-readable text and the `--json` document (its schema is documented on
//! [`JsonReport`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use c10_cuda::summary::{format_size, memory_summary};
use serde::Serialize;

use crate::model::Snapshot;
use crate::replay::{Outcome, Parity};

fn pct(a: usize, b: usize) -> String {
    if b == 0 {
        "n/a".to_string()
    } else {
        format!("{:.2}%", 100.0 * a as f64 / b as f64)
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// The config string as the report prints it (`default` for the empty string).
pub fn config_label(config: &str) -> &str {
    if config.is_empty() { "default" } else { config }
}

/// The header lines about the loaded file.
pub fn describe_file(name: &str, snap: &Snapshot, device: Option<usize>) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "tensormem replay {name}");
    let events = device.map_or(0, |d| snap.traces[d].len());
    let settings = match &snap.settings {
        crate::model::RecordedSettings::Recorded(c) => {
            format!("recorded ({})", config_label(&c.to_string()))
        }
        crate::model::RecordedSettings::Absent => "not recorded (default assumed)".to_string(),
    };
    let _ = writeln!(
        s,
        "  {} file: {} segments, {} reserved, {} allocated at the dump; {} history events{}; allocator settings {}",
        snap.format.encoding,
        snap.segments.len(),
        format_size(snap.reserved_bytes()),
        format_size(snap.allocated_bytes()),
        events,
        device.map_or(String::new(), |d| format!(" on device {d}")),
        settings
    );
    s
}

/// The parity section.
pub fn parity_text(o: &Outcome) -> String {
    let mut s = String::new();
    let Some(p) = &o.parity else { return s };
    let _ = writeln!(
        s,
        "\nParity with PyTorch (settings: {}, recorded start state)",
        config_label(&o.config)
    );
    if let Some(st) = &o.start {
        let _ = writeln!(
            s,
            "  start state rebuilt:      {} segments, {} live blocks{}",
            st.segments.len(),
            st.live_blocks,
            if st.unplaced > 0 {
                format!(", {} unplaced", st.unplaced)
            } else {
                String::new()
            }
        );
    }
    let _ = writeln!(
        s,
        "  allocations at PyTorch's address: {} / {} ({})",
        p.alloc_address_match,
        p.alloc_total,
        pct(p.alloc_address_match, p.alloc_total)
    );
    let _ = writeln!(
        s,
        "  segment decisions identical:      {} / {} ({})",
        p.segment_decision_match,
        p.segment_decision_total,
        pct(p.segment_decision_match, p.segment_decision_total)
    );
    match &p.first_divergence {
        None => {
            let _ = writeln!(s, "  first divergence:                 none");
        }
        Some(d) => {
            let _ = writeln!(
                s,
                "  first divergence:                 event {}: expected {}, got {}",
                d.event_index, d.expected, d.got
            );
        }
    }
    let _ = writeln!(
        s,
        "  peak reserved:                    ours {}, recorded {}",
        gib(o.peak_reserved),
        o.recorded_peak_reserved.map_or("n/a".into(), gib)
    );
    let _ = writeln!(
        s,
        "  peak allocated:                   ours {}",
        gib(o.peak_allocated)
    );
    let _ = writeln!(
        s,
        "  empty_cache calls inferred:       {}; recorded OOMs: {}; frees skipped: {}",
        o.empty_cache_calls, o.recorded_ooms, o.skipped_frees
    );
    s
}

/// The what-if table, one row per configuration.
pub fn sweep_table(rows: &[Outcome], capacity: usize) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nWhat-if: the alloc/free sequence from an empty allocator, device memory {}",
        gib(capacity as u64)
    );
    let _ = writeln!(
        s,
        "  {:<28} {:>13} {:>14} {:>12} {:>7} {:>8} {:>8} {:>5}",
        "config",
        "peak reserved",
        "peak allocated",
        "lower bound",
        "frag",
        "mallocs",
        "retries",
        "OOMs"
    );
    for o in rows {
        let frag = if o.lower_bound > 0 {
            o.peak_reserved as f64 / o.lower_bound as f64
        } else {
            0.0
        };
        let _ = writeln!(
            s,
            "  {:<28} {:>13} {:>14} {:>12} {:>7.3} {:>8} {:>8} {:>5}",
            config_label(&o.config),
            gib(o.peak_reserved),
            gib(o.peak_allocated),
            gib(o.lower_bound),
            frag,
            o.device_mallocs,
            o.retries,
            o.ooms
        );
    }
    let _ = writeln!(
        s,
        "  (frag = peak reserved / lower bound; lower bound = peak of live bytes, each rounded up to 512)"
    );
    s
}

/// `memory_summary()` at the reserved peak and at the end.
pub fn summaries(o: &Outcome, device: u8) -> String {
    format!(
        "\nmemory_summary() at the reserved peak ({}):\n{}\nmemory_summary() at the end:\n{}",
        config_label(&o.config),
        memory_summary(device, &o.stats_at_peak, false),
        memory_summary(device, &o.stats_end, false)
    )
}

/// `--json` output. Schema (all byte figures are integers, in bytes):
///
/// - `file`, `device`, `events`, `config` (PYTORCH_CUDA_ALLOC_CONF string replayed; "" = default)
/// - `parity`: `alloc_address_match`, `alloc_total`, `segment_decision_match`,
///   `segment_decision_total`, `first_divergence` (`null` or `{event_index, expected, got}`);
///   `null` with `--from-empty`
/// - `peak_reserved_bytes`, `peak_allocated_bytes`, `recorded_peak_reserved_bytes` (or null),
///   `lower_bound_bytes`, `device_mallocs`, `num_alloc_retries`, `num_ooms`, `failed_allocs`,
///   `skipped_frees`, `empty_cache_calls`
/// - `sweep`: with `--sweep`, a list of `{config, peak_reserved_bytes, peak_allocated_bytes,
///   lower_bound_bytes, fragmentation, device_mallocs, num_alloc_retries, num_ooms}`; else `[]`
/// - `memory_stats`: the allocator's 122 `memory_stats()` keys at the end of the main replay.
#[derive(Serialize)]
pub struct JsonReport {
    /// The input file.
    pub file: String,
    /// The device replayed.
    pub device: usize,
    /// Recorded events.
    pub events: usize,
    /// The configuration replayed.
    pub config: String,
    /// Parity figures.
    pub parity: Option<JsonParity>,
    /// Our peak reserved bytes.
    pub peak_reserved_bytes: u64,
    /// Our peak allocated bytes.
    pub peak_allocated_bytes: u64,
    /// The recording's peak reserved bytes.
    pub recorded_peak_reserved_bytes: Option<u64>,
    /// Peak of live bytes rounded to 512 each.
    pub lower_bound_bytes: u64,
    /// `num_device_alloc`.
    pub device_mallocs: i64,
    /// `num_alloc_retries`.
    pub num_alloc_retries: i64,
    /// `num_ooms`.
    pub num_ooms: i64,
    /// Requests that failed in our replay.
    pub failed_allocs: usize,
    /// Frees skipped.
    pub skipped_frees: usize,
    /// Inferred empty_cache calls.
    pub empty_cache_calls: usize,
    /// The sweep rows.
    pub sweep: Vec<JsonSweepRow>,
    /// The 122 stats at the end.
    pub memory_stats: BTreeMap<String, i64>,
}

/// Parity in the JSON report.
#[derive(Serialize)]
pub struct JsonParity {
    /// See [`Parity::alloc_address_match`].
    pub alloc_address_match: usize,
    /// See [`Parity::alloc_total`].
    pub alloc_total: usize,
    /// See [`Parity::segment_decision_match`].
    pub segment_decision_match: usize,
    /// See [`Parity::segment_decision_total`].
    pub segment_decision_total: usize,
    /// The first divergence.
    pub first_divergence: Option<JsonDivergence>,
}

/// A divergence in the JSON report.
#[derive(Serialize)]
pub struct JsonDivergence {
    /// Recorded event index.
    pub event_index: usize,
    /// What PyTorch did.
    pub expected: String,
    /// What we did.
    pub got: String,
}

/// One sweep row in the JSON report.
#[derive(Serialize)]
pub struct JsonSweepRow {
    /// PYTORCH_CUDA_ALLOC_CONF string ("" = default).
    pub config: String,
    /// Peak reserved bytes.
    pub peak_reserved_bytes: u64,
    /// Peak allocated bytes.
    pub peak_allocated_bytes: u64,
    /// Lower bound bytes.
    pub lower_bound_bytes: u64,
    /// Peak reserved / lower bound.
    pub fragmentation: f64,
    /// `num_device_alloc`.
    pub device_mallocs: i64,
    /// `num_alloc_retries`.
    pub num_alloc_retries: i64,
    /// `num_ooms`.
    pub num_ooms: i64,
}

impl JsonParity {
    fn from(p: &Parity) -> Self {
        JsonParity {
            alloc_address_match: p.alloc_address_match,
            alloc_total: p.alloc_total,
            segment_decision_match: p.segment_decision_match,
            segment_decision_total: p.segment_decision_total,
            first_divergence: p.first_divergence.as_ref().map(|d| JsonDivergence {
                event_index: d.event_index,
                expected: d.expected.clone(),
                got: d.got.clone(),
            }),
        }
    }
}

impl JsonSweepRow {
    /// The row for one sweep outcome.
    pub fn from(o: &Outcome) -> Self {
        JsonSweepRow {
            config: o.config.clone(),
            peak_reserved_bytes: o.peak_reserved,
            peak_allocated_bytes: o.peak_allocated,
            lower_bound_bytes: o.lower_bound,
            fragmentation: if o.lower_bound > 0 {
                o.peak_reserved as f64 / o.lower_bound as f64
            } else {
                0.0
            },
            device_mallocs: o.device_mallocs,
            num_alloc_retries: o.retries,
            num_ooms: o.ooms,
        }
    }
}

impl JsonReport {
    /// The report for a main replay and optional sweep rows.
    pub fn new(file: &str, device: usize, main: &Outcome, sweep: &[Outcome]) -> Self {
        JsonReport {
            file: file.to_string(),
            device,
            events: main.events,
            config: main.config.clone(),
            parity: main.parity.as_ref().map(JsonParity::from),
            peak_reserved_bytes: main.peak_reserved,
            peak_allocated_bytes: main.peak_allocated,
            recorded_peak_reserved_bytes: main.recorded_peak_reserved,
            lower_bound_bytes: main.lower_bound,
            device_mallocs: main.device_mallocs,
            num_alloc_retries: main.retries,
            num_ooms: main.ooms,
            failed_allocs: main.failed_allocs,
            skipped_frees: main.skipped_frees,
            empty_cache_calls: main.empty_cache_calls,
            sweep: sweep.iter().map(JsonSweepRow::from).collect(),
            memory_stats: main.stats_end.memory_stats(),
        }
    }
}
