//! No import circle among c10-cuda's modules: every `crate::<module>` path of `src/` (in `use`
//! lines and inline, comments and doc comments left out) is an edge from the file's top-level
//! module to that module; the graph must have no strongly connected component of two or more
//! modules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The text of a file without `//` comments (doc comments included).
fn code(text: &str) -> String {
    text.lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every module named after `crate::` in `code`, and inside `use crate::{...}` groups.
fn referenced(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // The first name of every item at the group's top level.
            let (mut depth, mut start) = (0usize, true);
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && depth == 0 && is_ident(c) => {
                        start = false;
                        out.insert(group[i..].chars().take_while(|&c| is_ident(c)).collect());
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(rest.chars().take_while(|&c| is_ident(c)).collect());
        }
    }
    out
}

/// The import graph: top-level module -> the modules it names.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let module = |p: &Path| -> String {
        let rel = p.strip_prefix(&src).expect("under src/");
        let first = rel.components().next().expect("a component");
        let name = first.as_os_str().to_string_lossy();
        name.trim_end_matches(".rs").to_string()
    };
    let modules: BTreeSet<String> = files.iter().map(|p| module(p)).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let m = module(f);
        if m == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(f).expect("a readable source file");
        let targets = edges.entry(m.clone()).or_default();
        for t in referenced(&code(&text)) {
            if t != m && t != "lib" && modules.contains(&t) {
                targets.insert(t);
            }
        }
    }
    edges
}

/// Strongly connected components (Tarjan), each sorted.
fn components(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        let edges: &'a BTreeMap<String, BTreeSet<String>> = s.edges;
        let next: Vec<&'a str> = edges
            .get(v)
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        for w in next {
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = s.stack.pop().expect("v is on the stack");
                s.on_stack.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            comp.sort();
            s.out.push(comp);
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

#[test]
fn no_import_circle() {
    let edges = graph();
    assert!(edges.len() > 30, "found only {} modules", edges.len());
    // The allocator's own file imports no file that holds its impl blocks.
    assert!(edges["release"].contains("allocator"));
    let circles: Vec<Vec<String>> = components(&edges)
        .into_iter()
        .filter(|c| c.len() > 1)
        .collect();
    assert!(circles.is_empty(), "import circles: {circles:?}");
}

#[test]
fn the_checker_sees_a_circle() {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    edges.insert("a".into(), ["b".to_string()].into());
    edges.insert("b".into(), ["c".to_string()].into());
    edges.insert("c".into(), ["a".to_string()].into());
    edges.insert("d".into(), ["a".to_string()].into());
    let big: Vec<Vec<String>> = components(&edges)
        .into_iter()
        .filter(|c| c.len() > 1)
        .collect();
    assert_eq!(big, vec![vec!["a".to_string(), "b".into(), "c".into()]]);
    assert_eq!(
        referenced("use crate::{block::{A, B}, stats};\nlet x = crate::oom::f();"),
        ["block", "oom", "stats"].map(String::from).into()
    );
}
