//! The DTR paper's operator logs: one JSON object per line, scalars as strings, parsed into
//! [`Event`]s with line numbers and every name resolved (errors name the line).
//!
//! Instructions (see `shared/reference/dtr.md`): `ANNOTATE` (events before `START` are
//! ignored), `CONSTANT` + `MEMORY`, `CALL` followed by `MEMORY` then `ALIAS` per result,
//! `MUTATE`, `COPY`, `COPY_FROM`, `RELEASE`. Numbers may be JSON strings of digits (as the
//! prototype writes them) or JSON integers (`MUTATE` indices are integers in the logs).
//!
//! [`parse_file`] also reads gzip-compressed logs (`.log.gz`, as `tensormem.record` writes the
//! corpus), recognised by the gzip magic bytes ([`gunzip`]).

use std::path::Path;

use rustc_hash::FxHashMap;
use serde_json::{Map, Value};

/// Index of a name (`x<id>`) in [`Log::names`], in order of definition.
pub type NameId = u32;

/// One result of a `CALL`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallResult {
    /// The result's name.
    pub name: NameId,
    /// Bytes from its `MEMORY` line, as logged (an alias's logged size is kept for
    /// round-tripping; it allocates nothing).
    pub bytes: u64,
    /// `Some(i)`: a view of argument `i` (`ALIAS` other than `-1`).
    pub alias: Option<u32>,
}

/// One instruction of a log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// `ANNOTATE` with its annotation (`START`, `BACKWARD`, ...).
    Annotate(String),
    /// `CONSTANT` and its `MEMORY`: an input or weight of `bytes`.
    Constant {
        /// The name.
        name: NameId,
        /// Bytes.
        bytes: u64,
    },
    /// `CALL`: an operator producing `results` from `args` in `time_ns`.
    Call {
        /// The operator's name (`cudnn_convolution`, ...).
        op: String,
        /// Argument names.
        args: Vec<NameId>,
        /// Results with their sizes and aliases.
        results: Vec<CallResult>,
        /// Compute time, ns.
        time_ns: u64,
    },
    /// `MUTATE`: an in-place operator updating `args[i]` for each `i` in `mutated`.
    Mutate {
        /// The operator's name (`add_`, ...).
        op: String,
        /// Argument names.
        args: Vec<NameId>,
        /// Indices into `args` of the mutated arguments.
        mutated: Vec<u32>,
        /// Compute time, ns.
        time_ns: u64,
    },
    /// `COPY`: `dst` is a new name for `src`'s tensor.
    Copy {
        /// The new name.
        dst: NameId,
        /// The existing name.
        src: NameId,
    },
    /// `COPY_FROM`: `dst` now refers to `src`'s tensor; its old tensor is released.
    CopyFrom {
        /// The rebound name.
        dst: NameId,
        /// The source name.
        src: NameId,
    },
    /// `RELEASE`: a name is dropped.
    Release {
        /// The name.
        name: NameId,
    },
}

/// An event and the (1-based) line it starts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Located {
    /// 1-based line number in the file.
    pub line: usize,
    /// The event.
    pub event: Event,
}

/// A parsed log: the events from `START` on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Log {
    /// Events after the `START` annotation (all events when there is none), the `START`
    /// annotation itself included.
    pub events: Vec<Located>,
    /// Names by [`NameId`].
    pub names: Vec<String>,
}

impl Log {
    /// Number of `CALL` and `MUTATE` events.
    pub fn op_count(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e.event, Event::Call { .. } | Event::Mutate { .. }))
            .count()
    }

    /// What `TIME` holds when the log says so: the text after `COST ` of the first
    /// `ANNOTATE` starting with it (`tensormem.record` writes `COST roofline ...`,
    /// `COST flops ...` or `COST time ...` right after `START`); `None` for the prototype's
    /// logs, whose `TIME` is measured nanoseconds.
    pub fn cost_annotation(&self) -> Option<&str> {
        self.events.iter().find_map(|e| match &e.event {
            Event::Annotate(a) => a.strip_prefix("COST "),
            _ => None,
        })
    }

    /// Sum of `TIME` over `CALL` and `MUTATE`, ns (the baseline compute).
    pub fn total_time_ns(&self) -> u64 {
        self.events
            .iter()
            .map(|e| match e.event {
                Event::Call { time_ns, .. } | Event::Mutate { time_ns, .. } => time_ns,
                _ => 0,
            })
            .sum()
    }
}

