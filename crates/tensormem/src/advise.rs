//! `tensormem advise`: which allocator setting makes this program fit.
//!
//! Replays the whole job (the blocks live when recording began, allocated first under the
//! setting, then the recorded history; or with `history_only` the history alone) from an
//! empty allocator under each candidate setting ([`candidates`]: `expandable_segments`,
//! `max_split_size_mb` over a range, `roundup_power2_divisions` uniform and per interval,
//! `garbage_collection_threshold` with a per-process memory fraction, and combinations), at
//! the device memory asked for (default 1 TiB: unconstrained). Then, for each candidate that
//! completes there, finds by bisection the smallest device memory (to [`RESOLUTION`]) on
//! which a full replay completes without an out-of-memory error, with PyTorch's full retry
//! path (free the cached blocks, retry) in force: every device memory reported was replayed
//! in full with 0 OOMs. Candidates are ranked: those that fit the device memory asked for
//! first, then by that smallest device memory, then by peak reserved bytes and device
//! mallocs. Replays run on every core.

use std::fmt::Write as _;
use std::sync::Arc;

use c10_cuda::config::AllocatorConfig;
use c10_cuda::summary::format_size;
use serde::Serialize;

use crate::error::Error;
use crate::model::Snapshot;
use crate::par;
use crate::replay::{Mode, Outcome, ReplayOptions, replay};
use crate::report::config_label;
use crate::start_state::{StartState, start_state};
use crate::window::{EventWindow, Window};

/// The bisection's resolution: 2 MiB, PyTorch's large-segment rounding.
pub const RESOLUTION: u64 = 2 << 20;

/// One setting to try.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// The PYTORCH_CUDA_ALLOC_CONF value (`""` = PyTorch's default).
    pub alloc_conf: String,
    /// A per-process memory fraction to set with `torch.cuda.set_per_process_memory_fraction`
    /// (only with `garbage_collection_threshold`, which needs one to act).
    pub memory_fraction: Option<f64>,
}

impl Candidate {
    fn new(alloc_conf: &str) -> Self {
        Candidate {
            alloc_conf: alloc_conf.to_string(),
            memory_fraction: None,
        }
    }

    /// The configuration replayed: the string plus our `per_process_memory_fraction` key.
    ///
    /// # Panics
    /// Never for the built-in candidates (each is checked by a test).
    pub fn config(&self) -> AllocatorConfig {
        self.config_string()
            .parse()
            .expect("the built-in candidates are valid")
    }

    /// How reports name it: the PYTORCH_CUDA_ALLOC_CONF value (`default` when empty), plus
    /// `+ memory fraction F`.
    pub fn label(&self) -> String {
        let base = config_label(&self.alloc_conf).to_string();
        match self.memory_fraction {
            Some(f) => format!("{base} + memory fraction {f:?}"),
            None => base,
        }
    }

    /// What to paste: one shell line that sets everything (quoted for the shell where the
    /// value needs it; the memory fraction rides in the same string, as
    /// `per_process_memory_fraction`, which torch 2.15 reads from PYTORCH_CUDA_ALLOC_CONF), and
    /// for a memory fraction a comment line saying what to do on older torch (which rejects
    /// that key).
    pub fn how_to_apply(&self) -> Vec<String> {
        let mut lines = Vec::new();
        match self.memory_fraction {
            None if self.alloc_conf.is_empty() => {
                lines.push("unset PYTORCH_CUDA_ALLOC_CONF   # PyTorch's default settings".into());
            }
            None => lines.push(format!(
                "export PYTORCH_CUDA_ALLOC_CONF={}",
                shell_quote(&self.alloc_conf)
            )),
            Some(f) => {
                lines.push(format!(
                    "export PYTORCH_CUDA_ALLOC_CONF={}   # torch 2.15 or newer",
                    shell_quote(&self.config_string())
                ));
                let older = if self.alloc_conf.is_empty() {
                    "unset PYTORCH_CUDA_ALLOC_CONF".to_string()
                } else {
                    format!(
                        "export PYTORCH_CUDA_ALLOC_CONF={}",
                        shell_quote(&self.alloc_conf)
                    )
                };
                lines.push(format!(
                    "# older torch rejects per_process_memory_fraction there: use  {older}  and call \
                     torch.cuda.set_per_process_memory_fraction({f:?}) before the first allocation"
                ));
            }
        }
        lines
    }

