//! Python's dict-key and set-member equality, and the index that merges duplicate keys.
//!
//! Python merges equal keys (`{1: 'a', True: 'b'} == {1: 'b'}`), so the decoder does too:
//! [`key_eq`] and [`key_hash`] follow Python's rules for hashable builtins (numbers compare across
//! `bool`/`int`/`float`, `str` and `bytes` never equal each other, tuples and frozensets by
//! content). Small containers are searched linearly; from [`INDEX_FROM`] entries on a hash index
//! keeps insertion linear-time even for hostile inputs with many keys.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};

use crate::value::{Shared, Value};

/// From this many entries on, a container being built gets a hash index.
const INDEX_FROM: usize = 12;

/// Whether Python could use `v` as a dict key or set member (it is hashable).
#[inline]
pub(crate) fn is_hashable(v: &Value) -> bool {
    match v {
        Value::List(_) | Value::Dict(_) | Value::Set(_) => false,
        Value::Tuple(items) => items.iter().all(is_hashable),
        _ => true,
    }
}

/// A number, for Python's cross-type numeric comparison.
enum Num<'a> {
    Int(i64),
    /// Two's-complement little-endian bytes, outside `i64`.
    Big(&'a [u8]),
    /// A float that is not an integer (or is an integer beyond `i64`, which then compares
    /// through [`float_to_big`]).
    Float(f64),
}

fn as_num(v: &Value) -> Option<Num<'_>> {
    match v {
        Value::Bool(b) => Some(Num::Int(i64::from(*b))),
        Value::Int(i) => Some(Num::Int(*i)),
        Value::BigInt(b) => Some(Num::Big(b.as_le_bytes())),
        Value::Float(f) => Some(match float_to_i64(*f) {
            Some(i) => Num::Int(i),
            None => Num::Float(*f),
        }),
        _ => None,
    }
}

/// `f` as an `i64` when it is an integer in range.
fn float_to_i64(f: f64) -> Option<i64> {
    // -2^63 is exact; 2^63 is out of range.
    if f.fract() == 0.0 && (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&f)
    {
        Some(f as i64)
    } else {
        None
    }
}

/// The minimal two's-complement little-endian bytes of an integral float outside `i64`.
fn float_to_big(f: f64) -> Option<Vec<u8>> {
    if !f.is_finite() || f.fract() != 0.0 {
        return None;
    }
    let bits = f.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i64 - 1075;
    let mantissa = (bits & ((1 << 52) - 1)) | (1 << 52);
    if exp < 0 {
        return None; // |f| < 2^53: fits in i64, handled by float_to_i64
    }
    let shift = exp as usize;
    let mut bytes = vec![0u8; shift / 8 + 9];
    let wide = u128::from(mantissa) << (shift % 8);
    for (i, b) in wide.to_le_bytes().iter().enumerate() {
        if shift / 8 + i < bytes.len() {
            bytes[shift / 8 + i] = *b;
        }
    }
    if f < 0.0 {
        bytes = crate::value::negate_twos_complement(&bytes);
    }
    Some(crate::value::trim_twos_complement(&bytes).to_vec())
}

/// Python's `a == b` for two hashable values.
#[inline]
pub(crate) fn key_eq(a: &Value, b: &Value) -> bool {
    // The common case first: string keys.
    match (a, b) {
        (Value::Str(x), Value::Str(y)) => Shared::ptr_eq(x, y) || x == y,
        (Value::Str(_), _) | (_, Value::Str(_)) => false,
        _ => key_eq_other(a, b),
    }
}

