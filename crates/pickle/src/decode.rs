//! The decoder: a stack machine over the pickle opcodes that build plain builtins.
//!
//! # Mutable containers and the memo
//! Lists, dicts and sets are filled *after* they are pushed and memoized (`EMPTY_DICT MEMOIZE
//! MARK ... SETITEMS`). While a container is still on the stack it is *open*: a growable `Vec`
//! kept beside the stack (the stack holds a placeholder), and memo entries for it name its stack
//! position. An open container is frozen into its shared [`Value`] (the `Vec` moves into an
//! `Arc`; the children are not copied) when it leaves the stack, or in place when the memo or
//! `DUP` hands out a second reference to it. Every memo entry that named it then holds the
//! frozen value.
//!
//! A frozen container can no longer change, so an opcode that appends to one fails with
//! [`DecodeError::RecursiveStructure`]. CPython's pickler writes a container completely before
//! anything refers to it again, except when the container is reachable from itself; so this
//! refuses exactly the recursive structures (which snapshots never hold), without a hang or a
//! reference-count cycle.
//!
//! # Limits
//! Every length field is checked against the remaining input before anything is allocated;
//! nesting is limited to [`MAX_DEPTH`] (dropping and encoding values recurse per level); every
//! other structure (stack, marks, memo) grows by at most one entry per input byte.

use std::collections::HashMap;
use std::io::Read;

use crate::error::DecodeError;
use crate::key::{self, KeyIndex, Keyed};
use crate::opcodes::{self as op, name};
use crate::text;
use crate::value::{Dict, Shared, Value};

/// The deepest container nesting the decoder accepts (a snapshot nests 6 levels). Python's own
/// recursion limit is 1000.
pub const MAX_DEPTH: usize = 1000;

/// The highest pickle protocol understood (Python 3.8+ writes up to 5).
pub const HIGHEST_PROTOCOL: u8 = 5;

type Result<T> = std::result::Result<T, DecodeError>;

/// Decodes one pickle from `bytes`, ignoring anything after its STOP opcode (as CPython's
/// `pickle.loads` does; use [`decode_exact`] to refuse trailing data).
///
/// # Errors
/// A [`DecodeError`] for anything but a well-formed pickle of plain builtins: a refused opcode
/// ([`DecodeError::Forbidden`]), truncated or malformed input, a recursive structure, nesting
/// deeper than [`MAX_DEPTH`]. Never panics.
pub fn decode(bytes: &[u8]) -> Result<Value> {
    decode_prefix(bytes).map(|(value, _)| value)
}

/// The same as [`decode`], under serde's name.
///
/// # Errors
/// As [`decode`].
pub fn from_slice(bytes: &[u8]) -> Result<Value> {
    decode(bytes)
}

/// Decodes one pickle from the start of `bytes`; returns it and the number of bytes it used (up
/// to and including STOP), so a caller can read several pickles written one after another.
///
/// # Errors
/// As [`decode`].
pub fn decode_prefix(bytes: &[u8]) -> Result<(Value, usize)> {
    Decoder::new(bytes).run()
}

/// Decodes one pickle that must fill `bytes` exactly.
///
/// # Errors
/// As [`decode`], and [`DecodeError::TrailingData`] when bytes follow the STOP opcode.
pub fn decode_exact(bytes: &[u8]) -> Result<Value> {
    let (value, used) = decode_prefix(bytes)?;
    if used < bytes.len() {
        return Err(DecodeError::TrailingData {
            offset: used,
            extra: bytes.len() - used,
        });
    }
    Ok(value)
}

/// Reads `reader` to its end, then decodes the pickle at its start (ignoring trailing data, as
/// [`decode`] does). Memory: the whole input, then the value.
///
/// # Errors
/// [`DecodeError::Io`] when reading fails; otherwise as [`decode`].
pub fn from_reader<R: Read>(mut reader: R) -> Result<Value> {
    let mut bytes = Vec::new();
    reader.read_to_end(&mut bytes)?;
    decode(&bytes)
}

