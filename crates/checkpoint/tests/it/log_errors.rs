//! Bad logs give one error naming the line, never a panic; good logs round-trip through the
//! writer byte for byte.

use crate::support;

use checkpoint::log::{self, Event, LogError};
use checkpoint::{LogWriter, sim};
use rstest::rstest;

/// A small well-formed log in the paper's format (line 1 is START).
const GOOD: &str = r#"{"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}
{"INSTRUCTION":"CONSTANT","NAME":"x1"}
{"INSTRUCTION":"MEMORY","MEMORY":"64","NAME":"x1"}
{"DST":"x2","INSTRUCTION":"COPY","SRC":"x1"}
{"ARGS":["x2"],"INSTRUCTION":"CALL","NAME":"relu","RESULT":["x3"],"TIME":"100"}
{"INSTRUCTION":"MEMORY","MEMORY":"128","NAME":"x3"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"x3"}
{"ARGS":["x3"],"INSTRUCTION":"CALL","NAME":"view","RESULT":["x4"],"TIME":"5"}
{"INSTRUCTION":"MEMORY","MEMORY":"128","NAME":"x4"}
{"ALIAS":"0","INSTRUCTION":"ALIAS","NAME":"x4"}
{"ARGS":["x4","x1"],"INSTRUCTION":"MUTATE","MUTATE":[0],"NAME":"add_","TIME":"20"}
{"INSTRUCTION":"RELEASE","NAME":"x3"}
{"ANNOTATION":"BACKWARD","INSTRUCTION":"ANNOTATE"}
{"DST":"x2","INSTRUCTION":"COPY_FROM","SRC":"x4"}
{"INSTRUCTION":"RELEASE","NAME":"x2"}
"#;

#[test]
fn good_log_parses_and_runs() {
    let lg = log::parse(GOOD).expect("parses");
    assert_eq!(lg.events.len(), 10);
    assert_eq!(lg.names, ["x1", "x2", "x3", "x4"]);
    assert_eq!(lg.op_count(), 3);
    assert_eq!(lg.total_time_ns(), 125);
    match &lg.events[4].event {
        Event::Call { results, .. } => {
            assert_eq!(results[0].alias, Some(0));
            assert_eq!(results[0].bytes, 128);
        }
        other => panic!("expected the view CALL, got {other:?}"),
    }
    assert_eq!(lg.events[4].line, 8);
    let base = sim::baseline(&lg).expect("runs");
    // x1 (64) + x3 (128) + the mutated copy of x3's storage (128).
    assert_eq!(base.peak_bytes, 320);
    assert_eq!(base.compute_ns, 125);
}

#[test]
fn writer_round_trips_the_good_log() {
    let lg = log::parse(GOOD).expect("parses");
    let mut w = LogWriter::new(Vec::new());
    w.write_log(&lg).unwrap();
    assert_eq!(String::from_utf8(w.into_inner().unwrap()).unwrap(), GOOD);
}

/// Every shared log written back is byte-identical to the file (they all start with START).
#[test]
fn writer_round_trips_the_shared_logs() {
    let Some(dir) = support::dtr_logs_dir() else {
        return;
    };
    for model in support::LOGS {
        let path = support::log_path(&dir, model);
        let text = std::fs::read_to_string(&path).unwrap();
        let lg = log::parse(&text).expect("parses");
        let mut w = LogWriter::new(Vec::new());
        w.write_log(&lg).unwrap();
        let out = String::from_utf8(w.into_inner().unwrap()).unwrap();
        assert!(
            out == text,
            "{model}: the written log differs from the file"
        );
    }
}

fn replace_line(n: usize, with: &str) -> String {
    GOOD.lines()
        .enumerate()
        .map(|(i, l)| if i + 1 == n { with } else { l })
        .collect::<Vec<_>>()
        .join("\n")
}

#[rstest]
#[case::unknown_instruction(
    3,
    r#"{"INSTRUCTION":"FROB","NAME":"x1"}"#,
    "line 3: unknown instruction 'FROB'"
)]
#[case::missing_field(
    5,
    r#"{"ARGS":["x2"],"INSTRUCTION":"CALL","NAME":"relu","RESULT":["x3"]}"#,
    "line 5: CALL has no TIME field"
)]
#[case::non_numeric_time(
    5,
    r#"{"ARGS":["x2"],"INSTRUCTION":"CALL","NAME":"relu","RESULT":["x3"],"TIME":"fast"}"#,
    "line 5: field TIME is not a number: 'fast'"
)]
#[case::non_numeric_memory(
    6,
    r#"{"INSTRUCTION":"MEMORY","MEMORY":"-128","NAME":"x3"}"#,
    "line 6: field MEMORY is not a number: '-128'"
)]
#[case::unknown_arg(
    5,
    r#"{"ARGS":["x9"],"INSTRUCTION":"CALL","NAME":"relu","RESULT":["x3"],"TIME":"100"}"#,
    "line 5: unknown name 'x9'"
)]
#[case::unknown_release(
    12,
    r#"{"INSTRUCTION":"RELEASE","NAME":"x77"}"#,
    "line 12: unknown name 'x77'"
)]
#[case::unknown_copy_src(
    4,
    r#"{"DST":"x2","INSTRUCTION":"COPY","SRC":"x0"}"#,
    "line 4: unknown name 'x0'"
)]
#[case::redefined(
    4,
    r#"{"DST":"x1","INSTRUCTION":"COPY","SRC":"x1"}"#,
    "line 4: name 'x1' is already defined"
)]
#[case::alias_out_of_range(
    10,
    r#"{"ALIAS":"3","INSTRUCTION":"ALIAS","NAME":"x4"}"#,
    "line 10: ALIAS index 3 is out of range for 1 argument(s)"
)]
#[case::mutate_out_of_range(
    11,
    r#"{"ARGS":["x4","x1"],"INSTRUCTION":"MUTATE","MUTATE":[2],"NAME":"add_","TIME":"20"}"#,
    "line 11: MUTATE index 2 is out of range for 2 argument(s)"
)]
#[case::memory_missing(
    6,
    r#"{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"x3"}"#,
    "line 6: expected MEMORY for x3, found ALIAS for x3"
)]
#[case::stray_memory(
    4,
    r#"{"INSTRUCTION":"MEMORY","MEMORY":"1","NAME":"x1"}"#,
    "line 4: expected an instruction (MEMORY and ALIAS only follow CONSTANT or CALL), found MEMORY for x1"
)]
#[case::not_json(2, r#"{"INSTRUCTION":"CONSTANT","#, "line 2: invalid JSON")]
#[case::not_an_object(2, r#"["CONSTANT"]"#, "line 2: expected a JSON object")]
#[case::wrong_type(
    5,
    r#"{"ARGS":"x2","INSTRUCTION":"CALL","NAME":"relu","RESULT":["x3"],"TIME":"100"}"#,
    "line 5: field ARGS must be an array of strings"
)]
fn bad_logs_name_the_line(#[case] line: usize, #[case] text: &str, #[case] message: &str) {
    let err = log::parse(&replace_line(line, text)).expect_err("must be refused");
    assert_eq!(err.line(), Some(line), "{err}");
    let shown = err.to_string();
    assert!(shown.starts_with(message), "got: {shown}");
}

