//! Reading snapshots: PyTorch pickles (without executing anything) and JSON exports of the same
//! structure, in every format PyTorch has written.
//!
//! Accepted shapes: a dict with `segments` (and optionally `device_traces`,
//! `allocator_settings`, `external_annotations`), or a bare list of segments (very old files).
//! Blocks may carry `frames` or the old `history`; trace entries may lack `time_us`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use c10_cuda::config::{AllocatorConfig, ConfigError, SettingValue};
use c10_cuda::history::{Frame, Frames, TraceAction};
use c10_cuda::snapshot::BlockState;
use tensormem_pickle::Value;
use thiserror::Error;

use crate::model::{
    FormatNotes, RecordedBlock, RecordedEvent, RecordedSegment, RecordedSettings, Snapshot,
};

/// Why a file could not be loaded. Every message names the file's problem in one line.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The path given.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is empty.
    #[error("{path}: the file is empty")]
    Empty {
        /// The path given.
        path: String,
    },
    /// The pickle is corrupt, truncated, or asks to run code.
    #[error("{path}: {source}")]
    Pickle {
        /// The path given.
        path: String,
        /// What the decoder found.
        source: tensormem_pickle::DecodeError,
    },
    /// The JSON is malformed.
    #[error("{path}: invalid JSON: {source}")]
    Json {
        /// The path given.
        path: String,
        /// What the JSON parser found.
        source: serde_json::Error,
    },
    /// The data decoded but is not a memory snapshot.
    #[error("{path}: not a PyTorch memory snapshot: {what}")]
    Shape {
        /// The path given.
        path: String,
        /// What is missing or of the wrong type (with the path inside the data).
        what: String,
    },
    /// `allocator_settings` holds values our configuration rejects.
    #[error("{path}: unusable allocator_settings: {source}")]
    Settings {
        /// The path given.
        path: String,
        /// The configuration error.
        source: ConfigError,
    },
}

/// Reads and decodes a snapshot file (pickle, or JSON when it starts with `{` or `[`).
///
/// # Errors
/// [`LoadError`] naming the problem: unreadable, empty, corrupt or code-bearing pickle,
/// malformed JSON, or a structure that is not a memory snapshot.
pub fn load_path(path: &Path) -> Result<Snapshot, LoadError> {
    let name = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| LoadError::Io {
        path: name.clone(),
        source,
    })?;
    load_bytes(&bytes, &name)
}

/// Decodes snapshot bytes; `name` is used in error messages.
///
/// # Errors
/// As [`load_path`].
pub fn load_bytes(bytes: &[u8], name: &str) -> Result<Snapshot, LoadError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    let (value, encoding) = match first {
        None => {
            return Err(LoadError::Empty {
                path: name.to_string(),
            });
        }
        Some(b'{') | Some(b'[') => {
            let text = String::from_utf8_lossy(bytes);
            let v = tensormem_pickle::from_json(&text).map_err(|source| LoadError::Json {
                path: name.to_string(),
                source,
            })?;
            (v, "json")
        }
        Some(_) => {
            let v = tensormem_pickle::decode(bytes).map_err(|source| LoadError::Pickle {
                path: name.to_string(),
                source,
            })?;
            (v, "pickle")
        }
    };
    load_value_as(&value, name, encoding)
}

/// Builds the model from an already decoded snapshot value (e.g. the dict
/// `torch.cuda.memory._snapshot()` returns, converted); `name` is used in error messages.
///
/// # Errors
/// [`LoadError::Shape`] or [`LoadError::Settings`], as [`load_path`].
pub fn load_value(value: &Value, name: &str) -> Result<Snapshot, LoadError> {
    load_value_as(value, name, "dict")
}

fn load_value_as(value: &Value, name: &str, encoding: &'static str) -> Result<Snapshot, LoadError> {
    from_value(value, encoding)
        .map_err(|what| LoadError::Shape {
            path: name.to_string(),
            what,
        })
        .and_then(|r| {
            r.map_err(|source| LoadError::Settings {
                path: name.to_string(),
                source,
            })
        })
}

type Shape<T> = Result<T, String>;

fn field<'a>(v: &'a Value, key: &str, at: &str) -> Shape<&'a Value> {
    v.get(key).ok_or_else(|| format!("{at} has no '{key}' key"))
}

fn int(v: &Value, key: &str, at: &str) -> Shape<u64> {
    let x = field(v, key, at)?;
    x.as_i64()
        .and_then(|i| u64::try_from(i).ok())
        .ok_or_else(|| {
            // A number that is out of range shows itself; anything else shows its type.
            let found = match x {
                Value::Int(i) => i.to_string(),
                Value::BigInt(b) => b.to_string(),
                other => other.type_name().to_string(),
            };
            format!("{at}['{key}'] should be a non-negative integer, found {found}")
        })
}