/// A container still being filled.
struct Open<T> {
    items: Vec<T>,
    /// Built once the container is large (see [`key::insert`]); sets and dicts only.
    index: Option<Box<KeyIndex>>,
    /// The memo keys stored while the container was open: usually one, so it is kept inline.
    memo_key: Option<u64>,
    more_memo_keys: Vec<u64>,
}

impl<T> Default for Open<T> {
    fn default() -> Open<T> {
        Open {
            items: Vec::new(),
            index: None,
            memo_key: None,
            more_memo_keys: Vec::new(),
        }
    }
}

impl<T> Open<T> {
    fn add_memo_key(&mut self, key: u64) {
        if self.memo_key.is_none() {
            self.memo_key = Some(key);
        } else {
            self.more_memo_keys.push(key);
        }
    }
}

enum OpenKind {
    List(Open<Value>),
    Set(Open<Value>),
    Dict(Open<(Value, Value)>),
}

/// An open container and its stack position (where the stack holds a placeholder).
struct OpenSlot {
    at: usize,
    kind: OpenKind,
}

enum MemoEntry {
    Value(Value, u32),
    /// An open container at this stack position.
    Open(usize),
}

/// The memo: a dense vector for the keys picklers use (0, 1, 2, ...), a map for the rest, so a
/// key of 2^32 costs one map entry, not a 2^32-long vector. Keys in `sparse` are always
/// `>= dense.len()`.
#[derive(Default)]
struct Memo {
    dense: Vec<MemoEntry>,
    sparse: HashMap<u64, MemoEntry>,
    /// Keys present (`len(memo)` in Python): the key MEMOIZE stores under.
    count: u64,
}

impl Memo {
    #[inline]
    fn get(&self, key: u64) -> Option<&MemoEntry> {
        if let Some(entry) = usize::try_from(key).ok().and_then(|k| self.dense.get(k)) {
            return Some(entry);
        }
        if self.sparse.is_empty() {
            return None;
        }
        self.sparse.get(&key)
    }

    fn put(&mut self, key: u64, entry: MemoEntry) {
        let len = self.dense.len() as u64;
        let previous = if key < len {
            Some(std::mem::replace(&mut self.dense[key as usize], entry))
        } else if key == len {
            self.dense.push(entry);
            if self.sparse.is_empty() {
                None
            } else {
                self.sparse.remove(&key)
            }
        } else {
            self.sparse.insert(key, entry)
        };
        if previous.is_none() {
            self.count += 1;
        }
    }

    /// Freezes `open` into its value and points the memo keys that named it to that value.
    fn freeze(&mut self, open: OpenSlot, depth: u32) -> Value {
        let (value, first, more) = match open.kind {
            OpenKind::List(o) => (
                Value::List(Shared::new(o.items)),
                o.memo_key,
                o.more_memo_keys,
            ),
            OpenKind::Set(o) => (
                Value::Set(Shared::new(o.items)),
                o.memo_key,
                o.more_memo_keys,
            ),
            OpenKind::Dict(o) => (
                Value::Dict(Dict::from_entries(o.items)),
                o.memo_key,
                o.more_memo_keys,
            ),
        };
        for key in first.into_iter().chain(more) {
            if matches!(self.get(key), Some(MemoEntry::Open(i)) if *i == open.at) {
                self.put(key, MemoEntry::Value(value.clone(), depth));
            }
        }
        value
    }
}

/// Which open container an opcode fills.
#[derive(Clone, Copy, PartialEq)]
enum Target {
    List,
    Set,
    Dict,
}

/// The decoder's state.
///
/// The stack is split in three parallel parts so that its common case, plain values, moves as
/// plain 16-byte words (an APPENDS is one `memcpy` into the list): `stack` holds the values,
/// `depths` their nesting depths (0 for scalars), and `opens` the open containers, by increasing
/// stack position; `stack` holds a `None` placeholder at an open container's position.
struct Decoder<'a> {
    input: &'a [u8],
    pos: usize,
    /// Position of the opcode being run.
    at: usize,
    /// The opcode being run.
    op: u8,
    stack: Vec<Value>,
    depths: Vec<u32>,
    opens: Vec<OpenSlot>,
    /// Stack lengths at each open MARK.
    marks: Vec<usize>,
    memo: Memo,
    empty_tuple: Value,
}

