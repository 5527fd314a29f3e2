//! Committed fixtures: scripts with the real allocator's decisions, checked by CI without the
//! oracle.
//!
//! A fixture file holds many cases, deflate-compressed. Each case is a script, the rules to
//! check it under (`all`: our default fixes; `none`: PyTorch's behaviour exactly, for a script
//! where a fix of ours makes a deliberate difference) and the oracle's output in the canonical
//! text of [`render`]: exactly what [`crate::compare`] compares (device calls, allocation
//! placement, OOMs, frees, syncs, snapshots; stats as their key count and non-zero values).
//!
//! Text format before compression:
//!
//! ```text
//! case NAME
//! fixes all|none
//! script
//! <script lines>
//! expect
//! <rendered oracle output>
//! end
//! ```

use std::fmt::Write as _;

use c10_cuda::rules::{Rules, TorchVersion};

use crate::compare::{Call, order_sensitive, stat_is_order_dependent, steps};
use crate::driver;
use crate::fake::FakeCuda;
use crate::script::Script;
use crate::trace::Line;

/// One committed case.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    /// Its name (the generator's case number, or a probe's name).
    pub name: String,
    /// `true`: checked under our default rules; `false`: under PyTorch-exact rules (the case
    /// shows a deliberate difference).
    pub with_fixes: bool,
    /// The script.
    pub script: Script,
    /// The oracle's output, rendered.
    pub expect: String,
}

/// A fixture file that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    /// Not deflate data.
    #[error("not a deflate stream: {0}")]
    Inflate(String),
    /// The text inside is malformed.
    #[error("fixture line {line}: {why}")]
    Format {
        /// 1-based line of the inflated text.
        line: usize,
        /// What is wrong.
        why: String,
    },
}

/// The canonical text of an output: one line per compared fact (with `order_sensitive`, the
/// stats [`stat_is_order_dependent`] leaves out are left out here too).
pub fn render(lines: &[Line], order_sensitive: bool) -> String {
    let mut out = String::new();
    for step in steps(lines) {
        render_memory(&mut out, &step.memory);
        if !step.events.is_empty() {
            let ev: Vec<String> = step.events.iter().map(Call::to_string).collect();
            let _ = writeln!(out, "  {}", ev.join("; "));
        }
        let Some(line) = step.line else { continue };
        match line {
            Line::Alloc {
                id,
                seg,
                offset,
                block,
                private_pool,
                ..
            } => {
                let _ = write!(out, "alloc {id} seg {seg} off {offset} block {block}");
                match private_pool {
                    Some(p) => {
                        let _ = writeln!(out, " in {p}");
                    }
                    None => out.push('\n'),
                }
            }
            Line::Pool {
                op,
                pool,
                id,
                use_count,
            } => {
                let _ = write!(out, "{op} {pool} ({}, {})", id.0, id.1);
                match use_count {
                    Some(n) => {
                        let _ = writeln!(out, " use_count {n}");
                    }
                    None => out.push('\n'),
                }
            }
            Line::Observe { observer } => {
                let _ = writeln!(out, "observe {observer}");
            }
            Line::OomObserver {
                observer,
                alloc,
                device_total,
                device_free,
            } => {
                let _ = writeln!(
                    out,
                    "oom_observer {observer} alloc {alloc} total {device_total} free {device_free}"
                );
            }
            Line::Oom { id, .. } => {
                let _ = writeln!(out, "oom {id}");
            }
            Line::Error { id, .. } => {
                let _ = writeln!(out, "error {}", id.unwrap_or_default());
            }
            Line::Free { id, pending } => {
                let _ = writeln!(out, "free {id}{}", if pending { " pending" } else { "" });
            }
            Line::Record { id, stream } => {
                let _ = writeln!(out, "record {id} {stream}");
            }
            Line::Sync { stream, completed } => {
                let s = stream.map_or("all".to_owned(), |s| s.to_string());
                let _ = writeln!(out, "sync {s} {completed}");
            }
            Line::Stats { last, stats, fake } => {
                let nonzero: Vec<String> = stats
                    .iter()
                    .filter(|(k, v)| **v != 0 && !(order_sensitive && stat_is_order_dependent(k)))
                    .map(|(k, v)| format!("{}={v}", short_key(k)))
                    .collect();
                let counters: Vec<String> = FakeCuda::counter_names()
                    .iter()
                    .map(|k| format!("{k}={}", fake.get(*k).copied().unwrap_or(-1)))
                    .collect();
                let _ = writeln!(
                    out,
                    "{} keys={} {}\n  fake {}",
                    if last { "final" } else { "stats" },
                    stats.len(),
                    nonzero.join(" "),
                    counters.join(" ")
                );
            }
            Line::Snapshot(segs) => {
                let _ = writeln!(out, "snapshot");
                for s in segs {
                    let blocks: Vec<String> = s
                        .blocks
                        .iter()
                        .map(|(o, sz, r, st)| match st.as_str() {
                            "active_allocated" => format!("{o}+{sz}/{r}:a"),
                            "active_pending_free" => format!("{o}+{sz}/{r}:p"),
                            // An inactive block's requested size is not compared.
                            _ => format!("{o}+{sz}:i"),
                        })
                        .collect();
                    let _ = writeln!(
                        out,
                        "  seg {} off {} size {} alloc {} active {} req {} stream {} {}{}{} [{}]",
                        s.seg,
                        s.offset,
                        s.total_size,
                        s.allocated_size,
                        s.active_size,
                        s.requested_size,
                        s.stream,
                        s.pool,
                        if s.pool_id == (0, 0) {
                            String::new()
                        } else {
                            format!(" pool ({}, {})", s.pool_id.0, s.pool_id.1)
                        },
                        if s.expandable { " expandable" } else { "" },
                        blocks.join(" ")
                    );
                }
            }
            Line::EmptyCache => out.push_str("empty_cache\n"),
            Line::SetFraction => out.push_str("set_fraction\n"),
            Line::ResetPeak => out.push_str("reset_peak\n"),
            Line::ResetAccumulated => out.push_str("reset_accumulated\n"),
            Line::Mark(t) => {
                let _ = writeln!(out, "mark {t}");
            }
            Line::Config { .. } | Line::Ev(_) => {}
        }
    }
    out
}

