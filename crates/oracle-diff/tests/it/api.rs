//! The scripts no PyTorch program can produce are refused before they run (issue 29), one
//! case per refused pattern, by the check, by our driver and by the command line; the probes
//! and what programs do pass.

use std::process::Command;

use c10_cuda::Rules;
use oracle_diff::api::{ApiError, check};
use oracle_diff::driver::{self, DriverError};
use oracle_diff::script::Script;
use rstest::rstest;

/// Case 240 of `cargo xtask oracle --torch 2.15.0 --cases 300 --seed 7` before the fix, as
/// shrunk: P0 released twice while begun (real torch 2.15.0 crashed with SIGSEGV on it).
const CASE_240: &str =
    "env PYTORCH_CUDA_ALLOC_CONF=max_non_split_rounding_mb:101,expandable_segments:True
env FAKECUDA_TOTAL_MEM=536870912
pool_create P0 mempool
pool_begin P0 all
alloc 10 60817408
pool_release P0
alloc 11 2097152
alloc 16 283115520
pool_release P0
free 16
free 10
alloc 48 247463936 1
";

fn parse(text: &str) -> Script {
    Script::parse(text).expect("the script parses")
}

#[rstest]
#[case::release_while_begun_case_240(
    CASE_240,
    "op 7 (`pool_release P0`): P0 is begun and its begin holds the last reference: use_mem_pool \
     and a capture release a pool only after pool_end"
)]
#[case::mempool_released_twice(
    "pool_create p\npool_begin p\npool_end p\npool_release p\npool_release p\npool_release p\n",
    "op 6 (`pool_release p`): p has no reference left to release (use count 0): a program \
     releases a pool once per use_mem_pool block or capture, and a MemPool once more when it \
     goes away"
)]
#[case::capture_released_twice(
    "pool_create g graph\npool_begin g 1\nalloc x 1MiB\npool_end g\npool_release g\npool_release g\n",
    "op 6 (`pool_release g`): g has no reference left to release (use count 0): a program \
     releases a pool once per use_mem_pool block or capture, and a MemPool once more when it \
     goes away"
)]
#[case::handle_released_never_begun(
    "pool_create h handle\npool_release h\n",
    "op 2 (`pool_release h`): h has no reference left to release (use count 0): a program \
     releases a pool once per use_mem_pool block or capture, and a MemPool once more when it \
     goes away"
)]
#[case::end_not_begun("pool_create p\npool_end p\n", "op 2 (`pool_end p`): p is not begun")]
#[case::begin_a_gone_mempool(
    "pool_create p\npool_release p\npool_begin p\n",
    "op 3 (`pool_begin p all`): p's MemPool has released its own reference (it is gone): no \
     program can use it again"
)]
#[case::delete_a_handle(
    "pool_create h handle\npool_begin h 1\npool_end h\npool_delete h\n",
    "op 4 (`pool_delete h`): h is not a MemPool (only a MemPool is deleted)"
)]
#[case::delete_twice(
    "pool_create p\npool_begin p 1\npool_end p\npool_delete p\npool_delete p\n",
    "op 5 (`pool_delete p`): p's MemPool was deleted already (its destructor runs once)"
)]
#[case::begin_after_delete(
    "pool_create p\npool_begin p 1\npool_end p\npool_delete p\npool_begin p\n",
    "op 5 (`pool_begin p all`): p's MemPool was deleted already (its destructor runs once)"
)]
fn refused_patterns(#[case] text: &str, #[case] message: &str) {
    let s = parse(text);
    let e = check(&s).expect_err("refused");
    assert_eq!(e.to_string(), message);
    // Our driver (what campaigns, fixtures and `diff` run) refuses it the same way.
    match driver::run(&s, Rules::default()) {
        Err(DriverError::NotProducible(d)) => assert_eq!(d, e),
        other => panic!("the driver ran it: {other:?}"),
    }
}

/// What programs do passes: a `use_mem_pool` block, a capture into a MemPool released after
/// the MemPool is gone (the graph keeps the id), a handle shared by two captures, a nested
/// begin the allocator itself refuses (an error both sides report), reads after the last
/// release.
#[rstest]
#[case::use_mem_pool_block(
    "pool_create p\npool_begin p\nalloc x 1MiB\npool_end p\npool_release p\npool_delete p\n"
)]
#[case::capture_outlives_its_mempool(
    "pool_create p\npool_begin p 1\nalloc x 1MiB\npool_end p\npool_delete p\npool_release p\n"
)]
#[case::handle_shared_by_two_captures(
    "pool_create h handle\npool_begin h 1\npool_end h\npool_begin h 2\npool_end h\npool_release h\npool_release h\n"
)]
#[case::second_begin_the_allocator_refuses(
    "pool_create p\npool_begin p\npool_begin p\npool_end p\npool_release p\n"
)]
#[case::reads_after_the_last_release(
    "pool_create p\npool_release p\nempty_cache p\nsnapshot p\npool_use_count p\n"
)]
fn programs_pass(#[case] text: &str) {
    check(&parse(text)).expect("a program makes these calls");
}

/// Every committed probe is one a program can produce.
#[test]
fn the_probes_pass() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/oracle/probes");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("the probes folder") {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|e| e == "ops") {
            let text = std::fs::read_to_string(&path).expect("read");
            if let Err(e) = check(&parse(&text)) {
                panic!("{}: {e}", path.display());
            }
            n += 1;
        }
    }
    assert!(n >= 20, "{n} probes");
}

/// The command line refuses such a script with one line and exit code 2, naming the file.
#[test]
fn the_command_line_refuses_with_one_line() {
    let dir = std::env::temp_dir().join(format!("oracle-diff-api-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    let path = dir.join("case240.ops");
    std::fs::write(&path, CASE_240).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_oracle-diff"))
        .args(["run", "--torch", "2.15"])
        .arg(&path)
        .output()
        .expect("run oracle-diff");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).expect("UTF-8");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("oracle-diff: error: ")
            && err.contains("case240.ops: not a script a PyTorch program can produce: op 7"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
}

/// The errors compare by value (the driver's wraps the check's).
#[test]
fn the_error_is_the_checks() {
    let e = check(&parse("pool_create p\npool_end p\n")).unwrap_err();
    assert!(matches!(e, ApiError::EndNotBegun { op: 2, .. }));
}
