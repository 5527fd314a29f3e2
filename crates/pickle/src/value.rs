//! The pickle data model: [`Value`], its shared containers ([`Dict`]) and big integers ([`BigInt`]).
//!
//! Containers and strings sit behind [`Shared`] (an `Arc`), so cloning a `Value` is a reference
//! count bump, never a deep copy. That is what makes memo references cheap: a pickle that
//! mentions the same stack-frame dict ten thousand times yields ten thousand pointers to one dict.
//!
//! Layout: a `Value` is 16 bytes (an 8-byte tag and one 8-byte word: an integer, a float or a
//! *thin* pointer such as `Arc<Vec<Value>>`). Decoding moves values several times (stack, container,
//! memo), so their size is most of the decoder's cost; fat pointers (`Arc<[Value]>`, `Arc<str>`)
//! would make them 24 bytes, and measured 25% slower.

use std::fmt;
use std::sync::Arc;

/// The shared pointer behind every string and container of a [`Value`].
///
/// It is `Arc`, so decoded values are `Send + Sync` and can be handed to other threads; measured
/// against `Rc` on the shared snapshots, decode times were the same within noise.
pub type Shared<T> = Arc<T>;

/// CPython's default limit on the number of decimal digits of an `int` converted to or from text
/// (`sys.get_int_max_str_digits()`); we apply the same limit to `LONG`/`INT` text and to
/// [`BigInt::to_decimal_string`], which keeps both conversions (quadratic in the digit count) cheap.
pub const MAX_STR_DIGITS: usize = 4300;

/// One Python value built from plain builtins.
///
/// Cloning is cheap: strings, bytes and containers are [`Shared`] pointers.
///
/// Equality (`==`) is *data identity*, meant for tests and round trips, not Python's `==`:
/// types must match (`Int(1)`, `Float(1.0)` and `Bool(true)` all differ), floats compare by
/// their bits (a NaN equals the same NaN; `0.0 != -0.0`), sets compare in stream order, and
/// shared pointers compare equal without looking inside.
#[derive(Clone, Debug)]
// An 8-byte tag keeps every payload 8-byte aligned: moving a `Value` is two aligned words
// (with the default layout a `bool` payload sits at byte 1, and moves compile to misaligned
// copies that stall store forwarding; measured 20% slower decoding).
#[repr(u64)]
pub enum Value {
    /// Python `None`.
    None,
    /// Python `bool`.
    Bool(bool),
    /// A Python `int` that fits in `i64`.
    Int(i64),
    /// A Python `int` outside the `i64` range (rare: `LONG1`/`LONG4` with more than 8 bytes).
    BigInt(BigInt),
    /// Python `float` (IEEE 754 double).
    Float(f64),
    /// Python `str`. Python 2 `str` (`STRING` opcodes) also decodes to this, byte by byte as
    /// Latin-1.
    Str(Shared<String>),
    /// Python `bytes`; protocol 5 `bytearray` (`BYTEARRAY8`) decodes to this too.
    Bytes(Shared<Vec<u8>>),
    /// Python `list`.
    List(Shared<Vec<Value>>),
    /// Python `tuple`.
    Tuple(Shared<Vec<Value>>),
    /// Python `dict`, in insertion order.
    Dict(Dict),
    /// Python `set`, members in the order the pickle added them (duplicates removed).
    Set(Shared<Vec<Value>>),
    /// Python `frozenset`, members in the order the pickle listed them (duplicates removed).
    FrozenSet(Shared<Vec<Value>>),
}

