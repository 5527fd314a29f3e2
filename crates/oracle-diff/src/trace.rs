//! The lines torch-oracle prints (JSON, one object a line), as values: read from the oracle's
//! output, made by our driver, printed back in the oracle's spelling.
//!
//! Only the fields the comparison uses, or that help a reader of a divergence, are kept.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

/// One device-level call (an `"ev"` line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DevCall {
    /// `cudaMalloc`: `seg` is `None` when it failed.
    Malloc {
        /// Bytes.
        size: u64,
        /// Creation index of the segment (`None`: the call failed).
        seg: Option<i64>,
    },
    /// `cudaFree`.
    Free {
        /// Bytes.
        size: u64,
        /// Creation index of the segment.
        seg: i64,
    },
    /// `cuMemAddressReserve`.
    Reserve {
        /// Bytes of address space.
        size: u64,
        /// Creation index of the reservation (`None`: the call failed).
        seg: Option<i64>,
    },
    /// `cuMemAddressFree`.
    AddressFree {
        /// Bytes.
        size: u64,
        /// Creation index.
        seg: i64,
    },
    /// `cuMemCreate`.
    Create {
        /// Bytes.
        size: u64,
        /// Whether it succeeded.
        ok: bool,
    },
    /// `cuMemRelease`.
    Release {
        /// Bytes.
        size: u64,
    },
    /// `cuMemMap`.
    Map {
        /// Bytes.
        size: u64,
        /// Reservation index.
        seg: i64,
        /// Offset in it.
        offset: u64,
    },
    /// `cuMemUnmap`.
    Unmap {
        /// Bytes.
        size: u64,
        /// Reservation index.
        seg: i64,
        /// Offset in it.
        offset: u64,
    },
    /// `cudaEventRecord`.
    EventRecord {
        /// Stream number.
        stream: i64,
    },
    /// `cudaEventSynchronize`.
    EventSync {
        /// Stream number.
        stream: i64,
        /// Event records that completed.
        completed: u64,
    },
    /// `cudaStreamSynchronize` made by the allocator.
    StreamSync {
        /// Stream number.
        stream: i64,
    },
    /// `cudaDeviceSynchronize` made by the allocator.
    DeviceSync,
    /// An entry point the fake does not provide.
    Unsupported(String),
}

/// A segment of a `snapshot` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapSegment {
    /// Creation index of the segment (cudaMalloc or reservation).
    pub seg: i64,
    /// Offset of this range in it (expandable segments report one range per mapped run).
    pub offset: u64,
    /// Bytes.
    pub total_size: u64,
    /// Allocated bytes.
    pub allocated_size: u64,
    /// Active bytes.
    pub active_size: u64,
    /// Requested bytes of active blocks.
    pub requested_size: u64,
    /// Stream number.
    pub stream: i64,
    /// `large` or `small`.
    pub pool: String,
    /// The segment's `owner_private_pool_id` (`segment_pool_id`), `(0, 0)` for the default
    /// pools.
    pub pool_id: (u64, u64),
    /// Part of an expandable segment.
    pub expandable: bool,
    /// `(offset in the range, size, requested_size, state)` per block.
    pub blocks: Vec<(u64, u64, u64, String)>,
}