    /// The PYTORCH_CUDA_ALLOC_CONF string with the memory fraction as
    /// `per_process_memory_fraction` (torch 2.15's syntax).
    pub fn config_string(&self) -> String {
        let mut s = self.alloc_conf.clone();
        if let Some(f) = self.memory_fraction {
            if !s.is_empty() {
                s.push(',');
            }
            let _ = write!(s, "per_process_memory_fraction:{f:?}");
        }
        s
    }
}

/// `s` as one shell word: as it is when it holds only characters no shell treats specially,
/// else in single quotes (a `'` inside written as `'\''`).
pub fn shell_quote(s: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_:,.=/+-@%".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// The settings [`advise`] tries, PyTorch's default first.
pub fn candidates() -> Vec<Candidate> {
    let mut out: Vec<Candidate> = Vec::new();
    let plain = [
        "",
        "expandable_segments:True",
        "max_split_size_mb:64",
        "max_split_size_mb:128",
        "max_split_size_mb:256",
        "max_split_size_mb:512",
        "max_split_size_mb:1024",
        "roundup_power2_divisions:2",
        "roundup_power2_divisions:4",
        "roundup_power2_divisions:8",
        "roundup_power2_divisions:16",
        // Per interval: fine rounding for small sizes, coarse for large (fewer distinct sizes
        // where the bytes are), and the reverse.
        "roundup_power2_divisions:[256:8,512:4,1024:2,>:1]",
        "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
        "expandable_segments:True,roundup_power2_divisions:4",
        "expandable_segments:True,roundup_power2_divisions:16",
        "max_split_size_mb:128,roundup_power2_divisions:4",
        "max_split_size_mb:256,roundup_power2_divisions:8",
    ];
    out.extend(plain.iter().map(|s| Candidate::new(s)));
    // Garbage collection needs a memory fraction below 1.0 (torch 2.15 takes a fraction of 1.0
    // as "no limit", and collects nothing then); 0.999 caps the process just under the device
    // memory, so the threshold is about a share of the device.
    for base in ["", "max_split_size_mb:128", "expandable_segments:True"] {
        for threshold in ["0.6", "0.8", "0.95"] {
            let mut s = base.to_string();
            if !s.is_empty() {
                s.push(',');
            }
            s.push_str("garbage_collection_threshold:");
            s.push_str(threshold);
            out.push(Candidate {
                alloc_conf: s,
                memory_fraction: Some(GC_FRACTION),
            });
        }
    }
    out
}

/// The memory fraction the garbage-collection candidates set (see [`candidates`]).
pub const GC_FRACTION: f64 = 0.999;

/// How to search.
#[derive(Clone, Debug)]
pub struct AdviseOptions {
    /// The device memory to fit (`--device-memory`), bytes; `None`: unconstrained (1 TiB).
    pub device_memory: Option<u64>,
    /// How many candidates the text report prints (all are in the JSON).
    pub show: usize,
    /// Which device's history (default: the longest).
    pub device: Option<usize>,
    /// Replay the recorded history alone (`--history-only`), leaving out the blocks live when
    /// recording began: the old behaviour, which undercounts the job's memory.
    pub history_only: bool,
    /// The start state of the whole job, when the caller has it (explain passes the one of the
    /// whole recording); `None`: rebuilt from the snapshot.
    pub start: Option<Arc<StartState>>,
    /// `--since`/`--until` ([`crate::window`]): every replay runs the job from its start to
    /// the window's end (an OOM anywhere there counts: the job runs it), and the peaks and
    /// lower bound are measured inside the window.
    pub window: Window,
}

impl Default for AdviseOptions {
    fn default() -> Self {
        AdviseOptions {
            device_memory: None,
            show: 5,
            device: None,
            history_only: false,
            start: None,
            window: Window::default(),
        }
    }
}

/// One candidate's results.
#[derive(Clone, Debug, Serialize)]
pub struct CandidateResult {
    /// How reports name it (`default`, the string, `+ memory fraction F`).
    pub config: String,
    /// The PYTORCH_CUDA_ALLOC_CONF value to set (`""` = default).
    pub alloc_conf: String,
    /// The `torch.cuda.set_per_process_memory_fraction` value to set, if any.
    pub memory_fraction: Option<f64>,
    /// Peak reserved bytes at the device memory asked for.
    pub peak_reserved_bytes: u64,
    /// Peak allocated bytes at the device memory asked for.
    pub peak_allocated_bytes: u64,
    /// Peak reserved / lower bound.
    pub fragmentation: f64,
    /// `num_device_alloc` (cudaMalloc calls and expandable-segment growths).
    pub device_mallocs: i64,
    /// `num_alloc_retries`.
    pub num_alloc_retries: i64,
    /// Allocations that failed at the device memory asked for.
    pub failed_allocs: usize,
    /// Whether the run completed without an out-of-memory error at the device memory asked
    /// for.
    pub fits: bool,
    /// The smallest device memory (a multiple of [`RESOLUTION`]) on which the replay completes
    /// without an out-of-memory error; `null` when even the device memory asked for fails.
    pub min_device_memory_bytes: Option<u64>,
    /// `num_alloc_retries` on that smallest device memory (each retry frees the cached blocks
    /// and synchronizes the device: the price of running at the edge).
    pub retries_at_min_device_memory: Option<i64>,
    /// A device memory on which a full replay needed no retry at all (its peak reserved bytes
    /// rounded up to [`RESOLUTION`], or the device memory asked for), when one was replayed;
    /// `null` when none was.
    pub retry_free_device_memory_bytes: Option<u64>,
    /// The lines to paste.
    pub apply: Vec<String>,
}

/// What [`advise`] found.
#[derive(Clone, Debug, Serialize)]
pub struct Advice {
    /// The snapshot's name.
    pub file: String,
    /// The device replayed.
    pub device: usize,
    /// Recorded events.
    pub events: usize,
    /// The device memory fitted (`--device-memory`), or `null` when unconstrained.
    pub device_memory_bytes: Option<u64>,
    /// What every replay covered: `whole job` (the blocks live when recording began, then the
    /// history) or `history only` (`--history-only`).
    pub mode: &'static str,
    /// Blocks live when recording began that the replays allocated first (0 with
    /// `history only`, which leaves them out).
    pub start_blocks: usize,
    /// Their requested bytes.
    pub start_bytes: u64,
    /// With `history only`: the blocks live when recording began that were left out, and
    /// their requested bytes (`null` in whole-job mode).
    pub left_out: Option<(usize, u64)>,
    /// Peak of live bytes (each request rounded up to 512): no setting needs less.
    pub lower_bound_bytes: u64,
    /// Replays run in all.
    pub replays: usize,
    /// With `--since`/`--until`: the window (absent without one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<EventWindow>,
    /// The candidates, best first.
    pub candidates: Vec<CandidateResult>,
    /// Options not shown in the text report (for the report).
    #[serde(skip)]
    pub show: usize,
}

/// One candidate's evaluation: the replay at the asked device memory and the bisection.
struct Evaluated {
    candidate: Candidate,
    outcome: Outcome,
    /// The smallest device memory and the retries there.
    min_device: Option<(u64, i64)>,
    /// A device memory replayed without any retry.
    retry_free: Option<u64>,
    replays: usize,
}

/// What every replay of one advise run replays: the snapshot's device, whole job or history
/// only, with the start state rebuilt once.
struct Job<'a> {
    snap: &'a Snapshot,
    device: usize,
    history_only: bool,
    start: Option<Arc<StartState>>,
    window: Option<EventWindow>,
}

