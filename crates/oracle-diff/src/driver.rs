//! Our side of the comparison: runs a [`Script`] through c10-cuda's
//! [`DeviceCachingAllocator`] on [`FakeCuda`] and produces the lines torch-oracle prints for
//! the same script.

use std::collections::HashMap;

use c10_cuda::config::AllocatorConfig;
use c10_cuda::device::{DevicePtr, StreamId};
use c10_cuda::observer::OomObservation;
use c10_cuda::rules::Rules;
use c10_cuda::snapshot::BlockState;
use c10_cuda::{DeviceCachingAllocator, Error, MempoolId, StreamFilter};

use crate::fake::{FakeConfig, FakeCuda};
use crate::script::{Op, PoolKind, Script};
use crate::trace::{Line, SnapSegment};

/// Why a script cannot run on our side at all (the oracle would not start either).
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// `PYTORCH_CUDA_ALLOC_CONF` is not a configuration this version accepts.
    #[error("PYTORCH_CUDA_ALLOC_CONF: {0}")]
    Config(String),
    /// A `FAKECUDA_*` value is not a number.
    #[error("bad {name} value \"{value}\"")]
    Knob {
        /// The variable.
        name: String,
        /// Its value.
        value: String,
    },
    /// The allocator could not be created.
    #[error("creating the allocator: {0}")]
    Allocator(Error),
    /// The script's private-pool calls are not ones a PyTorch program can make
    /// ([`crate::api::check`]): neither side runs it.
    #[error("not a script a PyTorch program can produce: {0}")]
    NotProducible(#[from] crate::api::ApiError),
}

/// `strtoull` with a one-letter binary suffix, as the fake reads `FAKECUDA_*` sizes.
fn fake_size(s: &str) -> Option<u64> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let n: u64 = t[..digits].parse().ok()?;
    let shift = match t[digits..].trim_start().chars().next() {
        None => 0,
        Some(c) => match c.to_ascii_uppercase() {
            'K' => 10,
            'M' => 20,
            'G' => 30,
            'T' => 40,
            _ => 0,
        },
    };
    n.checked_mul(1 << shift)
}

/// The fake's knobs from a script's `env` lines.
///
/// # Errors
/// [`DriverError::Knob`] for a size that is not a number.
pub fn fake_config(script: &Script) -> Result<FakeConfig, DriverError> {
    let mut cfg = FakeConfig::default();
    let knob = |name: &str, value: &str| DriverError::Knob {
        name: name.to_owned(),
        value: value.to_owned(),
    };
    if let Some(v) = script
        .env_value("FAKECUDA_TOTAL_MEM")
        .filter(|v| !v.is_empty())
    {
        cfg.total_mem = fake_size(v).ok_or_else(|| knob("FAKECUDA_TOTAL_MEM", v))?;
    }
    if let Some(v) = script.env_value("FAKECUDA_ALIGN").filter(|v| !v.is_empty()) {
        cfg.align = fake_size(v)
            .filter(|a| a.is_power_of_two())
            .ok_or_else(|| knob("FAKECUDA_ALIGN", v))?;
    }
    if let Some(v) = script.env_value("FAKECUDA_TOPDOWN") {
        cfg.topdown = v.trim().parse::<i64>().unwrap_or(0) != 0;
    }
    Ok(cfg)
}

/// The allocator configuration of a script, as `rules`' PyTorch version would read it.
///
/// # Errors
/// [`DriverError::Config`] for a string our parser refuses, or a key the version does not
/// know (torch 2.7 has no `per_process_memory_fraction` key).
pub fn alloc_config(script: &Script, rules: Rules) -> Result<AllocatorConfig, DriverError> {
    let conf = script.env_value("PYTORCH_CUDA_ALLOC_CONF").unwrap_or("");
    AllocatorConfig::parse_for(conf, rules.version).map_err(|e| DriverError::Config(e.to_string()))
}

/// Runs `script` through our allocator under `rules`; returns the lines the oracle would print
/// (device calls included, `final` last; stats with every pool, as `--full-stats`).
///
/// # Errors
/// [`DriverError`] when the script's configuration cannot be used;
/// [`DriverError::NotProducible`] when no PyTorch program can make its pool calls.
pub fn run(script: &Script, rules: Rules) -> Result<Vec<Line>, DriverError> {
    run_noting(script, rules).map(|(lines, _)| lines)
}