/// A bad log. Every variant but `Io` and `Empty` names the 1-based line.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A gzip-compressed file that does not decompress (truncated, corrupt, bad checksum).
    #[error("{path}: not a valid gzip file: {message}")]
    Gzip {
        /// The path.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The log is not UTF-8 text.
    #[error("{path}: not UTF-8 text")]
    NotText {
        /// The path.
        path: String,
    },
    /// The log holds no instruction at all (an empty or blank file).
    #[error("the log is empty: no instruction on any line")]
    Empty,
    /// Not JSON.
    #[error("line {line}: invalid JSON: {message}")]
    Json {
        /// Line.
        line: usize,
        /// serde_json's message.
        message: String,
    },
    /// JSON but not an object.
    #[error("line {line}: expected a JSON object")]
    NotAnObject {
        /// Line.
        line: usize,
    },
    /// An `INSTRUCTION` we do not know.
    #[error("line {line}: unknown instruction '{instruction}'")]
    UnknownInstruction {
        /// Line.
        line: usize,
        /// The instruction given.
        instruction: String,
    },
    /// A required field is absent.
    #[error("line {line}: {instruction} has no {field} field")]
    MissingField {
        /// Line.
        line: usize,
        /// The instruction.
        instruction: String,
        /// The missing field.
        field: &'static str,
    },
    /// A field of the wrong JSON type.
    #[error("line {line}: field {field} must be {expected}")]
    WrongType {
        /// Line.
        line: usize,
        /// The field.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
    },
    /// A number that is not a non-negative integer.
    #[error("line {line}: field {field} is not a number: '{value}'")]
    InvalidNumber {
        /// Line.
        line: usize,
        /// The field.
        field: &'static str,
        /// The value as written.
        value: String,
    },
    /// A name used before (or without) being defined.
    #[error("line {line}: unknown name '{name}'")]
    UnknownName {
        /// Line.
        line: usize,
        /// The name.
        name: String,
    },
    /// A name defined twice.
    #[error("line {line}: name '{name}' is already defined")]
    Redefined {
        /// Line.
        line: usize,
        /// The name.
        name: String,
    },
    /// An index (`ALIAS`, `MUTATE`) outside the arguments.
    #[error("line {line}: {field} index {index} is out of range for {len} argument(s)")]
    IndexOutOfRange {
        /// Line.
        line: usize,
        /// The field.
        field: &'static str,
        /// The index.
        index: i64,
        /// Number of arguments.
        len: usize,
    },
    /// A `MEMORY` or `ALIAS` line missing where the format requires one.
    #[error("line {line}: expected {expected}, found {found}")]
    Unexpected {
        /// Line.
        line: usize,
        /// What was expected (`MEMORY for x12`).
        expected: String,
        /// What was there.
        found: String,
    },
}

impl LogError {
    /// The 1-based line the error is about (`None` for I/O errors and an empty log).
    pub fn line(&self) -> Option<usize> {
        match self {
            LogError::Io { .. }
            | LogError::Gzip { .. }
            | LogError::NotText { .. }
            | LogError::Empty => None,
            LogError::Json { line, .. }
            | LogError::NotAnObject { line }
            | LogError::UnknownInstruction { line, .. }
            | LogError::MissingField { line, .. }
            | LogError::WrongType { line, .. }
            | LogError::InvalidNumber { line, .. }
            | LogError::UnknownName { line, .. }
            | LogError::Redefined { line, .. }
            | LogError::IndexOutOfRange { line, .. }
            | LogError::Unexpected { line, .. } => Some(*line),
        }
    }
}

/// One parsed line before name resolution.
struct Raw {
    line: usize,
    instruction: String,
    obj: Map<String, Value>,
}

impl Raw {
    fn field(&self, field: &'static str) -> Result<&Value, LogError> {
        self.obj.get(field).ok_or_else(|| LogError::MissingField {
            line: self.line,
            instruction: self.instruction.clone(),
            field,
        })
    }

