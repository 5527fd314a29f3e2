//! Pickles written by CPython (protocols 0 to 5, in `tests/data/`) decode to the values that
//! CPython pickled; the handcrafted Python 2 string opcodes decode as documented (Latin-1).
//!
//! The files were written with CPython 3.11:
//! ```python
//! x = {'k': 'v'}
//! plain = {'int': 1, 'neg': -5, 'big': 2**70, 'nbig': -2**64, 'i64max': 2**63 - 1,
//!          'i64min': -2**63, 'f': 1.5, 's': 'h\xe9llo\n\\ \U0001F600', 'l': [1, 2, 3],
//!          't': (1, 'a'), 't4': (1, 2, 3, 4), 'e': (), 'n': None, 'T': True, 'F': False,
//!          'shared': [x, x], 'nested': [[[]]], 'd2': {1: 'one'}, 'long': list(range(3)),
//!          'k300': 'x' * 300}
//! for p in range(6): open(f'plain_p{p}.pickle', 'wb').write(pickle.dumps(plain, protocol=p))
//! rich = {'b': b'\x00\x01', 'set': {1}, 'fs': frozenset({2}), 'bb': b'y' * 300}
//! for p in (4, 5): open(f'rich_p{p}.pickle', 'wb').write(pickle.dumps(rich, protocol=p))
//! open('bytearray_p5.pickle', 'wb').write(pickle.dumps(bytearray(b'xy'), protocol=5))
//! ```

use tensormem_pickle::{Shared, Value, decode};

fn data(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn ints(items: &[i64]) -> Vec<Value> {
    items.iter().map(|&i| Value::Int(i)).collect()
}

fn plain() -> Value {
    let s = Value::str;
    let shared = Value::dict(vec![(s("k"), s("v"))]);
    let two_pow_70 = Value::int_from_le_bytes(&[0, 0, 0, 0, 0, 0, 0, 0, 0x40, 0]);
    let minus_two_pow_64 = Value::int_from_le_bytes(&[0, 0, 0, 0, 0, 0, 0, 0, 0xff]);
    Value::dict(vec![
        (s("int"), Value::Int(1)),
        (s("neg"), Value::Int(-5)),
        (s("big"), two_pow_70),
        (s("nbig"), minus_two_pow_64),
        (s("i64max"), Value::Int(i64::MAX)),
        (s("i64min"), Value::Int(i64::MIN)),
        (s("f"), Value::Float(1.5)),
        (s("s"), s("h\u{e9}llo\n\\ \u{1F600}")),
        (s("l"), Value::list(ints(&[1, 2, 3]))),
        (s("t"), Value::tuple(vec![Value::Int(1), s("a")])),
        (s("t4"), Value::tuple(ints(&[1, 2, 3, 4]))),
        (s("e"), Value::tuple(vec![])),
        (s("n"), Value::None),
        (s("T"), Value::Bool(true)),
        (s("F"), Value::Bool(false)),
        (s("shared"), Value::list(vec![shared.clone(), shared])),
        (
            s("nested"),
            Value::list(vec![Value::list(vec![Value::list(vec![])])]),
        ),
        (s("d2"), Value::dict(vec![(Value::Int(1), s("one"))])),
        (s("long"), Value::list(ints(&[0, 1, 2]))),
        (s("k300"), s(&"x".repeat(300))),
    ])
}

#[test]
fn every_protocol_decodes_to_the_pickled_value() {
    let expected = plain();
    for protocol in 0..=5 {
        let bytes = data(&format!("plain_p{protocol}.pickle"));
        let value = decode(&bytes).unwrap_or_else(|e| panic!("protocol {protocol}: {e}"));
        assert_eq!(value, expected, "protocol {protocol}");
        // The memo made both references one dict.
        let shared = value.get("shared").and_then(Value::as_list).unwrap();
        match (&shared[0], &shared[1]) {
            (Value::Dict(a), Value::Dict(b)) => {
                assert!(
                    std::ptr::eq(a.entries(), b.entries()),
                    "protocol {protocol}"
                )
            }
            other => panic!("{other:?}"),
        }
        match value.get("big") {
            Some(Value::BigInt(b)) => {
                assert_eq!(b.to_string(), "1180591620717411303424")
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn bytes_sets_and_bytearrays_decode() {
    let expected = Value::dict(vec![
        (Value::str("b"), Value::bytes(b"\x00\x01")),
        (
            Value::str("set"),
            Value::Set(Shared::new(vec![Value::Int(1)])),
        ),
        (
            Value::str("fs"),
            Value::FrozenSet(Shared::new(vec![Value::Int(2)])),
        ),
        (Value::str("bb"), Value::bytes(&[b'y'; 300])),
    ]);
    for protocol in [4, 5] {
        let value = decode(&data(&format!("rich_p{protocol}.pickle"))).unwrap();
        assert_eq!(value, expected, "protocol {protocol}");
    }
    let value = decode(&data("bytearray_p5.pickle")).unwrap();
    assert_eq!(value, Value::bytes(b"xy"));
}

#[test]
fn python2_strings_decode_as_latin1() {
    assert_eq!(decode(b"S'abc'\n.").unwrap(), Value::str("abc"));
    // Python: pickle.loads(b'S"a\\\\x e\\xe9\\n"\n.', encoding='latin1') == 'a\\x e\xe9\n'
    assert_eq!(
        decode(b"S\"a\\\\x e\\xe9\\n\"\n.").unwrap(),
        Value::str("a\\x e\u{e9}\n")
    );
    assert_eq!(
        decode(b"T\x03\x00\x00\x00ab\xff.").unwrap(),
        Value::str("ab\u{ff}")
    );
    assert_eq!(decode(b"U\x02\xe9z.").unwrap(), Value::str("\u{e9}z"));
    assert_eq!(
        decode(b"Vcaf\xe9 \\u20ac\n.").unwrap(),
        Value::str("caf\u{e9} \u{20ac}")
    );
}

#[test]
fn protocol0_text_opcodes() {
    assert_eq!(decode(b"I42\n.").unwrap(), Value::Int(42));
    assert_eq!(decode(b"I01\n.").unwrap(), Value::Bool(true));
    assert_eq!(decode(b"L-7L\n.").unwrap(), Value::Int(-7));
    assert_eq!(decode(b"F-2.5e3\n.").unwrap(), Value::Float(-2500.0));
    assert!(matches!(decode(b"Fnan\n.").unwrap(), Value::Float(f) if f.is_nan()));
    // PUT and GET with text keys, DICT from a MARK, POP, POP_MARK, DUP; CPython gives
    // ('a', 3, 3).
    let v = decode(b"(S'a'\np7\nI1\nd0(g7\n(N1I3\n2t.").unwrap();
    assert_eq!(
        v,
        Value::tuple(vec![Value::str("a"), Value::Int(3), Value::Int(3)])
    );
}
