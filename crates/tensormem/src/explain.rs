//! `tensormem explain`: why an allocation failed.
//!
//! The moment explained is the first `oom` trace entry when the history has one (the state
//! just before it is rebuilt by a parity replay), else the dump itself (a snapshot taken at an
//! OOM, e.g. by an out-of-memory observer). At that moment: the failed request (size, stream,
//! pool, the device's free bytes), the free bytes of each segment, the largest free block per
//! pool and stream against the request, the bytes reserved but unallocated in split segments
//! (which no `empty_cache` can return), the call sites holding memory, and the allocator
//! setting that would have avoided the OOM: [`crate::advise`] on the whole job (the blocks
//! live when recording began, then the history with each failed request as the allocation it
//! asked for), on the device memory the allocator could have had; a setting is named only when
//! a full replay of that job under it completes there without OOM. Figures a snapshot cannot
//! give are listed as unknown, never printed as zeros.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use c10_cuda::history::TraceAction;
use c10_cuda::sizes::SMALL_SIZE;
use c10_cuda::snapshot::{BlockState, DeviceSnapshot};
use c10_cuda::summary::format_size;
use serde::Serialize;

use crate::advise::{Advice, AdviseOptions, advise};
use crate::error::Error;
use crate::model::{RecordedEvent, Snapshot};
use crate::replay::{ReplayOptions, replay};
use crate::top_sites::{self, Grouping, Site};
use crate::window::Window;

/// The failed request of an `oom` entry.
#[derive(Clone, Debug, Serialize)]
pub struct FailedRequest {
    /// The recorded event index of the `oom` entry.
    pub event_index: usize,
    /// Bytes requested, as rounded by the allocator (the entry's `size`).
    pub size: u64,
    /// The stream.
    pub stream: u64,
    /// `small` (requests up to 1 MiB) or `large`.
    pub pool: &'static str,
    /// The device's free bytes at the OOM (`device_free`).
    pub device_free: u64,
}

/// One segment's free space at the moment.
#[derive(Clone, Debug, Serialize)]
pub struct SegmentFree {
    /// Start address.
    pub address: u64,
    /// `small` or `large`.
    pub pool: &'static str,
    /// The stream it serves.
    pub stream: u64,
    /// Bytes of the segment.
    pub total_size: u64,
    /// Bytes of its inactive (free) blocks.
    pub free_bytes: u64,
    /// Its largest free block.
    pub largest_free_block: u64,
    /// Blocks in it.
    pub blocks: usize,
}

/// Free space of one pool and stream, against the request.
#[derive(Clone, Debug, Serialize)]
pub struct PoolFree {
    /// `small` or `large`.
    pub pool: &'static str,
    /// The stream.
    pub stream: u64,
    /// Segments.
    pub segments: usize,
    /// Reserved bytes.
    pub reserved_bytes: u64,
    /// Free bytes in its segments.
    pub free_bytes: u64,
    /// The largest free block.
    pub largest_free_block: u64,
    /// Whether the largest free block could serve the request (`null` without a request, or
    /// for another pool or stream than the request's).
    pub fits_request: Option<bool>,
}

/// What [`explain`] found.
#[derive(Clone, Debug, Serialize)]
pub struct Explanation {
    /// The snapshot's name.
    pub file: String,
    /// What moment is explained: `oom_entry` or `dump`.
    pub moment: &'static str,
    /// The failed request, when the history records it.
    pub request: Option<FailedRequest>,
    /// Reserved bytes at the moment.
    pub reserved_bytes: u64,
    /// Allocated bytes (blocks handed out) at the moment.
    pub allocated_bytes: u64,
    /// Free bytes in segments that also hold active blocks: reserved but unallocated, and not
    /// returnable by `empty_cache` (PyTorch's `inactive_split_bytes`).
    pub inactive_split_bytes: u64,
    /// Free bytes in wholly free segments (returnable by `empty_cache`).
    pub releasable_bytes: u64,
    /// Per segment with free bytes, most free first.
    pub segments: Vec<SegmentFree>,
    /// Per pool and stream.
    pub pools: Vec<PoolFree>,
    /// Call sites holding memory at the moment (`null` when unknown).
    pub top_sites: Option<Vec<Site>>,
    /// The advise result that would have avoided the OOM (`null` when unknown).
    pub advice: Option<Advice>,
    /// The figures this snapshot cannot give, each with the reason.
    pub unknown: Vec<String>,
    /// One line first: fragmentation or too much live memory, and who holds the most.
    pub verdict: String,
}

