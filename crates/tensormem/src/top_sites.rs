//! Who holds the memory: the recorded allocations live at a moment of the history, grouped by
//! call site (the top user frame of their stack, or the whole stack) and summed.
//!
//! A site is named after PyTorch's memory viewer's frame format, `filename:line:name`. The *top
//! user frame* is the innermost frame of user Python code: a `.py` file outside the `torch`
//! package; failing that, the innermost Python frame; failing that, the innermost frame with a
//! known file. Bytes are the requested bytes of the live allocations (what the program asked
//! for, the same under every allocator setting).

use std::collections::HashMap;

use c10_cuda::history::{Frame, Frames, TraceAction};
use c10_cuda::snapshot::BlockState;
use serde::Serialize;

use crate::model::Snapshot;
use crate::start_state::StartState;

/// The site of allocations whose stack was not recorded.
pub const NO_STACK: &str = "<no stack recorded>";

/// The site of blocks without a stack that were allocated before recording began (live in the
/// start state: usually the weights and optimizer state).
pub const BEFORE_RECORDING: &str = "<no stack: allocated before recording began>";

/// One call site and what its live allocations hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Site {
    /// `filename:line:name` of the top user frame (or [`NO_STACK`], [`BEFORE_RECORDING`]).
    pub site: String,
    /// Requested bytes of its live allocations.
    pub bytes: u64,
    /// Number of its live allocations.
    pub count: usize,
    /// With full stacks: the stack (innermost first, PyTorch's viewer's noise frames left
    /// out), as `filename:line:name` lines.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack: Option<Vec<String>>,
}

/// How to group allocations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Grouping {
    /// By the top user frame.
    #[default]
    TopFrame,
    /// By the whole (filtered) stack.
    FullStack,
}

/// `filename:line:name`, as PyTorch's memory viewer prints a frame.
pub fn format_frame(f: &Frame) -> String {
    format!("{}:{}:{}", f.filename, f.line, f.name)
}

fn is_python(f: &Frame) -> bool {
    f.filename.ends_with(".py")
}

/// Whether the file belongs to PyTorch itself (`.../site-packages/torch/...`, `torch/...`).
fn is_torch_file(filename: &str) -> bool {
    filename.contains("/torch/") || filename.starts_with("torch/")
}

/// The top user frame of a stack (see the module docs); `None` for an empty stack.
pub fn top_user_frame(frames: &[Frame]) -> Option<&Frame> {
    frames
        .iter()
        .find(|f| is_python(f) && !is_torch_file(&f.filename))
        .or_else(|| frames.iter().find(|f| is_python(f)))
        .or_else(|| {
            frames.iter().find(|f| {
                !is_noise(f)
                    && !f.name.starts_with("c10::")
                    && !f.filename.contains("Register")
                    && (!matches!(&*f.filename, "" | "??") || f.line > 0)
            })
        })
        .or_else(|| frames.iter().find(|f| !is_noise(f)))
        .or_else(|| frames.first())
}

/// Frames PyTorch's memory viewer also hides: the unwinder, the interpreter's dispatch loop,
/// generated registration and boxing glue.
fn is_noise(f: &Frame) -> bool {
    const NAMES: [&str; 8] = [
        "unwind::unwind",
        "CapturedTraceback::gather",
        "gather_with_cpp",
        "_start",
        "__libc_start_main",
        "PyEval_",
        "PyObject_",
        "PyFunction_",
    ];
    const FILES: [&str; 10] = [
        "core/boxing",
        "/Register",
        "/Redispatch",
        "pythonrun.c",
        "Modules/main.c",
        "Objects/call.c",
        "Objects/methodobject.c",
        "pycore_ceval.h",
        "ceval.c",
        "cpython/abstract.h",
    ];
    NAMES.iter().any(|n| f.name.contains(n)) || FILES.iter().any(|n| f.filename.contains(n))
}

/// The stack as shown with full stacks: innermost first, noise frames left out.
pub fn stack_lines(frames: &[Frame]) -> Vec<String> {
    frames
        .iter()
        .filter(|f| !is_noise(f))
        .map(format_frame)
        .collect()
}

/// A live allocation at some moment: its requested bytes and stack.
#[derive(Clone, Debug)]
pub struct LiveAlloc {
    /// Requested bytes (the block's size when the request is unknown).
    pub bytes: u64,
    /// Its stack, when recorded.
    pub frames: Option<Frames>,
    /// Allocated before recording began (a block of the start state).
    pub before_recording: bool,
}

/// The allocations live in `device`'s recording just after event `index` (inclusive). With a
/// `start` state (parity and whole-job replays), the blocks live before the history began
/// count too (every one, placed in a recorded segment or not); their
/// stack is the one recorded on their dump block or on the `free_requested` that frees them.
pub fn live_at(
    snapshot: &Snapshot,
    device: usize,
    index: usize,
    start: Option<&StartState>,
) -> Vec<LiveAlloc> {
    let empty = Vec::new();
    let events = snapshot.traces.get(device).unwrap_or(&empty);
    let mut live: HashMap<u64, LiveAlloc> = HashMap::new();
    if let Some(st) = start {
        // Stacks of blocks alive before the trace: the dump's block, else the free's context.
        let mut stacks: HashMap<u64, Frames> = HashMap::new();
        for e in events {
            if e.action == TraceAction::FreeRequested {
                if let Some(f) = &e.frames {
                    stacks.entry(e.addr).or_insert_with(|| f.clone());
                }
            }
        }
        for s in snapshot
            .segments
            .iter()
            .filter(|s| s.device as usize == device)
        {
            for b in &s.blocks {
                if let (Some(f), BlockState::ActiveAllocated) = (&b.frames, b.state) {
                    stacks.entry(b.address).or_insert_with(|| f.clone());
                }
            }
        }
        for b in &st.live {
            live.insert(
                b.address,
                LiveAlloc {
                    bytes: b.request_bytes(),
                    frames: stacks.get(&b.address).cloned(),
                    before_recording: true,
                },
            );
        }
    }
    for e in events.iter().take(index.saturating_add(1)) {
        match e.action {
            TraceAction::Alloc => {
                live.insert(
                    e.addr,
                    LiveAlloc {
                        bytes: e.size,
                        frames: e.frames.clone(),
                        before_recording: false,
                    },
                );
            }
            TraceAction::FreeRequested => {
                live.remove(&e.addr);
            }
            _ => {}
        }
    }
    live.into_values().collect()
}

