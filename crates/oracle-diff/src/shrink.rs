//! Shrinking a diverging script to a small one that still diverges (delta debugging).
//!
//! Passes, repeated until none helps: remove chunks of ops (halves, quarters, ... single ops),
//! remove `env` lines, then make sizes rounder (to 512 B, 1 MiB, 2 MiB multiples) and streams
//! lower. A candidate is kept when the caller's test says it still shows the divergence.

use crate::script::{Op, Script};

/// Shrinks `script` while `still_fails` holds, trying at most `budget` candidates.
/// Returns the smallest failing script found and the number of candidates tried.
pub fn shrink(
    script: &Script,
    budget: usize,
    mut still_fails: impl FnMut(&Script) -> bool,
) -> (Script, usize) {
    let mut best = script.clone();
    let mut tried = 0usize;
    let mut attempt = |cand: &Script, tried: &mut usize| -> bool {
        if *tried >= budget {
            return false;
        }
        *tried += 1;
        still_fails(cand)
    };
    loop {
        let before = (best.ops.len(), best.env.len(), weight(&best));
        // Remove chunks of ops, largest first.
        let mut chunk = best.ops.len().div_ceil(2).max(1);
        loop {
            let mut start = 0;
            while start < best.ops.len() {
                let mut cand = best.clone();
                let end = (start + chunk).min(cand.ops.len());
                cand.ops.drain(start..end);
                if attempt(&cand, &mut tried) {
                    best = cand;
                } else {
                    start += chunk;
                }
            }
            if chunk == 1 {
                break;
            }
            chunk = chunk.div_ceil(2);
        }
        // Remove env lines.
        let mut i = 0;
        while i < best.env.len() {
            let mut cand = best.clone();
            cand.env.remove(i);
            if attempt(&cand, &mut tried) {
                best = cand;
            } else {
                i += 1;
            }
        }
        // Simpler values.
        for k in 0..best.ops.len() {
            for simpler in simplifications(&best.ops[k]) {
                let mut cand = best.clone();
                cand.ops[k] = simpler;
                if attempt(&cand, &mut tried) {
                    best = cand;
                    break;
                }
            }
        }
        if (best.ops.len(), best.env.len(), weight(&best)) == before || tried >= budget {
            return (best, tried);
        }
    }
}

/// A measure of how "round" a script's values are (smaller is simpler).
fn weight(s: &Script) -> u64 {
    s.ops
        .iter()
        .map(|op| match op {
            Op::Alloc { size, stream, .. } => {
                u64::from(size.trailing_zeros() < 20) + u64::from(*stream)
            }
            Op::Record { stream, .. } => u64::from(*stream),
            Op::Sync { stream } => stream.map_or(0, u64::from),
            _ => 0,
        })
        .sum()
}

/// Candidate replacements for one op, simplest first.
fn simplifications(op: &Op) -> Vec<Op> {
    const MIB: u64 = 1 << 20;
    match op {
        Op::Alloc { id, size, stream } => {
            let mut sizes = Vec::new();
            for unit in [2 * MIB, MIB, 512] {
                let r = size.div_ceil(unit) * unit;
                if r != *size && r > 0 {
                    sizes.push(r);
                }
            }
            let mut out: Vec<Op> = sizes
                .into_iter()
                .map(|s| Op::Alloc {
                    id: id.clone(),
                    size: s,
                    stream: *stream,
                })
                .collect();
            if *stream > 1 {
                out.push(Op::Alloc {
                    id: id.clone(),
                    size: *size,
                    stream: 1,
                });
            }
            out
        }
        Op::Record { id, stream } if *stream > 1 => vec![Op::Record {
            id: id.clone(),
            stream: 1,
        }],
        Op::Sync { stream: Some(s) } if *s > 1 => vec![Op::Sync { stream: Some(1) }],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shrinks_to_the_ops_that_matter() {
        // "Fails" while it allocates 3 MiB and later frees id 7.
        let mut s = Script::default();
        for i in 0..40 {
            s.ops.push(Op::Alloc {
                id: i.to_string(),
                size: 1000 + i,
                stream: 0,
            });
        }
        s.ops.push(Op::Alloc {
            id: "x".into(),
            size: 3 << 20,
            stream: 2,
        });
        s.ops.push(Op::Free { id: "7".into() });
        s.env.push(("FAKECUDA_TOPDOWN".into(), "1".into()));
        let fails = |c: &Script| {
            let big = c
                .ops
                .iter()
                .position(|o| matches!(o, Op::Alloc { size, .. } if *size == 3 << 20));
            let free7 = c
                .ops
                .iter()
                .position(|o| matches!(o, Op::Free { id } if id == "7"));
            matches!((big, free7), (Some(a), Some(b)) if a < b)
        };
        let (small, tried) = shrink(&s, 10_000, fails);
        assert!(tried > 0);
        assert_eq!(
            small.ops,
            vec![
                Op::Alloc {
                    id: "x".into(),
                    size: 3 << 20,
                    stream: 1
                },
                Op::Free { id: "7".into() }
            ]
        );
        assert!(small.env.is_empty());
    }
}
