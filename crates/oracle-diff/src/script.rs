//! Op scripts in torch-oracle's format: the model, the parser and the printer.
//!
//! One op per line, `#` starts a comment, `env NAME=VALUE` lines before the first op (see
//! `../shared/torch-oracle/README.md`), private pools (`pool_*`, `empty_cache P`, `snapshot P`)
//! and OOM observers (`observe`) included.

use std::fmt;

/// One op of a script.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// `alloc ID SIZE [STREAM]`: `raw_alloc_with_stream(SIZE, stream)`.
    Alloc {
        /// The script's name for the allocation.
        id: String,
        /// Bytes requested.
        size: u64,
        /// Stream number (0: the default stream).
        stream: u32,
    },
    /// `free ID`: `raw_delete`.
    Free {
        /// The allocation to free.
        id: String,
    },
    /// `record ID STREAM`: `recordStream` on the block.
    Record {
        /// The allocation.
        id: String,
        /// The stream that used it.
        stream: u32,
    },
    /// `sync [STREAM|all]`: that stream's work (every stream's, for `None`) is done.
    Sync {
        /// The stream, or `None` for all.
        stream: Option<u32>,
    },
    /// `empty_cache`: `emptyCache()`.
    EmptyCache,
    /// `set_fraction F`: `setMemoryFraction(F, 0)`.
    SetFraction(f64),
    /// `reset_peak`: `resetPeakStats(0)`.
    ResetPeak,
    /// `reset_accumulated`: `resetAccumulatedStats(0)`.
    ResetAccumulated,
    /// `stats`: print the device stats.
    Stats,
    /// `snapshot`: print the segments and blocks.
    Snapshot,
    /// `mark TEXT`: print TEXT.
    Mark(String),
    /// `pool_create P [mempool|handle|graph] [use_on_oom] [no_split]`: a new private pool id
    /// (`torch.cuda.MemPool()`, `graph_pool_handle()`, a capture's own id).
    PoolCreate {
        /// The script's name for the pool.
        pool: String,
        /// How the id is made.
        kind: PoolKind,
        /// torch 2.15's `MemPool(use_on_oom=True)`.
        use_on_oom: bool,
        /// torch 2.15's `MemPool(no_split=True)`.
        no_split: bool,
    },
    /// `pool_begin P [STREAM|all]`: `beginAllocateToPool(0, id, filter)`.
    PoolBegin {
        /// The pool.
        pool: String,
        /// The stream the filter accepts, `None` for all.
        stream: Option<u32>,
    },
    /// `pool_end P`: `endAllocateToPool`.
    PoolEnd(String),
    /// `pool_release P`: `releasePool`.
    PoolRelease(String),
    /// `pool_use_count P`: print `getPoolUseCount`.
    PoolUseCount(String),
    /// `pool_delete P`: what `~MemPool` does.
    PoolDelete(String),
    /// `empty_cache P`: `emptyCache(id)` (2.7: under the pool's `MemPoolContext`).
    EmptyCachePool(String),
    /// `snapshot P`: the pool's segments only.
    SnapshotPool(String),
    /// `observe`: attach an OOM observer.
    Observe,
}

/// How `pool_create` makes a pool id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// `torch.cuda.MemPool()`: id `(0, n)`, made in the allocator at use count 1.
    Mempool,
    /// `torch.cuda.graph_pool_handle()`: id `(0, n)` from the same counter, made by the first
    /// `pool_begin`.
    Handle,
    /// A CUDA graph's own pool: id `(n, 0)` from another counter, made by `pool_begin`.
    Graph,
}

impl PoolKind {
    /// The script spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolKind::Mempool => "mempool",
            PoolKind::Handle => "handle",
            PoolKind::Graph => "graph",
        }
    }
}

/// A whole script: its `env` lines and its ops.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Script {
    /// `env NAME=VALUE` lines, in order (`PYTORCH_CUDA_ALLOC_CONF`, `FAKECUDA_*`).
    pub env: Vec<(String, String)>,
    /// The ops, in order.
    pub ops: Vec<Op>,
}