/// One line of output.
#[derive(Clone, Debug, PartialEq)]
pub enum Line {
    /// The first line.
    Config {
        /// The allocator's version string.
        torch: String,
        /// `PYTORCH_CUDA_ALLOC_CONF`.
        conf: String,
        /// Device bytes.
        total_mem: u64,
    },
    /// An allocation that succeeded.
    Alloc {
        /// The script's id.
        id: String,
        /// Requested bytes.
        size: u64,
        /// Stream number.
        stream: i64,
        /// Device address.
        addr: u64,
        /// Creation index of its segment.
        seg: i64,
        /// Offset from the segment's base.
        offset: u64,
        /// The block's bytes (growth of `allocated_bytes`).
        block: i64,
        /// The script's name of the private pool holding the block, if any.
        private_pool: Option<String>,
    },
    /// An allocation that raised out-of-memory.
    Oom {
        /// The script's id.
        id: String,
        /// Requested bytes.
        size: u64,
        /// The message.
        error: String,
    },
    /// Any other error.
    Error {
        /// The id or pool the op named, if any.
        id: Option<String>,
        /// The message.
        error: String,
    },
    /// A free.
    Free {
        /// The script's id.
        id: String,
        /// Whether it waits for events on other streams.
        pending: bool,
    },
    /// `record`.
    Record {
        /// The script's id.
        id: String,
        /// Stream number.
        stream: i64,
    },
    /// `sync`.
    Sync {
        /// Stream number, `None` for all.
        stream: Option<i64>,
        /// Event records completed.
        completed: u64,
    },
    /// `empty_cache` (printed before the call).
    EmptyCache,
    /// `set_fraction`.
    SetFraction,
    /// `reset_peak`.
    ResetPeak,
    /// `reset_accumulated`.
    ResetAccumulated,
    /// `stats` or (`last`) the `final` line: the allocator's stats and the fake's counters.
    Stats {
        /// Whether this is the `final` line.
        last: bool,
        /// `memory_stats()` keys.
        stats: BTreeMap<String, i64>,
        /// The fake's counters.
        fake: BTreeMap<String, i64>,
    },
    /// `snapshot`.
    Snapshot(Vec<SnapSegment>),
    /// `mark`.
    Mark(String),
    /// A private-pool op that succeeded: `pool_create`, `pool_begin`, `pool_end`,
    /// `pool_release`, `pool_delete`, or `pool_use_count` (with its count).
    Pool {
        /// The op.
        op: String,
        /// The script's pool name.
        pool: String,
        /// The pool id `(first, second)`.
        id: (u64, u64),
        /// `pool_use_count`'s count.
        use_count: Option<i64>,
    },
    /// `observe`: an OOM observer attached.
    Observe {
        /// Its number, from 0.
        observer: i64,
    },
    /// An OOM observer's call (before the `oom` line).
    OomObserver {
        /// The observer's number.
        observer: i64,
        /// The device allocation tried (rounded).
        alloc: u64,
        /// The device's total, or the fraction's limit.
        device_total: u64,
        /// The device's free bytes.
        device_free: u64,
    },
    /// A device-level call.
    Ev(DevCall),
}

/// A line that is not what the oracle prints.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unreadable output line {line}: {why}: {text}")]
pub struct LineError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub why: String,
    /// The line (cut to 300 bytes).
    pub text: String,
}

fn u(v: &Value, k: &str) -> Option<u64> {
    v.get(k)?.as_u64()
}
fn i(v: &Value, k: &str) -> Option<i64> {
    v.get(k)?.as_i64()
}
fn s(v: &Value, k: &str) -> Option<String> {
    Some(v.get(k)?.as_str()?.to_owned())
}

