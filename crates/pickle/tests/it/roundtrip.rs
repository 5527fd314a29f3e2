//! `decode(encode(v)) == v` for arbitrary values, sharing kept, and the encoder's opcode choices.
//! (That CPython's `pickle.loads` reads `encode`'s output was checked by hand when the encoder
//! was written; tests here need no Python.)

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use tensormem_pickle::{Shared, Value, decode, encode};

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::None),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::Int),
        (-70_000i64..70_000).prop_map(Value::Int),
        proptest::collection::vec(any::<u8>(), 0..24).prop_map(|b| Value::int_from_le_bytes(&b)),
        any::<u64>().prop_map(|bits| Value::Float(f64::from_bits(bits))),
        ".{0,40}".prop_map(|s: String| Value::from(s)),
        proptest::collection::vec(any::<u8>(), 0..300).prop_map(|b| Value::bytes(&b)),
    ]
}

/// Values nested up to 4 levels; dict keys and set members are distinct (decoding merges
/// equal ones, as Python does), and some children are shared.
fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 96, 12, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..12).prop_map(Value::list),
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::tuple),
            proptest::collection::btree_map(".{0,8}", inner.clone(), 0..8).prop_map(|m| {
                Value::dict(m.into_iter().map(|(k, v)| (Value::from(k), v)).collect())
            }),
            proptest::collection::btree_map(any::<i64>(), inner.clone(), 0..4).prop_map(|m| {
                Value::dict(m.into_iter().map(|(k, v)| (Value::Int(k), v)).collect())
            }),
            proptest::collection::btree_set(any::<i32>(), 0..6).prop_map(|s: BTreeSet<i32>| {
                Value::Set(Shared::new(
                    s.into_iter().map(|i| Value::Int(i.into())).collect(),
                ))
            }),
            proptest::collection::btree_set(".{0,6}", 0..6).prop_map(|s: BTreeSet<String>| {
                Value::FrozenSet(Shared::new(s.into_iter().map(Value::from).collect()))
            }),
            // Sharing: the same child twice.
            inner.prop_map(|v| Value::list(vec![v.clone(), v])),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn decode_inverts_encode(v in value()) {
        let bytes = encode(&v);
        let back = decode(&bytes).expect("our own output decodes");
        prop_assert_eq!(back, v);
    }
}

#[test]
fn shared_children_stay_shared_and_are_written_once() {
    let frame = Value::dict(vec![
        (Value::str("filename"), Value::str("model.py")),
        (Value::str("line"), Value::Int(42)),
        (Value::str("name"), Value::str("forward")),
    ]);
    let frames = Value::list(vec![frame.clone(); 1000]);
    let bytes = encode(&frames);
    // One dict body, then 999 memo references of 2 bytes (BINGET) or 5 (LONG_BINGET).
    assert!(bytes.len() < 1000 * 5 + 100, "{} bytes", bytes.len());
    let back = decode(&bytes).unwrap();
    let items = back.as_list().unwrap();
    let first = items[0].as_dict().unwrap();
    assert!(
        items
            .iter()
            .all(|f| std::ptr::eq(f.as_dict().unwrap().entries(), first.entries()))
    );
    assert_eq!(back, frames);
}

#[test]
fn encoder_picks_cpythons_opcodes() {
    let cases: &[(Value, &[u8])] = &[
        (Value::None, b"N"),
        (Value::Bool(true), b"\x88"),
        (Value::Int(5), b"K\x05"),
        (Value::Int(300), b"M\x2c\x01"),
        (Value::Int(-1), b"J\xff\xff\xff\xff"),
        (Value::Int(1 << 40), b"\x8a\x06\x00\x00\x00\x00\x00\x01"),
        (
            Value::Int(i64::MIN),
            b"\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80",
        ),
        (Value::Float(1.5), b"G\x3f\xf8\x00\x00\x00\x00\x00\x00"),
        (Value::str("ab"), b"\x8c\x02ab"),
        (Value::bytes(b"ab"), b"C\x02ab"),
        (Value::tuple(vec![]), b")"),
        (Value::tuple(vec![Value::None, Value::None]), b"NN\x86"),
        (Value::tuple(vec![Value::None; 4]), b"(NNNNt"),
        (Value::list(vec![]), b"]"),
        (Value::list(vec![Value::None]), b"]Na"),
        (Value::list(vec![Value::None; 2]), b"](NNe"),
        (Value::dict(vec![(Value::None, Value::None)]), b"}NNs"),
    ];
    for (value, body) in cases {
        let mut want = vec![0x80, 4];
        want.extend_from_slice(body);
        want.push(b'.');
        assert_eq!(encode(value), want, "{value:?}");
        assert_eq!(&decode(&want).unwrap(), value);
    }
}

#[test]
fn big_containers_are_batched_by_1000() {
    // Nones, so that no argument byte looks like an opcode.
    let list = Value::list(vec![Value::None; 2500]);
    let bytes = encode(&list);
    assert_eq!(bytes.iter().filter(|&&b| b == b'(').count(), 3); // MARK
    assert_eq!(bytes.iter().filter(|&&b| b == b'e').count(), 3); // APPENDS
    assert_eq!(decode(&bytes).unwrap(), list);
    let list = Value::list((0..2500).map(Value::Int).collect());
    assert_eq!(decode(&encode(&list)).unwrap(), list);
    let mut map = BTreeMap::new();
    for i in 0..2001i64 {
        map.insert(i, Value::None);
    }
    let dict = Value::dict(map.into_iter().map(|(k, v)| (Value::Int(k), v)).collect());
    assert_eq!(decode(&encode(&dict)).unwrap(), dict);
}

#[test]
fn duplicate_keys_merge_like_python() {
    // {'a': 1, 'b': 2, 'a': 3} as CPython writes SETITEMS: one 'a' key, at the first position,
    // holding 3; 1 and True are one key too.
    let v =
        tensormem_pickle::decode(b"}(\x8c\x01aK\x01\x8c\x01bK\x02\x8c\x01aK\x03K\x01N\x88\x88u.")
            .unwrap();
    let d = v.as_dict().unwrap();
    assert_eq!(d.len(), 3);
    assert_eq!(d.get("a"), Some(&Value::Int(3)));
    assert_eq!(d.entries()[0].0, Value::str("a"));
    assert_eq!(d.entries()[2], (Value::Int(1), Value::Bool(true)));
}

#[test]
fn from_reader_reads_to_the_end() {
    let v = Value::list(vec![Value::str("x"), Value::Int(7)]);
    let bytes = encode(&v);
    assert_eq!(tensormem_pickle::from_reader(&bytes[..]).unwrap(), v);
    assert_eq!(tensormem_pickle::from_slice(&bytes).unwrap(), v);
}

#[test]
fn json_import_refuses_bad_text() {
    assert!(tensormem_pickle::from_json("{\"a\": [1, 2}").is_err());
    assert!(tensormem_pickle::from_json("1 2").is_err());
    let deep = "[".repeat(200) + &"]".repeat(200);
    assert!(tensormem_pickle::from_json(&deep).is_err());
}