/// What our run saw that PyTorch cannot be compared on from then on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Notes {
    /// The first op (from 1) after which a private pool was forgotten while allocations of it
    /// were still live. PyTorch's `release_cached_blocks` then erases the `PrivatePool` from
    /// `graph_pools` (its `cudaMalloc_count` is 0: with expandable segments its count of
    /// device allocations can reach 0 while blocks of it live) and goes on using the erased
    /// pool through those blocks' `pool` pointers: it reads freed memory (a crash, or segments
    /// missing from its snapshot). We keep such a pool's slot for its blocks (orphaned).
    pub erased_pool_with_live_blocks: Option<usize>,
}

/// [`run`], and what it saw that PyTorch cannot be compared on ([`Notes`]).
///
/// # Errors
/// As [`run`].
pub fn run_noting(script: &Script, rules: Rules) -> Result<(Vec<Line>, Notes), DriverError> {
    crate::api::check(script)?;
    let fake = FakeCuda::new(fake_config(script)?);
    let config = alloc_config(script, rules)?;
    let conf = script
        .env_value("PYTORCH_CUDA_ALLOC_CONF")
        .unwrap_or("")
        .to_owned();
    let total_mem = fake_config(script)?.total_mem;
    let mut alloc = DeviceCachingAllocator::with_rules(fake.clone(), config, rules)
        .map_err(DriverError::Allocator)?;
    fake.push(Line::Config {
        torch: format!("tensormem ({} rules)", rules.version),
        conf,
        total_mem,
    });
    let mut live: HashMap<&str, DevicePtr> = HashMap::new();
    // Pool names and ids: `(0, n)` for MemPools and graph_pool_handle()s (one counter), `(n, 0)`
    // for a capture's own pool (another), as the oracle numbers them.
    let mut pools: HashMap<&str, MempoolId> = HashMap::new();
    let mut names: HashMap<MempoolId, String> = HashMap::new();
    let (mut uid, mut uuid) = (1u64, 1u64);
    let mut observers = 0i64;
    let mut notes = Notes::default();
    for (k, op) in script.ops.iter().enumerate() {
        // The state after op k (from 1), checked here because the arms below `continue`.
        if notes.erased_pool_with_live_blocks.is_none()
            && !pools.is_empty()
            && erased_pool_with_live_blocks(&alloc, live.values())
        {
            notes.erased_pool_with_live_blocks = Some(k);
        }
        if let Some(name) = pool_name(op) {
            if !matches!(op, Op::PoolCreate { .. }) && !pools.contains_key(name) {
                fake.push(error(Some(&name.to_owned()), "no pool of that name"));
                continue;
            }
        }
        let id_of = |name: &str| pools[name];
        match op {
            Op::PoolCreate {
                pool,
                kind,
                use_on_oom,
                no_split,
            } => {
                if pools.contains_key(pool.as_str()) {
                    fake.push(error(Some(pool), "pool name already used"));
                    continue;
                }
                if (*use_on_oom || *no_split) && !rules.version.has_mem_pool_options() {
                    // torch-oracle refuses the options under 2.7 and makes no pool.
                    fake.push(error(Some(pool), "use_on_oom/no_split need torch 2.15"));
                    continue;
                }
                let id = match kind {
                    PoolKind::Graph => {
                        uuid += 1;
                        MempoolId::new(uuid - 1, 0)
                    }
                    _ => {
                        uid += 1;
                        MempoolId::new(0, uid - 1)
                    }
                };
                pools.insert(pool, id);
                names.insert(id, pool.clone());
                let mut r = Ok(());
                if *kind == PoolKind::Mempool {
                    r = alloc.create_or_incref_pool(id);
                    if r.is_ok() && *use_on_oom {
                        r = alloc.set_use_on_oom(id, true);
                    }
                    if r.is_ok() && *no_split {
                        r = alloc.set_no_split(id);
                    }
                }
                fake.push(pool_result(r, "pool_create", pool, id, None));
            }
            Op::PoolBegin { pool, stream } => {
                let id = id_of(pool);
                let filter = match stream {
                    None => StreamFilter::All,
                    Some(s) => StreamFilter::Stream(StreamId(u64::from(*s))),
                };
                let r = alloc.begin_allocate_to_pool(id, filter);
                fake.push(pool_result(r, "pool_begin", pool, id, None));
            }
            Op::PoolEnd(pool) => {
                let id = id_of(pool);
                let r = alloc.end_allocate_to_pool(id);
                fake.push(pool_result(r, "pool_end", pool, id, None));
            }
            Op::PoolRelease(pool) => {
                let id = id_of(pool);
                let r = alloc.release_pool(id);
                fake.push(pool_result(r, "pool_release", pool, id, None));
            }
            Op::PoolDelete(pool) => {
                // The oracle prints the line before the destructor empties the pool (its
                // cudaFrees follow the line), unless torch 2.7's use-count check refuses it.
                let id = id_of(pool);
                let refused = rules.version.mem_pool_destructor_needs_sole_use()
                    && alloc.pool_use_count(id).ok() != Some(1);
                if !refused {
                    fake.push(pool_result(Ok(()), "pool_delete", pool, id, None));
                }
                if let Err(e) = alloc.delete_mem_pool(id) {
                    fake.push(error(Some(pool), &e.to_string()));
                }
            }
            Op::PoolUseCount(pool) => {
                let id = id_of(pool);
                match alloc.pool_use_count(id) {
                    Ok(n) => fake.push(pool_result(Ok(()), "pool_use_count", pool, id, Some(n))),
                    Err(e) => fake.push(error(Some(pool), &e.to_string())),
                }
            }
            Op::EmptyCachePool(pool) => {
                let id = id_of(pool);
                fake.push(Line::EmptyCache);
                if let Err(e) = alloc.empty_cache_pool(id) {
                    fake.push(error(Some(pool), &e.to_string()));
                }
            }
            Op::SnapshotPool(pool) => {
                let id = id_of(pool);
                let snap = alloc.snapshot_pool(id);
                fake.push(snapshot_of(&snap, &fake));
            }
            Op::Observe => {
                fake.push(Line::Observe {
                    observer: observers,
                });
                observers += 1;
            }
            Op::Alloc { id, size, stream } => {
                if live.contains_key(id.as_str()) {
                    fake.push(error(Some(id), "alloc of an id that is still live"));
                    continue;
                }
                if *size == 0 {
                    // raw_alloc_with_stream(0) is the null pointer, as in our front.
                    live.insert(id, 0);
                    fake.push(Line::Alloc {
                        id: id.clone(),
                        size: 0,
                        stream: i64::from(*stream),
                        addr: 0,
                        seg: -1,
                        offset: 0,
                        block: 0,
                        private_pool: None,
                    });
                    continue;
                }
                match alloc.malloc(*size as usize, StreamId(u64::from(*stream))) {
                    Ok(a) => {
                        live.insert(id, a.ptr);
                        let (seg, offset) = fake
                            .segment_of(a.ptr)
                            .map_or((-1, 0), |(seg, base)| (seg, a.ptr - base));
                        fake.push(Line::Alloc {
                            id: id.clone(),
                            size: *size,
                            stream: i64::from(*stream),
                            addr: a.ptr,
                            seg,
                            offset,
                            block: a.size as i64,
                            private_pool: alloc
                                .block_pool_id(a.ptr)
                                .and_then(|p| names.get(&p).cloned()),
                        });
                    }
                    Err(Error::OutOfMemory(e)) => {
                        let seen = OomObservation::from_error(&e);
                        for observer in 0..observers {
                            fake.push(Line::OomObserver {
                                observer,
                                alloc: seen.alloc,
                                device_total: seen.device_total,
                                device_free: seen.device_free,
                            });
                        }
                        fake.push(Line::Oom {
                            id: id.clone(),
                            size: *size,
                            error: e.to_string(),
                        })
                    }
                    Err(e) => fake.push(error(Some(id), &e.to_string())),
                }
            }
            Op::Free { id } => {
                let Some(ptr) = live.remove(id.as_str()) else {
                    fake.push(error(Some(id), "free of an id that is not live"));
                    continue;
                };
                if ptr == 0 {
                    fake.push(Line::Free {
                        id: id.clone(),
                        pending: false,
                    });
                    continue;
                }
                let before = alloc.stats().active_bytes[0].current;
                match alloc.free(ptr) {
                    Ok(()) => {
                        let after = alloc.stats().active_bytes[0].current;
                        fake.push(Line::Free {
                            id: id.clone(),
                            pending: before == after,
                        });
                    }
                    Err(e) => fake.push(error(Some(id), &e.to_string())),
                }
            }
            Op::Record { id, stream } => {
                let Some(&ptr) = live.get(id.as_str()).filter(|&&p| p != 0) else {
                    fake.push(error(Some(id), "record of an id that is not live"));
                    continue;
                };
                match alloc.record_stream(ptr, StreamId(u64::from(*stream))) {
                    Ok(()) => fake.push(Line::Record {
                        id: id.clone(),
                        stream: i64::from(*stream),
                    }),
                    Err(e) => fake.push(error(Some(id), &e.to_string())),
                }
            }
            Op::Sync { stream } => {
                let s = stream.map(i64::from);
                let completed = fake.complete_stream(s);
                fake.push(Line::Sync {
                    stream: s,
                    completed,
                });
            }
            Op::EmptyCache => {
                fake.push(Line::EmptyCache);
                if let Err(e) = alloc.empty_cache() {
                    fake.push(error(None, &e.to_string()));
                }
            }
            Op::SetFraction(f) => match alloc.set_memory_fraction(*f) {
                Ok(()) => fake.push(Line::SetFraction),
                Err(e) => fake.push(error(None, &e.to_string())),
            },
            Op::ResetPeak => {
                alloc.reset_peak_stats();
                fake.push(Line::ResetPeak);
            }
            Op::ResetAccumulated => {
                alloc.reset_accumulated_stats();
                fake.push(Line::ResetAccumulated);
            }
            Op::Stats => fake.push(stats_line(&alloc, &fake, false)),
            Op::Snapshot => {
                let line = snapshot_line(&mut alloc, &fake);
                fake.push(line);
            }
            Op::Mark(t) => fake.push(Line::Mark(t.clone())),
        }
    }
    if notes.erased_pool_with_live_blocks.is_none()
        && !pools.is_empty()
        && erased_pool_with_live_blocks(&alloc, live.values())
    {
        notes.erased_pool_with_live_blocks = Some(script.ops.len());
    }
    fake.push(stats_line(&alloc, &fake, true));
    Ok((fake.take_log(), notes))
}

