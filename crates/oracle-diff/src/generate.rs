//! Random op scripts that reach every path of the allocator.
//!
//! Each script draws a device capacity (128 MiB to 80 GiB: small ones force every OOM and
//! retry path), an allocator configuration (any mix of `expandable_segments`,
//! `max_split_size_mb`, `max_non_split_rounding_mb`, `roundup_power2_divisions` in both forms,
//! `garbage_collection_threshold` with a memory fraction, and under torch 2.15
//! `per_process_memory_fraction`), top-down addresses or not (which tells the tie-breaking
//! rules apart), up to four streams, and a size palette (equal sizes make ties). Ops are
//! allocations of 0 B to more than the device (small pool, large pool, oversize), frees,
//! `record` on other streams, `sync` of one stream or all, `empty_cache`, `set_fraction`, stat
//! resets, `stats` and `snapshot`.
//!
//! Half the scripts also use private pools (issue 16): `pool_create` (MemPools, graph pool
//! handles and graph ids; under 2.15 `use_on_oom` and `no_split` MemPools), `pool_begin` on all
//! streams or one, `pool_end`, `pool_release`, `pool_use_count`, `pool_delete`, and
//! pool-scoped `empty_cache P` / `snapshot P`, only in the orders a PyTorch program makes them
//! (issue 29, see [`crate::api`]): `use_mem_pool` blocks, captures whose graphs are reset
//! later, a MemPool's destructor once. About a third attach OOM observers (`observe`).
//!
//! The same `(seed, case, version)` always gives the same script.

use c10_cuda::rules::TorchVersion;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::script::{Op, PoolKind, Script};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The shape of the scripts a campaign draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Fewest ops per script.
    pub min_ops: usize,
    /// Most ops per script.
    pub max_ops: usize,
}

impl Default for Shape {
    /// 200 to 400 ops.
    fn default() -> Self {
        Shape {
            min_ops: 200,
            max_ops: 400,
        }
    }
}

/// The script of case `case` of a campaign with `seed`, for `version` (2.7 scripts never use
/// the `per_process_memory_fraction` key, which torch 2.7 rejects).
pub fn script(seed: u64, case: u64, version: TorchVersion, shape: Shape) -> Script {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ case.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let total = *pick(
        &mut rng,
        &[
            128 * MIB,
            256 * MIB,
            512 * MIB,
            GIB,
            2 * GIB,
            4 * GIB,
            8 * GIB,
            16 * GIB,
            80 * GIB,
        ],
    );
    let mut env = Vec::new();
    let (conf, gc) = config(&mut rng, version);
    if !conf.is_empty() {
        env.push(("PYTORCH_CUDA_ALLOC_CONF".to_owned(), conf));
    }
    env.push(("FAKECUDA_TOTAL_MEM".to_owned(), total.to_string()));
    if rng.random_bool(0.35) {
        env.push(("FAKECUDA_TOPDOWN".to_owned(), "1".to_owned()));
    }
    let n = rng.random_range(shape.min_ops..=shape.max_ops);
    let mut ops = Vec::with_capacity(n + 1);
    if gc && rng.random_bool(0.8) {
        // garbage_collection_threshold only acts with a memory fraction.
        ops.push(Op::SetFraction(fraction(&mut rng)));
    }
    ops.extend(self::ops(&mut rng, n, total, version));
    Script { env, ops }
}

fn pick<'a, T>(rng: &mut ChaCha8Rng, xs: &'a [T]) -> &'a T {
    &xs[rng.random_range(0..xs.len())]
}

fn fraction(rng: &mut ChaCha8Rng) -> f64 {
    f64::from(rng.random_range(5u32..=100)) / 100.0
}

