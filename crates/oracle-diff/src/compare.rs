//! Comparing our lines with the oracle's: every allocation (segment index, offset, block
//! size), every OOM, free, sync and snapshot, every device call and the stats.
//!
//! Both outputs are cut into steps: the device calls made since the previous op line, then the
//! op line (`empty_cache` prints its line before it calls the allocator, in both, so its calls
//! fall in the next step). Device calls are compared in a canonical form:
//! - memory calls in order, with their size and segment: `cudaMalloc` (and whether it failed),
//!   `cudaFree`, `cuMemAddressReserve`, `cuMemAddressFree`, and per page `map` (a `cuMemMap`),
//!   `map failed` (a failed `cuMemCreate`) and `unmap` (a `cuMemUnmap`); `cuMemCreate`s that
//!   succeed and `cuMemRelease`s are implied by those (PyTorch creates every page's handle before
//!   it maps any; we map page by page);
//! - event records and event synchronizations as a multiset per step, sorted by stream (PyTorch
//!   keeps streams in hash sets, so its order across streams is arbitrary), with the number of
//!   records each synchronization completed;
//! - the `cudaStreamSynchronize` PyTorch makes before unmapping pages is not compared (our CUDA
//!   backend waits in its unmap instead); its effect is: our allocator makes the same call
//!   ([`c10_cuda::device::DeviceMemory::synchronize_stream`]) and the fake completes the
//!   stream's events as the oracle's does, which matters when not every event was synchronized
//!   first (a pool-scoped `empty_cache P` syncs only the pool's events, issue 29).
//!
//! One more thing depends on an order PyTorch does not define: when frees waiting for events
//! on several streams complete in one step, PyTorch walks its per-stream event queues in the
//! order of a `ska::flat_hash_map` keyed by the stream's hash, and which block completes last
//! decides how the merges count in `inactive_split{,_bytes}`'s `peak`, `allocated` and `freed`
//! (their `current` does not depend on it). For a script that records blocks on two or more
//! streams ([`order_sensitive`]) those 18 values are not compared.
//!
//! OOM and error messages are not compared (ours are worded differently on purpose): only that
//! the op raised. In snapshots, the `requested_size` of inactive blocks is not compared: when
//! frees on several streams complete in one step, the merged block keeps the requested size of
//! the one freed last, and PyTorch walks the streams in hash-table order. Stats lines must have the same keys with the same values, and the fake's
//! counters named by [`FakeCuda::counter_names`] must agree.

use std::fmt;

use crate::fake::FakeCuda;
use crate::script::{Op, Script};
use crate::trace::{DevCall, Line, SnapSegment};

/// A device call in the canonical form the comparison uses.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Call {
    /// `cudaMalloc` of `size` bytes: segment index, or `None` when it failed.
    Malloc(u64, Option<i64>),
    /// `cudaFree` of a segment.
    Free(u64, i64),
    /// `cuMemAddressReserve`: reservation index, or `None` when it failed.
    Reserve(u64, Option<i64>),
    /// `cuMemAddressFree`.
    AddressFree(u64, i64),
    /// One page mapped: size, reservation, offset.
    Map(u64, i64, u64),
    /// A page's `cuMemCreate` failed.
    MapFailed(u64),
    /// One page unmapped: size, reservation, offset.
    Unmap(u64, i64, u64),
    /// `cudaEventRecord` on a stream.
    EventRecord(i64),
    /// `cudaEventSynchronize` of an event of a stream, and the records it completed.
    EventSync(i64, u64),
    /// An entry point the fake does not provide (always a divergence).
    Unsupported(String),
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Call::Malloc(s, Some(seg)) => write!(f, "cudaMalloc({s}) -> seg {seg}"),
            Call::Malloc(s, None) => write!(f, "cudaMalloc({s}) failed"),
            Call::Free(s, seg) => write!(f, "cudaFree(seg {seg}, {s})"),
            Call::Reserve(s, Some(seg)) => write!(f, "cuMemAddressReserve({s}) -> seg {seg}"),
            Call::Reserve(s, None) => write!(f, "cuMemAddressReserve({s}) failed"),
            Call::AddressFree(s, seg) => write!(f, "cuMemAddressFree(seg {seg}, {s})"),
            Call::Map(s, seg, o) => write!(f, "map(seg {seg} + {o}, {s})"),
            Call::MapFailed(s) => write!(f, "cuMemCreate({s}) failed"),
            Call::Unmap(s, seg, o) => write!(f, "unmap(seg {seg} + {o}, {s})"),
            Call::EventRecord(st) => write!(f, "cudaEventRecord(stream {st})"),
            Call::EventSync(st, n) => write!(f, "cudaEventSynchronize(stream {st}) completed {n}"),
            Call::Unsupported(c) => write!(f, "unsupported {c}"),
        }
    }
}

/// One step: the canonical device calls, then the op line (`None` past the end).
#[derive(Clone, Debug, Default)]
pub struct Step {
    /// Memory calls, in order.
    pub memory: Vec<Call>,
    /// Event calls, sorted.
    pub events: Vec<Call>,
    /// The op line.
    pub line: Option<Line>,
}