/// An optional non-negative integer field: `None` when the key is absent or holds `None`; a
/// value of another type or a negative one is an error naming the field (it used to read as
/// absent, so a negative size in a hand-built dict replayed as 0).
fn opt_int(v: &Value, key: &str, at: &str) -> Shape<Option<u64>> {
    match v.get(key) {
        None | Some(Value::None) => Ok(None),
        Some(_) => int(v, key, at).map(Some),
    }
}

fn list<'a>(v: &'a Value, at: &str) -> Shape<&'a [Value]> {
    v.as_list()
        .ok_or_else(|| format!("{at} should be a list, found {}", v.type_name()))
}

fn from_value(v: &Value, encoding: &'static str) -> Shape<Result<Snapshot, ConfigError>> {
    let mut notes = FormatNotes {
        encoding,
        ..FormatNotes::default()
    };
    let (segments_v, traces_v, settings_v) = if v.as_dict().is_some() {
        (
            field(v, "segments", "the top-level dict")?,
            v.get("device_traces"),
            v.get("allocator_settings"),
        )
    } else if v.as_list().is_some() {
        notes.bare_segment_list = true;
        (v, None, None)
    } else {
        return Err(format!(
            "expected a dict with 'segments' or a list of segments, found {}",
            v.type_name()
        ));
    };
    let mut frames = FrameCache::default();
    let mut segments = Vec::new();
    for (i, s) in list(segments_v, "'segments'")?.iter().enumerate() {
        segments.push(segment(s, i, &mut notes, &mut frames)?);
    }
    let mut traces = Vec::new();
    if let Some(tv) = traces_v.filter(|t| !t.is_none()) {
        for (d, dev) in list(tv, "'device_traces'")?.iter().enumerate() {
            let at = format!("device_traces[{d}]");
            let mut events = Vec::new();
            for (i, e) in list(dev, &at)?.iter().enumerate() {
                events.push(event(e, &format!("{at}[{i}]"), &mut notes, &mut frames)?);
            }
            traces.push(events);
        }
    }
    let settings = match settings_v.filter(|s| !s.is_none()) {
        None => Ok(RecordedSettings::Absent),
        Some(s) => settings(s).map(|r| r.map(RecordedSettings::Recorded))?,
    };
    let external_annotations = v
        .as_dict()
        .and_then(|d| d.get("external_annotations"))
        .filter(|a| !a.is_none())
        .cloned();
    Ok(settings.map(|settings| Snapshot {
        segments,
        traces,
        settings,
        external_annotations,
        format: notes,
    }))
}

/// Turns `frames` lists into shared [`Frames`]: each frame dict of the pickle (shared through
/// its memo) is converted once, strings are interned, and equal stacks share one allocation.
#[derive(Default)]
struct FrameCache {
    strings: HashMap<String, Arc<str>>,
    by_dict: HashMap<*const (Value, Value), Frame>,
    stacks: HashMap<Vec<Frame>, Frames>,
}

impl FrameCache {
    fn intern(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.strings.get(s) {
            return a.clone();
        }
        let a: Arc<str> = Arc::from(s);
        self.strings.insert(s.to_string(), a.clone());
        a
    }

    fn frame(&mut self, f: &Value) -> Option<Frame> {
        let d = f.as_dict()?;
        let key = d.entries().as_ptr();
        if let Some(fr) = self.by_dict.get(&key) {
            return Some(fr.clone());
        }
        let fr = Frame {
            name: self.intern(d.get("name").and_then(Value::as_str).unwrap_or("??")),
            filename: self.intern(d.get("filename").and_then(Value::as_str).unwrap_or("??")),
            line: d
                .get("line")
                .and_then(Value::as_i64)
                .and_then(|l| u32::try_from(l).ok())
                .unwrap_or(0),
        };
        // Keyed by the dict's address: the decoded value outlives this cache.
        self.by_dict.insert(key, fr.clone());
        Some(fr)
    }

    /// The stack of a `frames` list; `None` when absent or empty.
    fn stack(&mut self, v: Option<&Value>) -> Option<Frames> {
        let items = v?.as_list()?;
        if items.is_empty() {
            return None;
        }
        let frames: Vec<Frame> = items.iter().filter_map(|f| self.frame(f)).collect();
        if frames.is_empty() {
            return None;
        }
        if let Some(s) = self.stacks.get(&frames) {
            return Some(s.clone());
        }
        let shared: Frames = Arc::from(frames.clone());
        self.stacks.insert(frames, shared.clone());
        Some(shared)
    }
}

/// A block's stack: `frames`, or in older files the newest entry of `history`.
fn block_frames(b: &Value, cache: &mut FrameCache) -> Option<Frames> {
    if let Some(f) = cache.stack(b.get("frames")) {
        return Some(f);
    }
    let last = b.get("history")?.as_list()?.last()?;
    cache.stack(last.get("frames"))
}

