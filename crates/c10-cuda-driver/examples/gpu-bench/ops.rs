//! The compact op form the GPU bench reads: torch-oracle op scripts (`alloc ID SIZE [STREAM]`,
//! `free ID`, `#` comments), as `gpu-bench convert` writes them from the shared snapshots.

use std::path::Path;

/// One replay step; blocks are named by slot (one per `alloc`).
#[derive(Clone, Copy, Debug)]
pub enum Op {
    Alloc { size: usize, slot: u32, stream: u32 },
    Free { slot: u32 },
}

/// A trace ready to replay.
pub struct Trace {
    pub name: String,
    pub ops: Vec<Op>,
    /// One slot per allocation id.
    pub slots: usize,
    /// Allocations (pairs).
    pub allocs: usize,
    /// Stream numbers are `0..streams`.
    pub streams: u32,
}

impl Trace {
    /// Reads an op script. Ids may be any integers below 2^32; they are slots.
    pub fn read(name: &str, path: &Path) -> Result<Trace, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Trace::parse(name, &text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses an op script (see the module doc).
    pub fn parse(name: &str, text: &str) -> Result<Trace, String> {
        let mut t = Trace {
            name: name.to_string(),
            ops: Vec::new(),
            slots: 0,
            allocs: 0,
            streams: 1,
        };
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = || format!("line {}: cannot read `{line}`", n + 1);
            let words: Vec<&str> = line.split_whitespace().collect();
            let num = |i: usize| -> Result<u64, String> {
                words.get(i).and_then(|w| w.parse().ok()).ok_or_else(bad)
            };
            match words[0] {
                "alloc" if words.len() <= 4 => {
                    let slot = u32::try_from(num(1)?).map_err(|_| bad())?;
                    let size = usize::try_from(num(2)?).map_err(|_| bad())?;
                    let stream = if words.len() == 4 {
                        u32::try_from(num(3)?).map_err(|_| bad())?
                    } else {
                        0
                    };
                    t.slots = t.slots.max(slot as usize + 1);
                    t.streams = t.streams.max(stream + 1);
                    t.allocs += 1;
                    t.ops.push(Op::Alloc { size, slot, stream });
                }
                "free" if words.len() == 2 => {
                    let slot = u32::try_from(num(1)?).map_err(|_| bad())?;
                    t.ops.push(Op::Free { slot });
                }
                _ => return Err(bad()),
            }
        }
        Ok(t)
    }
}

impl From<&crate::trace::Trace> for Trace {
    /// The alloc bench's form of a trace (its warm-pair scripts) in this bench's.
    fn from(t: &crate::trace::Trace) -> Trace {
        Trace {
            name: t.name.to_string(),
            ops: t
                .ops
                .iter()
                .map(|op| match *op {
                    crate::trace::Op::Alloc { size, slot, stream } => {
                        Op::Alloc { size, slot, stream }
                    }
                    crate::trace::Op::Free { slot } => Op::Free { slot },
                })
                .collect(),
            slots: t.slots,
            allocs: t.allocs(),
            streams: t.streams,
        }
    }
}