impl Value {
    /// Python's name for this value's type (`"NoneType"`, `"int"`, `"dict"`, ...), for error
    /// messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::None => "NoneType",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::BigInt(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Dict(_) => "dict",
            Value::Set(_) => "set",
            Value::FrozenSet(_) => "frozenset",
        }
    }

    /// The dict, when this is a [`Value::Dict`].
    pub fn as_dict(&self) -> Option<&Dict> {
        match self {
            Value::Dict(d) => Some(d),
            _ => None,
        }
    }

    /// The value under the string key `key`, when this is a dict that has it; `None` for a
    /// missing key and for non-dicts. Linear in the dict's length (see [`Dict::get`]).
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.as_dict()?.get(key)
    }

    /// The items of a list or a tuple.
    pub fn as_list(&self) -> Option<&[Value]> {
        match self {
            Value::List(items) | Value::Tuple(items) => Some(items),
            _ => None,
        }
    }

    /// The text of a [`Value::Str`].
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The bytes of a [`Value::Bytes`].
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Bytes(b) => Some(b),
            _ => None,
        }
    }

    /// The integer of a [`Value::Int`]. `None` for bools (although Python's `bool` is an `int`),
    /// big integers and everything else.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The number of a [`Value::Float`] or a [`Value::Int`] (converted, rounding to nearest
    /// above 2^53 in magnitude). `None` for bools, big integers and everything else.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Float(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    /// The truth value of a [`Value::Bool`] (not Python truthiness: `Int(1)` gives `None`).
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// Whether this is [`Value::None`].
    pub fn is_none(&self) -> bool {
        matches!(self, Value::None)
    }

    /// A new [`Value::Str`].
    pub fn str(s: &str) -> Value {
        Value::Str(Shared::new(s.to_owned()))
    }

    /// A new [`Value::Bytes`].
    pub fn bytes(b: &[u8]) -> Value {
        Value::Bytes(Shared::new(b.to_vec()))
    }

    /// A new [`Value::List`] holding `items`.
    pub fn list(items: Vec<Value>) -> Value {
        Value::List(Shared::new(items))
    }

    /// A new [`Value::Tuple`] holding `items`.
    pub fn tuple(items: Vec<Value>) -> Value {
        Value::Tuple(Shared::new(items))
    }

    /// A new [`Value::Dict`] holding `entries` in order; see [`Dict::from_entries`] (duplicate
    /// keys are not merged).
    pub fn dict(entries: Vec<(Value, Value)>) -> Value {
        Value::Dict(Dict::from_entries(entries))
    }

    /// The integer whose two's-complement little-endian bytes are `bytes` (pickle's `LONG1`
    /// encoding; no bytes is zero): a [`Value::Int`] when it fits in `i64`, else a
    /// [`Value::BigInt`].
    pub fn int_from_le_bytes(bytes: &[u8]) -> Value {
        let bytes = trim_twos_complement(bytes);
        if bytes.len() <= 8 {
            let fill = if bytes.last().is_some_and(|b| b & 0x80 != 0) {
                0xff
            } else {
                0
            };
            let mut buf = [fill; 8];
            buf[..bytes.len()].copy_from_slice(bytes);
            Value::Int(i64::from_le_bytes(buf))
        } else {
            Value::BigInt(BigInt(Shared::new(bytes.to_vec())))
        }
    }
}