impl Job<'_> {
    fn options(&self, config: &AllocatorConfig, capacity: u64) -> ReplayOptions {
        ReplayOptions {
            history_only: self.history_only,
            start: self.start.clone(),
            since_event: self.window.map(|w| w.since_event),
            until_event: self.window.map(|w| w.until_event),
            ..ReplayOptions::new(config.clone(), capacity as usize, true)
        }
    }

    /// The `num_alloc_retries` of a full replay of `config` on `capacity` bytes that completes
    /// without an OOM; `None` when an allocation fails (the replay stops there).
    fn fits(&self, config: &AllocatorConfig, capacity: u64) -> Option<i64> {
        let opts = ReplayOptions {
            stop_at_first_oom: true,
            ..self.options(config, capacity)
        };
        replay(self.snap, self.device, &opts, &mut |_, _| {})
            .ok()
            .filter(|o| o.failed_allocs == 0)
            .map(|o| o.retries)
    }

    /// The smallest multiple of [`RESOLUTION`] in `(lo, hi]` on which `config` fits, knowing
    /// it fits on `hi` (with `hi_retries` retries) and not on `lo`; its retries there, and the
    /// replays it took.
    fn bisect(
        &self,
        config: &AllocatorConfig,
        mut lo: u64,
        mut hi: u64,
        mut hi_retries: i64,
    ) -> (u64, i64, usize) {
        let mut replays = 0;
        while hi - lo > RESOLUTION {
            let mid = (lo + (hi - lo) / 2).div_ceil(RESOLUTION) * RESOLUTION;
            let mid = mid.clamp(lo + RESOLUTION, hi - RESOLUTION);
            replays += 1;
            match self.fits(config, mid) {
                Some(r) => {
                    hi = mid;
                    hi_retries = r;
                }
                None => lo = mid,
            }
        }
        (hi, hi_retries, replays)
    }

    fn evaluate(&self, candidate: &Candidate, capacity: u64) -> Result<Evaluated, Error> {
        let config = candidate.config();
        let outcome = replay(
            self.snap,
            self.device,
            &self.options(&config, capacity),
            &mut |_, _| {},
        )?;
        let mut replays = 1;
        let mut retry_free =
            (outcome.failed_allocs == 0 && outcome.retries == 0).then_some(capacity);
        let min_device = if outcome.failed_allocs > 0 {
            None
        } else {
            // It fits on its peak reserved bytes rounded up (unless garbage collection, which
            // depends on the device memory, changes that; then on the device memory asked
            // for); nothing fits below the live bytes.
            let mut hi = outcome.peak_reserved.div_ceil(RESOLUTION).max(1) * RESOLUTION;
            let mut hi_retries = outcome.retries;
            if hi < capacity {
                replays += 1;
                match self.fits(&config, hi) {
                    Some(r) => {
                        hi_retries = r;
                        if r == 0 {
                            retry_free = Some(hi);
                        }
                    }
                    None => hi = capacity,
                }
            } else {
                hi = capacity;
            }
            let lo = (outcome.lower_bound / RESOLUTION * RESOLUTION).saturating_sub(RESOLUTION);
            if lo >= hi {
                Some((hi, hi_retries))
            } else {
                let (m, r, n) = self.bisect(&config, lo, hi, hi_retries);
                replays += n;
                Some((m, r))
            }
        };
        Ok(Evaluated {
            candidate: candidate.clone(),
            outcome,
            min_device,
            retry_free,
            replays,
        })
    }
}