/// A configuration string and whether it sets `garbage_collection_threshold`.
fn config(rng: &mut ChaCha8Rng, version: TorchVersion) -> (String, bool) {
    let mut items = Vec::new();
    if rng.random_bool(0.3) {
        let mb = if rng.random_bool(0.5) {
            rng.random_range(20..=200)
        } else {
            *pick(rng, &[20, 32, 64, 128, 256, 512, 1024, 4096])
        };
        items.push(format!("max_split_size_mb:{mb}"));
    }
    if rng.random_bool(0.15) {
        items.push(format!(
            "max_non_split_rounding_mb:{}",
            rng.random_range(20..=300)
        ));
    }
    if rng.random_bool(0.25) {
        let divs = [0u32, 1, 2, 4, 8, 16];
        if rng.random_bool(0.5) {
            items.push(format!(
                "roundup_power2_divisions:{}",
                pick(rng, &[1, 2, 4, 8, 16, 32])
            ));
        } else {
            let mut keys: Vec<u32> = (0..rng.random_range(1..=4))
                .map(|_| 1u32 << rng.random_range(0..=13))
                .collect();
            keys.sort_unstable();
            keys.dedup();
            let mut parts: Vec<String> = keys
                .iter()
                .map(|k| format!("{k}:{}", pick(rng, &divs)))
                .collect();
            if rng.random_bool(0.6) {
                parts.push(format!(">:{}", pick(rng, &divs)));
            }
            items.push(format!("roundup_power2_divisions:[{}]", parts.join(",")));
        }
    }
    let gc = rng.random_bool(0.2);
    if gc {
        items.push(format!(
            "garbage_collection_threshold:{}",
            f64::from(rng.random_range(1u32..=99)) / 100.0
        ));
    }
    if rng.random_bool(0.3) {
        items.push("expandable_segments:True".into());
    } else if rng.random_bool(0.05) {
        items.push("expandable_segments:False".into());
    }
    if version.accepts_memory_fraction_key() && rng.random_bool(0.1) {
        items.push(format!("per_process_memory_fraction:{}", fraction(rng)));
    }
    (items.join(","), gc)
}

/// A request size: tiny, small-pool, mid (1 to 10 MiB: 20 MiB segments), large, or huge
/// (oversize, up to more than the device).
fn size(rng: &mut ChaCha8Rng, total: u64, palette: &[u64]) -> u64 {
    if !palette.is_empty() && rng.random_bool(0.4) {
        return *pick(rng, palette);
    }
    let log_uniform = |rng: &mut ChaCha8Rng, lo: u64, hi: u64| {
        let (a, b) = ((lo.max(1) as f64).ln(), (hi.max(lo + 1) as f64).ln());
        rng.random_range(a..b).exp() as u64
    };
    let s = match rng.random_range(0..100) {
        0 => 0,
        1..=5 => rng.random_range(1..=4 * KIB),
        6..=40 => log_uniform(rng, 512, MIB + 1),
        41..=62 => log_uniform(rng, MIB, 10 * MIB),
        63..=90 => log_uniform(rng, 10 * MIB, (total / 6).max(11 * MIB)),
        _ => log_uniform(rng, (total / 6).max(11 * MIB), total + total / 4),
    };
    // Round numbers are common in real programs and sit on the rules' boundaries.
    match rng.random_range(0..10) {
        0 => s.div_ceil(512) * 512,
        1 => s.div_ceil(MIB) * MIB,
        2 => s.div_ceil(2 * MIB) * (2 * MIB),
        _ => s,
    }
}

/// How a begun pool of a script was begun.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Use {
    /// `with torch.cuda.use_mem_pool(p):` (a MemPool, every stream): its end releases at once.
    Context,
    /// A CUDA graph capture on one stream: its graph's reset releases later.
    Capture,
}

/// A private pool of a script, as the generator tracks it (see [`crate::api`] for the calls a
/// program makes).
struct GenPool {
    name: String,
    kind: PoolKind,
    /// The use count the allocator should have (a handle's or graph's pool: once begun).
    uses: i64,
    /// How it is begun now, if it is.
    begun: Option<Use>,
    /// Captures ended whose graphs are not reset yet: each holds a reference.
    captured: i64,
    /// Whether the allocator has it (a handle or graph id only once begun).
    made: bool,
    /// `pool_delete`d (the MemPool's destructor ran): not named by `empty_cache P` /
    /// `snapshot P` again (torch-oracle needs a live MemPool for those under 2.7).
    deleted: bool,
}