/// Options of [`explain`].
#[derive(Clone, Debug)]
pub struct ExplainOptions {
    /// Call sites to list.
    pub top: usize,
    /// Segments to list in the text (all are in the JSON).
    pub show_segments: usize,
    /// `--since`/`--until`: explain the first `oom` entry of the history inside this window.
    pub window: Window,
}

impl Default for ExplainOptions {
    fn default() -> Self {
        ExplainOptions {
            top: 5,
            show_segments: 8,
            window: Window::default(),
        }
    }
}

/// A segment at the moment: (address, pool, stream, total, blocks as (size, state)).
struct Seg {
    address: u64,
    small: bool,
    stream: u64,
    total: u64,
    blocks: Vec<(u64, BlockState)>,
}

fn pool_name(small: bool) -> &'static str {
    if small { "small" } else { "large" }
}

fn from_ours(s: &DeviceSnapshot) -> Vec<Seg> {
    s.segments
        .iter()
        .map(|g| Seg {
            address: g.address,
            small: !g.is_large,
            stream: g.stream.0,
            total: g.total_size,
            blocks: g.blocks.iter().map(|b| (b.size, b.state)).collect(),
        })
        .collect()
}

fn from_dump(snap: &Snapshot) -> Vec<Seg> {
    snap.segments
        .iter()
        .map(|g| Seg {
            address: g.address,
            small: !g.is_large,
            stream: g.stream,
            total: g.total_size,
            blocks: g.blocks.iter().map(|b| (b.size, b.state)).collect(),
        })
        .collect()
}

/// The whole job as it would run without the failures: `device`'s history with every `oom`
/// entry replaced by the `alloc` that failed there, each at an address no other block uses.
/// Its free was never recorded, so the request counts as live from then on. The dump's
/// segments stay, so the blocks live when recording began are rebuilt as for any replay.
fn job_without_failures(snap: &Snapshot, device: usize) -> Snapshot {
    let mut s = snap.clone();
    let events = &snap.traces[device];
    let mut fresh = events
        .iter()
        .map(|e| e.addr.saturating_add(e.size))
        .max()
        .unwrap_or(0)
        + (1 << 30);
    s.traces[device] = events
        .iter()
        .map(|e| {
            if e.action != TraceAction::Oom {
                return e.clone();
            }
            let mut failed = RecordedEvent::new(TraceAction::Alloc, fresh, e.size, e.stream);
            fresh += e.size.div_ceil(1 << 21).max(1) << 21;
            failed.frames = e.frames.clone();
            failed.time_us = e.time_us;
            failed
        })
        .collect();
    s
}