impl Line {
    /// Reads one JSON line.
    pub fn from_json(v: &Value) -> Option<Line> {
        if let Some(ev) = v.get("ev").and_then(Value::as_str) {
            let failed = v.get("error").is_some();
            let size = u(v, "size").unwrap_or(0);
            let call = match ev {
                "cudaMalloc" => DevCall::Malloc {
                    size,
                    seg: if failed { None } else { Some(i(v, "seg")?) },
                },
                "cudaFree" => DevCall::Free {
                    size,
                    seg: i(v, "seg")?,
                },
                "cuMemAddressReserve" => DevCall::Reserve {
                    size,
                    seg: if failed { None } else { Some(i(v, "seg")?) },
                },
                "cuMemAddressFree" => DevCall::AddressFree {
                    size,
                    seg: i(v, "seg")?,
                },
                "cuMemCreate" => DevCall::Create { size, ok: !failed },
                "cuMemRelease" => DevCall::Release { size },
                "cuMemMap" => DevCall::Map {
                    size,
                    seg: i(v, "seg")?,
                    offset: u(v, "offset")?,
                },
                "cuMemUnmap" => DevCall::Unmap {
                    size,
                    seg: i(v, "seg")?,
                    offset: u(v, "offset")?,
                },
                "cudaEventRecord" => DevCall::EventRecord {
                    stream: i(v, "stream")?,
                },
                "cudaEventSynchronize" => DevCall::EventSync {
                    stream: i(v, "stream")?,
                    completed: u(v, "completed")?,
                },
                "cudaStreamSynchronize" => DevCall::StreamSync {
                    stream: i(v, "stream")?,
                },
                "cudaDeviceSynchronize" => DevCall::DeviceSync,
                "unsupported" => DevCall::Unsupported(s(v, "call")?),
                _ => return None,
            };
            return Some(Line::Ev(call));
        }
        let op = v.get("op")?.as_str()?;
        Some(match op {
            "config" => Line::Config {
                torch: s(v, "torch")?,
                conf: s(v, "conf")?,
                total_mem: u(v, "total_mem")?,
            },
            "alloc" => Line::Alloc {
                id: s(v, "id")?,
                size: u(v, "size")?,
                stream: i(v, "stream")?,
                addr: u(v, "addr")?,
                seg: i(v, "seg")?,
                offset: u(v, "offset")?,
                block: i(v, "block")?,
                private_pool: s(v, "private_pool"),
            },
            "oom" => Line::Oom {
                id: s(v, "id")?,
                size: u(v, "size")?,
                error: s(v, "error")?,
            },
            "error" => Line::Error {
                id: s(v, "id").or_else(|| s(v, "pool")),
                error: s(v, "error")?,
            },
            "pool_create" | "pool_begin" | "pool_end" | "pool_release" | "pool_delete"
            | "pool_use_count" => {
                let id = v.get("id")?.as_array()?;
                Line::Pool {
                    op: op.to_owned(),
                    pool: s(v, "pool")?,
                    id: (id.first()?.as_u64()?, id.get(1)?.as_u64()?),
                    use_count: i(v, "use_count"),
                }
            }
            "observe" => Line::Observe {
                observer: i(v, "observer")?,
            },
            "oom_observer" => Line::OomObserver {
                observer: i(v, "observer")?,
                alloc: u(v, "alloc")?,
                device_total: u(v, "device_total")?,
                device_free: u(v, "device_free")?,
            },
            "free" => Line::Free {
                id: s(v, "id")?,
                pending: v.get("pending")?.as_bool()?,
            },
            "record" => Line::Record {
                id: s(v, "id")?,
                stream: i(v, "stream")?,
            },
            "sync" => Line::Sync {
                stream: i(v, "stream"),
                completed: u(v, "completed")?,
            },
            "empty_cache" => Line::EmptyCache,
            "set_fraction" => Line::SetFraction,
            "reset_peak" => Line::ResetPeak,
            "reset_accumulated" => Line::ResetAccumulated,
            "stats" | "final" => {
                let obj = v.as_object()?;
                let stats = obj
                    .iter()
                    .filter_map(|(k, x)| Some((k.clone(), x.as_i64()?)))
                    .collect();
                let fake = obj
                    .get("fake")?
                    .as_object()?
                    .iter()
                    .filter_map(|(k, x)| Some((k.clone(), x.as_i64()?)))
                    .collect();
                Line::Stats {
                    last: op == "final",
                    stats,
                    fake,
                }
            }
            "snapshot" => {
                let mut segs = Vec::new();
                for sg in v.get("segments")?.as_array()? {
                    let mut blocks = Vec::new();
                    for b in sg.get("blocks")?.as_array()? {
                        blocks.push((
                            u(b, "offset")?,
                            u(b, "size")?,
                            u(b, "requested_size")?,
                            s(b, "state")?,
                        ));
                    }
                    segs.push(SnapSegment {
                        seg: i(sg, "seg")?,
                        offset: u(sg, "offset")?,
                        total_size: u(sg, "total_size")?,
                        allocated_size: u(sg, "allocated_size")?,
                        active_size: u(sg, "active_size")?,
                        requested_size: u(sg, "requested_size")?,
                        stream: i(sg, "stream")?,
                        pool: s(sg, "pool")?,
                        pool_id: match sg.get("pool_id").and_then(Value::as_array) {
                            Some(a) => (a.first()?.as_u64()?, a.get(1)?.as_u64()?),
                            None => (0, 0),
                        },
                        expandable: sg.get("expandable")?.as_bool()?,
                        blocks,
                    });
                }
                Line::Snapshot(segs)
            }
            "mark" => Line::Mark(s(v, "text")?),
            _ => return None,
        })
    }

