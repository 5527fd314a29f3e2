//! The encoder: writes a [`Value`] as a protocol-4 pickle that CPython's `pickle.loads` reads.
//!
//! The opcodes are the ones CPython's own pickler picks for plain builtins (without FRAME, which
//! is optional): `BININT1/BININT2/BININT/LONG1` for ints, `BINFLOAT`, `SHORT_BINUNICODE` /
//! `BINUNICODE` for strings, `TUPLE1..3` or `MARK ... TUPLE`, and containers filled in batches of
//! 1000 (`MARK ... APPENDS/SETITEMS/ADDITEMS`).
//!
//! Sharing is kept: a string or container whose [`crate::Shared`] pointer has other holders is
//! memoized when first written and referenced with `BINGET`/`LONG_BINGET` afterwards, so a
//! decoded snapshot re-encodes to about its original size, with its frames still shared.

use std::collections::HashMap;

use crate::opcodes as op;
use crate::value::{Shared, Value, trim_twos_complement};

/// Items per `APPENDS`/`SETITEMS`/`ADDITEMS`, as CPython's pickler batches them.
const BATCH: usize = 1000;

/// Encodes `value` as a protocol-4 pickle.
///
/// Infallible for every `Value`. Recursion is one Rust call per nesting level: values from
/// [`crate::decode`] nest at most [`crate::MAX_DEPTH`] levels, which is safe on an ordinary
/// thread stack; a hand-built value nested many thousands deep could overflow the stack.
pub fn encode(value: &Value) -> Vec<u8> {
    let mut encoder = Encoder {
        out: Vec::with_capacity(1024),
        memo: HashMap::new(),
    };
    encoder.out.extend_from_slice(&[op::PROTO, 4]);
    encoder.write(value);
    encoder.out.push(op::STOP);
    encoder.out
}

struct Encoder {
    out: Vec<u8>,
    /// Address of a shared allocation -> its memo key.
    memo: HashMap<usize, u32>,
}

impl Encoder {
    /// Writes a memo reference and returns true when `ptr` (shared by `count` holders) was
    /// written before.
    fn get(&mut self, ptr: *const (), count: usize) -> bool {
        if count < 2 {
            return false;
        }
        match self.memo.get(&(ptr as usize)) {
            Some(&key) => {
                if let Ok(small) = u8::try_from(key) {
                    self.out.extend_from_slice(&[op::BINGET, small]);
                } else {
                    self.out.push(op::LONG_BINGET);
                    self.out.extend_from_slice(&key.to_le_bytes());
                }
                true
            }
            None => false,
        }
    }

    /// Memoizes the value just written when it is shared.
    fn put(&mut self, ptr: *const (), count: usize) {
        if count < 2 {
            return;
        }
        // MEMOIZE stores under the number of entries so far.
        let Ok(key) = u32::try_from(self.memo.len()) else {
            return; // LONG_BINGET cannot name it: leave it unshared
        };
        self.out.push(op::MEMOIZE);
        self.memo.insert(ptr as usize, key);
    }

    fn len_prefixed(&mut self, short: u8, long: u8, huge: u8, bytes: &[u8]) {
        if let Ok(n) = u8::try_from(bytes.len()) {
            self.out.extend_from_slice(&[short, n]);
        } else if let Ok(n) = u32::try_from(bytes.len()) {
            self.out.push(long);
            self.out.extend_from_slice(&n.to_le_bytes());
        } else {
            self.out.push(huge);
            self.out
                .extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        }
        self.out.extend_from_slice(bytes);
    }

    fn int(&mut self, i: i64) {
        if let Ok(n) = u8::try_from(i) {
            self.out.extend_from_slice(&[op::BININT1, n]);
        } else if let Ok(n) = u16::try_from(i) {
            self.out.push(op::BININT2);
            self.out.extend_from_slice(&n.to_le_bytes());
        } else if let Ok(n) = i32::try_from(i) {
            self.out.push(op::BININT);
            self.out.extend_from_slice(&n.to_le_bytes());
        } else {
            let bytes = i.to_le_bytes();
            let bytes = trim_twos_complement(&bytes);
            self.out.extend_from_slice(&[op::LONG1, bytes.len() as u8]);
            self.out.extend_from_slice(bytes);
        }
    }

    fn items(&mut self, items: &[Value]) {
        for item in items {
            self.write(item);
        }
    }