    fn str(&self, field: &'static str) -> Result<&str, LogError> {
        self.field(field)?.as_str().ok_or(LogError::WrongType {
            line: self.line,
            field,
            expected: "a string",
        })
    }

    fn number(&self, field: &'static str) -> Result<u64, LogError> {
        number(self.line, field, self.field(field)?)
    }

    fn strings(&self, field: &'static str) -> Result<Vec<&str>, LogError> {
        let wrong = || LogError::WrongType {
            line: self.line,
            field,
            expected: "an array of strings",
        };
        self.field(field)?
            .as_array()
            .ok_or_else(wrong)?
            .iter()
            .map(|v| v.as_str().ok_or_else(wrong))
            .collect()
    }
}

fn number(line: usize, field: &'static str, v: &Value) -> Result<u64, LogError> {
    let bad = |value: String| LogError::InvalidNumber { line, field, value };
    match v {
        Value::String(s) => s.trim().parse::<u64>().map_err(|_| bad(s.clone())),
        Value::Number(n) => n.as_u64().ok_or_else(|| bad(n.to_string())),
        other => Err(bad(other.to_string())),
    }
}

fn signed(line: usize, field: &'static str, v: &Value) -> Result<i64, LogError> {
    let bad = |value: String| LogError::InvalidNumber { line, field, value };
    match v {
        Value::String(s) => s.trim().parse::<i64>().map_err(|_| bad(s.clone())),
        Value::Number(n) => n.as_i64().ok_or_else(|| bad(n.to_string())),
        other => Err(bad(other.to_string())),
    }
}

const INSTRUCTIONS: [&str; 9] = [
    "ANNOTATE",
    "CONSTANT",
    "MEMORY",
    "CALL",
    "ALIAS",
    "MUTATE",
    "COPY",
    "COPY_FROM",
    "RELEASE",
];

fn parse_line(line: usize, text: &str) -> Result<Raw, LogError> {
    let value: Value = serde_json::from_str(text).map_err(|e| LogError::Json {
        line,
        message: e.to_string(),
    })?;
    let Value::Object(obj) = value else {
        return Err(LogError::NotAnObject { line });
    };
    let instruction = match obj.get("INSTRUCTION") {
        Some(Value::String(s)) => s.clone(),
        Some(_) => {
            return Err(LogError::WrongType {
                line,
                field: "INSTRUCTION",
                expected: "a string",
            });
        }
        None => {
            return Err(LogError::MissingField {
                line,
                instruction: "line".into(),
                field: "INSTRUCTION",
            });
        }
    };
    if !INSTRUCTIONS.contains(&instruction.as_str()) {
        return Err(LogError::UnknownInstruction { line, instruction });
    }
    Ok(Raw {
        line,
        instruction,
        obj,
    })
}

/// Resolves names while building events.
struct Names {
    ids: FxHashMap<String, NameId>,
    names: Vec<String>,
}

impl Names {
    fn define(&mut self, line: usize, name: &str) -> Result<NameId, LogError> {
        if self.ids.contains_key(name) {
            return Err(LogError::Redefined {
                line,
                name: name.to_string(),
            });
        }
        let id = self.names.len() as NameId;
        self.ids.insert(name.to_string(), id);
        self.names.push(name.to_string());
        Ok(id)
    }

    fn get(&self, line: usize, name: &str) -> Result<NameId, LogError> {
        self.ids
            .get(name)
            .copied()
            .ok_or_else(|| LogError::UnknownName {
                line,
                name: name.to_string(),
            })
    }
}

/// The line at `at` must be `what` (MEMORY or ALIAS) for `name`; `after` is the line of the
/// instruction that needs it.
fn expect<'a>(
    raws: &'a [Raw],
    at: usize,
    what: &str,
    name: &str,
    after: usize,
) -> Result<&'a Raw, LogError> {
    let Some(r) = raws.get(at) else {
        return Err(LogError::Unexpected {
            line: after,
            expected: format!("{what} for {name}"),
            found: "the end of the log".into(),
        });
    };
    let found_name = r.obj.get("NAME").and_then(Value::as_str);
    if r.instruction != what || found_name != Some(name) {
        return Err(LogError::Unexpected {
            line: r.line,
            expected: format!("{what} for {name}"),
            found: match found_name {
                Some(n) => format!("{} for {n}", r.instruction),
                None => r.instruction.clone(),
            },
        });
    }
    Ok(r)
}

