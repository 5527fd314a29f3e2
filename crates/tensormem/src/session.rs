//! One `tensormem replay` request from options to report: the options checked (with the CLI's
//! messages), the main replay, the sweep, the top call sites, and the text and JSON reports.
//! The CLI and the Python module both run requests through here, so they agree.

use std::fmt::Write as _;

use c10_cuda::config::AllocatorConfig;
use c10_cuda::{Rules, TorchVersion};
use serde_json::Value as Json;

use crate::error::Error;
use crate::model::Snapshot;
use crate::replay::{Outcome, ReplayOptions, replay};
use crate::report::{self, JsonReport};
use crate::size::parse_size;
use crate::top_sites::{self, Grouping, Site};
use crate::versions::{VersionParity, detect};
use crate::window::{EventWindow, Window};
use crate::{state, sweep};

/// Simulated device memory when none is given: 1 TiB, more than any recording needs.
pub const DEFAULT_DEVICE_MEMORY: usize = 1 << 40;

/// What `tensormem replay` was asked to do (its options, as given).
#[derive(Clone, Debug, Default)]
pub struct ReplayRequest {
    /// `--alloc-conf`: a PYTORCH_CUDA_ALLOC_CONF string instead of the recorded settings.
    pub alloc_conf: Option<String>,
    /// `--device-memory`: simulated device memory, e.g. `80GiB` (default 1 TiB).
    pub device_memory: Option<String>,
    /// `--from-empty`: a what-if replay from an empty allocator (of the whole job: the blocks
    /// live when recording began first, then the history; see `history_only`).
    pub from_empty: bool,
    /// `--sweep`: also replay the standard configurations from empty.
    pub sweep: bool,
    /// `--history-only`: the what-if replays (`--from-empty`, `--sweep`) replay the recorded
    /// history alone, without the blocks live when recording began.
    pub history_only: bool,
    /// `--device`: which device's history (default: the longest).
    pub device: Option<usize>,
    /// `--top N`: the N call sites holding the most bytes.
    pub top: Option<usize>,
    /// `--stack`: group call sites by their whole stack.
    pub full_stack: bool,
    /// Keep the memory series (for `--plot` and `--html`).
    pub series: bool,
    /// Keep our history (for `--dump`).
    pub keep_history: bool,
    /// An HTML report will be written (a state-only snapshot gets the page of its dump).
    pub html: bool,
    /// `--plot`: an SVG of the memory over time will be drawn (it needs a history).
    pub plot: bool,
    /// `--torch-version`: follow this PyTorch version's rules (`2.7`, `2.15`). Without it, a
    /// parity replay tries every supported version and keeps the one that reproduces the
    /// recording; what-if replays follow the detected version, or the newest.
    pub torch_version: Option<String>,
    /// `--since`/`--until`: measure in this window of the history (see [`crate::window`]).
    pub window: Window,
}

/// The call sites of a replay.
#[derive(Clone, Debug, Default)]
pub struct TopSites {
    /// At the main replay's reserved peak.
    pub at_peak: Vec<Site>,
    /// At the end of the main replay.
    pub at_end: Vec<Site>,
    /// At each sweep configuration's own peak.
    pub sweep: Vec<Vec<Site>>,
}

/// A replayed snapshot's results.
#[derive(Debug)]
pub struct Replayed {
    /// The snapshot's name.
    pub file: String,
    /// The device replayed.
    pub device: usize,
    /// Simulated device memory, bytes.
    pub capacity: usize,
    /// The configuration of the main replay.
    pub config: AllocatorConfig,
    /// The PyTorch version whose rules the main replay and the sweep followed.
    pub torch: TorchVersion,
    /// Without `--torch-version`, in parity mode: every version's parity replay (oldest first),
    /// the main one being the version chosen.
    pub by_version: Option<Vec<VersionScore>>,
    /// The main replay (parity, or from empty).
    pub main: Outcome,
    /// The sweep's replays (empty without `--sweep`).
    pub sweep: Vec<Outcome>,
    /// With `--top`.
    pub top: Option<TopSites>,
    /// With `--since`/`--until`: the window, resolved against the device's trace.
    pub window: Option<EventWindow>,
}

/// One version's parity figures when the version was detected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VersionScore {
    /// The version.
    pub version: TorchVersion,
    /// `(alloc_address_match, alloc_total, segment_decision_match, segment_decision_total)`,
    /// or `None` when the version rejects the configuration.
    pub parity: Option<(usize, usize, usize, usize)>,
}

