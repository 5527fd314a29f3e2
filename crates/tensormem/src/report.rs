//! Reports: the human-readable text and the `--json` document (its schema is documented on
//! [`JsonReport`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use c10_cuda::summary::{format_size, memory_summary};
use serde::Serialize;

use crate::model::Snapshot;
use crate::replay::{Mode, Outcome, Parity};
use crate::session::VersionScore;
use crate::top_sites::Site;

fn pct(a: usize, b: usize) -> String {
    if b == 0 {
        "n/a".to_string()
    } else {
        format!("{:.2}%", 100.0 * a as f64 / b as f64)
    }
}

/// The config string as reports name it, in text and JSON alike (`default` for the empty
/// string, which is PyTorch's default configuration).
pub fn config_label(config: &str) -> &str {
    if config.is_empty() { "default" } else { config }
}

/// Peak reserved / lower bound (0 when the lower bound is 0).
pub fn fragmentation(o: &Outcome) -> f64 {
    if o.lower_bound > 0 {
        o.peak_reserved as f64 / o.lower_bound as f64
    } else {
        0.0
    }
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

/// The parity section of a replay on `capacity` bytes of simulated device memory.
pub fn parity_text(o: &Outcome, capacity: usize) -> String {
    let mut s = String::new();
    let Some(p) = &o.parity else { return s };
    let _ = writeln!(
        s,
        "\nParity with PyTorch (torch {} rules, settings: {}, recorded start state)",
        o.rules.version,
        config_label(&o.config)
    );
    if o.failed_allocs > 0 {
        let _ = writeln!(
            s,
            "  out of memory in our replay:      {} OOMs on {} of device memory ({} allocations failed, {} retries; \
             the recording reserved up to {}): the decisions below diverge from it",
            o.ooms,
            format_size(capacity as u64),
            o.failed_allocs,
            o.retries,
            o.recorded_peak_reserved.map_or("n/a".into(), format_size)
        );
    } else if o.retries > 0 {
        let _ = writeln!(
            s,
            "  device memory too small:          {} free-the-cache-and-retry calls on {} of device memory \
             (the recording reserved up to {}): the decisions below diverge from it",
            o.retries,
            format_size(capacity as u64),
            o.recorded_peak_reserved.map_or("n/a".into(), format_size)
        );
    }
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
        format_size(o.peak_reserved),
        o.recorded_peak_reserved.map_or("n/a".into(), format_size)
    );
    let _ = writeln!(
        s,
        "  peak allocated:                   ours {}",
        format_size(o.peak_allocated)
    );
    let _ = writeln!(
        s,
        "  empty_cache calls inferred:       {}; recorded OOMs: {}; frees skipped: {}",
        o.empty_cache_calls, o.recorded_ooms, o.skipped_frees
    );
    s
}

/// The line saying what a what-if replay counted: in whole-job mode the blocks live when
/// recording began (`blocks` of `bytes` requested bytes), allocated first; in history-only
/// mode that they were left out.
pub fn counted_line(mode: Mode, blocks: usize, bytes: u64) -> String {
    if blocks == 0 {
        return "whole job: nothing was live when recording began (the history starts from an empty allocator)"
            .to_string();
    }
    match mode {
        Mode::HistoryOnly => format!(
            "history only (--history-only): the {blocks} blocks ({}) live when recording began are left out, \
             so every figure undercounts the job",
            format_size(bytes)
        ),
        Mode::WholeJob => format!(
            "whole job: the {blocks} blocks ({}) live when recording began are allocated first under each setting, \
             then the history",
            format_size(bytes)
        ),
        Mode::Parity => format!(
            "whole job: the {blocks} blocks ({}) live when recording began at their recorded places, then the history",
            format_size(bytes)
        ),
    }
}