/// Cuts lines into steps (the config line is dropped).
pub fn steps(lines: &[Line]) -> Vec<Step> {
    let mut out = Vec::new();
    let mut cur = Step::default();
    for l in lines {
        match l {
            Line::Config { .. } => {}
            Line::Ev(call) => {
                let c = match call {
                    DevCall::Malloc { size, seg } => Some(Call::Malloc(*size, *seg)),
                    DevCall::Free { size, seg } => Some(Call::Free(*size, *seg)),
                    DevCall::Reserve { size, seg } => Some(Call::Reserve(*size, *seg)),
                    DevCall::AddressFree { size, seg } => Some(Call::AddressFree(*size, *seg)),
                    DevCall::Create { size, ok: false } => Some(Call::MapFailed(*size)),
                    DevCall::Create { ok: true, .. } | DevCall::Release { .. } => None,
                    DevCall::Map { size, seg, offset } => Some(Call::Map(*size, *seg, *offset)),
                    DevCall::Unmap { size, seg, offset } => Some(Call::Unmap(*size, *seg, *offset)),
                    DevCall::EventRecord { stream } => {
                        cur.events.push(Call::EventRecord(*stream));
                        None
                    }
                    DevCall::EventSync { stream, completed } => {
                        cur.events.push(Call::EventSync(*stream, *completed));
                        None
                    }
                    DevCall::StreamSync { .. } | DevCall::DeviceSync => None,
                    DevCall::Unsupported(c) => Some(Call::Unsupported(c.clone())),
                };
                if let Some(c) = c {
                    cur.memory.push(c);
                }
            }
            op => {
                cur.events.sort();
                cur.line = Some(op.clone());
                out.push(std::mem::take(&mut cur));
            }
        }
    }
    if !cur.memory.is_empty() || !cur.events.is_empty() {
        cur.events.sort();
        out.push(cur);
    }
    out
}

/// Where and how two outputs first differ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Divergence {
    /// The step (0-based op index, the `final` line being the last).
    pub step: usize,
    /// What differs.
    pub what: String,
    /// The oracle's side.
    pub theirs: String,
    /// Our side.
    pub ours: String,
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "at op {}: {}\n  torch: {}\n  ours:  {}",
            self.step + 1,
            self.what,
            self.theirs,
            self.ours
        )
    }
}

fn show_line(l: &Option<Line>) -> String {
    match l {
        Some(l) => l.to_json().to_string(),
        None => "(nothing)".into(),
    }
}

