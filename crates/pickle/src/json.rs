//! JSON export ([`Value::to_json_string`]) and import ([`from_json`]) of snapshots.
//!
//! Mapping, both ways: `None` <-> `null`, `bool` <-> `true`/`false`, `int` <-> integer,
//! `float` <-> number with a fraction or exponent, `str` <-> string, `dict` <-> object,
//! `list` <-> array. Export only: tuples, sets and frozensets become arrays; `int` dict keys
//! become their decimal text (as Python's `json.dumps` does); non-finite floats (NaN, ±inf) become
//! `null` (JSON has no spelling for them; Python would write the non-standard `NaN`). `bytes`,
//! and dict keys of other types, are errors ([`JsonError`]). JSON has no references, so a shared
//! subtree (a frame list) is written out at each place it occurs.

use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;
use std::io::Write as _;

use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};

use crate::error::JsonError;
use crate::key::{self, KeyIndex};
use crate::value::{Dict, Shared, Value};

impl Value {
    /// This value as compact JSON text: `None` -> `null`, `bool`, `int` and `float` -> numbers
    /// (non-finite floats -> `null`: JSON cannot spell NaN or infinity), `str` -> string,
    /// list/tuple/set/frozenset -> array, dict -> object (`int` keys become their decimal
    /// text, as in Python's `json.dumps`). A shared subtree is written out at every place it
    /// occurs (JSON has no references), so the text can be much longer than the pickle.
    ///
    /// # Errors
    /// [`JsonError`] for `bytes`, for dict keys that are not `str` or `int`, and for integers of
    /// more than [`crate::MAX_STR_DIGITS`] digits.
    pub fn to_json_string(&self) -> Result<String, JsonError> {
        let mut out = Vec::with_capacity(1024);
        write_json(self, &mut out)?;
        // Everything written is ASCII or serde_json's escaping of a valid `str`: valid UTF-8.
        Ok(String::from_utf8(out).unwrap_or_default())
    }
}

fn write_json(value: &Value, out: &mut Vec<u8>) -> Result<(), JsonError> {
    match value {
        Value::None => out.extend_from_slice(b"null"),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Value::BigInt(b) => {
            let text = b.to_decimal_string().ok_or(JsonError::IntTooLarge {
                bytes: b.as_le_bytes().len(),
            })?;
            out.extend_from_slice(text.as_bytes());
        }
        Value::Float(f) => {
            if f.is_finite() {
                // ryu through serde_json: shortest text that reads back exactly.
                let _ = serde_json::to_writer(&mut *out, f);
            } else {
                out.extend_from_slice(b"null");
            }
        }
        Value::Str(s) => {
            let _ = serde_json::to_writer(&mut *out, &**s);
        }
        Value::Bytes(b) => return Err(JsonError::Bytes { len: b.len() }),
        Value::List(items) | Value::Tuple(items) | Value::Set(items) | Value::FrozenSet(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json(item, out)?;
            }
            out.push(b']');
        }
        Value::Dict(dict) => {
            out.push(b'{');
            for (i, (k, v)) in dict.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                match k {
                    Value::Str(_) => write_json(k, out)?,
                    Value::Int(_) | Value::BigInt(_) => {
                        out.push(b'"');
                        write_json(k, out)?;
                        out.push(b'"');
                    }
                    other => {
                        return Err(JsonError::UnsupportedKey {
                            type_name: other.type_name(),
                        });
                    }
                }
                out.push(b':');
                write_json(v, out)?;
            }
            out.push(b'}');
        }
    }
    Ok(())
}

/// Parses JSON text (a snapshot exported as JSON) into a [`Value`]: objects become dicts with
/// `str` keys (a repeated key keeps its first position and its last value, as in Python),
/// arrays lists, integers `int` (beyond `u64`: `float`, as serde_json reads them), other
/// numbers `float`. Equal strings are interned: each distinct text is allocated once.
///
/// # Errors
/// serde_json's error for text that is not one JSON value, or that nests deeper than 128 levels.
pub fn from_json(text: &str) -> Result<Value, serde_json::Error> {
    let interner = Interner::default();
    let mut de = serde_json::Deserializer::from_str(text);
    let value = ValueSeed(&interner).deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

#[derive(Default)]
struct Interner {
    strings: RefCell<HashSet<Interned>>,
}

/// A shared string looked up by its text.
#[derive(PartialEq, Eq, Hash)]
struct Interned(Shared<String>);

impl std::borrow::Borrow<str> for Interned {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl Interner {
    fn intern(&self, s: &str) -> Shared<String> {
        let mut strings = self.strings.borrow_mut();
        if let Some(found) = strings.get(s) {
            return found.0.clone();
        }
        let new = Shared::new(s.to_owned());
        strings.insert(Interned(new.clone()));
        new
    }
}

#[derive(Clone, Copy)]
struct ValueSeed<'i>(&'i Interner);

impl<'de> DeserializeSeed<'de> for ValueSeed<'_> {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, de: D) -> Result<Value, D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::None)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_i64<E>(self, i: i64) -> Result<Value, E> {
        Ok(Value::Int(i))
    }

    fn visit_u64<E>(self, u: u64) -> Result<Value, E> {
        let mut bytes = u.to_le_bytes().to_vec();
        bytes.push(0);
        Ok(Value::int_from_le_bytes(&bytes))
    }

    fn visit_f64<E>(self, f: f64) -> Result<Value, E> {
        Ok(Value::Float(f))
    }

    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::Str(self.0.intern(s)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Value::list(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut entries: Vec<(Value, Value)> = Vec::new();
        let mut index: Option<Box<KeyIndex>> = None;
        while let Some(k) = map.next_key_seed(self)? {
            let v = map.next_value_seed(self)?;
            // JSON keys are strings, always hashable.
            let _ = key::insert(&mut entries, &mut index, (k, v));
        }
        Ok(Value::Dict(Dict::from_entries(entries)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trip() {
        let text = r#"{"a":[1,-2,3.5,null,true,"x"],"b":{"a":1,"a":2},"big":18446744073709551615}"#;
        let value = from_json(text).unwrap();
        let b = value.get("b").unwrap().as_dict().unwrap();
        assert_eq!(b.len(), 1);
        assert_eq!(b.get("a"), Some(&Value::Int(2)));
        assert_eq!(
            value.to_json_string().unwrap(),
            r#"{"a":[1,-2,3.5,null,true,"x"],"b":{"a":2},"big":18446744073709551615}"#
        );
    }

    #[test]
    fn json_export_rules() {
        let v = Value::dict(vec![
            (Value::Int(7), Value::Float(f64::NAN)),
            (
                Value::str("t"),
                Value::tuple(vec![Value::Float(f64::INFINITY), Value::Float(0.5)]),
            ),
        ]);
        assert_eq!(v.to_json_string().unwrap(), r#"{"7":null,"t":[null,0.5]}"#);
        let bad = Value::dict(vec![(Value::None, Value::None)]);
        assert_eq!(
            bad.to_json_string(),
            Err(JsonError::UnsupportedKey {
                type_name: "NoneType"
            })
        );
        let bytes = Value::bytes(b"ab");
        assert_eq!(bytes.to_json_string(), Err(JsonError::Bytes { len: 2 }));
    }
}
