//! The shared traces: the alloc/free sequence of a PyTorch memory snapshot's history, read with
//! `tensormem-pickle`, as replay steps and as a torch-oracle op script.
//!
//! The sequence is the one torch-oracle's `tools/mktrace.py` makes from the same pickle: an
//! `alloc` at each recorded `alloc`, a `free` at each `free_completed` of a block the history
//! allocated (frees of blocks allocated before the history started are skipped), the recorded
//! stream 0 as stream 0 and other streams numbered 1, 2, ... in order of appearance. So
//! [`Trace::write_ops`] writes the script mktrace.py writes (without its comment lines), and
//! every allocator in the side-by-side table replays exactly the same calls.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tensormem_pickle::Value;

/// The snapshots, relative to this crate's manifest.
const SNAPSHOTS: &str = "../../../shared/data/snapshots";

/// The history-bearing shared snapshots, smallest first.
pub const TRACES: [&str; 6] = [
    "lm_small_forward_from_empty",
    "lm_small_forward_bf16",
    "gpt2small_trainstep_steady",
    "lm2.7b_ctx128_forward_fp32",
    "lm2.7b_ctx512_forward_bf16",
    "lm2.7b_ctx128_trainstep_fp32",
];

/// The allocation unit of the live-bytes lower bound (PyTorch's kMinBlockSize).
const ALIGN: u64 = 512;

/// One replay step. Blocks are named by slot (an index into a table of live handles, one per
/// `alloc`) so that the timed loops do no address lookups.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    /// Allocate `size` bytes on stream number `stream` into `slot`.
    Alloc { size: usize, slot: u32, stream: u32 },
    /// Free the block in `slot`.
    Free { slot: u32 },
}

/// A trace ready to replay.
pub struct Trace {
    pub name: &'static str,
    pub ops: Vec<Op>,
    /// Number of slots (one per `alloc`).
    pub slots: usize,
    /// Streams used (stream numbers are `0..streams`).
    pub streams: u32,
    /// Frees of blocks the trace never allocated (live before history started): skipped.
    pub skipped_frees: usize,
    /// Peak over the sequence of the live requested bytes, each rounded up to 512.
    pub live_lower_bound: u64,
}

impl Trace {
    /// Reads the trace of the snapshot pickle at `path`.
    pub fn load(name: &'static str, path: &Path) -> Result<Trace, String> {
        let fail = |what: &dyn std::fmt::Display| format!("{}: {what}", path.display());
        let bytes = std::fs::read(path).map_err(|e| fail(&e))?;
        let snapshot = tensormem_pickle::decode(&bytes).map_err(|e| fail(&e))?;
        let mut trace = Trace {
            name,
            ops: Vec::new(),
            slots: 0,
            streams: 1,
            skipped_frees: 0,
            live_lower_bound: 0,
        };
        // mktrace.py reads device 0's trace; every shared history has one device. Very old
        // snapshots are a bare list of segments: no history.
        let Some(entries) = snapshot
            .get("device_traces")
            .and_then(Value::as_list)
            .and_then(|d| d.first())
        else {
            return Ok(trace);
        };
        let entries = entries
            .as_list()
            .ok_or_else(|| fail(&"a device trace that is not a list"))?;
        let mut live: HashMap<u64, (u32, u64)> = HashMap::new();
        let mut streams: HashMap<i64, u32> = HashMap::from([(0, 0)]);
        let mut live_bytes = 0u64;
        for entry in entries {
            let int = |key: &str| {
                entry
                    .get(key)
                    .and_then(Value::as_i64)
                    .ok_or_else(|| fail(&format!("a trace entry without a valid {key:?}")))
            };
            match entry.get("action").and_then(Value::as_str) {
                Some("alloc") => {
                    let (addr, size) = (int("addr")? as u64, int("size")? as u64);
                    let recorded = entry.get("stream").and_then(Value::as_i64).unwrap_or(0);
                    let next = streams.len() as u32;
                    let stream = *streams.entry(recorded).or_insert(next);
                    let slot = trace.slots as u32;
                    let rounded = size.max(1).next_multiple_of(ALIGN);
                    if let Some((_, old)) = live.insert(addr, (slot, rounded)) {
                        // An inconsistent trace: the old block stays live, unreachable.
                        live_bytes -= old;
                    }
                    live_bytes += rounded;
                    trace.live_lower_bound = trace.live_lower_bound.max(live_bytes);
                    trace.ops.push(Op::Alloc {
                        size: size as usize,
                        slot,
                        stream,
                    });
                    trace.slots += 1;
                }
                Some("free_completed") => match live.remove(&(int("addr")? as u64)) {
                    Some((slot, rounded)) => {
                        live_bytes -= rounded;
                        trace.ops.push(Op::Free { slot });
                    }
                    None => trace.skipped_frees += 1,
                },
                _ => {}
            }
        }
        trace.streams = streams.len() as u32;
        Ok(trace)
    }