impl<'a> Decoder<'a> {
    fn new(input: &'a [u8]) -> Decoder<'a> {
        let mut memo = Memo::default();
        // Snapshots memoize about once per 70-90 input bytes: sizing the memo up front saves
        // its regrowth.
        memo.dense.reserve(input.len() / 64);
        Decoder {
            input,
            pos: 0,
            at: 0,
            op: 0,
            stack: Vec::with_capacity(256),
            depths: Vec::with_capacity(256),
            opens: Vec::with_capacity(16),
            marks: Vec::with_capacity(16),
            memo,
            empty_tuple: Value::tuple(Vec::new()),
        }
    }

    fn op_name(&self) -> &'static str {
        name(self.op).unwrap_or("?")
    }

    fn malformed(&self, reason: impl Into<String>) -> DecodeError {
        DecodeError::Malformed {
            offset: self.at,
            reason: reason.into(),
        }
    }

    fn underflow(&self) -> DecodeError {
        DecodeError::StackUnderflow {
            opcode_name: self.op_name(),
            offset: self.at,
        }
    }

    fn forbidden(&self, detail: impl Into<String>) -> DecodeError {
        DecodeError::Forbidden {
            opcode_name: self.op_name(),
            offset: self.at,
            detail: detail.into(),
        }
    }

    fn unhashable(&self, type_name: &str) -> DecodeError {
        self.malformed(format!(
            "unhashable type: '{type_name}' used as a dict key or set member"
        ))
    }

    // ---- reading arguments ----