fn key_eq_other(a: &Value, b: &Value) -> bool {
    if let (Some(x), Some(y)) = (as_num(a), as_num(b)) {
        return match (x, y) {
            (Num::Int(x), Num::Int(y)) => x == y,
            (Num::Big(x), Num::Big(y)) => x == y,
            (Num::Float(x), Num::Float(y)) => x == y,
            (Num::Big(x), Num::Float(f)) | (Num::Float(f), Num::Big(x)) => {
                float_to_big(f).is_some_and(|fb| fb == x)
            }
            _ => false,
        };
    }
    match (a, b) {
        (Value::None, Value::None) => true,
        (Value::Str(x), Value::Str(y)) => Shared::ptr_eq(x, y) || x == y,
        (Value::Bytes(x), Value::Bytes(y)) => Shared::ptr_eq(x, y) || x == y,
        (Value::Tuple(x), Value::Tuple(y)) => {
            Shared::ptr_eq(x, y)
                || (x.len() == y.len() && x.iter().zip(y.iter()).all(|(p, q)| key_eq(p, q)))
        }
        (Value::FrozenSet(x), Value::FrozenSet(y)) => {
            // Both hold distinct members: equal when every member of one is in the other.
            x.len() == y.len() && {
                let mut hashed: Vec<(u64, &Value)> = y.iter().map(|v| (key_hash(v), v)).collect();
                hashed.sort_unstable_by_key(|(h, _)| *h);
                x.iter().all(|v| {
                    let h = key_hash(v);
                    let start = hashed.partition_point(|(k, _)| *k < h);
                    hashed[start..]
                        .iter()
                        .take_while(|(k, _)| *k == h)
                        .any(|(_, w)| key_eq(v, w))
                })
            }
        }
        _ => false,
    }
}

thread_local! {
    /// Per-thread random hash keys (SipHash), so hostile keys cannot be chosen to collide.
    static HASH_STATE: RandomState = RandomState::new();
}

/// A hash consistent with [`key_eq`] (equal keys hash equal).
pub(crate) fn key_hash(v: &Value) -> u64 {
    let mut h = HASH_STATE.with(|s| s.build_hasher());
    hash_into(v, &mut h);
    h.finish()
}

fn hash_into(v: &Value, h: &mut impl Hasher) {
    if let Some(n) = as_num(v) {
        match n {
            Num::Int(i) => (0u8, i).hash(h),
            Num::Big(b) => (1u8, b).hash(h),
            Num::Float(f) => match float_to_big(f) {
                Some(b) => (1u8, &b[..]).hash(h),
                None => (2u8, f.to_bits()).hash(h),
            },
        }
        return;
    }
    match v {
        Value::Str(s) => (3u8, &**s).hash(h),
        Value::Bytes(b) => (4u8, &**b).hash(h),
        Value::Tuple(items) => {
            (5u8, items.len()).hash(h);
            for item in items.iter() {
                hash_into(item, h);
            }
        }
        Value::FrozenSet(items) => {
            // Order-independent: a wrapping sum of the members' hashes.
            let sum = items
                .iter()
                .fold(0u64, |acc, m| acc.wrapping_add(key_hash(m)));
            (6u8, items.len(), sum).hash(h);
        }
        _ => 7u8.hash(h),
    }
}

/// Something stored under a key: a set member (its own key) or a dict entry.
pub(crate) trait Keyed {
    fn key(&self) -> &Value;
    /// Python's behaviour when an equal key is inserted again.
    fn merge(&mut self, new: Self);
}

impl Keyed for Value {
    fn key(&self) -> &Value {
        self
    }
    /// `set.add` of an equal member keeps the old one.
    fn merge(&mut self, _new: Value) {}
}

impl Keyed for (Value, Value) {
    fn key(&self) -> &Value {
        &self.0
    }
    /// `d[k] = v` with an equal key keeps the old key and its position, takes the new value.
    fn merge(&mut self, new: (Value, Value)) {
        self.1 = new.1;
    }
}

/// Hash chains over a container's entries: `heads[hash]` is the newest entry with that hash,
/// `next[i]` the previous entry with the same hash as entry `i` (or `u32::MAX`).
#[derive(Default)]
pub(crate) struct KeyIndex {
    heads: HashMap<u64, u32>,
    next: Vec<u32>,
}