impl VersionScore {
    fn of(r: &VersionParity) -> Self {
        VersionScore {
            version: r.version,
            parity: r.outcome.as_ref().and_then(|o| o.parity.as_ref()).map(|p| {
                (
                    p.alloc_address_match,
                    p.alloc_total,
                    p.segment_decision_match,
                    p.segment_decision_total,
                )
            }),
        }
    }
}

/// A state-only snapshot's summary.
#[derive(Debug)]
pub struct StateOnly {
    /// The snapshot's name.
    pub file: String,
    /// The device summarized.
    pub device: u8,
    /// Its statistics, as our allocator counts the dump's segments.
    pub stats: c10_cuda::stats::DeviceStats,
    /// With `--top`: the call sites of the dump's held blocks.
    pub top: Option<Vec<Site>>,
}

/// What a replay request produced.
#[derive(Debug)]
pub enum ReplayReport {
    /// The snapshot had a history: it was replayed.
    Replayed(Box<Replayed>),
    /// The snapshot holds state only.
    StateOnly(Box<StateOnly>),
}

/// Parses `--device-memory` (the default when `None`).
///
/// # Errors
/// [`Error::Option`] naming `--device-memory` and the problem.
pub fn device_memory(arg: Option<&str>) -> Result<usize, Error> {
    match arg {
        Some(s) => parse_size(s).map_err(|e| Error::option("--device-memory", e)),
        None => Ok(DEFAULT_DEVICE_MEMORY),
    }
}

/// Parses `--alloc-conf`, or the snapshot's recorded settings when `None`.
///
/// # Errors
/// [`Error::Option`] naming `--alloc-conf` and the problem.
pub fn alloc_conf(arg: Option<&str>, snap: &Snapshot) -> Result<AllocatorConfig, Error> {
    alloc_conf_for(arg, snap, TorchVersion::NEWEST)
}

/// [`alloc_conf`] as `version`'s allocator reads the string (see
/// [`AllocatorConfig::parse_for`]).
///
/// # Errors
/// [`Error::Option`] naming `--alloc-conf` and the problem.
pub fn alloc_conf_for(
    arg: Option<&str>,
    snap: &Snapshot,
    version: TorchVersion,
) -> Result<AllocatorConfig, Error> {
    match arg {
        Some(s) => {
            AllocatorConfig::parse_for(s, version).map_err(|e| Error::option("--alloc-conf", e))
        }
        None => Ok(snap.config()),
    }
}

/// Parses `--torch-version`.
///
/// # Errors
/// [`Error::Option`] naming `--torch-version` and the versions supported.
pub fn torch_version(arg: Option<&str>) -> Result<Option<TorchVersion>, Error> {
    arg.map(|s| s.parse().map_err(|e| Error::option("--torch-version", e)))
        .transpose()
}

/// The device whose history to replay: `--device`, else the longest history; `None` for a
/// state-only snapshot.
///
/// # Errors
/// [`Error::NoSuchDevice`] when `--device` names a device the snapshot has no trace for.
pub fn history_device(arg: Option<usize>, snap: &Snapshot) -> Result<Option<usize>, Error> {
    match arg {
        Some(d) if d < snap.traces.len() => Ok(Some(d)),
        Some(d) => Err(Error::NoSuchDevice {
            device: d,
            count: snap.traces.len(),
        }),
        None => Ok(snap.main_device()),
    }
}