/// A script line that cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// Parses a size in bytes with an optional binary suffix (`K`/`KiB`, `M`/`MiB`, `G`/`GiB`,
/// `T`/`TiB`, `B`), as the oracle does. `None` when it is not a size.
pub fn parse_size(s: &str) -> Option<u64> {
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let n: u64 = s[..digits].parse().ok()?;
    let mult = match &s[digits..] {
        "" | "B" => 1,
        "K" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "T" | "TiB" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(mult)
}

fn parse_stream(s: &str, line: usize) -> Result<u32, ParseError> {
    match s.parse::<u32>() {
        Ok(v) if v <= 1000 => Ok(v),
        _ => Err(ParseError {
            line,
            message: format!("bad stream number '{s}' (0 = default, 1..1000)"),
        }),
    }
}

impl Script {
    /// Parses a script.
    ///
    /// # Errors
    /// [`ParseError`] naming the line: an unknown op, a wrong number of arguments, a bad size,
    /// stream or fraction, an `env` line after the first op, or an op of the oracle's that is
    /// not supported here yet (private pools, observers).
    pub fn parse(text: &str) -> Result<Script, ParseError> {
        let mut script = Script::default();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let code = raw.split('#').next().unwrap_or("");
            let words: Vec<&str> = code.split_whitespace().collect();
            let Some(&cmd) = words.first() else {
                continue;
            };
            let err = |message: String| ParseError { line, message };
            let need = |lo: usize, hi: usize| {
                if words.len() < lo || words.len() > hi {
                    Err(err(format!("wrong number of arguments for '{cmd}'")))
                } else {
                    Ok(())
                }
            };
            let op = match cmd {
                "env" => {
                    need(2, 2)?;
                    if !script.ops.is_empty() {
                        return Err(err("'env' lines must come before the first op".into()));
                    }
                    let Some((k, v)) = words[1].split_once('=') else {
                        return Err(err("expected env NAME=VALUE".into()));
                    };
                    script.env.push((k.to_owned(), v.to_owned()));
                    continue;
                }
                "alloc" | "a" => {
                    need(3, 4)?;
                    let size = parse_size(words[2])
                        .ok_or_else(|| err(format!("bad size '{}'", words[2])))?;
                    let stream = match words.get(3) {
                        Some(s) => parse_stream(s, line)?,
                        None => 0,
                    };
                    Op::Alloc {
                        id: words[1].to_owned(),
                        size,
                        stream,
                    }
                }
                "free" | "f" => {
                    need(2, 2)?;
                    Op::Free {
                        id: words[1].to_owned(),
                    }
                }
                "record" => {
                    need(3, 3)?;
                    Op::Record {
                        id: words[1].to_owned(),
                        stream: parse_stream(words[2], line)?,
                    }
                }
                "sync" => {
                    need(1, 2)?;
                    let stream = match words.get(1) {
                        None | Some(&"all") => None,
                        Some(s) => Some(parse_stream(s, line)?),
                    };
                    Op::Sync { stream }
                }
                "empty_cache" => {
                    need(1, 2)?;
                    match words.get(1) {
                        Some(p) => Op::EmptyCachePool((*p).to_owned()),
                        None => Op::EmptyCache,
                    }
                }
                "set_fraction" => {
                    need(2, 2)?;
                    match words[1].parse::<f64>() {
                        Ok(f) if (0.0..=1.0).contains(&f) => Op::SetFraction(f),
                        _ => return Err(err("set_fraction wants a number in [0, 1]".into())),
                    }
                }
                "reset_peak" => {
                    need(1, 1)?;
                    Op::ResetPeak
                }
                "reset_accumulated" => {
                    need(1, 1)?;
                    Op::ResetAccumulated
                }
                "stats" => {
                    need(1, 1)?;
                    Op::Stats
                }
                "snapshot" => {
                    need(1, 2)?;
                    match words.get(1) {
                        Some(p) => Op::SnapshotPool((*p).to_owned()),
                        None => Op::Snapshot,
                    }
                }
                "mark" => {
                    let text = code.trim_start()[4..].trim();
                    Op::Mark(text.to_owned())
                }
                "pool_create" => {
                    need(2, 5)?;
                    let (mut kind, mut use_on_oom, mut no_split) =
                        (PoolKind::Mempool, false, false);
                    for w in &words[2..] {
                        match *w {
                            "mempool" => kind = PoolKind::Mempool,
                            "handle" => kind = PoolKind::Handle,
                            "graph" => kind = PoolKind::Graph,
                            "use_on_oom" => use_on_oom = true,
                            "no_split" => no_split = true,
                            other => {
                                return Err(err(format!("unknown pool_create option '{other}'")));
                            }
                        }
                    }
                    Op::PoolCreate {
                        pool: words[1].to_owned(),
                        kind,
                        use_on_oom,
                        no_split,
                    }
                }
                "pool_begin" => {
                    need(2, 3)?;
                    let stream = match words.get(2) {
                        None | Some(&"all") => None,
                        Some(s) => Some(parse_stream(s, line)?),
                    };
                    Op::PoolBegin {
                        pool: words[1].to_owned(),
                        stream,
                    }
                }
                "pool_end" | "pool_release" | "pool_use_count" | "pool_delete" => {
                    need(2, 2)?;
                    let p = words[1].to_owned();
                    match cmd {
                        "pool_end" => Op::PoolEnd(p),
                        "pool_release" => Op::PoolRelease(p),
                        "pool_use_count" => Op::PoolUseCount(p),
                        _ => Op::PoolDelete(p),
                    }
                }
                "observe" => {
                    need(1, 1)?;
                    Op::Observe
                }
                other => return Err(err(format!("unknown op '{other}'"))),
            };
            script.ops.push(op);
        }
        Ok(script)
    }

    /// The value of an `env` line, if the script has one.
    pub fn env_value(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The number of streams the script uses besides the default one (the oracle creates
    /// streams 1..=n at start-up).
    pub fn max_stream(&self) -> u32 {
        self.ops
            .iter()
            .filter_map(|op| match op {
                Op::Alloc { stream, .. } | Op::Record { stream, .. } => Some(*stream),
                Op::Sync { stream } | Op::PoolBegin { stream, .. } => *stream,
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    /// Whether the script has no ops.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Alloc { id, size, stream } => {
                write!(f, "alloc {id} {size}")?;
                if *stream != 0 {
                    write!(f, " {stream}")?;
                }
                Ok(())
            }
            Op::Free { id } => write!(f, "free {id}"),
            Op::Record { id, stream } => write!(f, "record {id} {stream}"),
            Op::Sync { stream: None } => f.write_str("sync all"),
            Op::Sync { stream: Some(s) } => write!(f, "sync {s}"),
            Op::EmptyCache => f.write_str("empty_cache"),
            Op::SetFraction(x) => write!(f, "set_fraction {x}"),
            Op::ResetPeak => f.write_str("reset_peak"),
            Op::ResetAccumulated => f.write_str("reset_accumulated"),
            Op::Stats => f.write_str("stats"),
            Op::Snapshot => f.write_str("snapshot"),
            Op::Mark(t) => write!(f, "mark {t}"),
            Op::PoolCreate {
                pool,
                kind,
                use_on_oom,
                no_split,
            } => {
                write!(f, "pool_create {pool} {}", kind.as_str())?;
                if *use_on_oom {
                    f.write_str(" use_on_oom")?;
                }
                if *no_split {
                    f.write_str(" no_split")?;
                }
                Ok(())
            }
            Op::PoolBegin { pool, stream: None } => write!(f, "pool_begin {pool} all"),
            Op::PoolBegin {
                pool,
                stream: Some(s),
            } => write!(f, "pool_begin {pool} {s}"),
            Op::PoolEnd(p) => write!(f, "pool_end {p}"),
            Op::PoolRelease(p) => write!(f, "pool_release {p}"),
            Op::PoolUseCount(p) => write!(f, "pool_use_count {p}"),
            Op::PoolDelete(p) => write!(f, "pool_delete {p}"),
            Op::EmptyCachePool(p) => write!(f, "empty_cache {p}"),
            Op::SnapshotPool(p) => write!(f, "snapshot {p}"),
            Op::Observe => f.write_str("observe"),
        }
    }
}

impl fmt::Display for Script {
    /// The script in the oracle's format: `env` lines, then one op per line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, v) in &self.env {
            writeln!(f, "env {k}={v}")?;
        }
        for op in &self.ops {
            writeln!(f, "{op}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_oracle_example_and_prints_it_back() {
        let text = "# a comment\nenv PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n\
                    alloc x 1MiB   # stream 0\nrecord x 1\nfree x\na y 100KiB 2\nsync 1\nsync\n\
                    empty_cache\nset_fraction 0.5\nmark hello there\nf y\n";
        let s = Script::parse(text).unwrap();
        assert_eq!(
            s.env_value("PYTORCH_CUDA_ALLOC_CONF"),
            Some("expandable_segments:True")
        );
        assert_eq!(s.ops.len(), 10);
        assert_eq!(
            s.ops[0],
            Op::Alloc {
                id: "x".into(),
                size: 1 << 20,
                stream: 0
            }
        );
        assert_eq!(s.ops[5], Op::Sync { stream: None });
        assert_eq!(s.ops[9], Op::Free { id: "y".into() });
        assert_eq!(s.max_stream(), 2);
        let again = Script::parse(&s.to_string()).unwrap();
        assert_eq!(again, s);
    }

    #[test]
    fn pool_and_observer_ops_parse_and_print_back() {
        let text = "observe\npool_create p\npool_create g graph\npool_create q mempool use_on_oom no_split\n\
                    pool_begin p\npool_begin g 2\nalloc x 1MiB\npool_end p\npool_release p\n\
                    pool_use_count p\nempty_cache p\nsnapshot p\npool_delete p\n";
        let s = Script::parse(text).unwrap();
        assert_eq!(s.ops.len(), 13);
        assert_eq!(s.ops[0], Op::Observe);
        assert_eq!(
            s.ops[3],
            Op::PoolCreate {
                pool: "q".into(),
                kind: PoolKind::Mempool,
                use_on_oom: true,
                no_split: true
            }
        );
        assert_eq!(
            s.ops[5],
            Op::PoolBegin {
                pool: "g".into(),
                stream: Some(2)
            }
        );
        assert_eq!(s.ops[10], Op::EmptyCachePool("p".into()));
        assert_eq!(s.ops[11], Op::SnapshotPool("p".into()));
        assert_eq!(s.max_stream(), 2);
        assert_eq!(Script::parse(&s.to_string()).unwrap(), s);
    }

    #[test]
    fn bad_lines_name_the_line_and_the_problem() {
        for (text, want) in [
            ("alloc x 12Q", "line 1: bad size '12Q'"),
            ("free", "line 1: wrong number of arguments for 'free'"),
            (
                "alloc x 1\nenv A=B",
                "line 2: 'env' lines must come before the first op",
            ),
            (
                "set_fraction 2",
                "line 1: set_fraction wants a number in [0, 1]",
            ),
            (
                "pool_create p frob",
                "line 1: unknown pool_create option 'frob'",
            ),
            ("frob", "line 1: unknown op 'frob'"),
            (
                "record x 1001",
                "line 1: bad stream number '1001' (0 = default, 1..1000)",
            ),
        ] {
            assert_eq!(Script::parse(text).unwrap_err().to_string(), want);
        }
    }

    #[test]
    fn sizes_take_the_oracles_suffixes() {
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("3K"), Some(3072));
        assert_eq!(parse_size("2MiB"), Some(2 << 20));
        assert_eq!(parse_size("1G"), Some(1 << 30));
        assert_eq!(parse_size("1TiB"), Some(1 << 40));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size("1MB"), None);
    }
}