/// Explains the snapshot's OOM (see the module docs).
///
/// # Errors
/// A replay failure while rebuilding the state before the `oom` entry, or in advise.
pub fn explain(snap: &Snapshot, file: &str, opts: &ExplainOptions) -> Result<Explanation, Error> {
    let mut unknown = Vec::new();
    let device = snap.main_device();
    // The first `oom` entry of the history, else of any trace (a dump taken at the OOM may
    // carry its `oom` entry and nothing else).
    let first_oom = |d: usize| {
        snap.traces[d]
            .iter()
            .position(|e| e.action == TraceAction::Oom)
            .map(|k| (d, k))
    };
    let oom = if opts.window.is_all() {
        device
            .and_then(first_oom)
            .or_else(|| (0..snap.traces.len()).find_map(first_oom))
    } else {
        // A window picks the first `oom` entry of the history inside it.
        let d = device.ok_or_else(|| Error::NeedsHistory {
            what: if opts.window.since.is_some() {
                "--since"
            } else {
                "--until"
            },
            file: file.to_string(),
        })?;
        let w = opts
            .window
            .resolve(&snap.traces[d])?
            .ok_or_else(|| Error::option("--since", "no window given"))?;
        let events = &snap.traces[d];
        let k = (w.since_event..w.until_event)
            .find(|&k| events[k].action == TraceAction::Oom)
            .ok_or_else(|| {
                let all: Vec<String> = events
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| e.action == TraceAction::Oom)
                    .map(|(k, _)| k.to_string())
                    .collect();
                Error::option(
                    if opts.window.since.is_some() {
                        "--since"
                    } else {
                        "--until"
                    },
                    format!(
                        "no oom entry in the {} ({})",
                        w.describe(events.len()),
                        if all.is_empty() {
                            "the history records none".to_string()
                        } else {
                            format!("the history's are at events {}", all.join(", "))
                        }
                    ),
                )
            })?;
        Some((d, k))
    };
    let (moment, segs, request, top_sites, advice) = match oom {
        Some((d, k)) => {
            let e = &snap.traces[d][k];
            let (segs, live, reserved) = if crate::model::is_history(&snap.traces[d]) {
                let opts_replay = ReplayOptions {
                    until_event: Some(k),
                    ..ReplayOptions::new(
                        snap.config(),
                        crate::session::DEFAULT_DEVICE_MEMORY,
                        false,
                    )
                };
                let outcome = replay(snap, d, &opts_replay, &mut |_, _| {})?;
                let live =
                    top_sites::live_at(snap, d, k.saturating_sub(1), outcome.start.as_deref());
                let reserved: u64 = outcome.snapshot.segments.iter().map(|s| s.total_size).sum();
                (from_ours(&outcome.snapshot), live, reserved)
            } else {
                // No history: the dump is the moment of the OOM.
                let dev = snap.segments.first().map_or(0, |s| s.device);
                let reserved = snap.reserved_bytes();
                (
                    from_dump(snap),
                    top_sites::live_in_dump(snap, dev),
                    reserved,
                )
            };
            let request = FailedRequest {
                event_index: k,
                size: e.size,
                stream: e.stream,
                pool: pool_name(e.size as usize <= SMALL_SIZE),
                device_free: e.addr,
            };
            let sites = top_sites::top_sites(&live, opts.top, Grouping::TopFrame);
            let device_memory = reserved + e.addr;
            let job = job_without_failures(snap, d);
            let advice = advise(
                &job,
                file,
                &AdviseOptions {
                    device_memory: Some(device_memory),
                    device: Some(d),
                    ..AdviseOptions::default()
                },
            )?;
            ("oom_entry", segs, Some(request), Some(sites), Some(advice))
        }
        None => {
            unknown.push(
                "the failed request (size, stream, pool) and the device's free bytes: the \
                 snapshot has no oom trace entry"
                    .to_string(),
            );
            let dev = snap.segments.first().map_or(0, |s| s.device);
            // With a history, the dump's live blocks are those live at its end: the ones
            // allocated before recording began (and never freed) are named so.
            let live = match device {
                Some(d) => {
                    let st = crate::start_state::start_state(snap, d, &snap.config());
                    let last = snap.traces[d].len().saturating_sub(1);
                    top_sites::live_at(snap, d, last, Some(&st))
                }
                None => top_sites::live_in_dump(snap, dev),
            };
            let sites = if live.iter().any(|a| a.frames.is_some()) {
                Some(top_sites::top_sites(&live, opts.top, Grouping::TopFrame))
            } else {
                unknown.push(
                    "the call sites holding memory: the dump's blocks carry no stacks".to_string(),
                );
                None
            };
            if device.is_some() {
                unknown.push(
                    "the setting that would have avoided an OOM: no OOM is recorded (to fit a \
                     given device, run tensormem advise FILE --device-memory SIZE)"
                        .to_string(),
                );
            } else {
                unknown.push(
                    "the setting that would have avoided the OOM: advise needs a memory history \
                     (record one with torch.cuda.memory._record_memory_history())"
                        .to_string(),
                );
            }
            ("dump", from_dump(snap), None, sites, None)
        }
    };

    let mut reserved = 0;
    let mut allocated = 0;
    let mut inactive_split = 0;
    let mut releasable = 0;
    let mut segments = Vec::new();
    let mut pools: BTreeMap<(bool, u64), PoolFree> = BTreeMap::new();
    for s in &segs {
        let free: u64 = s
            .blocks
            .iter()
            .filter(|b| b.1 == BlockState::Inactive)
            .map(|b| b.0)
            .sum();
        let largest = s
            .blocks
            .iter()
            .filter(|b| b.1 == BlockState::Inactive)
            .map(|b| b.0)
            .max()
            .unwrap_or(0);
        reserved += s.total;
        allocated += s
            .blocks
            .iter()
            .filter(|b| b.1 == BlockState::ActiveAllocated)
            .map(|b| b.0)
            .sum::<u64>();
        if free == s.total {
            releasable += free;
        } else {
            inactive_split += free;
        }
        let p = pools.entry((s.small, s.stream)).or_insert(PoolFree {
            pool: pool_name(s.small),
            stream: s.stream,
            segments: 0,
            reserved_bytes: 0,
            free_bytes: 0,
            largest_free_block: 0,
            fits_request: None,
        });
        p.segments += 1;
        p.reserved_bytes += s.total;
        p.free_bytes += free;
        p.largest_free_block = p.largest_free_block.max(largest);
        if free > 0 {
            segments.push(SegmentFree {
                address: s.address,
                pool: pool_name(s.small),
                stream: s.stream,
                total_size: s.total,
                free_bytes: free,
                largest_free_block: largest,
                blocks: s.blocks.len(),
            });
        }
    }
    segments.sort_by(|a, b| {
        b.free_bytes
            .cmp(&a.free_bytes)
            .then(a.address.cmp(&b.address))
    });
    let mut pools: Vec<PoolFree> = pools.into_values().collect();
    if let Some(r) = &request {
        for p in &mut pools {
            if p.pool == r.pool && p.stream == r.stream {
                p.fits_request = Some(p.largest_free_block >= r.size);
            }
        }
    }
    let _ = opts.show_segments;
    let verdict = verdict(
        reserved,
        allocated,
        request.as_ref(),
        &pools,
        top_sites.as_deref(),
    );
    Ok(Explanation {
        verdict,
        file: file.to_string(),
        moment,
        request,
        reserved_bytes: reserved,
        allocated_bytes: allocated,
        inactive_split_bytes: inactive_split,
        releasable_bytes: releasable,
        segments,
        pools,
        top_sites,
        advice,
        unknown,
    })
}