impl PartialEq for Value {
    fn eq(&self, other: &Value) -> bool {
        match (self, other) {
            (Value::None, Value::None) => true,
            (Value::Bool(a), Value::Bool(b)) => a == b,
            (Value::Int(a), Value::Int(b)) => a == b,
            (Value::BigInt(a), Value::BigInt(b)) => a == b,
            (Value::Float(a), Value::Float(b)) => a.to_bits() == b.to_bits(),
            (Value::Str(a), Value::Str(b)) => Shared::ptr_eq(a, b) || a == b,
            (Value::Bytes(a), Value::Bytes(b)) => Shared::ptr_eq(a, b) || a == b,
            (Value::List(a), Value::List(b))
            | (Value::Tuple(a), Value::Tuple(b))
            | (Value::Set(a), Value::Set(b))
            | (Value::FrozenSet(a), Value::FrozenSet(b)) => Shared::ptr_eq(a, b) || a == b,
            (Value::Dict(a), Value::Dict(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for Value {}

impl From<bool> for Value {
    fn from(b: bool) -> Value {
        Value::Bool(b)
    }
}

impl From<i64> for Value {
    fn from(i: i64) -> Value {
        Value::Int(i)
    }
}

impl From<f64> for Value {
    fn from(f: f64) -> Value {
        Value::Float(f)
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::str(s)
    }
}

impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::Str(Shared::new(s))
    }
}

impl From<Vec<Value>> for Value {
    fn from(items: Vec<Value>) -> Value {
        Value::list(items)
    }
}

/// A Python `dict`: entries in insertion order behind one [`Shared`] pointer (cloning is cheap).
///
/// Decoding merges duplicate keys the way Python does (the first key's position, the last
/// value); [`Dict::from_entries`] takes entries as given.
#[derive(Clone, Debug, Default)]
pub struct Dict(Shared<Vec<(Value, Value)>>);

impl Dict {
    /// A dict holding `entries` in order. Duplicate keys are *not* merged (a pickle of such a
    /// dict loads in Python with the last value winning, which is also what [`Dict::get`]
    /// returns).
    pub fn from_entries(entries: Vec<(Value, Value)>) -> Dict {
        Dict(Shared::new(entries))
    }

    /// The value under the string key `key`, or `None`. A linear scan (dicts in snapshots have
    /// a handful of keys); with duplicate keys, the last one wins.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| matches!(k, Value::Str(s) if s.as_str() == key))
            .map(|(_, v)| v)
    }

    /// Whether the dict has the string key `key`.
    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the dict has no entries.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The entries, in insertion order.
    pub fn entries(&self) -> &[(Value, Value)] {
        &self.0
    }

    /// An iterator over `(key, value)` pairs in insertion order.
    pub fn iter(&self) -> std::slice::Iter<'_, (Value, Value)> {
        self.0.iter()
    }

    /// The keys, in insertion order.
    pub fn keys(&self) -> impl Iterator<Item = &Value> {
        self.0.iter().map(|(k, _)| k)
    }

    /// The address of the shared entries: equal for clones of one dict (used to keep sharing
    /// when encoding).
    pub(crate) fn as_ptr(&self) -> *const () {
        Shared::as_ptr(&self.0) as *const ()
    }

    /// How many handles share these entries.
    pub(crate) fn strong_count(&self) -> usize {
        Shared::strong_count(&self.0)
    }
}

impl PartialEq for Dict {
    fn eq(&self, other: &Dict) -> bool {
        Shared::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

impl Eq for Dict {}

impl<'a> IntoIterator for &'a Dict {
    type Item = &'a (Value, Value);
    type IntoIter = std::slice::Iter<'a, (Value, Value)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// A Python `int` outside the `i64` range, as minimal two's-complement little-endian bytes
/// (pickle's own `LONG1`/`LONG4` encoding). Made by [`Value::int_from_le_bytes`], which keeps the
/// invariant that a `BigInt` never fits in `i64` (so each integer has one representation).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BigInt(Shared<Vec<u8>>);

impl BigInt {
    /// The minimal two's-complement little-endian bytes (at least 9).
    pub fn as_le_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Whether the integer is below zero.
    pub fn is_negative(&self) -> bool {
        self.0.last().is_some_and(|b| b & 0x80 != 0)
    }

    /// The decimal text (`-` sign when negative), or `None` when it would have more than
    /// [`MAX_STR_DIGITS`] digits (CPython refuses those too).
    pub fn to_decimal_string(&self) -> Option<String> {
        // An upper bound on the digits: 8 bits are at most 2.41 decimal digits.
        if self.0.len() * 241 / 100 > MAX_STR_DIGITS + 3 {
            return None;
        }
        let negative = self.is_negative();
        let mut magnitude: Vec<u8> = if negative {
            negate_twos_complement(&self.0)
        } else {
            self.0.to_vec()
        };
        // Little-endian base-2^32 limbs of the magnitude.
        magnitude.resize(magnitude.len().div_ceil(4) * 4, 0);
        let mut limbs: Vec<u32> = magnitude
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let mut chunks = Vec::new(); // base 10^9, least significant first
        while limbs.iter().any(|&l| l != 0) {
            let mut rem: u64 = 0;
            for limb in limbs.iter_mut().rev() {
                let cur = (rem << 32) | u64::from(*limb);
                *limb = (cur / 1_000_000_000) as u32;
                rem = cur % 1_000_000_000;
            }
            chunks.push(rem as u32);
            while limbs.last() == Some(&0) {
                limbs.pop();
            }
        }
        let mut out = String::with_capacity(chunks.len() * 9 + 1);
        if negative {
            out.push('-');
        }
        let mut iter = chunks.iter().rev();
        if let Some(first) = iter.next() {
            out.push_str(&first.to_string());
        } else {
            out.push('0');
        }
        for chunk in iter {
            out.push_str(&format!("{chunk:09}"));
        }
        if out.trim_start_matches('-').len() > MAX_STR_DIGITS {
            return None;
        }
        Some(out)
    }
}

impl fmt::Display for BigInt {
    /// Decimal when at most [`MAX_STR_DIGITS`] digits, else `<int of N bytes>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_decimal_string() {
            Some(s) => f.write_str(&s),
            None => write!(f, "<int of {} bytes>", self.0.len()),
        }
    }
}

/// Drops redundant sign-extension bytes from two's-complement little-endian `bytes`.
pub(crate) fn trim_twos_complement(bytes: &[u8]) -> &[u8] {
    let mut len = bytes.len();
    while len > 1 {
        let top = bytes[len - 1];
        let next = bytes[len - 2];
        if (top == 0 && next & 0x80 == 0) || (top == 0xff && next & 0x80 != 0) {
            len -= 1;
        } else {
            break;
        }
    }
    if len == 1 && bytes[0] == 0 {
        len = 0;
    }
    &bytes[..len]
}

/// `-x` for two's-complement little-endian `bytes` (one byte longer, to hold `-min`).
pub(crate) fn negate_twos_complement(bytes: &[u8]) -> Vec<u8> {
    let fill = if bytes.last().is_some_and(|b| b & 0x80 != 0) {
        0xff
    } else {
        0
    };
    let mut out: Vec<u8> = bytes.iter().map(|b| !b).collect();
    out.push(!fill);
    let mut carry = true;
    for b in &mut out {
        if !carry {
            break;
        }
        let (sum, overflow) = b.overflowing_add(1);
        *b = sum;
        carry = overflow;
    }
    out
}

/// Two's-complement little-endian bytes of an integer given as a sign and its magnitude in
/// little-endian base-2^32 limbs (minimal form).
pub(crate) fn int_from_sign_magnitude(negative: bool, limbs: &[u32]) -> Value {
    let mut bytes: Vec<u8> = limbs.iter().flat_map(|l| l.to_le_bytes()).collect();
    bytes.push(0); // room for the sign bit
    if negative {
        bytes = negate_twos_complement(&bytes);
    }
    Value::int_from_le_bytes(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_from_le_bytes_normalizes() {
        assert_eq!(Value::int_from_le_bytes(&[]), Value::Int(0));
        assert_eq!(Value::int_from_le_bytes(&[0xff]), Value::Int(-1));
        assert_eq!(Value::int_from_le_bytes(&[0x80, 0x00]), Value::Int(128));
        let max = i64::MAX.to_le_bytes();
        assert_eq!(Value::int_from_le_bytes(&max), Value::Int(i64::MAX));
        let mut over = [0u8; 9];
        over[7] = 0x80; // 2^63
        match Value::int_from_le_bytes(&over) {
            Value::BigInt(b) => {
                assert_eq!(b.to_decimal_string().unwrap(), "9223372036854775808");
                assert!(!b.is_negative());
            }
            other => panic!("expected BigInt, got {other:?}"),
        }
        let mut under = [0xffu8; 9];
        under[7] = 0x7f; // -2^63 - 1
        match Value::int_from_le_bytes(&under) {
            Value::BigInt(b) => assert_eq!(b.to_string(), "-9223372036854775809"),
            other => panic!("expected BigInt, got {other:?}"),
        }
    }
}