fn segment(
    s: &Value,
    i: usize,
    notes: &mut FormatNotes,
    cache: &mut FrameCache,
) -> Shape<RecordedSegment> {
    let at = format!("segments[{i}]");
    if s.as_dict().is_none() {
        return Err(format!("{at} should be a dict, found {}", s.type_name()));
    }
    let is_large = match s.get("segment_type").and_then(Value::as_str) {
        Some("large") => true,
        Some("small") => false,
        Some(other) => {
            return Err(format!(
                "{at}['segment_type'] is '{other}', expected 'large' or 'small'"
            ));
        }
        // Older files: infer from the size (small segments are always 2 MiB).
        None => int(s, "total_size", &at)? != 2 << 20,
    };
    let seg_address = int(s, "address", &at)?;
    let mut cursor = seg_address;
    let mut blocks = Vec::new();
    for (j, b) in list(field(s, "blocks", &at)?, &format!("{at}['blocks']"))?
        .iter()
        .enumerate()
    {
        let bat = format!("{at}['blocks'][{j}]");
        if b.get("history").is_some() {
            notes.history_key = true;
        }
        let state = match b.get("state").and_then(Value::as_str) {
            Some(st) => BlockState::parse(st)
                .ok_or_else(|| format!("{bat}['state'] is '{st}', not a block state"))?,
            None => return Err(format!("{bat} has no 'state' key")),
        };
        // Older files give blocks no address: they tile the segment in order.
        let address = match opt_int(b, "address", &bat)? {
            Some(a) => a,
            None => {
                notes.blocks_without_address = true;
                cursor
            }
        };
        let size = int(b, "size", &bat)?;
        cursor = address + size;
        blocks.push(RecordedBlock {
            address,
            size,
            requested_size: opt_int(b, "requested_size", &bat)?.unwrap_or(0),
            state,
            frames: block_frames(b, cache),
        });
    }
    Ok(RecordedSegment {
        device: opt_int(s, "device", &at)?.unwrap_or(0).min(255) as u8,
        address: seg_address,
        total_size: int(s, "total_size", &at)?,
        stream: opt_int(s, "stream", &at)?.unwrap_or(0),
        is_large,
        is_expandable: s
            .get("is_expandable")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        blocks,
    })
}

fn event(
    e: &Value,
    at: &str,
    notes: &mut FormatNotes,
    cache: &mut FrameCache,
) -> Shape<RecordedEvent> {
    let name = field(e, "action", at)?
        .as_str()
        .ok_or_else(|| format!("{at}['action'] should be a string"))?;
    let action = TraceAction::parse(name)
        .ok_or_else(|| format!("{at}['action'] is '{name}', not a trace action"))?;
    let addr = match action {
        TraceAction::Oom => opt_int(e, "device_free", at)?.unwrap_or(0),
        TraceAction::Snapshot => opt_int(e, "addr", at)?.unwrap_or(0),
        _ => int(e, "addr", at)?,
    };
    let time_us = opt_int(e, "time_us", at)?;
    if time_us.is_none() {
        notes.missing_time = true;
    }
    Ok(RecordedEvent {
        action,
        addr,
        size: opt_int(e, "size", at)?.unwrap_or(0),
        stream: opt_int(e, "stream", at)?.unwrap_or(0),
        time_us,
        frames: cache.stack(e.get("frames")),
        compile_context: e
            .get("compile_context")
            .and_then(Value::as_str)
            .map(str::to_string),
        user_metadata: e
            .get("user_metadata")
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}

fn settings(s: &Value) -> Shape<Result<AllocatorConfig, ConfigError>> {
    let dict = s.as_dict().ok_or_else(|| {
        format!(
            "'allocator_settings' should be a dict, found {}",
            s.type_name()
        )
    })?;
    let mut out: Vec<(String, SettingValue)> = Vec::new();
    for (k, v) in dict.iter() {
        let Some(key) = k.as_str() else { continue };
        let value = match v {
            Value::Bool(b) => SettingValue::Bool(*b),
            Value::Str(_) => SettingValue::Str(v.as_str().unwrap_or_default().to_string()),
            Value::Float(f) => SettingValue::Float(*f),
            _ if v.as_i64().is_some() => SettingValue::Int(v.as_i64().unwrap_or_default()),
            _ if v.as_dict().is_some() => SettingValue::Map(
                v.as_dict()
                    .into_iter()
                    .flat_map(|d| d.iter())
                    .filter_map(|(k, v)| Some((k.as_str()?.to_string(), v.as_i64()?)))
                    .collect(),
            ),
            _ => continue,
        };
        out.push((key.to_string(), value));
    }
    Ok(AllocatorConfig::from_settings(&out))
}
