//! Hostile and broken inputs: each is refused with the right [`DecodeError`] variant, never a
//! panic, a hang or a large allocation; the messages are pinned with an insta snapshot; and
//! random bytes and mutations of valid pickles never make the decoder panic.

use proptest::prelude::*;
use rstest::rstest;
use tensormem_pickle::{DecodeError, MAX_DEPTH, Value, decode, decode_exact, encode};

/// Which variant an input must give.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Empty,
    Truncated,
    NoStop,
    UnknownOpcode,
    Forbidden,
    StackUnderflow,
    NoMark,
    BadMemoKey,
    InvalidUtf8,
    RecursiveStructure,
    TooDeep,
    UnsupportedProtocol,
    Malformed,
}

fn kind(e: &DecodeError) -> Kind {
    match e {
        DecodeError::Empty => Kind::Empty,
        DecodeError::Truncated { .. } => Kind::Truncated,
        DecodeError::NoStop { .. } => Kind::NoStop,
        DecodeError::UnknownOpcode { .. } => Kind::UnknownOpcode,
        DecodeError::Forbidden { .. } => Kind::Forbidden,
        DecodeError::StackUnderflow { .. } => Kind::StackUnderflow,
        DecodeError::NoMark { .. } => Kind::NoMark,
        DecodeError::BadMemoKey { .. } => Kind::BadMemoKey,
        DecodeError::InvalidUtf8 { .. } => Kind::InvalidUtf8,
        DecodeError::RecursiveStructure { .. } => Kind::RecursiveStructure,
        DecodeError::TooDeep { .. } => Kind::TooDeep,
        DecodeError::UnsupportedProtocol { .. } => Kind::UnsupportedProtocol,
        DecodeError::Malformed { .. } => Kind::Malformed,
        other => panic!("unexpected variant {other:?}"),
    }
}

fn nested_lists(n: usize) -> Vec<u8> {
    let mut v = vec![b']'; n];
    v.extend(std::iter::repeat_n(b'a', n - 1));
    v.push(b'.');
    v
}

fn nested_tuples(n: usize) -> Vec<u8> {
    let mut v = vec![b'N'];
    v.extend(std::iter::repeat_n(0x85, n)); // TUPLE1
    v.push(b'.');
    v
}

fn with_len8(op: u8, len: u64) -> Vec<u8> {
    let mut v = vec![0x80, 4, op];
    v.extend_from_slice(&len.to_le_bytes());
    v.extend_from_slice(b"abc.");
    v
}