/// Private-pool ops for the pools so far, appended to `out`, in sequences a PyTorch program
/// makes: `use_mem_pool` blocks (begin on every stream; end and release together), captures
/// into a MemPool, a graph pool handle or a graph's own pool (begin on one stream, end; the
/// graph's reset releases later, once per capture), MemPool destructors (once, when no block
/// or capture holds the pool), and `MemPool.use_count()`, `empty_cache()`, `snapshot()` on live
/// MemPools. Nothing when nothing sensible can be done now.
fn pool_op(
    rng: &mut ChaCha8Rng,
    pools: &mut Vec<GenPool>,
    streams: u32,
    version: TorchVersion,
    out: &mut Vec<Op>,
) {
    let roll = rng.random_range(0..100);
    if pools.len() < 4 && (pools.is_empty() || roll < 15) {
        let name = format!("P{}", pools.len());
        let kind = *pick(
            rng,
            &[
                PoolKind::Mempool,
                PoolKind::Mempool,
                PoolKind::Mempool,
                PoolKind::Handle,
                PoolKind::Graph,
            ],
        );
        let options = version.has_mem_pool_options() && kind == PoolKind::Mempool;
        let use_on_oom = options && rng.random_bool(0.3);
        let no_split = options && rng.random_bool(0.2);
        let made = kind == PoolKind::Mempool;
        pools.push(GenPool {
            name: name.clone(),
            kind,
            uses: i64::from(made),
            begun: None,
            captured: 0,
            made,
            deleted: false,
        });
        out.push(Op::PoolCreate {
            pool: name,
            kind,
            use_on_oom,
            no_split,
        });
        return;
    }
    let any_begun = pools.iter().any(|p| p.begun.is_some());
    let k = rng.random_range(0..pools.len());
    let p = &mut pools[k];
    let name = p.name.clone();
    let mempool = p.kind == PoolKind::Mempool;
    match roll {
        15..=44 => {
            // Begin: a pool not begun now, alive (a MemPool not deleted; a handle or graph pool
            // not released to 0 by all its graphs: a capture into such a pool is possible, but
            // whether the allocator then refuses it depends on its segments).
            if p.begun.is_some() || p.deleted || (p.made && p.uses <= 0) {
                return;
            }
            // Captures run on a side stream (CUDA refuses to capture the legacy default one).
            let capture = streams > 0 && (!mempool || rng.random_bool(0.25));
            if !mempool && !capture {
                return;
            }
            let stream = capture.then(|| rng.random_range(1..=streams));
            p.begun = Some(if capture { Use::Capture } else { Use::Context });
            p.uses += 1;
            p.made = true;
            out.push(Op::PoolBegin { pool: name, stream });
        }
        45..=64 => match p.begun.take() {
            Some(Use::Context) => {
                // Leaving the `with` block: endAllocateToPool, then releasePool.
                p.uses -= 1;
                out.push(Op::PoolEnd(name.clone()));
                out.push(Op::PoolRelease(name));
            }
            Some(Use::Capture) => {
                p.captured += 1;
                out.push(Op::PoolEnd(name));
            }
            None => {}
        },
        65..=77 => {
            // A captured graph is reset (or destroyed): one release per capture.
            if p.captured > 0 {
                p.captured -= 1;
                p.uses -= 1;
                out.push(Op::PoolRelease(name));
            }
        }
        78..=83 => {
            if mempool && !p.deleted {
                out.push(Op::PoolUseCount(name));
            }
        }
        84..=87 => {
            // `del pool`: a MemPool no block or capture holds. torch 2.7's ~MemPool needs use
            // count 1 and empties the cache, which aborts (an assertion in a destructor) while
            // any pool is begun: the oracle cannot run that.
            let torch27 = version.mem_pool_destructor_needs_sole_use();
            if !mempool || p.deleted || p.begun.is_some() || (torch27 && (any_begun || p.uses != 1))
            {
                return;
            }
            p.uses -= 1;
            p.deleted = true;
            out.push(Op::PoolDelete(name));
        }
        88..=95 => {
            if mempool && !p.deleted {
                out.push(Op::EmptyCachePool(name));
            }
        }
        _ => {
            if mempool && !p.deleted {
                out.push(Op::SnapshotPool(name));
            }
        }
    }
}