/// The what-if table, one row per configuration.
pub fn sweep_table(rows: &[Outcome], capacity: usize) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\nWhat-if from an empty allocator, device memory {}",
        format_size(capacity as u64)
    );
    if let Some(o) = rows.first() {
        let _ = writeln!(
            s,
            "  {}",
            counted_line(o.mode, o.start_blocks, o.start_bytes)
        );
    }
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
        let _ = writeln!(
            s,
            "  {:<28} {:>13} {:>14} {:>12} {:>7.3} {:>8} {:>8} {:>5}",
            config_label(&o.config),
            format_size(o.peak_reserved),
            format_size(o.peak_allocated),
            format_size(o.lower_bound),
            fragmentation(o),
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

/// The line saying whose rules a parity replay followed: given, or detected (each version's
/// figures when it was detected).
pub fn version_text(torch: c10_cuda::TorchVersion, by_version: Option<&[VersionScore]>) -> String {
    let Some(scores) = by_version else {
        return format!("  torch version:                    {torch} rules (--torch-version)\n");
    };
    let is_exact = |v: c10_cuda::TorchVersion| {
        scores
            .iter()
            .find(|s| s.version == v)
            .and_then(|s| s.parity)
            .is_some_and(|(a, at, d, dt)| a == at && d == dt)
    };
    let exact = is_exact(torch);
    let all_exact = scores.iter().all(|s| is_exact(s.version));
    let others: Vec<String> = scores
        .iter()
        .filter(|s| s.version != torch)
        .map(|s| match s.parity {
            Some((a, at, d, dt)) => format!(
                "{} rules: {a} / {at} allocations, {d} / {dt} segment decisions",
                s.version
            ),
            None => format!("{} rules: the settings are not valid there", s.version),
        })
        .collect();
    format!(
        "  torch version:                    {torch} rules, detected: {} ({})\n",
        if all_exact {
            "every version's rules reproduce the recording, the newest is used"
        } else if exact {
            "they reproduce the recording"
        } else {
            "no version reproduces every decision; these come closest"
        },
        others.join("; ")
    )
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
/// - `file`, `device`, `events`; `config` (the configuration's name: `"default"` or the
///   PYTORCH_CUDA_ALLOC_CONF string), `alloc_conf` (the PYTORCH_CUDA_ALLOC_CONF string replayed,
///   `""` for the default)
/// - `torch_version` (`"2.7"` or `"2.15"`: whose rules the main replay followed),
///   `torch_version_detected` (true when no `--torch-version` was given and a parity replay
///   chose it), `parity_by_version` (when detected: a list, oldest first, of
///   `{torch_version, alloc_address_match, alloc_total, segment_decision_match,
///   segment_decision_total}`, the figures `null` for a version that rejects the settings;
///   else `null`)
/// - `parity`: `alloc_address_match`, `alloc_total`, `segment_decision_match`,
///   `segment_decision_total`, `first_divergence` (`null` or `{event_index, expected, got}`);
///   `null` with `--from-empty`
/// - `peak_reserved_bytes`, `peak_event_index`, `peak_allocated_bytes`,
///   `recorded_peak_reserved_bytes` (or null), `lower_bound_bytes`, `device_mallocs`,
///   `num_alloc_retries`, `num_ooms`, `failed_allocs`, `skipped_frees`, `empty_cache_calls`
/// - `sweep`: with `--sweep`, a list of `{config, alloc_conf, torch_version, peak_reserved_bytes,
///   peak_event_index, peak_allocated_bytes, lower_bound_bytes, fragmentation, device_mallocs,
///   num_alloc_retries, num_ooms}` (and `top_sites` at that configuration's own peak with
///   `--top`); else `[]`
/// - with `--top N`: `top_sites` (at the reserved peak) and `top_sites_at_end`, each a list
///   of `{site, bytes, count}` (and `stack` with `--stack`), largest first
/// - `memory_stats`: the allocator's `memory_stats()` keys at the end of the main replay (the
///   keys of `torch_version`: 122 for 2.7, 123 for 2.15).
#[derive(Serialize)]
pub struct JsonReport {
    /// The input file.
    pub file: String,
    /// The device replayed.
    pub device: usize,
    /// Recorded events.
    pub events: usize,
    /// The configuration's name (`default` or the PYTORCH_CUDA_ALLOC_CONF string).
    pub config: String,
    /// The PYTORCH_CUDA_ALLOC_CONF string replayed (`""` = default).
    pub alloc_conf: String,
    /// Whose rules the main replay followed (`2.7`, `2.15`).
    pub torch_version: String,
    /// Whether the version was detected (no `--torch-version`, parity mode).
    pub torch_version_detected: bool,
    /// When detected: every version's parity figures.
    pub parity_by_version: Option<Vec<JsonVersionParity>>,
    /// Parity figures.
    pub parity: Option<JsonParity>,
    /// Our peak reserved bytes.
    pub peak_reserved_bytes: u64,
    /// The recorded event of the reserved peak (with the most bytes allocated).
    pub peak_event_index: usize,
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
    /// With `--top`: the call sites holding the most bytes at the reserved peak.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_sites: Option<Vec<Site>>,
    /// With `--top`: the call sites holding the most bytes at the end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_sites_at_end: Option<Vec<Site>>,
    /// With `--since`/`--until`: the window the peaks were measured in (absent without one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<crate::window::EventWindow>,
    /// The stats at the end (the version's keys).
    pub memory_stats: BTreeMap<String, i64>,
}

/// One version's parity figures in the JSON report.
#[derive(Serialize)]
pub struct JsonVersionParity {
    /// The version (`2.7`, `2.15`).
    pub torch_version: String,
    /// Allocations at PyTorch's address (`null`: the version rejects the settings).
    pub alloc_address_match: Option<usize>,
    /// Allocations replayed.
    pub alloc_total: Option<usize>,
    /// Identical segment decisions.
    pub segment_decision_match: Option<usize>,
    /// Segment decisions.
    pub segment_decision_total: Option<usize>,
}

impl JsonVersionParity {
    /// The row of one version.
    pub fn from(s: &VersionScore) -> Self {
        JsonVersionParity {
            torch_version: s.version.to_string(),
            alloc_address_match: s.parity.map(|p| p.0),
            alloc_total: s.parity.map(|p| p.1),
            segment_decision_match: s.parity.map(|p| p.2),
            segment_decision_total: s.parity.map(|p| p.3),
        }
    }
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
    /// The configuration's name (`default` or the PYTORCH_CUDA_ALLOC_CONF string).
    pub config: String,
    /// PYTORCH_CUDA_ALLOC_CONF string (`""` = default).
    pub alloc_conf: String,
    /// Whose rules the row followed (`2.7`, `2.15`).
    pub torch_version: String,
    /// Peak reserved bytes.
    pub peak_reserved_bytes: u64,
    /// The recorded event of the reserved peak (with the most bytes allocated).
    pub peak_event_index: usize,
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
    /// With `--top`: the call sites holding the most bytes at this configuration's peak.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_sites: Option<Vec<Site>>,
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
    /// The row for one sweep outcome (`top_sites` left out).
    pub fn from(o: &Outcome) -> Self {
        JsonSweepRow {
            config: config_label(&o.config).to_string(),
            alloc_conf: o.config.clone(),
            torch_version: o.rules.version.to_string(),
            peak_reserved_bytes: o.peak_reserved,
            peak_event_index: o.peak_event_index,
            peak_allocated_bytes: o.peak_allocated,
            lower_bound_bytes: o.lower_bound,
            fragmentation: fragmentation(o),
            device_mallocs: o.device_mallocs,
            num_alloc_retries: o.retries,
            num_ooms: o.ooms,
            top_sites: None,
        }
    }
}

impl JsonReport {
    /// The report for a main replay and optional sweep rows (no top sites).
    pub fn new(file: &str, device: usize, main: &Outcome, sweep: &[Outcome]) -> Self {
        JsonReport {
            file: file.to_string(),
            device,
            events: main.events,
            config: config_label(&main.config).to_string(),
            alloc_conf: main.config.clone(),
            torch_version: main.rules.version.to_string(),
            torch_version_detected: false,
            parity_by_version: None,
            parity: main.parity.as_ref().map(JsonParity::from),
            peak_reserved_bytes: main.peak_reserved,
            peak_event_index: main.peak_event_index,
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
            top_sites: None,
            top_sites_at_end: None,
            window: None,
            memory_stats: main.stats_end.memory_stats(),
        }
    }
}

/// The top-sites section of the text report: one table per moment.
pub fn top_sites_text(title: &str, sites: &[Site]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "\nTop call sites {title}");
    if sites.is_empty() {
        let _ = writeln!(s, "  (no live allocations)");
        return s;
    }
    let _ = writeln!(s, "  {:>12} {:>7}  site", "bytes", "allocs");
    for site in sites {
        let _ = writeln!(
            s,
            "  {:>12} {:>7}  {}",
            format_size(site.bytes),
            site.count,
            site.site
        );
        if let Some(stack) = &site.stack {
            for line in stack {
                let _ = writeln!(s, "  {:>12} {:>7}    {line}", "", "");
            }
        }
    }
    if sites.iter().all(|x| {
        x.site == crate::top_sites::NO_STACK || x.site == crate::top_sites::BEFORE_RECORDING
    }) {
        let _ = writeln!(
            s,
            "  (the snapshot records no stacks: record them with \
             torch.cuda.memory._record_memory_history(stacks=\"python\") or \"all\")"
        );
    }
    s
}
