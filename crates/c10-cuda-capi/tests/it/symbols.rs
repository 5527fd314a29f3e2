//! `libtensormem_alloc.so` exports exactly the functions `include/tensormem_alloc.h` declares
//! (what `nm -D --defined-only` shows), read from its ELF dynamic symbol table with `object` so
//! the test needs no binutils.

use std::collections::BTreeSet;
use std::path::PathBuf;

use object::{Object, ObjectSymbol, SymbolKind};

/// The functions the header declares: each `tm_name(` at the start of a declaration.
fn declared() -> BTreeSet<String> {
    let header = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("include/tensormem_alloc.h"),
    )
    .unwrap();
    header
        .lines()
        .filter(|l| !l.trim_start().starts_with('*') && !l.trim_start().starts_with("/*"))
        .filter_map(|l| {
            let at = l.find("tm_")?;
            let rest = &l[at..];
            let end = rest.find('(')?;
            let name = &rest[..end];
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
                .then(|| name.to_string())
        })
        .collect()
}

#[test]
fn the_library_exports_the_documented_symbols() {
    let exe = std::env::current_exe().unwrap();
    let lib = exe.parent().unwrap().join("libtensormem_alloc.so");
    let data = std::fs::read(&lib).unwrap_or_else(|e| panic!("{}: {e}", lib.display()));
    let file = object::File::parse(&*data).unwrap();
    let exported: BTreeSet<String> = file
        .dynamic_symbols()
        .filter(|s| s.is_definition() && s.is_global())
        .map(|s| (s.name().unwrap().to_string(), s.kind()))
        .inspect(|(name, kind)| {
            assert_eq!(*kind, SymbolKind::Text, "{name} is a function");
        })
        .map(|(name, _)| name)
        .collect();
    let want: BTreeSet<String> = [
        "tm_empty_cache",
        "tm_free",
        "tm_last_error",
        "tm_malloc",
        "tm_memory_stats_json",
        "tm_memory_summary",
        "tm_record_history",
        "tm_record_stream",
        "tm_set_config",
        "tm_snapshot_pickle",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(declared(), want, "the header declares these");
    // Nothing else leaks out (Rust symbols stay hidden in a cdylib).
    assert_eq!(exported, want);
}