/// Parses a log from its text.
///
/// # Errors
/// The first bad line as a [`LogError`] (unknown instruction, missing field, non-numeric
/// number, unknown or redefined name, bad index, missing `MEMORY`/`ALIAS`).
pub fn parse(text: &str) -> Result<Log, LogError> {
    let mut raws = Vec::new();
    for (i, l) in text.lines().enumerate() {
        if l.trim().is_empty() {
            continue;
        }
        raws.push(parse_line(i + 1, l)?);
    }
    if raws.is_empty() {
        return Err(LogError::Empty);
    }
    let start = raws
        .iter()
        .position(|r| {
            r.instruction == "ANNOTATE"
                && r.obj.get("ANNOTATION").and_then(Value::as_str) == Some("START")
        })
        .unwrap_or(0);
    let mut names = Names {
        ids: FxHashMap::default(),
        names: Vec::new(),
    };
    let mut events = Vec::with_capacity(raws.len() - start);
    let mut i = start;
    while i < raws.len() {
        let r = &raws[i];
        let line = r.line;
        i += 1;
        let event = match r.instruction.as_str() {
            "ANNOTATE" => Event::Annotate(r.str("ANNOTATION")?.to_string()),
            "CONSTANT" => {
                let name = r.str("NAME")?;
                let m = expect(&raws, i, "MEMORY", name, line)?;
                i += 1;
                let bytes = m.number("MEMORY")?;
                Event::Constant {
                    name: names.define(line, name)?,
                    bytes,
                }
            }
            "CALL" => {
                let op = r.str("NAME")?.to_string();
                let time_ns = r.number("TIME")?;
                let arg_names = r.strings("ARGS")?;
                let result_names = r.strings("RESULT")?;
                if result_names.is_empty() {
                    return Err(LogError::WrongType {
                        line,
                        field: "RESULT",
                        expected: "a non-empty array of strings",
                    });
                }
                let args = arg_names
                    .iter()
                    .map(|a| names.get(line, a))
                    .collect::<Result<Vec<_>, _>>()?;
                let mut results = Vec::with_capacity(result_names.len());
                for name in result_names {
                    let m = expect(&raws, i, "MEMORY", name, line)?;
                    let bytes = m.number("MEMORY")?;
                    let a = expect(&raws, i + 1, "ALIAS", name, m.line)?;
                    let alias = signed(a.line, "ALIAS", a.field("ALIAS")?)?;
                    let alias = match alias {
                        -1 => None,
                        k if k >= 0 && (k as usize) < args.len() => Some(k as u32),
                        k => {
                            return Err(LogError::IndexOutOfRange {
                                line: a.line,
                                field: "ALIAS",
                                index: k,
                                len: args.len(),
                            });
                        }
                    };
                    i += 2;
                    results.push(CallResult {
                        name: names.define(line, name)?,
                        bytes,
                        alias,
                    });
                }
                Event::Call {
                    op,
                    args,
                    results,
                    time_ns,
                }
            }
            "MUTATE" => {
                let op = r.str("NAME")?.to_string();
                let time_ns = r.number("TIME")?;
                let args = r
                    .strings("ARGS")?
                    .iter()
                    .map(|a| names.get(line, a))
                    .collect::<Result<Vec<_>, _>>()?;
                let list = r.field("MUTATE")?.as_array().ok_or(LogError::WrongType {
                    line,
                    field: "MUTATE",
                    expected: "an array of indices",
                })?;
                if list.is_empty() {
                    return Err(LogError::WrongType {
                        line,
                        field: "MUTATE",
                        expected: "a non-empty array of indices",
                    });
                }
                let mut mutated = Vec::with_capacity(list.len());
                for v in list {
                    let k = signed(line, "MUTATE", v)?;
                    if k < 0 || k as usize >= args.len() {
                        return Err(LogError::IndexOutOfRange {
                            line,
                            field: "MUTATE",
                            index: k,
                            len: args.len(),
                        });
                    }
                    mutated.push(k as u32);
                }
                Event::Mutate {
                    op,
                    args,
                    mutated,
                    time_ns,
                }
            }
            "COPY" => {
                let src = names.get(line, r.str("SRC")?)?;
                let dst = names.define(line, r.str("DST")?)?;
                Event::Copy { dst, src }
            }
            "COPY_FROM" => {
                let src = names.get(line, r.str("SRC")?)?;
                let dst = names.get(line, r.str("DST")?)?;
                Event::CopyFrom { dst, src }
            }
            "RELEASE" => Event::Release {
                name: names.get(line, r.str("NAME")?)?,
            },
            other => {
                // MEMORY and ALIAS are consumed by CONSTANT and CALL; anywhere else they are
                // out of place.
                let name = r.obj.get("NAME").and_then(Value::as_str).unwrap_or("?");
                return Err(LogError::Unexpected {
                    line,
                    expected: "an instruction (MEMORY and ALIAS only follow CONSTANT or CALL)"
                        .into(),
                    found: format!("{other} for {name}"),
                });
            }
        };
        events.push(Located { line, event });
    }
    Ok(Log {
        events,
        names: names.names,
    })
}

