//! Our side of the comparison: runs a [`Script`] through c10-cuda's
//! [`DeviceCachingAllocator`] on [`FakeCuda`] and produces the lines torch-oracle prints for
//! the same script.

use std::collections::HashMap;

use c10_cuda::config::AllocatorConfig;
use c10_cuda::device::{DevicePtr, StreamId};
use c10_cuda::rules::Rules;
use c10_cuda::snapshot::BlockState;
use c10_cuda::{DeviceCachingAllocator, Error};

use crate::fake::{FakeConfig, FakeCuda};
use crate::script::{Op, Script};
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
/// [`DriverError`] when the script's configuration cannot be used.
pub fn run(script: &Script, rules: Rules) -> Result<Vec<Line>, DriverError> {
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
    for op in &script.ops {
        match op {
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
                        });
                    }
                    Err(Error::OutOfMemory(e)) => fake.push(Line::Oom {
                        id: id.clone(),
                        size: *size,
                        error: e.to_string(),
                    }),
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
    fake.push(stats_line(&alloc, &fake, true));
    Ok(fake.take_log())
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
