//! Writing snapshots in PyTorch's format (`torch.cuda.memory._dump_snapshot`): a pickle of
//! plain builtins that PyTorch's memory visualizer (pytorch.org/memory_viz) opens.

use std::collections::HashMap;

use tensormem_pickle::Value;

use crate::config::{AllocatorConfig, SettingValue};
use crate::history::{Frame, Frames, TraceAction, TraceEntry};
use crate::snapshot::DeviceSnapshot;

fn int(v: u64) -> Value {
    Value::Int(i64::try_from(v).unwrap_or(i64::MAX))
}

fn entry(key: &str, value: Value) -> (Value, Value) {
    (Value::str(key), value)
}

/// Turns stacks into pickle lists, each distinct frame and each distinct stack once: the encoder
/// writes a shared value once and references it after (as PyTorch's pickles share frames).
#[derive(Default)]
struct FrameCache {
    frames: HashMap<Frame, Value>,
    stacks: HashMap<*const Frame, Value>,
    empty: Option<Value>,
}

impl FrameCache {
    fn stack(&mut self, frames: Option<&Frames>) -> Value {
        let Some(stack) = frames.filter(|f| !f.is_empty()) else {
            return self
                .empty
                .get_or_insert_with(|| Value::list(Vec::new()))
                .clone();
        };
        if let Some(v) = self.stacks.get(&stack.as_ptr()) {
            return v.clone();
        }
        let list = stack
            .iter()
            .map(|f| {
                self.frames
                    .entry(f.clone())
                    .or_insert_with(|| {
                        Value::dict(vec![
                            entry("name", Value::str(&f.name)),
                            entry("filename", Value::str(&f.filename)),
                            entry("line", Value::Int(i64::from(f.line))),
                        ])
                    })
                    .clone()
            })
            .collect();
        let v = Value::list(list);
        // The key stays valid: `stacks` lives no longer than the snapshot that owns the Arcs.
        self.stacks.insert(stack.as_ptr(), v.clone());
        v
    }
}

fn trace_entry(t: &TraceEntry, cache: &mut FrameCache) -> Value {
    let addr_key = if t.action == TraceAction::Oom {
        "device_free"
    } else {
        "addr"
    };
    Value::dict(vec![
        entry("action", Value::str(t.action.as_str())),
        entry(addr_key, int(t.addr)),
        entry("size", int(t.size)),
        entry("stream", int(t.stream.0)),
        entry("time_us", int(t.time_us)),
        entry("frames", cache.stack(t.frames.as_ref())),
    ])
}

fn setting(v: SettingValue) -> Value {
    match v {
        SettingValue::Str(s) => Value::str(&s),
        SettingValue::Int(i) => Value::Int(i),
        SettingValue::Float(f) => Value::Float(f),
        SettingValue::Bool(b) => Value::Bool(b),
        SettingValue::Map(m) => Value::dict(
            m.into_iter()
                .map(|(k, v)| (Value::str(&k), Value::Int(v)))
                .collect(),
        ),
    }
}

/// The snapshot dictionary PyTorch's `_snapshot()` returns, for `devices` (one entry per device,
/// in device order) and the allocator `config`: `segments`, `device_traces`,
/// `allocator_settings`, `external_annotations`. Trace entries, segments and blocks carry their `frames`
/// (an empty list when they have none); each distinct frame and stack is written once.
pub fn snapshot_value(devices: &[DeviceSnapshot], config: &AllocatorConfig) -> Value {
    let mut cache = FrameCache::default();
    let mut segments = Vec::new();
    for d in devices {
        for s in &d.segments {
            let blocks = s
                .blocks
                .iter()
                .map(|b| {
                    Value::dict(vec![
                        entry("address", int(b.address)),
                        entry("size", int(b.size)),
                        entry("requested_size", int(b.requested_size)),
                        entry("state", Value::str(b.state.as_str())),
                        entry("frames", cache.stack(b.frames.as_ref())),
                    ])
                })
                .collect();
            segments.push(Value::dict(vec![
                entry("device", Value::Int(i64::from(s.device))),
                entry("address", int(s.address)),
                entry("total_size", int(s.total_size)),
                entry("allocated_size", int(s.allocated_size)),
                entry("active_size", int(s.active_size)),
                entry("requested_size", int(s.requested_size)),
                entry("stream", int(s.stream.0)),
                entry("segment_type", Value::str(s.segment_type())),
                entry(
                    "segment_pool_id",
                    Value::tuple(vec![
                        int(s.segment_pool_id.first),
                        int(s.segment_pool_id.second),
                    ]),
                ),
                entry("is_expandable", Value::Bool(s.is_expandable)),
                entry("frames", cache.stack(s.frames.as_ref())),
                entry("blocks", Value::list(blocks)),
            ]));
        }
    }
    let traces = devices
        .iter()
        .map(|d| Value::list(d.trace.iter().map(|t| trace_entry(t, &mut cache)).collect()))
        .collect();
    let settings = config
        .to_settings()
        .into_iter()
        .map(|(k, v)| (Value::str(k), setting(v)))
        .collect();
    Value::dict(vec![
        entry("segments", Value::list(segments)),
        entry("device_traces", Value::list(traces)),
        entry("allocator_settings", Value::dict(settings)),
        entry("external_annotations", Value::list(Vec::new())),
    ])
}

/// [`snapshot_value`] encoded as a pickle (the bytes `_dump_snapshot` writes).
pub fn snapshot_pickle(devices: &[DeviceSnapshot], config: &AllocatorConfig) -> Vec<u8> {
    tensormem_pickle::encode(&snapshot_value(devices, config))
}