#[test]
fn truncated_call_names_the_call_line() {
    let text: String = GOOD.lines().take(6).collect::<Vec<_>>().join("\n");
    let err = log::parse(&text).expect_err("the ALIAS line is missing");
    assert_eq!(
        err.to_string(),
        "line 6: expected ALIAS for x3, found the end of the log"
    );
}

#[test]
fn io_errors_name_the_path() {
    let err = log::parse_file(std::path::Path::new("/nonexistent/x.log")).unwrap_err();
    assert!(matches!(err, LogError::Io { .. }));
    assert_eq!(err.line(), None);
    assert!(err.to_string().starts_with("/nonexistent/x.log: "));
}

#[test]
fn release_twice_is_a_runtime_error_with_the_line() {
    let text = format!("{GOOD}{}\n", r#"{"INSTRUCTION":"RELEASE","NAME":"x3"}"#);
    let lg = log::parse(&text).expect("names are known");
    let err = sim::baseline(&lg).expect_err("x3 has no reference left");
    assert_eq!(err.line, 16);
    assert!(err.to_string().starts_with("line 16: tensor "), "{err}");
}

#[test]
fn an_empty_or_blank_log_is_an_error_not_an_empty_run() {
    for text in ["", "\n\n", "   \n"] {
        let err = checkpoint::log::parse(text).expect_err("an empty log must be refused");
        assert!(matches!(err, checkpoint::log::LogError::Empty));
        assert_eq!(err.line(), None);
        assert_eq!(
            err.to_string(),
            "the log is empty: no instruction on any line"
        );
    }
}

/// `good.log.gz`: [`GOOD`] compressed by Python's `gzip` module (with a file name in the
/// header, as the `gzip` command writes it).
fn gz_fixture() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/good.log.gz")
}

#[test]
fn gzip_logs_parse_as_their_text() {
    let lg = log::parse_file(&gz_fixture()).expect("gzip log parses");
    assert_eq!(lg, log::parse(GOOD).unwrap());
    assert_eq!(lg.cost_annotation(), None);
}

#[rstest]
#[case::crc(|b: &mut Vec<u8>| { let n = b.len(); b[n - 6] ^= 1; }, "CRC-32 mismatch")]
#[case::length(|b: &mut Vec<u8>| { let n = b.len(); b[n - 2] ^= 1; }, "length mismatch")]
#[case::truncated(|b: &mut Vec<u8>| b.truncate(b.len() / 2), "broken deflate stream")]
#[case::method(|b: &mut Vec<u8>| b[2] = 7, "compression method 7 is not deflate")]
#[case::header(|b: &mut Vec<u8>| b.truncate(12), "too short for a gzip file")]
fn broken_gzip_is_one_error(#[case] spoil: fn(&mut Vec<u8>), #[case] message: &str) {
    let mut bytes = std::fs::read(gz_fixture()).unwrap();
    spoil(&mut bytes);
    let dir = std::env::temp_dir().join(format!("checkpoint-gz-{}-{message}", std::process::id()));
    std::fs::write(&dir, &bytes).unwrap();
    let e = log::parse_file(&dir).unwrap_err();
    let _ = std::fs::remove_file(&dir);
    assert!(matches!(e, LogError::Gzip { .. }), "{e}");
    assert!(e.to_string().contains(message), "{e}");
    assert_eq!(e.line(), None);
}

#[test]
fn the_cost_annotation_says_what_time_holds() {
    let text = GOOD.replacen(
        "\n",
        "\n{\"ANNOTATION\":\"COST flops torch.utils.flop_counter\",\"INSTRUCTION\":\"ANNOTATE\"}\n",
        1,
    );
    let lg = log::parse(&text).unwrap();
    assert_eq!(lg.cost_annotation(), Some("flops torch.utils.flop_counter"));
    // Annotations are no operations: the same compute and ops as without it.
    assert_eq!(lg.op_count(), 3);
    assert_eq!(lg.total_time_ns(), 125);
}
