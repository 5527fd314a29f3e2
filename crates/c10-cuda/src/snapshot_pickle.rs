//! Writing snapshots in PyTorch's format (`torch.cuda.memory._dump_snapshot`): a pickle of
//! plain builtins that PyTorch's memory visualizer (pytorch.org/memory_viz) opens.

use tensormem_pickle::Value;

use crate::config::{AllocatorConfig, SettingValue};
use crate::history::{TraceAction, TraceEntry};
use crate::snapshot::DeviceSnapshot;

fn int(v: u64) -> Value {
    Value::Int(i64::try_from(v).unwrap_or(i64::MAX))
}

fn entry(key: &str, value: Value) -> (Value, Value) {
    (Value::str(key), value)
}

fn trace_entry(t: &TraceEntry) -> Value {
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
        entry("frames", Value::list(Vec::new())),
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
/// `allocator_settings`, `external_annotations`. Frames are empty lists (we record no stacks).
pub fn snapshot_value(devices: &[DeviceSnapshot], config: &AllocatorConfig) -> Value {
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
                        entry("frames", Value::list(Vec::new())),
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
                    Value::tuple(vec![Value::Int(0), Value::Int(0)]),
                ),
                entry("is_expandable", Value::Bool(s.is_expandable)),
                entry("frames", Value::list(Vec::new())),
                entry("blocks", Value::list(blocks)),
            ]));
        }
    }
    let traces = devices
        .iter()
        .map(|d| Value::list(d.trace.iter().map(trace_entry).collect()))
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