/// The hostile inputs, by name: (name, bytes, expected variant).
fn cases() -> Vec<(&'static str, Vec<u8>, Kind)> {
    vec![
        ("empty", vec![], Kind::Empty),
        (
            "global_os_system",
            b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00ls\x85R.".to_vec(),
            Kind::Forbidden,
        ),
        (
            "global_posix_system_proto0",
            b"cposix\nsystem\n(S'ls'\ntR.".to_vec(),
            Kind::Forbidden,
        ),
        (
            "stack_global_reduce",
            b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x02ls\x85R.".to_vec(),
            Kind::Forbidden,
        ),
        ("reduce", b"N)R.".to_vec(), Kind::Forbidden),
        ("build", b"}Nb.".to_vec(), Kind::Forbidden),
        (
            "inst",
            b"(ibuiltins\neval\nS'1'\n.".to_vec(),
            Kind::Forbidden,
        ),
        ("obj", b"(N)o.".to_vec(), Kind::Forbidden),
        ("newobj", b"N)\x81.".to_vec(), Kind::Forbidden),
        ("ext2", b"\x83\x01\x02.".to_vec(), Kind::Forbidden),
        ("persid", b"P1\n.".to_vec(), Kind::Forbidden),
        ("binpersid", b"NQ.".to_vec(), Kind::Forbidden),
        ("next_buffer", b"\x80\x05\x97.".to_vec(), Kind::Forbidden),
        (
            "binget_out_of_range",
            b"\x80\x02K\x01q\x00h\x05.".to_vec(),
            Kind::BadMemoKey,
        ),
        (
            "long_binget_never_stored",
            b"j\xff\xff\xff\xff.".to_vec(),
            Kind::BadMemoKey,
        ),
        (
            "long4_huge_length",
            b"\x8b\xff\xff\xff\x7f\x00.".to_vec(),
            Kind::Truncated,
        ),
        (
            "long4_negative_length",
            b"\x8b\xff\xff\xff\xff.".to_vec(),
            Kind::Malformed,
        ),
        (
            "binunicode8_2_pow_62",
            with_len8(0x8d, 1 << 62),
            Kind::Truncated,
        ),
        (
            "binbytes8_2_pow_64_minus_1",
            with_len8(0x8e, u64::MAX),
            Kind::Truncated,
        ),
        ("frame_2_pow_60", with_len8(0x95, 1 << 60), Kind::Truncated),
        (
            "invalid_utf8",
            b"\x8c\x02\xff\xfe.".to_vec(),
            Kind::InvalidUtf8,
        ),
        (
            "lone_surrogate",
            b"X\x03\x00\x00\x00\xed\xa0\x80.".to_vec(),
            Kind::InvalidUtf8,
        ),
        ("unknown_opcode_ff", b"\xff".to_vec(), Kind::UnknownOpcode),
        ("mark_never_closed", b"(N.".to_vec(), Kind::Malformed),
        ("mark_then_stop", b"(.".to_vec(), Kind::Malformed),
        ("two_values_at_stop", b"NN.".to_vec(), Kind::Malformed),
        ("stop_on_empty_stack", b".".to_vec(), Kind::StackUnderflow),
        (
            "append_on_empty_stack",
            b"\x80\x02a.".to_vec(),
            Kind::StackUnderflow,
        ),
        ("append_below_mark", b"](Na.".to_vec(), Kind::Malformed),
        ("appends_without_mark", b"]Ne.".to_vec(), Kind::NoMark),
        ("tuple_without_mark", b"Nt.".to_vec(), Kind::NoMark),
        ("append_to_dict", b"}Na.".to_vec(), Kind::Malformed),
        ("setitems_odd", b"}(Nu.".to_vec(), Kind::Malformed),
        ("unhashable_key", b"}]Ns.".to_vec(), Kind::Malformed),
        (
            "list_containing_itself",
            b"]q\x00h\x00a.".to_vec(),
            Kind::RecursiveStructure,
        ),
        (
            "dict_containing_itself",
            b"}q\x00K\x01h\x00s.".to_vec(),
            Kind::RecursiveStructure,
        ),
        (
            "append_after_dup",
            b"]2Na.".to_vec(),
            Kind::RecursiveStructure,
        ),
        (
            "lists_nested_too_deep",
            nested_lists(MAX_DEPTH + 1),
            Kind::TooDeep,
        ),
        (
            "tuples_nested_too_deep",
            nested_tuples(MAX_DEPTH + 1),
            Kind::TooDeep,
        ),
        (
            "protocol_6",
            b"\x80\x06N.".to_vec(),
            Kind::UnsupportedProtocol,
        ),
        ("no_stop", b"\x80\x02N".to_vec(), Kind::NoStop),
        ("binint_truncated", b"J\x01\x02".to_vec(), Kind::Truncated),
        ("line_without_newline", b"I12".to_vec(), Kind::Truncated),
        ("string_not_quoted", b"Sabc\n.".to_vec(), Kind::Malformed),
        ("int_not_decimal", b"I0x10\n.".to_vec(), Kind::Malformed),
        (
            "int_too_many_digits",
            [b"I".to_vec(), vec![b'7'; 5000], b"\n.".to_vec()].concat(),
            Kind::Malformed,
        ),
    ]
}

#[rstest]
#[case::empty("empty")]
#[case::global_os_system("global_os_system")]
#[case::global_posix_system_proto0("global_posix_system_proto0")]
#[case::stack_global_reduce("stack_global_reduce")]
#[case::reduce("reduce")]
#[case::build("build")]
#[case::inst("inst")]
#[case::obj("obj")]
#[case::newobj("newobj")]
#[case::ext2("ext2")]
#[case::persid("persid")]
#[case::binpersid("binpersid")]
#[case::next_buffer("next_buffer")]
#[case::binget_out_of_range("binget_out_of_range")]
#[case::long_binget_never_stored("long_binget_never_stored")]
#[case::long4_huge_length("long4_huge_length")]
#[case::long4_negative_length("long4_negative_length")]
#[case::binunicode8_2_pow_62("binunicode8_2_pow_62")]
#[case::binbytes8_2_pow_64_minus_1("binbytes8_2_pow_64_minus_1")]
#[case::frame_2_pow_60("frame_2_pow_60")]
#[case::invalid_utf8("invalid_utf8")]
#[case::lone_surrogate("lone_surrogate")]
#[case::unknown_opcode_ff("unknown_opcode_ff")]
#[case::mark_never_closed("mark_never_closed")]
#[case::mark_then_stop("mark_then_stop")]
#[case::two_values_at_stop("two_values_at_stop")]
#[case::stop_on_empty_stack("stop_on_empty_stack")]
#[case::append_on_empty_stack("append_on_empty_stack")]
#[case::append_below_mark("append_below_mark")]
#[case::appends_without_mark("appends_without_mark")]
#[case::tuple_without_mark("tuple_without_mark")]
#[case::append_to_dict("append_to_dict")]
#[case::setitems_odd("setitems_odd")]
#[case::unhashable_key("unhashable_key")]
#[case::list_containing_itself("list_containing_itself")]
#[case::dict_containing_itself("dict_containing_itself")]
#[case::append_after_dup("append_after_dup")]
#[case::lists_nested_too_deep("lists_nested_too_deep")]
#[case::tuples_nested_too_deep("tuples_nested_too_deep")]
#[case::protocol_6("protocol_6")]
#[case::no_stop("no_stop")]
#[case::binint_truncated("binint_truncated")]
#[case::line_without_newline("line_without_newline")]
#[case::string_not_quoted("string_not_quoted")]
#[case::int_not_decimal("int_not_decimal")]
#[case::int_too_many_digits("int_too_many_digits")]
fn hostile_input_is_refused(#[case] name: &str) {
    let (_, bytes, want) = cases()
        .into_iter()
        .find(|(n, _, _)| *n == name)
        .expect("case in the table");
    match decode(&bytes) {
        Ok(v) => panic!("{name}: decoded to {v:?}"),
        Err(e) => assert_eq!(kind(&e), want, "{name}: {e}"),
    }
}