/// Searches [`candidates`] for `device`'s history of `snap` (named `file`); see the module
/// docs.
///
/// # Errors
/// [`Error::NeedsHistory`] for a state-only snapshot; [`Error::Option`] for an unknown
/// device; a replay failure.
pub fn advise(snap: &Snapshot, file: &str, opts: &AdviseOptions) -> Result<Advice, Error> {
    let device =
        crate::session::history_device(opts.device, snap)?.ok_or_else(|| Error::NeedsHistory {
            what: "advise",
            file: file.to_string(),
        })?;
    let capacity = opts
        .device_memory
        .unwrap_or(crate::session::DEFAULT_DEVICE_MEMORY as u64);
    let start = opts
        .start
        .clone()
        .unwrap_or_else(|| Arc::new(start_state(snap, device, &AllocatorConfig::default())));
    let left_out = opts
        .history_only
        .then(|| (start.live.len(), start.live_bytes()));
    let window = opts.window.resolve(&snap.traces[device])?;
    let job = Job {
        snap,
        device,
        history_only: opts.history_only,
        start: Some(start),
        window,
    };
    let cands = candidates();
    let evaluated = par::map(&cands, |c| job.evaluate(c, capacity));
    let mut evaluated = evaluated.into_iter().collect::<Result<Vec<_>, _>>()?;
    let replays = evaluated.iter().map(|e| e.replays).sum();
    let first = evaluated.first().map(|e| &e.outcome);
    let lower_bound = first.map_or(0, |o| o.lower_bound);
    let (start_blocks, start_bytes) = if opts.history_only {
        (0, 0)
    } else {
        first.map_or((0, 0), |o| (o.start_blocks, o.start_bytes))
    };
    // Those that complete on the device memory asked for first, by the smallest device memory
    // they complete on, then by peak reserved bytes and device mallocs; those that do not, by
    // their failures. Stable: among equal results the simpler candidate (listed first) stays
    // first.
    evaluated.sort_by(|a, b| {
        let key = |e: &Evaluated| {
            (
                e.outcome.failed_allocs > 0,
                e.min_device.map_or(u64::MAX, |m| m.0),
                e.outcome.failed_allocs,
                e.outcome.peak_reserved,
                e.outcome.device_mallocs,
            )
        };
        key(a).cmp(&key(b))
    });
    let candidates = evaluated
        .iter()
        .map(|e| CandidateResult {
            config: e.candidate.label(),
            alloc_conf: e.candidate.alloc_conf.clone(),
            memory_fraction: e.candidate.memory_fraction,
            peak_reserved_bytes: e.outcome.peak_reserved,
            peak_allocated_bytes: e.outcome.peak_allocated,
            fragmentation: crate::report::fragmentation(&e.outcome),
            device_mallocs: e.outcome.device_mallocs,
            num_alloc_retries: e.outcome.retries,
            failed_allocs: e.outcome.failed_allocs,
            fits: e.outcome.failed_allocs == 0,
            min_device_memory_bytes: e.min_device.map(|m| m.0),
            retries_at_min_device_memory: e.min_device.map(|m| m.1),
            retry_free_device_memory_bytes: e.retry_free,
            apply: e.candidate.how_to_apply(),
        })
        .collect();
    Ok(Advice {
        file: file.to_string(),
        device,
        events: snap.traces[device].len(),
        device_memory_bytes: opts.device_memory,
        mode: if opts.history_only {
            Mode::HistoryOnly
        } else {
            Mode::WholeJob
        }
        .label(),
        start_blocks,
        start_bytes,
        left_out,
        lower_bound_bytes: lower_bound,
        replays,
        window,
        candidates,
        show: opts.show,
    })
}