    /// The line in the oracle's JSON spelling (the fields kept here).
    pub fn to_json(&self) -> Value {
        match self {
            Line::Config {
                torch,
                conf,
                total_mem,
            } => json!({"op": "config", "torch": torch, "conf": conf, "total_mem": total_mem}),
            Line::Alloc {
                id,
                size,
                stream,
                addr,
                seg,
                offset,
                block,
                private_pool,
            } => {
                let mut v = json!({"op": "alloc", "id": id, "size": size, "stream": stream,
                                   "addr": addr, "seg": seg, "offset": offset, "block": block});
                if let Some(p) = private_pool {
                    v["private_pool"] = Value::from(p.as_str());
                }
                v
            }
            Line::Pool {
                op,
                pool,
                id,
                use_count,
            } => {
                let mut v = json!({"op": op, "pool": pool, "id": [id.0, id.1]});
                if let Some(c) = use_count {
                    v["use_count"] = Value::from(*c);
                }
                v
            }
            Line::Observe { observer } => json!({"op": "observe", "observer": observer}),
            Line::OomObserver {
                observer,
                alloc,
                device_total,
                device_free,
            } => json!({"op": "oom_observer", "observer": observer, "device": 0, "alloc": alloc,
                        "device_total": device_total, "device_free": device_free}),
            Line::Oom { id, size, error } => {
                json!({"op": "oom", "id": id, "size": size, "error": error})
            }
            Line::Error { id, error } => match id {
                Some(id) => json!({"op": "error", "id": id, "error": error}),
                None => json!({"op": "error", "error": error}),
            },
            Line::Free { id, pending } => json!({"op": "free", "id": id, "pending": pending}),
            Line::Record { id, stream } => json!({"op": "record", "id": id, "stream": stream}),
            Line::Sync { stream, completed } => match stream {
                Some(s) => json!({"op": "sync", "stream": s, "completed": completed}),
                None => json!({"op": "sync", "stream": "all", "completed": completed}),
            },
            Line::EmptyCache => json!({"op": "empty_cache"}),
            Line::SetFraction => json!({"op": "set_fraction"}),
            Line::ResetPeak => json!({"op": "reset_peak"}),
            Line::ResetAccumulated => json!({"op": "reset_accumulated"}),
            Line::Stats { last, stats, fake } => {
                let mut m = Map::new();
                m.insert(
                    "op".into(),
                    Value::from(if *last { "final" } else { "stats" }),
                );
                for (k, v) in stats {
                    m.insert(k.clone(), Value::from(*v));
                }
                let f: Map<String, Value> = fake
                    .iter()
                    .map(|(k, v)| (k.clone(), Value::from(*v)))
                    .collect();
                m.insert("fake".into(), Value::Object(f));
                Value::Object(m)
            }
            Line::Snapshot(segs) => {
                let segs: Vec<Value> = segs
                    .iter()
                    .map(|s| {
                        let blocks: Vec<Value> = s
                            .blocks
                            .iter()
                            .map(|(o, sz, r, st)| {
                                json!({"offset": o, "size": sz, "requested_size": r, "state": st})
                            })
                            .collect();
                        json!({"seg": s.seg, "offset": s.offset, "total_size": s.total_size,
                               "allocated_size": s.allocated_size, "active_size": s.active_size,
                               "requested_size": s.requested_size, "stream": s.stream,
                               "pool": s.pool, "pool_id": [s.pool_id.0, s.pool_id.1],
                               "expandable": s.expandable, "blocks": blocks})
                    })
                    .collect();
                json!({"op": "snapshot", "segments": segs})
            }
            Line::Mark(t) => json!({"op": "mark", "text": t}),
            Line::Ev(call) => call.to_json(),
        }
    }
}