/// The allocations held by the dump's blocks (allocated or pending free), for state-only
/// snapshots.
pub fn live_in_dump(snapshot: &Snapshot, device: u8) -> Vec<LiveAlloc> {
    snapshot
        .segments
        .iter()
        .filter(|s| s.device == device)
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state != BlockState::Inactive)
        .map(|b| LiveAlloc {
            bytes: if b.requested_size > 0 {
                b.requested_size
            } else {
                b.size
            },
            frames: b.frames.clone(),
            before_recording: false,
        })
        .collect()
}

/// Groups `live` by site and returns the `n` largest, by bytes (then count, then name).
pub fn top_sites(live: &[LiveAlloc], n: usize, grouping: Grouping) -> Vec<Site> {
    let mut groups: HashMap<String, Site> = HashMap::new();
    for a in live {
        let frames = a.frames.as_deref().unwrap_or(&[]);
        let unknown = if a.before_recording && a.frames.is_none() {
            BEFORE_RECORDING
        } else {
            NO_STACK
        };
        let site = top_user_frame(frames).map_or_else(|| unknown.to_string(), format_frame);
        let (key, stack) = match grouping {
            Grouping::TopFrame => (site.clone(), None),
            Grouping::FullStack => {
                let lines = stack_lines(frames);
                (lines.join("\n"), Some(lines))
            }
        };
        let g = groups.entry(key).or_insert_with(|| Site {
            site,
            bytes: 0,
            count: 0,
            stack,
        });
        g.bytes += a.bytes;
        g.count += 1;
    }
    let mut sites: Vec<Site> = groups.into_values().collect();
    sites.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(b.count.cmp(&a.count))
            .then_with(|| a.site.cmp(&b.site))
            .then_with(|| a.stack.cmp(&b.stack))
    });
    sites.truncate(n);
    sites
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn frame(name: &str, filename: &str, line: u32) -> Frame {
        Frame {
            name: name.into(),
            filename: filename.into(),
            line,
        }
    }

    #[test]
    fn the_top_user_frame_skips_cpp_and_torch_frames() {
        let stack = [
            frame(
                "c10::cuda::CUDACachingAllocator::malloc",
                "CUDACachingAllocator.cpp",
                0,
            ),
            frame(
                "_call_impl",
                "/env/lib/python3.11/site-packages/torch/nn/modules/module.py",
                1750,
            ),
            frame("forward", "/home/me/model.py", 208),
            frame("<module>", "/home/me/train.py", 3),
        ];
        assert_eq!(
            top_user_frame(&stack).map(format_frame).as_deref(),
            Some("/home/me/model.py:208:forward")
        );
        // Only torch's Python: the innermost Python frame.
        assert_eq!(
            top_user_frame(&stack[..2]).map(format_frame).as_deref(),
            Some("/env/lib/python3.11/site-packages/torch/nn/modules/module.py:1750:_call_impl")
        );
        assert_eq!(top_user_frame(&[]), None);
    }

    #[test]
    fn sites_sum_bytes_and_counts_largest_first() {
        let a: Frames = Arc::from(vec![frame("f", "/u/a.py", 1)]);
        let b: Frames = Arc::from(vec![frame("g", "/u/b.py", 2)]);
        let live = vec![
            LiveAlloc {
                bytes: 100,
                frames: Some(a.clone()),
                before_recording: false,
            },
            LiveAlloc {
                bytes: 300,
                frames: Some(b.clone()),
                before_recording: false,
            },
            LiveAlloc {
                bytes: 250,
                frames: Some(a),
                before_recording: false,
            },
            LiveAlloc {
                bytes: 7,
                frames: None,
                before_recording: false,
            },
        ];
        let sites = top_sites(&live, 2, Grouping::TopFrame);
        assert_eq!(
            sites
                .iter()
                .map(|s| (s.site.as_str(), s.bytes, s.count))
                .collect::<Vec<_>>(),
            vec![("/u/a.py:1:f", 350, 2), ("/u/b.py:2:g", 300, 1)]
        );
        let all = top_sites(&live, 10, Grouping::FullStack);
        assert_eq!(
            all.last().map(|s| (s.site.as_str(), s.bytes)),
            Some((NO_STACK, 7))
        );
        assert_eq!(
            all[0].stack.as_deref(),
            Some(&["/u/a.py:1:f".to_string()][..])
        );
    }

    #[test]
    fn blocks_from_before_recording_say_so() {
        let live = vec![
            LiveAlloc {
                bytes: 5,
                frames: None,
                before_recording: true,
            },
            LiveAlloc {
                bytes: 3,
                frames: None,
                before_recording: false,
            },
        ];
        let sites = top_sites(&live, 10, Grouping::TopFrame);
        assert_eq!(
            sites
                .iter()
                .map(|s| (s.site.as_str(), s.bytes))
                .collect::<Vec<_>>(),
            vec![(BEFORE_RECORDING, 5), (NO_STACK, 3)]
        );
    }
}