    #[inline]
    fn take(&mut self, n: u64) -> Result<&'a [u8]> {
        let available = self.input.len() - self.pos;
        match usize::try_from(n) {
            Ok(n) if n <= available => {
                let bytes = &self.input[self.pos..self.pos + n];
                self.pos += n;
                Ok(bytes)
            }
            _ => Err(DecodeError::Truncated {
                offset: self.pos,
                needed: n,
                available,
            }),
        }
    }

    #[inline]
    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let bytes = self.take(N as u64)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    #[inline]
    fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }

    #[inline]
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A signed 4-byte length (BINSTRING, LONG4): negative is malformed.
    fn len_i32(&mut self) -> Result<u64> {
        let n = i32::from_le_bytes(self.array()?);
        u64::try_from(n).map_err(|_| self.malformed(format!("negative length {n}")))
    }

    /// The bytes up to the next newline (consumed, not returned).
    fn line(&mut self) -> Result<&'a [u8]> {
        let rest = &self.input[self.pos..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(n) => {
                self.pos += n + 1;
                Ok(&rest[..n])
            }
            None => Err(DecodeError::Truncated {
                offset: self.pos,
                needed: rest.len() as u64 + 1,
                available: rest.len(),
            }),
        }
    }

    fn utf8(&self, bytes: &[u8]) -> Result<Value> {
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(Value::str(s)),
            Err(_) => Err(DecodeError::InvalidUtf8 { offset: self.at }),
        }
    }

    // ---- the stack ----

    #[inline]
    fn fence(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    #[inline]
    fn push_depth(&mut self, value: Value, depth: u32) {
        self.stack.push(value);
        self.depths.push(depth);
    }

    #[inline]
    fn push(&mut self, value: Value) {
        self.push_depth(value, 0);
    }

    fn push_open(&mut self, kind: OpenKind, depth: u32) {
        self.opens.push(OpenSlot {
            at: self.stack.len(),
            kind,
        });
        self.push_depth(Value::None, depth);
    }

    fn check_depth(&self, child_depth: u32) -> Result<u32> {
        let depth = child_depth + 1;
        if depth as usize > MAX_DEPTH {
            return Err(DecodeError::TooDeep {
                limit: MAX_DEPTH,
                offset: self.at,
            });
        }
        Ok(depth)
    }

    /// The open container at stack position `at`, if it is the topmost open one.
    fn open_at(&self, at: usize) -> Option<&OpenSlot> {
        self.opens.last().filter(|o| o.at == at)
    }

    /// Freezes every open container from stack position `from` on, in place.
    #[inline]
    fn freeze_from(&mut self, from: usize) {
        while self.opens.last().is_some_and(|o| o.at >= from) {
            if let Some(open) = self.opens.pop() {
                let at = open.at;
                let value = self.memo.freeze(open, self.depths[at]);
                self.stack[at] = value;
            }
        }
    }

    /// Freezes the open container at stack position `at`, wherever it is among the open ones
    /// (a memo reference or DUP hands out a second reference to it).
    fn freeze_one(&mut self, at: usize) -> Result<()> {
        match self.opens.binary_search_by_key(&at, |o| o.at) {
            Ok(i) => {
                let open = self.opens.remove(i);
                let value = self.memo.freeze(open, self.depths[at]);
                self.stack[at] = value;
                Ok(())
            }
            Err(_) => Err(self.malformed("internal: the memo names a container that is not open")),
        }
    }

    /// Pops the top value (above the innermost MARK), freezing it if it is an open container.
    fn pop(&mut self) -> Result<(Value, u32)> {
        let len = self.stack.len();
        if len <= self.fence() {
            return Err(self.underflow());
        }
        self.freeze_from(len - 1);
        match (self.stack.pop(), self.depths.pop()) {
            (Some(v), Some(d)) => Ok((v, d)),
            _ => Err(self.underflow()),
        }
    }

    fn pop_mark(&mut self) -> Result<usize> {
        self.marks.pop().ok_or(DecodeError::NoMark {
            opcode_name: name(self.op).unwrap_or("?"),
            offset: self.at,
        })
    }

    /// Removes the values from stack position `from` on (frozen first); returns them and their
    /// deepest depth.
    fn split_off(&mut self, from: usize) -> (Vec<Value>, u32) {
        self.freeze_from(from);
        let deepest = self.depths[from..].iter().copied().max().unwrap_or(0);
        self.depths.truncate(from);
        (self.stack.drain(from..).collect(), deepest)
    }

    /// Pops everything above the innermost MARK and the MARK; returns the frozen values and the
    /// deepest of their depths.
    fn pop_to_mark(&mut self) -> Result<(Vec<Value>, u32)> {
        let mark = self.pop_mark()?;
        Ok(self.split_off(mark))
    }

    fn put_memo(&mut self, key: u64) -> Result<()> {
        let len = self.stack.len();
        if len <= self.fence() {
            return Err(self.underflow());
        }
        let top = len - 1;
        let entry = match self.opens.last_mut() {
            Some(open) if open.at == top => {
                match &mut open.kind {
                    OpenKind::List(o) | OpenKind::Set(o) => o.add_memo_key(key),
                    OpenKind::Dict(o) => o.add_memo_key(key),
                }
                MemoEntry::Open(top)
            }
            _ => MemoEntry::Value(self.stack[top].clone(), self.depths[top]),
        };
        self.memo.put(key, entry);
        Ok(())
    }

    #[inline]
    fn get_memo(&mut self, key: u64) -> Result<()> {
        match self.memo.get(key) {
            Some(MemoEntry::Value(v, d)) => {
                let (v, d) = (v.clone(), *d);
                self.push_depth(v, d);
                Ok(())
            }
            Some(MemoEntry::Open(at)) => {
                let at = *at;
                self.freeze_one(at)?;
                self.push_depth(self.stack[at].clone(), self.depths[at]);
                Ok(())
            }
            None => Err(DecodeError::BadMemoKey {
                key,
                offset: self.at,
            }),
        }
    }

    /// The error for an opcode that fills a container when the value at `at` is not an open
    /// container of kind `want`.
    fn bad_target(&self, at: usize, want: Target) -> DecodeError {
        let found = match (self.open_at(at), self.stack.get(at)) {
            (Some(open), _) => match open.kind {
                OpenKind::List(_) => "list",
                OpenKind::Set(_) => "set",
                OpenKind::Dict(_) => "dict",
            },
            (None, Some(v)) => {
                let frozen = matches!(
                    (v, want),
                    (Value::List(_), Target::List)
                        | (Value::Set(_), Target::Set)
                        | (Value::Dict(_), Target::Dict)
                );
                if frozen {
                    return DecodeError::RecursiveStructure {
                        opcode_name: self.op_name(),
                        offset: self.at,
                    };
                }
                v.type_name()
            }
            (None, None) => return self.underflow(),
        };
        self.malformed(format!(
            "{} needs a {} below its arguments, found a {found}",
            self.op_name(),
            target_name(want),
        ))
    }

    /// Moves the stack values from position `from` on (keys and values alternating for dicts)
    /// into the open container just below them, at `from - 1`.
    fn fill(&mut self, want: Target, from: usize) -> Result<()> {
        let at = from.checked_sub(1).ok_or_else(|| self.underflow())?;
        let count = self.stack.len() - from;
        if want == Target::Dict && count % 2 != 0 {
            return Err(self.malformed(format!(
                "odd number of items ({count}) for {}",
                self.op_name()
            )));
        }
        self.freeze_from(from);
        let matches = match self.open_at(at).map(|o| &o.kind) {
            Some(OpenKind::List(_)) => want == Target::List,
            Some(OpenKind::Set(_)) => want == Target::Set,
            Some(OpenKind::Dict(_)) => want == Target::Dict,
            None => false,
        };
        if !matches {
            return Err(self.bad_target(at, want));
        }
        let deepest = self.depths[from..].iter().copied().max().unwrap_or(0);
        let depth = self.check_depth(deepest)?;
        self.depths.truncate(from);
        self.depths[at] = self.depths[at].max(depth);
        let Some(open) = self.opens.last_mut() else {
            return Err(self.underflow());
        };
        let mut values = self.stack.drain(from..);
        let result = match &mut open.kind {
            OpenKind::List(o) => {
                o.items.extend(values.by_ref());
                Ok(())
            }
            OpenKind::Set(o) => values.try_for_each(|v| key::insert(&mut o.items, &mut o.index, v)),
            OpenKind::Dict(o) => {
                o.items.reserve(count / 2);
                let mut result = Ok(());
                while let (Some(k), Some(v)) = (values.next(), values.next()) {
                    result = key::insert(&mut o.items, &mut o.index, (k, v));
                    if result.is_err() {
                        break;
                    }
                }
                result
            }
        };
        drop(values);
        result.map_err(|type_name| self.unhashable(type_name))
    }

    /// Builds a new open dict or a frozen set's members from `values`.
    fn keyed<T: Keyed>(&self, values: impl Iterator<Item = T>) -> Result<Open<T>> {
        let mut open = Open::default();
        for v in values {
            key::insert(&mut open.items, &mut open.index, v)
                .map_err(|type_name| self.unhashable(type_name))?;
        }
        Ok(open)
    }

    /// TUPLE1, TUPLE2, TUPLE3: the top `n` values become a tuple.
    fn tuple_of(&mut self, n: usize) -> Result<()> {
        let len = self.stack.len();
        if len < self.fence() + n {
            return Err(self.underflow());
        }
        let (items, deepest) = self.split_off(len - n);
        let depth = self.check_depth(deepest)?;
        self.push_depth(Value::tuple(items), depth);
        Ok(())
    }

    fn finish(&mut self) -> Result<Value> {
        if !self.marks.is_empty() {
            return Err(
                self.malformed(format!("STOP with {} MARK(s) still open", self.marks.len()))
            );
        }
        match self.stack.len() {
            0 => Err(self.underflow()),
            1 => self.pop().map(|(v, _)| v),
            n => Err(self.malformed(format!(
                "STOP leaves {n} values on the stack; a pickle ends with exactly one"
            ))),
        }
    }

    /// `module.name` of a GLOBAL or INST argument, for the refusal message.
    fn global_name(&mut self) -> String {
        let mut part = || {
            self.line()
                .map(|l| {
                    String::from_utf8_lossy(l)
                        .chars()
                        .take(200)
                        .collect::<String>()
                })
                .ok()
        };
        match (part(), part()) {
            (Some(module), Some(name)) => {
                format!("`{}.{}`", module.escape_debug(), name.escape_debug())
            }
            _ => "(its name is truncated)".into(),
        }
    }

    fn run(mut self) -> Result<(Value, usize)> {
        if self.input.is_empty() {
            return Err(DecodeError::Empty);
        }
        loop {
            self.at = self.pos;
            let Some(&code) = self.input.get(self.pos) else {
                return Err(DecodeError::NoStop { offset: self.pos });
            };
            self.op = code;
            self.pos += 1;
            match code {
                // ---- memo: the hot path of snapshots ----
                op::BINGET => {
                    let key = self.u8()?;
                    self.get_memo(u64::from(key))?;
                }
                op::LONG_BINGET => {
                    let key = self.u32()?;
                    self.get_memo(u64::from(key))?;
                }
                op::GET => {
                    let line = self.line()?;
                    let key = self.memo_key_text(line)?;
                    self.get_memo(key)?;
                }
                op::MEMOIZE => self.put_memo(self.memo.count)?,
                op::BINPUT => {
                    let key = self.u8()?;
                    self.put_memo(u64::from(key))?;
                }
                op::LONG_BINPUT => {
                    let key = self.u32()?;
                    self.put_memo(u64::from(key))?;
                }
                op::PUT => {
                    let line = self.line()?;
                    let key = self.memo_key_text(line)?;
                    self.put_memo(key)?;
                }

                // ---- framing and control ----
                op::PROTO => {
                    let version = self.u8()?;
                    if version > HIGHEST_PROTOCOL {
                        return Err(DecodeError::UnsupportedProtocol {
                            version,
                            offset: self.at,
                        });
                    }
                }
                op::FRAME => {
                    // CPython only checks that the frame's bytes are there.
                    let len = self.u64()?;
                    let available = self.input.len() - self.pos;
                    if usize::try_from(len).map_or(true, |len| len > available) {
                        return Err(DecodeError::Truncated {
                            offset: self.pos,
                            needed: len,
                            available,
                        });
                    }
                }
                op::STOP => {
                    let value = self.finish()?;
                    return Ok((value, self.pos));
                }
                op::MARK => self.marks.push(self.stack.len()),
                op::POP => {
                    // CPython: an empty MARK on top is popped instead of a value.
                    if self.marks.last() == Some(&self.stack.len()) {
                        self.marks.pop();
                    } else {
                        self.pop()?;
                    }
                }
                op::POP_MARK => {
                    self.pop_to_mark()?;
                }
                op::DUP => {
                    let top = self.stack.len();
                    if top <= self.fence() {
                        return Err(self.underflow());
                    }
                    let top = top - 1;
                    if self.open_at(top).is_some() {
                        self.freeze_one(top)?;
                    }
                    self.push_depth(self.stack[top].clone(), self.depths[top]);
                }

                // ---- scalars ----
                op::NONE => self.push(Value::None),
                op::NEWTRUE => self.push(Value::Bool(true)),
                op::NEWFALSE => self.push(Value::Bool(false)),
                op::BININT1 => {
                    let n = self.u8()?;
                    self.push(Value::Int(i64::from(n)));
                }
                op::BININT2 => {
                    let n = u16::from_le_bytes(self.array()?);
                    self.push(Value::Int(i64::from(n)));
                }
                op::BININT => {
                    let n = i32::from_le_bytes(self.array()?);
                    self.push(Value::Int(i64::from(n)));
                }
                op::LONG1 => {
                    let n = self.u8()?;
                    let bytes = self.take(u64::from(n))?;
                    self.push(Value::int_from_le_bytes(bytes));
                }
                op::LONG4 => {
                    let n = self.len_i32()?;
                    let bytes = self.take(n)?;
                    self.push(Value::int_from_le_bytes(bytes));
                }
                op::INT => {
                    let line = self.line()?;
                    let value = match line {
                        b"01" => Value::Bool(true),
                        b"00" => Value::Bool(false),
                        _ => text::parse_decimal(line).map_err(|r| self.malformed(r))?,
                    };
                    self.push(value);
                }
                op::LONG => {
                    let line = self.line()?;
                    let digits = line.strip_suffix(b"L").unwrap_or(line);
                    let value = text::parse_decimal(digits).map_err(|r| self.malformed(r))?;
                    self.push(value);
                }
                op::BINFLOAT => {
                    let f = f64::from_be_bytes(self.array()?);
                    self.push(Value::Float(f));
                }
                op::FLOAT => {
                    let line = self.line()?;
                    let f = text::parse_float(line).map_err(|r| self.malformed(r))?;
                    self.push(Value::Float(f));
                }

                // ---- text and bytes ----
                op::SHORT_BINUNICODE => {
                    let n = self.u8()?;
                    let bytes = self.take(u64::from(n))?;
                    let value = self.utf8(bytes)?;
                    self.push(value);
                }
                op::BINUNICODE => {
                    let n = self.u32()?;
                    let bytes = self.take(u64::from(n))?;
                    let value = self.utf8(bytes)?;
                    self.push(value);
                }
                op::BINUNICODE8 => {
                    let n = self.u64()?;
                    let bytes = self.take(n)?;
                    let value = self.utf8(bytes)?;
                    self.push(value);
                }
                op::UNICODE => {
                    let line = self.line()?;
                    let s = text::raw_unicode_unescape(line).map_err(|r| self.malformed(r))?;
                    self.push(Value::from(s));
                }
                op::SHORT_BINSTRING => {
                    let n = self.u8()?;
                    let bytes = self.take(u64::from(n))?;
                    self.push(latin1(bytes));
                }
                op::BINSTRING => {
                    let n = self.len_i32()?;
                    let bytes = self.take(n)?;
                    self.push(latin1(bytes));
                }
                op::STRING => {
                    let line = self.line()?;
                    let bytes = text::unquote_string(line).map_err(|r| self.malformed(r))?;
                    self.push(latin1(&bytes));
                }
                op::SHORT_BINBYTES => {
                    let n = self.u8()?;
                    let bytes = self.take(u64::from(n))?;
                    self.push(Value::bytes(bytes));
                }
                op::BINBYTES => {
                    let n = self.u32()?;
                    let bytes = self.take(u64::from(n))?;
                    self.push(Value::bytes(bytes));
                }
                op::BINBYTES8 | op::BYTEARRAY8 => {
                    let n = self.u64()?;
                    let bytes = self.take(n)?;
                    self.push(Value::bytes(bytes));
                }

                // ---- tuples ----
                op::EMPTY_TUPLE => {
                    let empty = self.empty_tuple.clone();
                    self.push_depth(empty, 1);
                }
                op::TUPLE1 => self.tuple_of(1)?,
                op::TUPLE2 => self.tuple_of(2)?,
                op::TUPLE3 => self.tuple_of(3)?,
                op::TUPLE => {
                    let (items, depth) = self.pop_to_mark()?;
                    let depth = self.check_depth(depth)?;
                    let value = if items.is_empty() {
                        self.empty_tuple.clone()
                    } else {
                        Value::tuple(items)
                    };
                    self.push_depth(value, depth);
                }

                // ---- lists ----
                op::EMPTY_LIST => self.push_open(OpenKind::List(Open::default()), 1),
                op::LIST => {
                    let (items, depth) = self.pop_to_mark()?;
                    let depth = self.check_depth(depth)?;
                    let open = Open {
                        items,
                        ..Open::default()
                    };
                    self.push_open(OpenKind::List(open), depth);
                }
                op::APPEND => self.fill_top(Target::List, 1)?,
                op::APPENDS => self.fill_to_mark(Target::List)?,

                // ---- dicts ----
                op::EMPTY_DICT => self.push_open(OpenKind::Dict(Open::default()), 1),
                op::DICT => {
                    let (items, depth) = self.pop_to_mark()?;
                    let depth = self.check_depth(depth)?;
                    if items.len() % 2 != 0 {
                        return Err(self
                            .malformed(format!("odd number of items ({}) for DICT", items.len())));
                    }
                    let mut iter = items.into_iter();
                    let pairs = std::iter::from_fn(|| Some((iter.next()?, iter.next()?)));
                    let open = self.keyed(pairs)?;
                    self.push_open(OpenKind::Dict(open), depth);
                }
                op::SETITEM => self.fill_top(Target::Dict, 2)?,
                op::SETITEMS => self.fill_to_mark(Target::Dict)?,

                // ---- sets ----
                op::EMPTY_SET => self.push_open(OpenKind::Set(Open::default()), 1),
                op::ADDITEMS => self.fill_to_mark(Target::Set)?,
                op::FROZENSET => {
                    let (items, depth) = self.pop_to_mark()?;
                    let depth = self.check_depth(depth)?;
                    let open = self.keyed(items.into_iter())?;
                    let value = Value::FrozenSet(Shared::new(open.items));
                    self.push_depth(value, depth);
                }

                // ---- refused: these import, call or build arbitrary objects ----
                op::GLOBAL => {
                    let what = self.global_name();
                    return Err(self.forbidden(format!("the pickle names a callable {what}")));
                }
                op::INST => {
                    let what = self.global_name();
                    return Err(self.forbidden(format!("the pickle instantiates a class {what}")));
                }
                op::STACK_GLOBAL => {
                    let n = self.stack.len();
                    let names = (n >= 2).then(|| (&self.stack[n - 2], &self.stack[n - 1]));
                    let detail = match names {
                        Some((Value::Str(m), Value::Str(q))) => format!(
                            "the pickle names a callable `{}.{}`",
                            m.chars().take(200).collect::<String>().escape_debug(),
                            q.chars().take(200).collect::<String>().escape_debug()
                        ),
                        _ => "the pickle names a callable".to_string(),
                    };
                    return Err(self.forbidden(detail));
                }
                op::REDUCE => return Err(self.forbidden("the pickle calls a callable")),
                op::BUILD => return Err(self.forbidden("the pickle sets the state of an object")),
                op::OBJ => return Err(self.forbidden("the pickle instantiates a class")),
                op::NEWOBJ | op::NEWOBJ_EX => {
                    return Err(self.forbidden("the pickle creates an object with `cls.__new__`"));
                }
                op::EXT1 | op::EXT2 | op::EXT4 => {
                    let code = match code {
                        op::EXT1 => self.u8().map(u32::from),
                        op::EXT2 => self.array::<2>().map(|b| u32::from(u16::from_le_bytes(b))),
                        _ => self.u32(),
                    };
                    let code = code.map_or_else(|_| "truncated".to_string(), |c| c.to_string());
                    return Err(self.forbidden(format!(
                        "the pickle names a callable through the copyreg extension registry (code {code})"
                    )));
                }
                op::PERSID | op::BINPERSID => {
                    return Err(
                        self.forbidden("the pickle asks for a persistent object (persistent_load)")
                    );
                }
                op::NEXT_BUFFER | op::READONLY_BUFFER => {
                    return Err(self.forbidden("the pickle uses out-of-band buffers"));
                }
                other => {
                    return Err(DecodeError::UnknownOpcode {
                        opcode: other,
                        offset: self.at,
                    });
                }
            }
        }
    }

    /// APPENDS, SETITEMS, ADDITEMS: the values above the innermost MARK go into the open
    /// container just below it.
    fn fill_to_mark(&mut self, want: Target) -> Result<()> {
        let mark = self.pop_mark()?;
        self.fill(want, mark)
    }

    /// APPEND, SETITEM: the top `n` values (above the innermost MARK) go into the open
    /// container below them.
    fn fill_top(&mut self, want: Target, n: usize) -> Result<()> {
        if self.stack.len() < self.fence() + n {
            return Err(self.underflow());
        }
        self.fill(want, self.stack.len() - n)
    }

    /// The key of a text GET or PUT: a non-negative decimal.
    fn memo_key_text(&self, line: &[u8]) -> Result<u64> {
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.trim_ascii().parse::<u64>().ok())
            .filter(|&k| k <= i64::MAX as u64)
            .ok_or_else(|| {
                self.malformed(format!(
                    "memo key `{}` is not a non-negative integer",
                    String::from_utf8_lossy(line).escape_debug()
                ))
            })
    }
}

/// A Python 2 `str`, decoded byte by byte as Latin-1 (what `pickle.loads(..., encoding="latin1")`
/// gives; for ASCII it equals CPython's default).
fn latin1(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(s) if s.is_ascii() => Value::str(s),
        _ => Value::from(bytes.iter().map(|&b| char::from(b)).collect::<String>()),
    }
}

fn target_name(t: Target) -> &'static str {
    match t {
        Target::List => "list",
        Target::Set => "set",
        Target::Dict => "dict",
    }
}