/// Runs `req` on `snap` (named `file` in reports). `progress(label, done, total)` reports
/// events replayed.
///
/// # Errors
/// [`Error`] with the CLI's message: a bad option, an option that needs a history on a
/// state-only snapshot, or a replay failure.
pub fn run(
    snap: &Snapshot,
    file: &str,
    req: &ReplayRequest,
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Result<ReplayReport, Error> {
    let capacity = device_memory(req.device_memory.as_deref())?;
    let given = torch_version(req.torch_version.as_deref())?;
    let conf_arg = req.alloc_conf.as_deref();
    // Checked up front with the CLI's message (under the version given, or the newest).
    let config = alloc_conf_for(conf_arg, snap, given.unwrap_or(TorchVersion::NEWEST))?;
    if req.top == Some(0) {
        return Err(Error::option("--top", "expected at least 1 call site"));
    }
    if req.history_only && !req.from_empty && !req.sweep {
        return Err(Error::option(
            "--history-only",
            "applies to what-if replays: add --from-empty or --sweep",
        ));
    }
    let grouping = if req.full_stack {
        Grouping::FullStack
    } else {
        Grouping::TopFrame
    };
    let Some(device) = history_device(req.device, snap)? else {
        let wanted = [
            (req.from_empty, "--from-empty"),
            (req.sweep, "--sweep"),
            (req.plot, "--plot"),
            (req.keep_history, "--dump"),
            (req.window.since.is_some(), "--since"),
            (req.window.until.is_some(), "--until"),
        ];
        if let Some((_, flag)) = wanted.iter().find(|(on, _)| *on) {
            return Err(Error::NeedsHistory {
                what: flag,
                file: file.to_string(),
            });
        }
        let dev = snap.segments.first().map_or(0, |s| s.device);
        let stats = state::state_stats(snap, dev)
            .map_err(|e| Error::Replay(crate::replay::ReplayError::Allocator(e)))?;
        let top = req
            .top
            .map(|n| top_sites::top_sites(&top_sites::live_in_dump(snap, dev), n, grouping));
        return Ok(ReplayReport::StateOnly(Box::new(StateOnly {
            file: file.to_string(),
            device: dev,
            stats,
            top,
        })));
    };
    let window = req.window.resolve(&snap.traces[device])?;
    let opts = ReplayOptions {
        series: req.series,
        keep_history: req.keep_history,
        history_only: req.history_only,
        since_event: window.map(|w| w.since_event),
        until_event: window.map(|w| w.until_event),
        ..ReplayOptions::new(config.clone(), capacity, req.from_empty)
    };
    let (main, by_version) = match (req.from_empty, given) {
        (true, v) => {
            let rules = Rules::new(v.unwrap_or(TorchVersion::NEWEST));
            let opts = ReplayOptions { rules, ..opts };
            let main = replay(snap, device, &opts, &mut |d, t| {
                progress("replay (from empty)", d, t)
            })?;
            (main, None)
        }
        (false, Some(v)) => {
            // Parity: PyTorch's behaviour exactly, bugs included.
            let opts = ReplayOptions {
                rules: Rules::pytorch_exact(v),
                ..opts
            };
            let main = replay(snap, device, &opts, &mut |d, t| {
                progress("replay (parity)", d, t)
            })?;
            (main, None)
        }
        (false, None) => {
            let conf = |v: TorchVersion| alloc_conf_for(conf_arg, snap, v).ok();
            let (mut runs, best) = detect(snap, device, &opts, &conf, &mut |v, d, t| {
                progress(&format!("replay (parity, torch {v} rules)"), d, t)
            })?;
            let scores = runs.iter().map(VersionScore::of).collect();
            let main = runs[best]
                .outcome
                .take()
                .expect("the best version replayed");
            (main, Some(scores))
        }
    };
    let torch = main.rules.version;
    let config = alloc_conf_for(conf_arg, snap, torch)?;
    let opts_window = (window.map(|w| w.since_event), window.map(|w| w.until_event));
    let sweep_rows = if req.sweep {
        let configs = sweep::standard_configs();
        let n = configs.len();
        let base = ReplayOptions {
            series: req.series,
            rules: Rules::new(torch),
            history_only: req.history_only,
            start: main.start.clone(),
            since_event: opts_window.0,
            until_event: opts_window.1,
            ..ReplayOptions::new(config.clone(), capacity, true)
        };
        sweep::sweep(snap, device, &configs, &base, &mut |k, d, t| {
            progress("sweep", k * t + d, n * t)
        })?
    } else {
        Vec::new()
    };
    let top = req.top.map(|n| {
        let at = |o: &Outcome, index: usize| {
            top_sites::top_sites(
                &top_sites::live_at(snap, device, index, o.start.as_deref()),
                n,
                grouping,
            )
        };
        TopSites {
            at_peak: at(&main, main.peak_event_index),
            at_end: at(&main, main.last_event_index),
            sweep: sweep_rows
                .iter()
                .map(|o| at(o, o.peak_event_index))
                .collect(),
        }
    });
    Ok(ReplayReport::Replayed(Box::new(Replayed {
        file: file.to_string(),
        device,
        capacity,
        config,
        torch,
        by_version,
        main,
        sweep: sweep_rows,
        top,
        window,
    })))
}

impl ReplayReport {
    /// The `--json` document (schema on [`JsonReport`]; for state-only snapshots `{file,
    /// state_only: true, segments, reserved_bytes, allocated_bytes, memory_stats}` and
    /// `top_sites` with `--top`).
    pub fn json(&self, snap: &Snapshot) -> Json {
        match self {
            ReplayReport::StateOnly(s) => {
                let recorded = matches!(snap.settings, crate::model::RecordedSettings::Recorded(_));
                let mut doc = serde_json::json!({
                    "file": s.file,
                    "state_only": true,
                    "segments": snap.segments.len(),
                    "reserved_bytes": snap.reserved_bytes(),
                    "allocated_bytes": snap.allocated_bytes(),
                    "stray_trace_entries": snap.stray_entries(),
                    "memory_stats": state::state_memory_stats(&s.stats, recorded),
                    "unknown": state::UNKNOWN_IN_STATE,
                });
                if let Some(top) = &s.top {
                    doc["top_sites"] = serde_json::to_value(top).unwrap_or_default();
                }
                doc
            }
            ReplayReport::Replayed(r) => {
                let mut doc = JsonReport::new(&r.file, r.device, &r.main, &r.sweep);
                doc.window = r.window;
                if let Some(scores) = &r.by_version {
                    doc.torch_version_detected = true;
                    doc.parity_by_version =
                        Some(scores.iter().map(report::JsonVersionParity::from).collect());
                }
                if let Some(top) = &r.top {
                    doc.top_sites = Some(top.at_peak.clone());
                    doc.top_sites_at_end = Some(top.at_end.clone());
                    for (row, sites) in doc.sweep.iter_mut().zip(&top.sweep) {
                        row.top_sites = Some(sites.clone());
                    }
                }
                serde_json::to_value(&doc).unwrap_or_default()
            }
        }
    }

    /// The text report.
    pub fn text(&self, snap: &Snapshot) -> String {
        let mut out = String::new();
        match self {
            ReplayReport::StateOnly(s) => {
                out.push_str(&report::describe_file(&s.file, snap, None));
                let stray = snap.stray_entries();
                if stray > 0 {
                    let _ = writeln!(
                        out,
                        "  {stray} trace entr{} without any allocation or free: not a history, not replayed",
                        if stray == 1 { "y" } else { "ies" }
                    );
                }
                out.push_str(
                    "  state only: no history to replay; the dump's state as memory_summary() reports it \
                     (the current values; a dump cannot give the rest):\n\n",
                );
                out.push_str(&state::state_summary(s.device, &s.stats));
                if let Some(top) = &s.top {
                    out.push_str(&report::top_sites_text(
                        "holding the dump's allocated blocks",
                        top,
                    ));
                }
                let _ = writeln!(out, "\nUnknown from this snapshot:");
                for u in state::UNKNOWN_IN_STATE {
                    let _ = writeln!(out, "  - {u}");
                }
            }
            ReplayReport::Replayed(r) => {
                let main = &r.main;
                out.push_str(&report::describe_file(&r.file, snap, Some(r.device)));
                if let Some(w) = &r.window {
                    let _ = writeln!(
                        out,
                        "  {}: the job replays from its start to the window's end; peaks, lower bound and \
                         call sites are measured inside the window, counters up to its end",
                        w.describe(snap.traces[r.device].len())
                    );
                }
                if main.parity.is_some() {
                    out.push_str(&report::parity_text(main, r.capacity));
                    out.push_str(&report::version_text(r.torch, r.by_version.as_deref()));
                } else if r.sweep.is_empty() {
                    out.push_str(&report::sweep_table(std::slice::from_ref(main), r.capacity));
                }
                if main.parity.is_none() && main.skipped_frees > 0 {
                    let _ = writeln!(
                        out,
                        "  {} frees of blocks allocated before the trace began were skipped",
                        main.skipped_frees
                    );
                }
                if !r.sweep.is_empty() {
                    out.push_str(&report::sweep_table(&r.sweep, r.capacity));
                }
                if let Some(top) = &r.top {
                    let label = report::config_label(&main.config);
                    out.push_str(&report::top_sites_text(
                        &format!(
                            "at the reserved peak ({label}: {} after event {})",
                            c10_cuda::summary::format_size(main.peak_reserved),
                            main.peak_event_index
                        ),
                        &top.at_peak,
                    ));
                    out.push_str(&report::top_sites_text(
                        &format!("at the end (after event {})", main.last_event_index),
                        &top.at_end,
                    ));
                    for (o, sites) in r.sweep.iter().zip(&top.sweep) {
                        out.push_str(&report::top_sites_text(
                            &format!(
                                "at the peak of {} ({} after event {})",
                                report::config_label(&o.config),
                                c10_cuda::summary::format_size(o.peak_reserved),
                                o.peak_event_index
                            ),
                            sites,
                        ));
                    }
                }
                out.push_str(&report::summaries(main, r.device as u8));
            }
        }
        out
    }
}