    /// Number of allocations (a pair is one allocation and its free: times per pair are a
    /// replay's time divided by this, as torch-oracle's `--bench` divides).
    pub fn allocs(&self) -> usize {
        self.slots
    }

    /// Number of frees.
    pub fn frees(&self) -> usize {
        self.ops.len() - self.slots
    }

    /// The torch-oracle op script of the trace (`alloc ID SIZE [STREAM]`, `free ID`; ids are
    /// slots), as mktrace.py writes it, with a header comment.
    pub fn ops_script(&self) -> String {
        use std::fmt::Write;
        let mut out = format!(
            "# {}: {} allocs, {} frees (written by c10-cuda's alloc bench)\n",
            self.name,
            self.allocs(),
            self.frees()
        );
        for op in &self.ops {
            match *op {
                Op::Alloc {
                    size, slot, stream, ..
                } if stream > 0 => writeln!(out, "alloc {slot} {size} {stream}"),
                Op::Alloc { size, slot, .. } => writeln!(out, "alloc {slot} {size}"),
                Op::Free { slot } => writeln!(out, "free {slot}"),
            }
            .expect("writing to a String");
        }
        out
    }

    /// Writes [`Self::ops_script`] to `dir/<name>.ops` and returns the path.
    pub fn write_ops(&self, dir: &Path) -> Result<PathBuf, String> {
        let path = dir.join(format!("{}.ops", self.name));
        std::fs::write(&path, self.ops_script()).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path)
    }
}

/// The folder of the shared snapshots.
pub fn snapshots_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(SNAPSHOTS)
}

/// The history-bearing shared snapshots that are present, or why there are none.
pub fn load_traces() -> Result<Vec<Trace>, String> {
    let dir = snapshots_dir();
    if !dir.is_dir() {
        return Err(format!("{} not found", dir.display()));
    }
    let mut traces = Vec::new();
    for name in TRACES {
        let path = dir.join(format!("{name}.pickle"));
        if !path.is_file() {
            eprintln!("alloc bench: {} not found, skipped", path.display());
            continue;
        }
        traces.push(Trace::load(name, &path)?);
    }
    Ok(traces)
}

/// The warm-pair scripts: `pairs` times `alloc` then `free` of `size` bytes, so that every
/// pair after the first is served from the cache (named `warm_pair_<label>`).
pub fn warm_pairs(pairs: usize) -> Vec<Trace> {
    [
        ("warm_pair_512B", 512),
        ("warm_pair_1MiB", 1 << 20),
        ("warm_pair_20MiB", 20 << 20),
    ]
    .into_iter()
    .map(|(name, size)| Trace {
        name,
        ops: (0..pairs as u32)
            .flat_map(|slot| {
                [
                    Op::Alloc {
                        size,
                        slot,
                        stream: 0,
                    },
                    Op::Free { slot },
                ]
            })
            .collect(),
        slots: pairs,
        streams: 1,
        skipped_frees: 0,
        live_lower_bound: size.next_multiple_of(ALIGN as usize) as u64,
    })
    .collect()
}