#[test]
fn every_table_case_has_an_rstest_case() {
    // Keeps the rstest list above and the table in step.
    assert_eq!(cases().len(), 46);
}

#[test]
fn refusal_messages() {
    let text: String = cases()
        .iter()
        .map(|(name, bytes, _)| {
            let message = decode(bytes)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            format!("{name}: {message}\n")
        })
        .collect();
    insta::assert_snapshot!(text);
}

#[test]
fn forbidden_names_the_opcode_offset_and_callable() {
    match decode(b"\x80\x02cposix\nsystem\n.") {
        Err(DecodeError::Forbidden {
            opcode_name,
            offset,
            detail,
        }) => {
            assert_eq!((opcode_name, offset), ("GLOBAL", 2));
            assert!(detail.contains("`posix.system`"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn trailing_data_is_ignored_by_decode_and_refused_by_decode_exact() {
    assert_eq!(decode(b"N.garbage").unwrap(), Value::None);
    match decode_exact(b"N.garbage") {
        Err(DecodeError::TrailingData { offset, extra }) => assert_eq!((offset, extra), (2, 7)),
        other => panic!("{other:?}"),
    }
    let (v, used) = tensormem_pickle::decode_prefix(b"K\x05.K\x06.").unwrap();
    assert_eq!((v, used), (Value::Int(5), 3));
}

#[test]
fn large_sparse_memo_keys_cost_no_memory() {
    // LONG_BINPUT 2^32-1, POP, LONG_BINGET 2^32-1: a map entry, not a 4-billion-entry vector.
    let v = decode(b"Nr\xff\xff\xff\xff0j\xff\xff\xff\xff.").unwrap();
    assert_eq!(v, Value::None);
}

#[test]
fn nesting_at_the_limit_decodes() {
    assert!(decode(&nested_lists(MAX_DEPTH)).is_ok());
    assert!(decode(&nested_tuples(MAX_DEPTH - 1)).is_ok());
}

/// A small valid pickle that uses many opcodes.
fn sample() -> Vec<u8> {
    let shared = Value::dict(vec![(Value::str("filename"), Value::str("a.py"))]);
    encode(&Value::dict(vec![
        (
            Value::str("frames"),
            Value::list(vec![shared.clone(), shared]),
        ),
        (Value::str("addr"), Value::Int(139_833_534_054_400)),
        (
            Value::str("t"),
            Value::tuple(vec![Value::Int(-1), Value::Float(0.5)]),
        ),
        (Value::str("b"), Value::bytes(b"xyz")),
        (Value::str("n"), Value::None),
    ]))
}

#[test]
fn every_truncation_of_a_valid_pickle_is_an_error() {
    let mut inputs = vec![sample()];
    for p in 0..=5 {
        let path = format!(
            "{}/tests/data/plain_p{p}.pickle",
            env!("CARGO_MANIFEST_DIR")
        );
        inputs.push(std::fs::read(path).unwrap());
    }
    for bytes in inputs {
        assert!(decode(&bytes).is_ok());
        for len in 0..bytes.len() {
            assert!(
                decode(&bytes[..len]).is_err(),
                "prefix of {len} bytes decoded"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode(&bytes);
    }

    #[test]
    fn random_opcode_soup_never_panics(
        ops in proptest::collection::vec(
            prop::sample::select(b"(.012NKJM]})aestu\x85\x86\x87hq\x94\x8c\x88\x89\x8f\x90\x91".to_vec()),
            0..256,
        )
    ) {
        // Mostly argument-free opcodes, so the stack machine itself is exercised.
        let _ = decode(&ops);
    }

    #[test]
    fn mutated_pickles_never_panic(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        cut_it in any::<bool>(),
    ) {
        let mut bytes = sample();
        for (at, bits) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= bits;
        }
        if cut_it {
            bytes.truncate(cut.index(bytes.len() + 1));
        }
        let _ = decode(&bytes);
    }
}