    fn write(&mut self, value: &Value) {
        match value {
            Value::None => self.out.push(op::NONE),
            Value::Bool(true) => self.out.push(op::NEWTRUE),
            Value::Bool(false) => self.out.push(op::NEWFALSE),
            Value::Int(i) => self.int(*i),
            Value::BigInt(b) => {
                let bytes = b.as_le_bytes();
                match u8::try_from(bytes.len()) {
                    Ok(n) => self.out.extend_from_slice(&[op::LONG1, n]),
                    Err(_) => {
                        self.out.push(op::LONG4);
                        // A LONG4 holds up to 2^31 - 1 bytes; a BigInt that long (2 GiB) is
                        // not a value anyone encodes.
                        let n = i32::try_from(bytes.len()).unwrap_or(i32::MAX);
                        self.out.extend_from_slice(&n.to_le_bytes());
                    }
                }
                self.out.extend_from_slice(bytes);
            }
            Value::Float(f) => {
                self.out.push(op::BINFLOAT);
                self.out.extend_from_slice(&f.to_be_bytes());
            }
            Value::Str(s) => {
                let (ptr, count) = (Shared::as_ptr(s) as *const (), Shared::strong_count(s));
                if self.get(ptr, count) {
                    return;
                }
                self.len_prefixed(
                    op::SHORT_BINUNICODE,
                    op::BINUNICODE,
                    op::BINUNICODE8,
                    s.as_bytes(),
                );
                self.put(ptr, count);
            }
            Value::Bytes(b) => {
                let (ptr, count) = (Shared::as_ptr(b) as *const (), Shared::strong_count(b));
                if self.get(ptr, count) {
                    return;
                }
                self.len_prefixed(op::SHORT_BINBYTES, op::BINBYTES, op::BINBYTES8, b);
                self.put(ptr, count);
            }
            Value::Tuple(items) => {
                let (ptr, count) = (
                    Shared::as_ptr(items) as *const (),
                    Shared::strong_count(items),
                );
                if self.get(ptr, count) {
                    return;
                }
                match items.len() {
                    0 => self.out.push(op::EMPTY_TUPLE),
                    1..=3 => {
                        self.items(items);
                        self.out
                            .push([op::TUPLE1, op::TUPLE2, op::TUPLE3][items.len() - 1]);
                    }
                    _ => {
                        self.out.push(op::MARK);
                        self.items(items);
                        self.out.push(op::TUPLE);
                    }
                }
                self.put(ptr, count);
            }
            Value::FrozenSet(items) => {
                let (ptr, count) = (
                    Shared::as_ptr(items) as *const (),
                    Shared::strong_count(items),
                );
                if self.get(ptr, count) {
                    return;
                }
                self.out.push(op::MARK);
                self.items(items);
                self.out.push(op::FROZENSET);
                self.put(ptr, count);
            }
            Value::List(items) | Value::Set(items) => {
                let (ptr, count) = (
                    Shared::as_ptr(items) as *const (),
                    Shared::strong_count(items),
                );
                if self.get(ptr, count) {
                    return;
                }
                let is_list = matches!(value, Value::List(_));
                self.out.push(if is_list {
                    op::EMPTY_LIST
                } else {
                    op::EMPTY_SET
                });
                self.put(ptr, count);
                for batch in items.chunks(BATCH) {
                    if is_list && batch.len() == 1 {
                        self.write(&batch[0]);
                        self.out.push(op::APPEND);
                    } else {
                        self.out.push(op::MARK);
                        self.items(batch);
                        self.out
                            .push(if is_list { op::APPENDS } else { op::ADDITEMS });
                    }
                }
            }
            Value::Dict(dict) => {
                let (ptr, count) = (dict.as_ptr(), dict.strong_count());
                if self.get(ptr, count) {
                    return;
                }
                self.out.push(op::EMPTY_DICT);
                self.put(ptr, count);
                for batch in dict.entries().chunks(BATCH) {
                    if let [(k, v)] = batch {
                        self.write(k);
                        self.write(v);
                        self.out.push(op::SETITEM);
                    } else {
                        self.out.push(op::MARK);
                        for (k, v) in batch {
                            self.write(k);
                            self.write(v);
                        }
                        self.out.push(op::SETITEMS);
                    }
                }
            }
        }
    }
}
