//! `--dump`: our replay's snapshot and history in PyTorch's pickle format, carrying what the
//! input recorded: each entry's stack (`frames`), time (`time_us`), `compile_context` and
//! `user_metadata` come from the recorded event it replays, each block allocated at the end
//! carries its allocation's stack, and `external_annotations` are copied. PyTorch's memory
//! viewer (pytorch.org/memory_viz, `torch.cuda._memory_viz`) then shows the recorded stacks on
//! our replay's timeline.

use c10_cuda::config::AllocatorConfig;
use c10_cuda::snapshot::DeviceSnapshot;
use tensormem_pickle::Value;

use crate::model::{RecordedEvent, Snapshot};
use crate::replay::Outcome;

/// Our snapshot of `outcome` (replayed from `device`'s history of `recorded` with
/// `keep_history`) with the recorded stacks, times and metadata attached (see the module docs).
pub fn dump_snapshot(recorded: &Snapshot, device: usize, outcome: &Outcome) -> DeviceSnapshot {
    let events: &[RecordedEvent] = recorded.traces.get(device).map_or(&[], Vec::as_slice);
    let mut snap = outcome.snapshot.clone();
    let n = snap.trace.len();
    for (k, entry) in snap.trace.iter_mut().enumerate() {
        let origin = outcome.origins.get(k).and_then(|&i| events.get(i));
        match origin {
            Some(e) => {
                entry.frames = e.frames.clone();
                if let Some(t) = e.time_us {
                    entry.time_us = t;
                }
            }
            // The final `snapshot` entry: the time of the last event replayed.
            None if k + 1 == n => {
                if let Some(t) = events
                    .get(..=outcome.last_event_index)
                    .and_then(|evs| evs.iter().rev().find_map(|e| e.time_us))
                {
                    entry.time_us = t;
                }
            }
            None => {}
        }
    }
    for b in snap.segments.iter_mut().flat_map(|s| &mut s.blocks) {
        if let Some(e) = outcome
            .live_origins
            .get(&b.address)
            .and_then(|&i| events.get(i))
        {
            b.frames = e.frames.clone();
        }
    }
    snap
}

/// The snapshot dict of [`dump_snapshot`] under `config`, with each trace entry's recorded
/// `compile_context` and `user_metadata` and the recorded `external_annotations`.
pub fn dump_value(
    recorded: &Snapshot,
    device: usize,
    outcome: &Outcome,
    config: &AllocatorConfig,
) -> Value {
    let snap = dump_snapshot(recorded, device, outcome);
    let value = c10_cuda::snapshot_pickle::snapshot_value(std::slice::from_ref(&snap), config);
    let events: &[RecordedEvent] = recorded.traces.get(device).map_or(&[], Vec::as_slice);
    let Some(top) = value.as_dict() else {
        return value;
    };
    let mut out = Vec::with_capacity(top.len());
    for (k, v) in top.iter() {
        let v = match k.as_str() {
            Some("device_traces") => with_metadata(v, &outcome.origins, events),
            Some("external_annotations") => recorded
                .external_annotations
                .clone()
                .unwrap_or_else(|| v.clone()),
            _ => v.clone(),
        };
        out.push((k.clone(), v));
    }
    Value::dict(out)
}

/// [`dump_value`] encoded as a pickle (what `torch.cuda.memory._dump_snapshot` writes).
pub fn dump_pickle(
    recorded: &Snapshot,
    device: usize,
    outcome: &Outcome,
    config: &AllocatorConfig,
) -> Vec<u8> {
    tensormem_pickle::encode(&dump_value(recorded, device, outcome, config))
}

/// Adds `compile_context` / `user_metadata` to the entries whose recorded event had them.
fn with_metadata(traces: &Value, origins: &[usize], events: &[RecordedEvent]) -> Value {
    let has_any = events
        .iter()
        .any(|e| e.compile_context.is_some() || e.user_metadata.is_some());
    let Some(devices) = traces.as_list().filter(|_| has_any) else {
        return traces.clone();
    };
    let devices = devices
        .iter()
        .map(|trace| {
            let Some(entries) = trace.as_list() else {
                return trace.clone();
            };
            let entries = entries
                .iter()
                .enumerate()
                .map(|(k, entry)| {
                    let origin = origins.get(k).and_then(|&i| events.get(i));
                    match (origin, entry.as_dict()) {
                        (Some(e), Some(d)) => {
                            let mut pairs: Vec<(Value, Value)> = d.entries().to_vec();
                            if let Some(c) = &e.compile_context {
                                pairs.push((Value::str("compile_context"), Value::str(c)));
                            }
                            if let Some(m) = &e.user_metadata {
                                pairs.push((Value::str("user_metadata"), Value::str(m)));
                            }
                            Value::dict(pairs)
                        }
                        _ => entry.clone(),
                    }
                })
                .collect();
            Value::list(entries)
        })
        .collect();
    Value::list(devices)
}