/// Whether two candidates' results are identical (every figure the table shows).
fn same_results(a: &CandidateResult, b: &CandidateResult) -> bool {
    (
        a.peak_reserved_bytes,
        a.peak_allocated_bytes,
        a.device_mallocs,
        a.num_alloc_retries,
        a.failed_allocs,
        a.min_device_memory_bytes,
        a.retries_at_min_device_memory,
    ) == (
        b.peak_reserved_bytes,
        b.peak_allocated_bytes,
        b.device_mallocs,
        b.num_alloc_retries,
        b.failed_allocs,
        b.min_device_memory_bytes,
        b.retries_at_min_device_memory,
    )
}

impl Advice {
    /// Whether some setting runs the job without an out-of-memory error on the device memory
    /// asked for (`tensormem advise` exits 1 when none does).
    pub fn fits(&self) -> bool {
        self.candidates.iter().any(|c| c.fits)
    }

    /// The default configuration's row.
    pub fn default_row(&self) -> Option<&CandidateResult> {
        self.candidates.iter().find(|c| c.config == "default")
    }

    /// The text report: the best few candidates, the best one's lines to paste, and how it
    /// compares with PyTorch's default.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "tensormem advise {}", self.file);
        let device = match self.device_memory_bytes {
            Some(b) => format!("device memory {}", format_size(b)),
            None => "device memory unconstrained".to_string(),
        };
        let _ = writeln!(
            s,
            "  {} history events on device {}; lower bound (peak of live bytes) {}; {}",
            self.events,
            self.device,
            format_size(self.lower_bound_bytes),
            device
        );
        let _ = writeln!(s, "  {}", self.counted());
        if let Some(w) = &self.window {
            let _ = writeln!(
                s,
                "  {}: each replay runs the job from its start to the window's end (an OOM anywhere there \
                 counts); peaks and lower bound are measured inside the window",
                w.describe(self.events)
            );
        }
        let _ = writeln!(
            s,
            "  {} allocator settings, each replayed in full from an empty allocator, then the smallest device memory\n  \
             on which a full replay completes without OOM (bisection to {}, with PyTorch's free-cache-and-retry path): {} replays",
            self.candidates.len(),
            format_size(RESOLUTION),
            self.replays
        );
        let _ = writeln!(s);
        // Settings with identical results show once (the simplest), with how many share it.
        let mut groups: Vec<(usize, &CandidateResult, usize)> = Vec::new();
        for (i, c) in self.candidates.iter().enumerate() {
            match groups.last_mut() {
                Some((_, rep, n)) if same_results(rep, c) => *n += 1,
                _ => groups.push((i, c, 0)),
            }
        }
        let width = groups
            .iter()
            .map(|g| g.1.config.len())
            .max()
            .unwrap_or(6)
            .max(6);
        let _ = writeln!(
            s,
            "  {:>4}  {:<width$} {:>13} {:>6} {:>8} {:>8} {:>5}  {:>17} {:>8}",
            "rank",
            "config",
            "peak reserved",
            "frag",
            "mallocs",
            "retries",
            "OOMs",
            "min device memory",
            "retries"
        );
        let mut shown: Vec<&(usize, &CandidateResult, usize)> =
            groups.iter().take(self.show).collect();
        if !shown.iter().any(|g| g.1.config == "default") {
            if let Some(d) = groups.iter().find(|g| g.1.config == "default") {
                shown.push(d);
            }
        }
        for (rank, c, same) in shown.iter().map(|g| (g.0, g.1, g.2)) {
            let _ = writeln!(
                s,
                "  {:>4}  {:<width$} {:>13} {:>6.3} {:>8} {:>8} {:>5}  {:>17} {:>8}{}",
                rank + 1,
                c.config,
                format_size(c.peak_reserved_bytes),
                c.fragmentation,
                c.device_mallocs,
                c.num_alloc_retries,
                c.failed_allocs,
                c.min_device_memory_bytes
                    .map_or("does not fit".to_string(), format_size),
                c.retries_at_min_device_memory
                    .map_or("-".to_string(), |r| r.to_string()),
                if same > 0 {
                    format!("  (+{same} with the same results)")
                } else {
                    String::new()
                }
            );
        }
        let _ = writeln!(
            s,
            "  (peak reserved, frag = peak reserved / lower bound, mallocs, retries and OOMs at the {device};\n   \
             min device memory: the smallest on which the replay completes, and its retries there)"
        );
        let Some(best) = self.candidates.first() else {
            return s;
        };
        let _ = writeln!(s);
        match best.min_device_memory_bytes {
            Some(min) => {
                let _ = writeln!(
                    s,
                    "Best: {} -- the {} completes without OOM on {} of device memory (replayed in full there; \
                     {} less runs out), peak reserved {}",
                    best.config,
                    self.what(),
                    format_size(min),
                    format_size(RESOLUTION),
                    format_size(best.peak_reserved_bytes)
                );
                if let Some(r) = best.retries_at_min_device_memory.filter(|&r| r > 0) {
                    let _ = writeln!(
                        s,
                        "  on {} it relies on PyTorch's free-the-cache-and-retry path: {r} retr{} (each frees every cached \
                         block and synchronizes the device){}",
                        format_size(min),
                        if r == 1 { "y" } else { "ies" },
                        best.retry_free_device_memory_bytes
                            .map_or(String::new(), |b| format!(
                                "; on {} it needs none",
                                format_size(b)
                            ))
                    );
                }
            }
            None => {
                let _ = writeln!(
                    s,
                    "No setting runs the {} without OOM on the {device}; the fewest failures: {} ({})",
                    self.what(),
                    best.config,
                    best.failed_allocs
                );
            }
        }
        if let Some(d) = self
            .default_row()
            .filter(|d| d.config != best.config && best.min_device_memory_bytes.is_some())
        {
            let cmp = |a: u64, b: u64| {
                if a <= b {
                    format!("{} less", format_size(b - a))
                } else {
                    format!("{} more", format_size(a - b))
                }
            };
            let _ = writeln!(
                s,
                "  against PyTorch's default: peak reserved {} ({}), smallest device memory {}",
                cmp(best.peak_reserved_bytes, d.peak_reserved_bytes),
                format_size(d.peak_reserved_bytes),
                match (best.min_device_memory_bytes, d.min_device_memory_bytes) {
                    (Some(a), Some(b)) => format!("{} ({})", cmp(a, b), format_size(b)),
                    (Some(_), None) => "(the default does not fit)".to_string(),
                    _ => "n/a".to_string(),
                }
            );
        }
        if best.min_device_memory_bytes.is_some() {
            for line in &best.apply {
                let _ = writeln!(s, "  {line}");
            }
        }
        let _ = writeln!(
            s,
            "  (device memory is what the allocator may reserve: leave room for the CUDA context \
             and other processes)"
        );
        s
    }

    /// What the replays covered, for sentences: `whole job`, or `recorded history alone`;
    /// with a window that ends before the last event, `... up to event N` (the replays stop
    /// there).
    pub fn what(&self) -> String {
        let base = if self.left_out.is_some() {
            "recorded history alone"
        } else {
            "whole job"
        };
        match self.window {
            Some(w) if w.until_event < self.events => {
                format!("{base} up to event {} (the window's end)", w.until_event)
            }
            _ => base.to_string(),
        }
    }

    /// The line saying what the replays counted: the blocks live when recording began, or,
    /// with `history only`, that they were left out.
    pub fn counted(&self) -> String {
        match self.left_out {
            None => {
                crate::report::counted_line(Mode::WholeJob, self.start_blocks, self.start_bytes)
            }
            Some((n, bytes)) => crate::report::counted_line(Mode::HistoryOnly, n, bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_candidate_is_a_valid_configuration() {
        let c = candidates();
        assert!(c.len() >= 25);
        assert_eq!(c[0].alloc_conf, "");
        for cand in &c {
            let config = cand.config();
            // The string itself is what the user pastes: PyTorch's syntax, our parser agrees.
            let alone: AllocatorConfig = cand.alloc_conf.parse().expect("valid");
            assert_eq!(
                alone.expandable_segments, config.expandable_segments,
                "{}",
                cand.alloc_conf
            );
            assert!(!cand.alloc_conf.contains("per_process_memory_fraction"));
            assert_eq!(
                config.gc_enabled(),
                cand.memory_fraction.is_some(),
                "{}",
                cand.alloc_conf
            );
        }
    }

    #[test]
    fn the_lines_to_paste() {
        let c = Candidate {
            alloc_conf: "garbage_collection_threshold:0.8".into(),
            memory_fraction: Some(GC_FRACTION),
        };
        assert_eq!(
            c.how_to_apply(),
            vec![
                "export PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.8,per_process_memory_fraction:0.999   # torch 2.15 or newer"
                    .to_string(),
                "# older torch rejects per_process_memory_fraction there: use  export PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.8  \
                 and call torch.cuda.set_per_process_memory_fraction(0.999) before the first allocation"
                    .to_string()
            ]
        );
        assert_eq!(
            c.label(),
            "garbage_collection_threshold:0.8 + memory fraction 0.999"
        );
        // The string pasted is the one replayed, memory fraction included.
        assert_eq!(
            c.config().per_process_memory_fraction,
            Some(GC_FRACTION),
            "{}",
            c.config_string()
        );
        let default = Candidate::new("");
        assert_eq!(
            default.how_to_apply(),
            ["unset PYTORCH_CUDA_ALLOC_CONF   # PyTorch's default settings"]
        );
    }

    /// Every line to paste survives a POSIX shell: run through `sh`, the variable holds
    /// exactly the string replayed (the `>` of a per-interval rounding used to redirect).
    #[test]
    fn the_export_lines_are_shell_safe() {
        for c in candidates() {
            let line = &c.how_to_apply()[0];
            if c.alloc_conf.is_empty() && c.memory_fraction.is_none() {
                continue;
            }
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("{line}\nprintf %s \"$PYTORCH_CUDA_ALLOC_CONF\""))
                .current_dir(std::env::temp_dir())
                .output()
                .expect("sh runs");
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                c.config_string(),
                "{line}"
            );
            assert!(out.stderr.is_empty(), "{line}");
        }
        assert_eq!(shell_quote("a:1,b:[2:1,>:4]"), "'a:1,b:[2:1,>:4]'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(
            shell_quote("expandable_segments:True"),
            "expandable_segments:True"
        );
    }
}