/// Memory calls, one a line, with each run of pages mapped (or unmapped) one after the other
/// in one reservation written once: `map(seg S + O, SIZE) x N`.
fn render_memory(out: &mut String, calls: &[Call]) {
    let mut i = 0;
    while i < calls.len() {
        let mut n = 1;
        if let Call::Map(size, seg, off) | Call::Unmap(size, seg, off) = calls[i] {
            while let Some(next) = calls.get(i + n) {
                let follows = match (&calls[i], next) {
                    (Call::Map(..), Call::Map(s2, g2, o2))
                    | (Call::Unmap(..), Call::Unmap(s2, g2, o2)) => {
                        *s2 == size && *g2 == seg && *o2 == off + size * n as u64
                    }
                    _ => false,
                };
                if !follows {
                    break;
                }
                n += 1;
            }
        }
        if n > 1 {
            let _ = writeln!(out, "  {} x {n}", calls[i]);
        } else {
            let _ = writeln!(out, "  {}", calls[i]);
        }
        i += n;
    }
}

/// A `memory_stats()` key in the fixtures' short spelling: the array's code, the pool's initial
/// (`a`ll, `s`mall, `l`arge) and the field's (`c`urrent, `p`eak, `a`llocated, `f`reed), e.g.
/// `inactive_split_bytes.large_pool.peak` -> `isb.l.p`; scalars keep their names.
pub fn short_key(key: &str) -> String {
    const CODES: [(&str, &str); 11] = [
        ("allocation", "al"),
        ("segment", "sg"),
        ("active", "ac"),
        ("inactive_split", "is"),
        ("allocated_bytes", "alb"),
        ("reserved_bytes", "rb"),
        ("active_bytes", "acb"),
        ("inactive_split_bytes", "isb"),
        ("requested_bytes", "rqb"),
        ("oversize_allocations", "oa"),
        ("oversize_segments", "os"),
    ];
    let parts: Vec<&str> = key.split('.').collect();
    let code = |s: &str| CODES.iter().find(|(k, _)| *k == s).map(|(_, c)| *c);
    match parts.as_slice() {
        [array, pool, field] => match code(array) {
            Some(c) => format!("{c}.{}.{}", &pool[..1], &field[..1]),
            None => key.to_owned(),
        },
        [stat, field] => match code(stat) {
            Some(c) => format!("{c}.{}", &field[..1]),
            None => key.to_owned(),
        },
        _ => key.to_owned(),
    }
}

