//! Helpers shared by tensormem's tests: the shared snapshots folder, scratch folders, running
//! the binary, and a small synthetic snapshot in each format PyTorch has written.
// Not every helper is used by every module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use tensormem_pickle::Value;

/// `<workspace>/../shared/data/snapshots/<file>`, or `None` (after printing why) when the
/// folder is absent; see `shared_data::dir`.
///
/// # Panics
/// When the folder is absent and `CI` is `true`: CI must never skip.
pub fn shared_snapshot(file: &str) -> Option<PathBuf> {
    shared_data::snapshots_dir().map(|d| d.join(file))
}

/// A fresh folder under the system temp dir, removed (with its contents) on drop.
pub struct Scratch(PathBuf);

impl Scratch {
    /// A new empty folder whose name includes `label`, the process id and a counter.
    pub fn new(label: &str) -> Scratch {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("tensormem-test-{label}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a scratch folder");
        Scratch(dir)
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Writes `bytes` to `name` inside the folder and returns its path.
    pub fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, bytes).expect("write a scratch file");
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the `tensormem` binary with `args` in the folder `cwd`.
pub fn tensormem(cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tensormem"))
        .args(args)
        .current_dir(cwd)
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("run the tensormem binary")
}

/// Stdout as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("UTF-8 stdout")
}

/// Stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).expect("UTF-8 stderr")
}

/// Asserts a clean success and returns stdout.
pub fn success(o: &Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}, stderr:\n{}",
        o.status.code(),
        stderr(o)
    );
    stdout(o)
}

/// Which format details the synthetic snapshot uses.
#[derive(Clone, Copy, Debug)]
pub struct Format {
    /// Trace entries carry `time_us` (PyTorch 2.1+).
    pub time_us: bool,
    /// The top level has `allocator_settings` (PyTorch 2.4+).
    pub settings: bool,
    /// Blocks carry `history` instead of `frames`, have no `address`, and segments have no
    /// `segment_type` (the oldest dict format).
    pub old_blocks: bool,
    /// The file is a bare list of segments (no history at all).
    pub bare_list: bool,
}

impl Format {
    /// Today's format (`torch.cuda.memory._dump_snapshot` in torch 2.4+).
    pub const MODERN: Format = Format {
        time_us: true,
        settings: true,
        old_blocks: false,
        bare_list: false,
    };
}

/// Bytes in a MiB.
pub const MIB: i64 = 1 << 20;
/// The recorded segments: a small one, a 20 MiB large one, a 40 MiB large one.
pub const SMALL_SEG: i64 = 0x7f00_0000_0000;
/// The 20 MiB segment's address.
pub const LARGE_SEG: i64 = 0x7f00_0200_0000;
/// The 40 MiB segment's address.
pub const HUGE_SEG: i64 = 0x7f00_0400_0000;

/// Allocations in the synthetic history.
pub const SYNTH_ALLOCS: usize = 7;
/// Segment decisions (`segment_alloc`) in the synthetic history.
pub const SYNTH_SEGMENT_ALLOCS: usize = 3;
/// Peak reserved bytes of the synthetic history: 2 + 20 + 40 MiB.
pub const SYNTH_PEAK_RESERVED: u64 = 62 << 20;

/// The synthetic history, from an empty allocator with the default settings, as PyTorch's
/// rules decide it: (action, addr, size).
fn synthetic_events() -> Vec<(&'static str, i64, i64)> {
    vec![
        ("segment_alloc", SMALL_SEG, 2 * MIB),
        ("alloc", SMALL_SEG, 1000), // rounds to 1024, splits the 2 MiB block
        ("alloc", SMALL_SEG + 1024, 4096),
        ("segment_alloc", LARGE_SEG, 20 * MIB), // 3 MiB < 10 MiB: a 20 MiB segment
        ("alloc", LARGE_SEG, 3 * MIB),
        ("free_requested", SMALL_SEG, 1000),
        ("free_completed", SMALL_SEG, 1000),
        ("alloc", LARGE_SEG + 3 * MIB, 5 * MIB),
        ("free_requested", LARGE_SEG, 3 * MIB),
        ("free_completed", LARGE_SEG, 3 * MIB),
        // Best fit is the freed 3 MiB block; a 1 MiB remainder is not > 1 MiB: no split.
        ("alloc", LARGE_SEG, 2 * MIB),
        ("alloc", SMALL_SEG, 600),
        ("segment_alloc", HUGE_SEG, 40 * MIB),
        ("alloc", HUGE_SEG, 40 * MIB),
        ("free_requested", HUGE_SEG, 40 * MIB),
        ("free_completed", HUGE_SEG, 40 * MIB),
    ]
}