fn show_calls(c: &[Call]) -> String {
    if c.is_empty() {
        return "(none)".into();
    }
    c.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether frees of `script` may wait on events of two or more streams (it records blocks on two
/// or more streams), which makes some accumulated stats depend on PyTorch's hash-table order.
pub fn order_sensitive(script: &Script) -> bool {
    let mut first = None;
    for op in &script.ops {
        if let Op::Record { stream, .. } = op {
            match first {
                None => first = Some(*stream),
                Some(s) if s != *stream => return true,
                Some(_) => {}
            }
        }
    }
    false
}

/// Whether a stat is left out of the comparison (see [`order_sensitive`]).
pub fn stat_is_order_dependent(key: &str) -> bool {
    key.starts_with("inactive_split") && !key.ends_with(".current")
}

/// Compares the oracle's lines with ours for `script`; `None` when they agree.
pub fn compare_for(script: &Script, theirs: &[Line], ours: &[Line]) -> Option<Divergence> {
    compare(theirs, ours, order_sensitive(script))
}

/// Compares the oracle's lines with ours; `None` when they agree. With `order_sensitive`, the
/// stats of [`stat_is_order_dependent`] are not compared.
pub fn compare(theirs: &[Line], ours: &[Line], order_sensitive: bool) -> Option<Divergence> {
    let a = steps(theirs);
    let b = steps(ours);
    for k in 0..a.len().max(b.len()) {
        let (x, y) = match (a.get(k), b.get(k)) {
            (Some(x), Some(y)) => (x, y),
            (x, y) => {
                return Some(Divergence {
                    step: k,
                    what: "one output ends early".into(),
                    theirs: x.map_or("(end)".into(), |s| show_line(&s.line)),
                    ours: y.map_or("(end)".into(), |s| show_line(&s.line)),
                });
            }
        };
        if x.memory != y.memory {
            return Some(Divergence {
                step: k,
                what: "device memory calls".into(),
                theirs: show_calls(&x.memory),
                ours: show_calls(&y.memory),
            });
        }
        if x.events != y.events {
            return Some(Divergence {
                step: k,
                what: "event calls".into(),
                theirs: show_calls(&x.events),
                ours: show_calls(&y.events),
            });
        }
        if let Some(what) = line_difference(&x.line, &y.line, order_sensitive) {
            let (theirs, ours) = if matches!(x.line, Some(Line::Snapshot(_) | Line::Stats { .. })) {
                ("(see above)".to_owned(), "(see above)".to_owned())
            } else {
                (show_line(&x.line), show_line(&y.line))
            };
            return Some(Divergence {
                step: k,
                what,
                theirs,
                ours,
            });
        }
    }
    None
}

/// A snapshot segment with what is compared: inactive blocks' requested sizes cleared.
fn comparable(s: &SnapSegment) -> SnapSegment {
    let mut s = s.clone();
    for b in &mut s.blocks {
        if b.3 == "inactive" {
            b.2 = 0;
        }
    }
    s
}

/// The first compared difference between two snapshots.
fn snapshot_difference(a: &[SnapSegment], b: &[SnapSegment]) -> Option<String> {
    if a.len() != b.len() {
        return Some(format!(
            "snapshot: torch has {} segments, ours {}",
            a.len(),
            b.len()
        ));
    }
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (comparable(x), comparable(y));
        if x != y {
            return Some(format!(
                "snapshot segment: torch {}, ours {}",
                Line::Snapshot(vec![x]).to_json()["segments"][0],
                Line::Snapshot(vec![y]).to_json()["segments"][0]
            ));
        }
    }
    None
}

/// What differs between two op lines, if anything that is compared.
fn line_difference(x: &Option<Line>, y: &Option<Line>, order_sensitive: bool) -> Option<String> {
    let (Some(x), Some(y)) = (x, y) else {
        return (x.is_some() != y.is_some()).then(|| "one output ends early".into());
    };
    match (x, y) {
        (
            Line::Alloc {
                id: i1,
                seg: s1,
                offset: o1,
                block: b1,
                private_pool: p1,
                ..
            },
            Line::Alloc {
                id: i2,
                seg: s2,
                offset: o2,
                block: b2,
                private_pool: p2,
                ..
            },
        ) => {
            if i1 != i2 || s1 != s2 || o1 != o2 || b1 != b2 {
                Some("allocation placement (segment, offset, block size)".into())
            } else {
                (p1 != p2).then(|| "the private pool holding the allocation".into())
            }
        }
        (Line::Pool { .. }, Line::Pool { .. }) | (Line::Observe { .. }, Line::Observe { .. }) => {
            (x != y).then(|| "private pool op (id, use count)".into())
        }
        (Line::OomObserver { .. }, Line::OomObserver { .. }) => {
            (x != y).then(|| "oom observer arguments".into())
        }
        (Line::Oom { id: a, .. }, Line::Oom { id: b, .. }) => (a != b).then(|| "oom".into()),
        (Line::Error { id: a, .. }, Line::Error { id: b, .. }) => (a != b).then(|| "error".into()),
        (Line::Free { id: a, pending: p }, Line::Free { id: b, pending: q }) => {
            (a != b || p != q).then(|| "free (pending)".into())
        }
        (Line::Record { id: a, stream: s }, Line::Record { id: b, stream: t }) => {
            (a != b || s != t).then(|| "record".into())
        }
        (
            Line::Sync {
                stream: s,
                completed: c,
            },
            Line::Sync {
                stream: t,
                completed: d,
            },
        ) => (s != t || c != d).then(|| "sync (records completed)".into()),
        (
            Line::Stats {
                last: l1,
                stats: s1,
                fake: f1,
            },
            Line::Stats {
                last: l2,
                stats: s2,
                fake: f2,
            },
        ) => {
            if l1 != l2 {
                return Some("stats line kind".into());
            }
            let keys1: Vec<&String> = s1.keys().collect();
            let keys2: Vec<&String> = s2.keys().collect();
            if keys1 != keys2 {
                let only1: Vec<&&String> = keys1.iter().filter(|k| !s2.contains_key(**k)).collect();
                let only2: Vec<&&String> = keys2.iter().filter(|k| !s1.contains_key(**k)).collect();
                return Some(format!(
                    "stats keys: only torch has {only1:?}, only ours has {only2:?}"
                ));
            }
            if let Some((k, v)) = s1.iter().find(|(k, v)| {
                s2.get(*k) != Some(v) && !(order_sensitive && stat_is_order_dependent(k))
            }) {
                return Some(format!("stat {k}: torch {v}, ours {}", s2[k]));
            }
            for name in FakeCuda::counter_names() {
                let (a, b) = (f1.get(*name), f2.get(*name));
                if a != b {
                    return Some(format!("device counter {name}: torch {a:?}, ours {b:?}"));
                }
            }
            None
        }
        (Line::Snapshot(a), Line::Snapshot(b)) => snapshot_difference(a, b),
        (Line::Config { .. }, Line::Config { .. })
        | (Line::EmptyCache, Line::EmptyCache)
        | (Line::SetFraction, Line::SetFraction)
        | (Line::ResetPeak, Line::ResetPeak)
        | (Line::ResetAccumulated, Line::ResetAccumulated) => None,
        (Line::Mark(a), Line::Mark(b)) => (a != b).then(|| "mark".into()),
        _ => Some("different kinds of line".into()),
    }
}