/// The text of a fixture file (before compression).
pub fn to_text(cases: &[Case]) -> String {
    let mut s = String::new();
    for c in cases {
        let _ = write!(
            s,
            "case {}\nfixes {}\nscript\n{}expect\n{}end\n",
            c.name,
            if c.with_fixes { "all" } else { "none" },
            c.script,
            c.expect
        );
    }
    s
}

/// Reads the text of a fixture file.
///
/// # Errors
/// [`FixtureError::Format`] naming the line.
pub fn from_text(text: &str) -> Result<Vec<Case>, FixtureError> {
    let lines: Vec<&str> = text.lines().collect();
    let mut cases = Vec::new();
    let mut i = 0;
    let bad = |line: usize, why: &str| FixtureError::Format {
        line: line + 1,
        why: why.to_owned(),
    };
    while i < lines.len() {
        let name = lines[i]
            .strip_prefix("case ")
            .ok_or_else(|| bad(i, "expected `case NAME`"))?
            .to_owned();
        let with_fixes = match lines.get(i + 1) {
            Some(&"fixes all") => true,
            Some(&"fixes none") => false,
            _ => return Err(bad(i + 1, "expected `fixes all` or `fixes none`")),
        };
        if lines.get(i + 2) != Some(&"script") {
            return Err(bad(i + 2, "expected `script`"));
        }
        let start = i + 3;
        let mid = (start..lines.len())
            .find(|&k| lines[k] == "expect")
            .ok_or_else(|| bad(start, "no `expect` line"))?;
        let end = (mid..lines.len())
            .find(|&k| lines[k] == "end")
            .ok_or_else(|| bad(mid, "no `end` line"))?;
        let script = Script::parse(&lines[start..mid].join("\n"))
            .map_err(|e| bad(start + e.line - 1, &e.message))?;
        let mut expect = lines[mid + 1..end].join("\n");
        expect.push('\n');
        if mid + 1 == end {
            expect.clear();
        }
        cases.push(Case {
            name,
            with_fixes,
            script,
            expect,
        });
        i = end + 1;
    }
    Ok(cases)
}

/// Compresses a fixture file's text.
pub fn compress(text: &str) -> Vec<u8> {
    miniz_oxide::deflate::compress_to_vec(text.as_bytes(), 10)
}

/// Reads a compressed fixture file.
///
/// # Errors
/// [`FixtureError`] when it is not deflate data or not a fixture file.
pub fn decompress(bytes: &[u8]) -> Result<Vec<Case>, FixtureError> {
    let raw = miniz_oxide::inflate::decompress_to_vec(bytes)
        .map_err(|e| FixtureError::Inflate(format!("{e:?}")))?;
    let text = String::from_utf8(raw).map_err(|e| FixtureError::Inflate(e.to_string()))?;
    from_text(&text)
}

/// Checks one case: our rendered output under its rules against the oracle's. `Err` holds the
/// first differing line, with the lines before it for context.
///
/// # Errors
/// A message naming the case and the first difference.
pub fn check_case(case: &Case, version: TorchVersion) -> Result<(), String> {
    let rules = if case.with_fixes {
        Rules::new(version)
    } else {
        Rules::pytorch_exact(version)
    };
    let ours = driver::run(&case.script, rules)
        .map_err(|e| format!("case {}: our driver refused it: {e}", case.name))?;
    let got = render(&ours, order_sensitive(&case.script));
    if got == case.expect {
        return Ok(());
    }
    let (a, b): (Vec<&str>, Vec<&str>) = (case.expect.lines().collect(), got.lines().collect());
    let k = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let context = a[k.saturating_sub(3)..k].join("\n    ");
    Err(format!(
        "case {} (torch {}, fixes {}): first difference at rendered line {}\n    {context}\n  torch: {}\n  ours:  {}",
        case.name,
        version.checked_release(),
        if case.with_fixes { "all" } else { "none" },
        k + 1,
        a.get(k).unwrap_or(&"(end)"),
        b.get(k).unwrap_or(&"(end)")
    ))
}