fn s(key: &str, v: Value) -> (Value, Value) {
    (Value::str(key), v)
}

/// The snapshot the synthetic history leaves, in `format`, as a pickle value.
pub fn synthetic_value(format: Format) -> Value {
    // One frame list shared by every entry, as PyTorch's pickles share them through the memo.
    let frames = Value::list(vec![Value::dict(vec![
        s("filename", Value::str("train.py")),
        s("line", Value::Int(42)),
        s("name", Value::str("forward")),
    ])]);
    let block = |addr: i64, size: i64, requested: i64, state: &str| {
        let mut e = Vec::new();
        if !format.old_blocks {
            e.push(s("address", Value::Int(addr)));
        }
        e.push(s("size", Value::Int(size)));
        e.push(s("requested_size", Value::Int(requested)));
        e.push(s("state", Value::str(state)));
        if format.old_blocks {
            e.push(s(
                "history",
                Value::list(vec![Value::dict(vec![
                    s("addr", Value::Int(addr)),
                    s("real_size", Value::Int(requested)),
                    s("frames", frames.clone()),
                ])]),
            ));
        } else {
            e.push(s("frames", frames.clone()));
        }
        Value::dict(e)
    };
    let segment = |addr: i64, size: i64, blocks: Vec<Value>| {
        let mut e = vec![
            s("device", Value::Int(0)),
            s("address", Value::Int(addr)),
            s("total_size", Value::Int(size)),
            s("stream", Value::Int(0)),
        ];
        if !format.old_blocks {
            let kind = if size == 2 * MIB { "small" } else { "large" };
            e.push(s("segment_type", Value::str(kind)));
            e.push(s(
                "segment_pool_id",
                Value::tuple(vec![Value::Int(0), Value::Int(0)]),
            ));
            e.push(s("is_expandable", Value::Bool(false)));
            e.push(s("frames", frames.clone()));
        }
        e.push(s("blocks", Value::list(blocks)));
        Value::dict(e)
    };
    let (a, l, h) = (SMALL_SEG, LARGE_SEG, HUGE_SEG);
    let segments = Value::list(vec![
        segment(
            a,
            2 * MIB,
            vec![
                block(a, 1024, 600, "active_allocated"),
                block(a + 1024, 4096, 4096, "active_allocated"),
                block(a + 5120, 2 * MIB - 5120, 0, "inactive"),
            ],
        ),
        segment(
            l,
            20 * MIB,
            vec![
                block(l, 3 * MIB, 2 * MIB, "active_allocated"),
                block(l + 3 * MIB, 5 * MIB, 5 * MIB, "active_allocated"),
                block(l + 8 * MIB, 12 * MIB, 0, "inactive"),
            ],
        ),
        segment(h, 40 * MIB, vec![block(h, 40 * MIB, 0, "inactive")]),
    ]);
    if format.bare_list {
        return segments;
    }
    let trace: Vec<Value> = synthetic_events()
        .into_iter()
        .enumerate()
        .map(|(i, (action, addr, size))| {
            let mut e = vec![
                s("action", Value::str(action)),
                s("addr", Value::Int(addr)),
                s("size", Value::Int(size)),
                s("stream", Value::Int(0)),
            ];
            if format.time_us {
                e.push(s(
                    "time_us",
                    Value::Int(1_700_000_000_000_000 + 10 * i as i64),
                ));
            }
            e.push(s("frames", frames.clone()));
            Value::dict(e)
        })
        .collect();
    let mut top = vec![
        s("segments", segments),
        s("device_traces", Value::list(vec![Value::list(trace)])),
    ];
    if format.settings {
        let divisions = (0..16)
            .map(|k| (Value::str(&(1u32 << k).to_string()), Value::Int(0)))
            .collect();
        top.push(s(
            "allocator_settings",
            Value::dict(vec![
                s("PYTORCH_CUDA_ALLOC_CONF", Value::str("")),
                s("max_split_size", Value::Int(-1)),
                s("garbage_collection_threshold", Value::Float(0.0)),
                s("expandable_segments", Value::Bool(false)),
                s("pinned_num_register_threads", Value::Int(1)),
                s("release_lock_on_cudamalloc", Value::Bool(false)),
                s("pinned_use_cuda_host_register", Value::Bool(false)),
                s("roundup_power2_divisions", Value::dict(divisions)),
            ]),
        ));
        top.push(s("external_annotations", Value::list(Vec::new())));
    }
    Value::dict(top)
}

/// [`synthetic_value`] as pickle bytes.
pub fn synthetic_pickle(format: Format) -> Vec<u8> {
    tensormem_pickle::encode(&synthetic_value(format))
}