/// `n` ops on a device of `total` bytes.
fn ops(rng: &mut ChaCha8Rng, n: usize, total: u64, version: TorchVersion) -> Vec<Op> {
    let streams: u32 = *pick(rng, &[0, 1, 1, 2, 2, 3]);
    let pooled = rng.random_bool(0.5);
    let mut pools: Vec<GenPool> = Vec::new();
    let observers = if rng.random_bool(0.35) {
        rng.random_range(1..=2)
    } else {
        0
    };
    let palette: Vec<u64> = (0..rng.random_range(0..=6))
        .map(|_| size(rng, total, &[]))
        .collect();
    let target_live = rng.random_range(4..=60usize);
    let mut live: Vec<(String, u32)> = Vec::new();
    let mut next_id = 0u64;
    let mut out = Vec::with_capacity(n);
    for _ in 0..observers {
        out.push(Op::Observe);
    }
    while out.len() < n {
        if pooled && rng.random_bool(0.1) {
            pool_op(rng, &mut pools, streams, version, &mut out);
            continue;
        }
        let roll = rng.random_range(0..1000);
        let want_alloc = live.is_empty() || (live.len() < target_live && roll < 520);
        let op = if want_alloc || roll < 430 {
            let id = next_id.to_string();
            next_id += 1;
            let stream = if streams > 0 && rng.random_bool(0.4) {
                rng.random_range(1..=streams)
            } else {
                0
            };
            live.push((id.clone(), stream));
            Op::Alloc {
                id,
                size: size(rng, total, &palette),
                stream,
            }
        } else if roll < 860 {
            // Free: mostly a recent allocation, sometimes an old one.
            let k = if rng.random_bool(0.5) {
                live.len() - 1 - rng.random_range(0..live.len().min(4))
            } else {
                rng.random_range(0..live.len())
            };
            let (id, _) = live.swap_remove(k);
            Op::Free { id }
        } else if roll < 920 {
            if streams == 0 {
                continue;
            }
            let (id, own) = &live[rng.random_range(0..live.len())];
            let mut stream = rng.random_range(0..=streams);
            if stream == *own && rng.random_bool(0.7) {
                stream = (stream + 1) % (streams + 1);
            }
            Op::Record {
                id: id.clone(),
                stream,
            }
        } else if roll < 965 {
            if streams == 0 && rng.random_bool(0.7) {
                continue;
            }
            if rng.random_bool(0.25) {
                Op::Sync { stream: None }
            } else {
                Op::Sync {
                    stream: Some(rng.random_range(0..=streams)),
                }
            }
        } else if roll < 978 {
            Op::EmptyCache
        } else if roll < 983 {
            Op::SetFraction(fraction(rng))
        } else if roll < 987 {
            Op::ResetPeak
        } else if roll < 990 {
            Op::ResetAccumulated
        } else if roll < 994 {
            Op::Stats
        } else {
            Op::Snapshot
        };
        out.push(op);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_are_reproducible_and_shaped() {
        let shape = Shape::default();
        for case in 0..50 {
            let a = script(7, case, TorchVersion::V2_15, shape);
            let b = script(7, case, TorchVersion::V2_15, shape);
            assert_eq!(a, b);
            assert!((200..=401).contains(&a.ops.len()), "{}", a.ops.len());
            let text = a.to_string();
            assert_eq!(Script::parse(&text).unwrap(), a);
            let old = script(7, case, TorchVersion::V2_7, shape);
            assert!(
                !old.env_value("PYTORCH_CUDA_ALLOC_CONF")
                    .unwrap_or("")
                    .contains("per_process_memory_fraction")
            );
        }
        assert_ne!(
            script(7, 0, TorchVersion::V2_15, shape),
            script(8, 0, TorchVersion::V2_15, shape)
        );
    }

    /// Every generated script is one a PyTorch program can produce, and pools are used in
    /// every way (so the check is not passed by never using them): `use_mem_pool` blocks
    /// (end then release at once), captures released later, and destructors.
    #[test]
    fn scripts_are_what_pytorch_programs_produce() {
        let shape = Shape::default();
        let (mut blocks, mut late_releases, mut deletes) = (0, 0, 0);
        for version in [TorchVersion::V2_7, TorchVersion::V2_15] {
            for case in 0..400 {
                let s = script(29, case, version, shape);
                if let Err(e) = crate::api::check(&s) {
                    panic!("case {case} under {version:?}: {e}\n{s}");
                }
                for w in s.ops.windows(2) {
                    match w {
                        [Op::PoolEnd(a), Op::PoolRelease(b)] if a == b => blocks += 1,
                        [_, Op::PoolRelease(_)] => late_releases += 1,
                        [_, Op::PoolDelete(_)] => deletes += 1,
                        _ => {}
                    }
                }
            }
        }
        assert!(
            blocks > 100 && late_releases > 20 && deletes > 20,
            "{blocks} {late_releases} {deletes}"
        );
    }
}