/// The percentage `a / b` with two decimals (`n/a` when `b` is 0).
fn percent(a: u64, b: u64) -> String {
    if b == 0 {
        "n/a".to_string()
    } else {
        format!("{:.2}%", 100.0 * a as f64 / b as f64)
    }
}

/// The verdict line. With a failed request: fragmentation when its pool's free bytes plus the
/// device's would have held it but no free block of the pool did; too much live memory when
/// they would not; else the recorded state had a free block for it. Without one: the share of
/// reserved memory allocated, and the most fragmentation can waste (the free reserved bytes,
/// cached or split).
/// Then the call site holding the most.
fn verdict(
    reserved: u64,
    allocated: u64,
    request: Option<&FailedRequest>,
    pools: &[PoolFree],
    top: Option<&[Site]>,
) -> String {
    let share = percent(allocated, reserved);
    let free = reserved.saturating_sub(allocated);
    let mut v = match request {
        Some(r) => {
            let (pool_free, largest) = pools
                .iter()
                .find(|p| p.pool == r.pool && p.stream == r.stream)
                .map_or((0, 0), |p| (p.free_bytes, p.largest_free_block));
            if largest >= r.size {
                format!(
                    "Verdict: a free block of its pool ({}) holds the request of {}: the state rebuilt here could have \
                     served it",
                    format_size(largest),
                    format_size(r.size)
                )
            } else if pool_free + r.device_free >= r.size {
                format!(
                    "Verdict: fragmentation: the request of {} needed one block; its pool had {} free (largest block {}) \
                     and the device {}: enough bytes, not in one piece",
                    format_size(r.size),
                    format_size(pool_free),
                    format_size(largest),
                    format_size(r.device_free)
                )
            } else {
                format!(
                    "Verdict: too much live memory, not fragmentation: {share} of reserved memory is allocated ({} of {}); \
                     its pool's free bytes and the device's ({} + {}) are less than the request of {}",
                    format_size(allocated),
                    format_size(reserved),
                    format_size(pool_free),
                    format_size(r.device_free),
                    format_size(r.size)
                )
            }
        }
        None => format!(
            "Verdict: {share} of reserved memory is allocated ({} of {}): at most {} ({}) is free for \
             fragmentation to waste",
            format_size(allocated),
            format_size(reserved),
            format_size(free),
            percent(free, reserved)
        ),
    };
    if let Some(site) = top.and_then(|t| t.first()) {
        let _ = write!(
            v,
            "; {} holds {} in {} allocation{}",
            site.site,
            format_size(site.bytes),
            site.count,
            if site.count == 1 { "" } else { "s" }
        );
    }
    v
}