impl DevCall {
    /// The `"ev"` line.
    pub fn to_json(&self) -> Value {
        let fail = |ev: &str, size: u64| json!({"ev": ev, "size": size, "error": "out of memory"});
        match self {
            DevCall::Malloc {
                size,
                seg: Some(seg),
            } => {
                json!({"ev": "cudaMalloc", "size": size, "seg": seg})
            }
            DevCall::Malloc { size, seg: None } => fail("cudaMalloc", *size),
            DevCall::Free { size, seg } => json!({"ev": "cudaFree", "size": size, "seg": seg}),
            DevCall::Reserve {
                size,
                seg: Some(seg),
            } => {
                json!({"ev": "cuMemAddressReserve", "size": size, "seg": seg})
            }
            DevCall::Reserve { size, seg: None } => fail("cuMemAddressReserve", *size),
            DevCall::AddressFree { size, seg } => {
                json!({"ev": "cuMemAddressFree", "size": size, "seg": seg})
            }
            DevCall::Create { size, ok: true } => json!({"ev": "cuMemCreate", "size": size}),
            DevCall::Create { size, ok: false } => fail("cuMemCreate", *size),
            DevCall::Release { size } => json!({"ev": "cuMemRelease", "size": size}),
            DevCall::Map { size, seg, offset } => {
                json!({"ev": "cuMemMap", "size": size, "seg": seg, "offset": offset})
            }
            DevCall::Unmap { size, seg, offset } => {
                json!({"ev": "cuMemUnmap", "size": size, "seg": seg, "offset": offset})
            }
            DevCall::EventRecord { stream } => json!({"ev": "cudaEventRecord", "stream": stream}),
            DevCall::EventSync { stream, completed } => {
                json!({"ev": "cudaEventSynchronize", "stream": stream, "completed": completed})
            }
            DevCall::StreamSync { stream } => {
                json!({"ev": "cudaStreamSynchronize", "stream": stream})
            }
            DevCall::DeviceSync => json!({"ev": "cudaDeviceSynchronize"}),
            DevCall::Unsupported(c) => json!({"ev": "unsupported", "call": c}),
        }
    }
}

/// Reads the oracle's (or our driver's) output: one JSON object a line; lines it does not
/// know (the 2.15 OOM-rejection observer's) are skipped.
///
/// # Errors
/// [`LineError`] for a line that is not JSON, or a known line missing a field.
pub fn parse_output(text: &str) -> Result<Vec<Line>, LineError> {
    let mut out = Vec::new();
    for (n, l) in text.lines().enumerate() {
        if l.trim().is_empty() {
            continue;
        }
        let err = |why: &str| LineError {
            line: n + 1,
            why: why.to_owned(),
            text: l.chars().take(300).collect(),
        };
        let v: Value = serde_json::from_str(l).map_err(|e| err(&e.to_string()))?;
        let known = v.get("ev").is_some()
            || matches!(
                v.get("op").and_then(Value::as_str),
                Some(
                    "config"
                        | "alloc"
                        | "oom"
                        | "error"
                        | "free"
                        | "record"
                        | "sync"
                        | "empty_cache"
                        | "set_fraction"
                        | "reset_peak"
                        | "reset_accumulated"
                        | "stats"
                        | "final"
                        | "snapshot"
                        | "mark"
                        | "pool_create"
                        | "pool_begin"
                        | "pool_end"
                        | "pool_release"
                        | "pool_delete"
                        | "pool_use_count"
                        | "observe"
                        | "oom_observer"
                )
            );
        if !known {
            continue;
        }
        out.push(Line::from_json(&v).ok_or_else(|| err("a field is missing"))?);
    }
    Ok(out)
}

/// Prints lines as JSON, one a line.
pub fn to_jsonl(lines: &[Line]) -> String {
    let mut s = String::new();
    for l in lines {
        s.push_str(&l.to_json().to_string());
        s.push('\n');
    }
    s
}