impl KeyIndex {
    fn add(&mut self, hash: u64, index: usize) {
        let prev = self.heads.insert(hash, index as u32).unwrap_or(u32::MAX);
        self.next.push(prev);
    }
}

/// Inserts `new` into `items` with Python's merging of equal keys.
///
/// # Errors
/// The key's Python type name when the key is unhashable (a list, dict or set).
#[inline]
pub(crate) fn insert<T: Keyed>(
    items: &mut Vec<T>,
    index: &mut Option<Box<KeyIndex>>,
    new: T,
) -> Result<(), &'static str> {
    let key = new.key();
    if !is_hashable(key) {
        return Err(key.type_name());
    }
    if index.is_none() && items.len() < INDEX_FROM {
        if let Some(old) = items.iter_mut().find(|old| key_eq(old.key(), key)) {
            old.merge(new);
        } else {
            items.push(new);
        }
        return Ok(());
    }
    insert_indexed(items, index, new)
}

fn insert_indexed<T: Keyed>(
    items: &mut Vec<T>,
    index: &mut Option<Box<KeyIndex>>,
    new: T,
) -> Result<(), &'static str> {
    let key = new.key();
    let idx = index.get_or_insert_with(|| {
        let mut idx = Box::<KeyIndex>::default();
        for (i, item) in items.iter().enumerate() {
            idx.add(key_hash(item.key()), i);
        }
        idx
    });
    let hash = key_hash(key);
    let mut cursor = idx.heads.get(&hash).copied().unwrap_or(u32::MAX);
    while cursor != u32::MAX {
        let i = cursor as usize;
        if key_eq(items[i].key(), key) {
            items[i].merge(new);
            return Ok(());
        }
        cursor = idx.next[i];
    }
    idx.add(hash, items.len());
    items.push(new);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_compare_across_types() {
        assert!(key_eq(&Value::Int(1), &Value::Bool(true)));
        assert!(key_eq(&Value::Int(1), &Value::Float(1.0)));
        assert!(!key_eq(&Value::Int(1), &Value::Float(1.5)));
        assert!(!key_eq(&Value::Float(f64::NAN), &Value::Float(f64::NAN)));
        assert_eq!(key_hash(&Value::Int(1)), key_hash(&Value::Float(1.0)));
        let two_pow_70 = Value::int_from_le_bytes(&[0, 0, 0, 0, 0, 0, 0, 0, 0x40, 0]);
        assert!(key_eq(&two_pow_70, &Value::Float(2f64.powi(70))));
        assert!(key_eq(
            &Value::Float(-(2f64.powi(70))),
            &Value::int_from_le_bytes(&[0, 0, 0, 0, 0, 0, 0, 0, 0xc0])
        ));
        assert_eq!(
            key_hash(&two_pow_70),
            key_hash(&Value::Float(2f64.powi(70)))
        );
        assert!(!key_eq(&Value::str("a"), &Value::bytes(b"a")));
    }

    #[test]
    fn insert_merges_like_python() {
        let mut items: Vec<(Value, Value)> = Vec::new();
        let mut index = None;
        for i in 0..100 {
            insert(&mut items, &mut index, (Value::Int(i % 40), Value::Int(i))).unwrap();
        }
        insert(&mut items, &mut index, (Value::Bool(true), Value::str("t"))).unwrap();
        assert_eq!(items.len(), 40);
        assert_eq!(items[1], (Value::Int(1), Value::str("t")));
        assert_eq!(items[0], (Value::Int(0), Value::Int(80)));
        let err = insert(&mut items, &mut index, (Value::list(vec![]), Value::None));
        assert_eq!(err, Err("list"));
    }

    #[test]
    fn frozensets_compare_unordered() {
        let a = Value::FrozenSet(Shared::new(vec![Value::Int(1), Value::str("x")]));
        let b = Value::FrozenSet(Shared::new(vec![Value::str("x"), Value::Float(1.0)]));
        assert!(key_eq(&a, &b));
        assert_eq!(key_hash(&a), key_hash(&b));
    }
}