impl Explanation {
    /// The text report; `show_segments` segments are listed.
    pub fn text(&self, show_segments: usize) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "tensormem explain {}", self.file);
        let _ = writeln!(s, "  {}", self.verdict);
        match &self.request {
            Some(r) => {
                let _ = writeln!(
                    s,
                    "  OOM at event {}: a request of {} on stream {} ({} pool) failed with {} free on the device",
                    r.event_index,
                    format_size(r.size),
                    r.stream,
                    r.pool,
                    format_size(r.device_free)
                );
            }
            None => {
                let _ = writeln!(
                    s,
                    "  no oom trace entry: explaining the state the snapshot holds (taken at the dump)"
                );
            }
        }
        let _ = writeln!(
            s,
            "  reserved {}, allocated {}; reserved but unallocated: {} in split segments (empty_cache cannot return it), {} in wholly free segments",
            format_size(self.reserved_bytes),
            format_size(self.allocated_bytes),
            format_size(self.inactive_split_bytes),
            format_size(self.releasable_bytes)
        );
        let _ = writeln!(s, "\nLargest free block per pool and stream");
        let _ = writeln!(
            s,
            "  {:<5} {:>6} {:>8} {:>13} {:>13} {:>18}  request",
            "pool", "stream", "segments", "reserved", "free", "largest free block"
        );
        for p in &self.pools {
            let _ = writeln!(
                s,
                "  {:<5} {:>6} {:>8} {:>13} {:>13} {:>18}  {}",
                p.pool,
                p.stream,
                p.segments,
                format_size(p.reserved_bytes),
                format_size(p.free_bytes),
                format_size(p.largest_free_block),
                match p.fits_request {
                    Some(true) => "fits",
                    Some(false) => "too small",
                    None => "-",
                }
            );
        }
        if let Some(r) = &self.request {
            let largest = self
                .pools
                .iter()
                .find(|p| p.pool == r.pool && p.stream == r.stream)
                .map_or(0, |p| p.largest_free_block);
            let _ = writeln!(
                s,
                "  the request needed {} in one block: the largest free block of its pool and stream is {}, \
                 and the device had {} free",
                format_size(r.size),
                format_size(largest),
                format_size(r.device_free)
            );
        }
        let _ = writeln!(
            s,
            "\nSegments with free bytes: {} of {} (the {} with the most free bytes)",
            self.segments.len(),
            self.pools.iter().map(|p| p.segments).sum::<usize>(),
            show_segments.min(self.segments.len())
        );
        let _ = writeln!(
            s,
            "  {:<16} {:<5} {:>6} {:>13} {:>13} {:>18} {:>6}",
            "address", "pool", "stream", "size", "free", "largest free block", "blocks"
        );
        for g in self.segments.iter().take(show_segments) {
            let _ = writeln!(
                s,
                "  {:<16} {:<5} {:>6} {:>13} {:>13} {:>18} {:>6}",
                format!("{:#x}", g.address),
                g.pool,
                g.stream,
                format_size(g.total_size),
                format_size(g.free_bytes),
                format_size(g.largest_free_block),
                g.blocks
            );
        }
        if let Some(sites) = &self.top_sites {
            s.push_str(&crate::report::top_sites_text(
                "holding memory at that moment",
                sites,
            ));
        }
        if let Some(a) = &self.advice {
            let _ = writeln!(
                s,
                "\nWhat would have avoided it (advise on {}: the reserved bytes plus the free bytes at the OOM;\n  \
                 {}, each failed request counted live from its OOM on)",
                a.device_memory_bytes
                    .map_or("the device memory unconstrained".to_string(), format_size),
                a.counted()
            );
            match a.candidates.first() {
                Some(best) if best.fits => {
                    let _ = writeln!(
                        s,
                        "  {} -- the {} completes without OOM on {} (replayed in full there), peak reserved {}; \
                         its smallest device memory: {}",
                        best.config,
                        a.what(),
                        a.device_memory_bytes
                            .map_or("the device memory unconstrained".to_string(), format_size),
                        format_size(best.peak_reserved_bytes),
                        best.min_device_memory_bytes
                            .map_or("n/a".to_string(), format_size)
                    );
                    for line in &best.apply {
                        let _ = writeln!(s, "  {line}");
                    }
                }
                _ => match a.device_memory_bytes {
                    Some(d) if a.lower_bound_bytes > d => {
                        let _ = writeln!(
                            s,
                            "  no allocator setting fits: the live bytes alone ({}) need more device memory",
                            format_size(a.lower_bound_bytes)
                        );
                    }
                    _ => {
                        let _ = writeln!(
                            s,
                            "  no allocator setting completes the {} without OOM there (the live bytes peak at {}; \
                             the fewest failures: {}, {})",
                            a.what(),
                            format_size(a.lower_bound_bytes),
                            a.candidates.first().map_or("none", |c| c.config.as_str()),
                            a.candidates.first().map_or(0, |c| c.failed_allocs)
                        );
                    }
                },
            }
        }
        if !self.unknown.is_empty() {
            let _ = writeln!(s, "\nUnknown from this snapshot:");
            for u in &self.unknown {
                let _ = writeln!(s, "  - {u}");
            }
        }
        s
    }
}