/// Reads and parses the log at `path`, plain or gzip-compressed (detected by its magic bytes,
/// whatever the file's name).
///
/// # Errors
/// [`LogError::Io`] when it cannot be read, [`LogError::Gzip`] when it is a broken gzip file,
/// [`LogError::NotText`] when it is not UTF-8; as [`parse`] otherwise.
pub fn parse_file(path: &Path) -> Result<Log, LogError> {
    let shown = || path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| LogError::Io {
        path: shown(),
        source,
    })?;
    let bytes = if is_gzip(&bytes) {
        gunzip(&bytes).map_err(|message| LogError::Gzip {
            path: shown(),
            message,
        })?
    } else {
        bytes
    };
    let text = String::from_utf8(bytes).map_err(|_| LogError::NotText { path: shown() })?;
    parse(&text)
}

/// Whether `bytes` start with gzip's magic (`1f 8b`).
pub fn is_gzip(bytes: &[u8]) -> bool {
    bytes.starts_with(&[0x1f, 0x8b])
}

/// CRC-32 (IEEE 802.3, reflected, as gzip's trailer), bitwise.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xedb8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// Decompresses one gzip member (RFC 1952: header with its optional fields, raw deflate,
/// CRC-32 and length trailer, both checked).
///
/// # Errors
/// A one-line reason: a bad header, a broken deflate stream, a short file, a checksum or
/// length mismatch.
pub fn gunzip(bytes: &[u8]) -> Result<Vec<u8>, String> {
    const FHCRC: u8 = 2;
    const FEXTRA: u8 = 4;
    const FNAME: u8 = 8;
    const FCOMMENT: u8 = 16;
    let short = || "the file ends inside the gzip header".to_string();
    if bytes.len() < 18 || !is_gzip(bytes) {
        return Err("too short for a gzip file".into());
    }
    if bytes[2] != 8 {
        return Err(format!("compression method {} is not deflate", bytes[2]));
    }
    let flags = bytes[3];
    let mut at = 10;
    if flags & FEXTRA != 0 {
        let len = bytes.get(at..at + 2).ok_or_else(short)?;
        at += 2 + usize::from(u16::from_le_bytes([len[0], len[1]]));
    }
    for flag in [FNAME, FCOMMENT] {
        if flags & flag != 0 {
            let end = bytes
                .get(at..)
                .and_then(|b| b.iter().position(|&c| c == 0))
                .ok_or_else(short)?;
            at += end + 1;
        }
    }
    if flags & FHCRC != 0 {
        at += 2;
    }
    if at + 8 > bytes.len() {
        return Err(short());
    }
    let trailer = &bytes[bytes.len() - 8..];
    let data = miniz_oxide::inflate::decompress_to_vec(&bytes[at..bytes.len() - 8])
        .map_err(|e| format!("broken deflate stream ({:?})", e.status))?;
    let crc = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
    let size = u32::from_le_bytes([trailer[4], trailer[5], trailer[6], trailer[7]]);
    if crc32(&data) != crc {
        return Err("CRC-32 mismatch".into());
    }
    if data.len() as u32 != size {
        return Err("length mismatch".into());
    }
    Ok(data)
}