/// Whether a live allocation belongs to a private pool the allocator has forgotten (see
/// [`Notes::erased_pool_with_live_blocks`]).
fn erased_pool_with_live_blocks<'a>(
    alloc: &DeviceCachingAllocator<FakeCuda>,
    mut live: impl Iterator<Item = &'a DevicePtr>,
) -> bool {
    let known: Vec<MempoolId> = alloc.private_pools().iter().map(|p| p.id).collect();
    live.any(|&ptr| {
        ptr != 0
            && alloc
                .block_pool_id(ptr)
                .is_some_and(|id| !known.contains(&id))
    })
}

/// The pool a pool op names.
fn pool_name(op: &Op) -> Option<&str> {
    match op {
        Op::PoolCreate { pool, .. }
        | Op::PoolBegin { pool, .. }
        | Op::PoolEnd(pool)
        | Op::PoolRelease(pool)
        | Op::PoolDelete(pool)
        | Op::PoolUseCount(pool)
        | Op::EmptyCachePool(pool)
        | Op::SnapshotPool(pool) => Some(pool),
        _ => None,
    }
}

/// The line of a pool op: its own on success, an error line naming the pool otherwise.
fn pool_result(
    r: c10_cuda::Result<()>,
    op: &str,
    pool: &str,
    id: MempoolId,
    use_count: Option<i64>,
) -> Line {
    match r {
        Ok(()) => Line::Pool {
            op: op.to_owned(),
            pool: pool.to_owned(),
            id: (id.first, id.second),
            use_count,
        },
        Err(e) => error(Some(&pool.to_owned()), &e.to_string()),
    }
}

fn error(id: Option<&String>, msg: &str) -> Line {
    Line::Error {
        id: id.cloned(),
        error: msg.to_owned(),
    }
}

fn stats_line(alloc: &DeviceCachingAllocator<FakeCuda>, fake: &FakeCuda, last: bool) -> Line {
    Line::Stats {
        last,
        stats: alloc.stats().memory_stats(),
        fake: fake.counters(),
    }
}

fn snapshot_line(alloc: &mut DeviceCachingAllocator<FakeCuda>, fake: &FakeCuda) -> Line {
    let snap = alloc.snapshot();
    snapshot_of(&snap, fake)
}

fn snapshot_of(snap: &c10_cuda::snapshot::DeviceSnapshot, fake: &FakeCuda) -> Line {
    let segs = snap
        .segments
        .iter()
        .map(|s| {
            let (seg, base) = fake.segment_of(s.address).unwrap_or((-1, s.address));
            SnapSegment {
                seg,
                offset: s.address - base,
                total_size: s.total_size,
                allocated_size: s.allocated_size,
                active_size: s.active_size,
                requested_size: s.requested_size,
                stream: s.stream.0 as i64,
                pool: s.segment_type().to_owned(),
                pool_id: (s.segment_pool_id.first, s.segment_pool_id.second),
                expandable: s.is_expandable,
                blocks: s
                    .blocks
                    .iter()
                    .map(|b| {
                        let state = match b.state {
                            BlockState::ActiveAllocated => "active_allocated",
                            BlockState::ActivePendingFree => "active_pending_free",
                            BlockState::Inactive => "inactive",
                        };
                        (
                            b.address - s.address,
                            b.size,
                            b.requested_size,
                            state.to_owned(),
                        )
                    })
                    .collect(),
            }
        })
        .collect();
    Line::Snapshot(segs)
}
