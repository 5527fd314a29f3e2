//! Call sites in the memory history: capturing where an allocation or a free came from, as
//! PyTorch's `_record_memory_history(context=..., stacks=...)` captures Python and C++ stacks
//! (its `CapturedTraceback::gather`).
//!
//! Two kinds of stack ([`Stacks`]):
//! - [`Stacks::Caller`]: one frame, the `#[track_caller]` location of the call into the
//!   allocator (the thread-safe front's `raw_alloc`/`raw_delete`/`empty_cache`, or c10-core's
//!   `Allocator::allocate`). Free: a `&'static Location`, cached per thread.
//! - [`Stacks::Full`]: the whole stack from [`backtrace`] (std's `Backtrace` does not expose its
//!   frames), innermost first, symbolized once per address and shared between identical stacks;
//!   the capture machinery's own frames are cut off the top.
//!
//! The machinery's frames (the unwinder, this crate, c10-core's `DataPtr` drop, the C ABI crate
//! `tensormem_alloc`, std's panic and closure shims) are the leading frames recognized by name
//! *or* by source file, up to the first frame that is neither. Names alone do not do: they carry
//! the module path (`c10_cuda::front::...`) only where the debug info has it; with
//! `debug = "line-tables-only"` (this workspace's release profile) and in inlined frames they
//! are bare (`trace`, `full_frames`, `raw_alloc<...>`). So a frame is also the machinery's when
//! its file lies under the `src` directory of this crate, of `c10-cuda-capi` or of `backtrace`
//! (the directory as in a workspace, `c10-cuda/src/...`, or as in a registry,
//! `c10-cuda-0.1.0/src/...`), is c10-core's `src/data_ptr.rs`, or is one of std's shim files
//! (`std/src/panicking.rs`, `std/src/panic.rs`, `core/src/ops/function.rs`,
//! `core/src/panic/unwind_safe.rs`), except the C ABI's exported entry points (`tm_malloc`,
//! `tm_free`, ...), where a C caller's stack starts. Frames without a file (no debug info) are judged by their
//! full names, which the symbol table then gives. The user's frames are never cut: the cut
//! stops at the first frame that is not the machinery's.
//!
//! A frame's `name` is the function (`??` when unknown: a `#[track_caller]` location names only
//! the file, line and column), `filename` the source file, `line` the line, as snapshots write
//! them (`{filename, line, name}`), so PyTorch's viewer shows them.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::panic::Location;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::allocator::DeviceCachingAllocator;
use crate::device::DeviceMemory;
use crate::history::{Clock, Frame, Frames, RecordContext};
use crate::observer::TraceTracker;

/// Which stack a recorded context holds (PyTorch's `stacks="python"|"all"` choice, for Rust).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Stacks {
    /// The location of the call into the allocator (`#[track_caller]`): one frame, no cost
    /// beyond a cached lookup.
    #[default]
    Caller = 0,
    /// The full stack ([`backtrace`]): microseconds per capture, symbols resolved once per
    /// address.
    Full = 1,
}

/// How to record memory history: PyTorch's `_record_memory_history(enabled, context, stacks,
/// max_entries)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryOptions {
    /// Ring-buffer entries per device (`max_entries`); 0 stops recording.
    pub max_entries: usize,
    /// Where timestamps come from.
    pub clock: Clock,
    /// Which entries and blocks carry stacks (`context`).
    pub context: RecordContext,
    /// What a stack holds (`stacks`).
    pub stacks: Stacks,
}

impl HistoryOptions {
    /// `max_entries` entries with PyTorch's defaults: wall-clock times, `context="all"`, and
    /// here [`Stacks::Caller`].
    pub fn new(max_entries: usize) -> Self {
        HistoryOptions {
            max_entries,
            clock: Clock::System,
            context: RecordContext::All,
            stacks: Stacks::Caller,
        }
    }

    /// The same with `context`.
    pub fn context(mut self, context: RecordContext) -> Self {
        self.context = context;
        self
    }

    /// The same with `stacks`.
    pub fn stacks(mut self, stacks: Stacks) -> Self {
        self.stacks = stacks;
        self
    }

    /// The same with `clock`.
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }
}

/// Captures the caller's stack of the kind `stacks`. With [`Stacks::Caller`] this is the
/// `#[track_caller]` location of the caller (or of the first caller up the chain that is not
/// `#[track_caller]` itself).
#[track_caller]
pub fn capture(stacks: Stacks) -> Frames {
    match stacks {
        Stacks::Caller => caller_frames(Location::caller()),
        Stacks::Full => full_frames(),
    }
}

thread_local! {
    /// One shared stack per call-site location (locations are `'static`, so the key is stable).
    static CALLERS: RefCell<HashMap<usize, Frames>> = RefCell::new(HashMap::new());
}

/// The one-frame stack of `location`.
pub fn caller_frames(location: &'static Location<'static>) -> Frames {
    let key = std::ptr::from_ref(location) as usize;
    CALLERS.with(|cache| {
        Arc::clone(cache.borrow_mut().entry(key).or_insert_with(|| {
            Arc::from(vec![Frame {
                name: Arc::from("??"),
                filename: Arc::from(location.file()),
                line: location.line(),
            }])
        }))
    })
}

/// Leading frames that belong to the capture itself or to the layers the call came through,
/// cut off full stacks, by their full names (the names where debug info or the symbol table
/// has the module path; bare release names are recognized by file, see the module docs): the
/// unwinder, this crate (the front, this module), c10-core's
/// `DataPtr` (whose drop calls the deleter), std's panic and closure shims (`catch_unwind`,
/// `__rust_try`), and the C ABI crate
/// (`tensormem_alloc`, which calls in through the front).
const MACHINERY: &[&str] = &[
    "backtrace::",
    "c10_cuda::",
    "<c10_cuda::",
    "c10_core::data_ptr::",
    "<c10_core::data_ptr::",
    "core::ptr::drop_in_place<c10_core::data_ptr::",
    "std::panicking::",
    "std::panic::",
    "__rust_try",
    "core::ops::function::",
    "<core::panic::unwind_safe::",
    "tensormem_alloc::",
    "<tensormem_alloc::",
];

/// Stacks kept for sharing (beyond it new stacks are still captured, just not shared).
const MAX_CACHED_STACKS: usize = 1 << 16;

#[derive(Default)]
struct Symbols {
    /// Return address -> its frames (several when functions were inlined), innermost first.
    frames: HashMap<usize, Arc<[Frame]>>,
    /// Whole stacks by their addresses, so identical stacks share one `Frames`.
    stacks: HashMap<Box<[usize]>, Frames>,
}

fn symbols() -> &'static Mutex<Symbols> {
    static SYMBOLS: OnceLock<Mutex<Symbols>> = OnceLock::new();
    SYMBOLS.get_or_init(Mutex::default)
}

fn resolve(ip: usize) -> Arc<[Frame]> {
    let mut out = Vec::new();
    // A return address points after the call: look up the call itself (backtrace's
    // `adjust_ip`), except for the innermost frame.
    let lookup = ip.saturating_sub(1);
    backtrace::resolve(lookup as *mut std::ffi::c_void, |symbol| {
        let name = symbol
            .name()
            .map_or_else(|| "??".to_string(), |n| format!("{n:#}"));
        let filename = symbol
            .filename()
            .map_or_else(|| "??".to_string(), |p| p.display().to_string());
        out.push(Frame {
            name: Arc::from(name),
            filename: Arc::from(filename),
            line: symbol.lineno().unwrap_or(0),
        });
    });
    if out.is_empty() {
        out.push(Frame {
            name: Arc::from(format!("{ip:#x}")),
            filename: Arc::from("??"),
            line: 0,
        });
    }
    Arc::from(out)
}

/// Names that bare (module-less) frame names of the machinery start with, where the file does
/// not tell (`drop_in_place` glue is in core's `ptr/mod.rs` whatever it drops).
const MACHINERY_BARE: &[&str] = &["drop_in_place<c10_core::data_ptr::"];

/// Crates whose whole `src` directory is the machinery's (by directory name, see
/// [`is_crate_dir`]).
const MACHINERY_CRATES: &[&str] = &[env!("CARGO_PKG_NAME"), "c10-cuda-capi", "backtrace"];

/// Std's panic and closure shims (the paths end so, after `library/`).
const MACHINERY_STD_FILES: &[&str] = &[
    "std/src/panicking.rs",
    "std/src/panic.rs",
    "core/src/ops/function.rs",
    "core/src/panic/unwind_safe.rs",
];

/// Whether `dir` is the directory of crate `krate`: `krate` itself (a workspace member) or
/// `krate-<version>` (a registry or vendored copy).
fn is_crate_dir(dir: &OsStr, krate: &str) -> bool {
    dir.to_str().is_some_and(|d| {
        d.strip_prefix(krate).is_some_and(|rest| {
            rest.is_empty()
                || rest
                    .strip_prefix('-')
                    .is_some_and(|v| v.starts_with(|c: char| c.is_ascii_digit()))
        })
    })
}

/// Whether the source file `filename` is the machinery's (see the module docs).
fn is_machinery_file(filename: &str) -> bool {
    let path = Path::new(filename);
    if MACHINERY_STD_FILES.iter().any(|f| path.ends_with(f)) {
        return true;
    }
    // c10-core's `DataPtr` (its drop calls the deleter): only that file of c10-core.
    if path.file_name() == Some(OsStr::new("data_ptr.rs")) {
        let mut up = path.ancestors().skip(1);
        if let (Some(src), Some(krate)) = (up.next(), up.next()) {
            if src.file_name() == Some(OsStr::new("src"))
                && krate
                    .file_name()
                    .is_some_and(|k| is_crate_dir(k, "c10-core"))
            {
                return true;
            }
        }
    }
    // A `src` directory anywhere up the path whose parent is a machinery crate's directory.
    let mut previous: Option<&OsStr> = None;
    for component in path.components() {
        let name = component.as_os_str();
        if name == "src"
            && previous.is_some_and(|p| MACHINERY_CRATES.iter().any(|k| is_crate_dir(p, k)))
        {
            return true;
        }
        previous = Some(name);
    }
    false
}

/// The C ABI's exported entry points (`tm_malloc`, `tm_free`, ...) are where a C or C++
/// caller's stack enters the allocator: never cut, though their file is `c10-cuda-capi`'s.
const C_ENTRY_PREFIX: &str = "tm_";

fn is_machinery(frame: &Frame) -> bool {
    if frame.name.starts_with(C_ENTRY_PREFIX) {
        return false;
    }
    MACHINERY
        .iter()
        .chain(MACHINERY_BARE)
        .any(|p| frame.name.starts_with(p))
        || is_machinery_file(&frame.filename)
}

/// The full stack of the calling thread, innermost first, without the capture machinery's
/// frames (see the module docs).
pub fn full_frames() -> Frames {
    let mut ips: Vec<usize> = Vec::with_capacity(64);
    backtrace::trace(|frame| {
        let ip = frame.ip() as usize;
        // The unwinder ends some stacks with a null return address: not a frame.
        if ip != 0 {
            ips.push(ip);
        }
        true
    });
    let mut symbols = symbols().lock();
    if let Some(stack) = symbols.stacks.get(ips.as_slice()) {
        return Arc::clone(stack);
    }
    let mut frames: Vec<Frame> = Vec::with_capacity(ips.len());
    for &ip in &ips {
        let resolved = match symbols.frames.get(&ip) {
            Some(f) => Arc::clone(f),
            None => {
                let f = resolve(ip);
                symbols.frames.insert(ip, Arc::clone(&f));
                f
            }
        };
        frames.extend(resolved.iter().cloned());
    }
    let skip = frames.iter().take_while(|f| is_machinery(f)).count();
    let stack: Frames = Arc::from(frames.split_off(skip));
    if symbols.stacks.len() < MAX_CACHED_STACKS {
        symbols
            .stacks
            .insert(ips.into_boxed_slice(), Arc::clone(&stack));
    }
    stack
}

impl<D: DeviceMemory> DeviceCachingAllocator<D> {
    /// Starts (or changes) memory history with a context mode: PyTorch's
    /// `_record_memory_history(context=..., stacks=..., max_entries=...)`.
    /// `options.max_entries == 0` stops recording (the entries so far are kept).
    ///
    /// The allocator itself captures no stack: the caller of each operation passes it with
    /// [`Self::with_context`] (the thread-safe front does this for every call, capturing outside
    /// the lock, as PyTorch does). [`Self::record_history`] is this with
    /// [`RecordContext::Never`].
    pub fn record_memory_history(&mut self, options: &HistoryOptions) {
        if options.max_entries == 0 {
            self.history.disable();
        } else {
            self.history
                .enable_with(options.max_entries, options.clock, options.context);
        }
        self.refresh_plain();
    }

    /// The context mode in force ([`RecordContext::Never`] while history is off).
    pub fn record_context(&self) -> RecordContext {
        self.history.context()
    }

    /// Runs `f` with `frames` as the stack of the operation: the trace entries `f` makes, and
    /// the blocks it allocates, carry it as [`RecordContext`] says (PyTorch passes the gathered
    /// context down through `malloc`, `free` and `emptyCache`). `None` runs `f` without one.
    ///
    /// # Panics
    /// Resumes a panic of `f`, after restoring the previous stack.
    pub fn with_context<R>(&mut self, frames: Option<Frames>, f: impl FnOnce(&mut Self) -> R) -> R {
        let previous = self.history.set_current(frames);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(self)));
        self.history.set_current(previous);
        match result {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    /// Attaches a trace tracker, called with this device's index and every trace entry from
    /// now on, whether or not history is recorded (PyTorch's `attachAllocatorTraceTracker`). It
    /// runs inside the allocator's operations: see [`TraceTracker`] for what it must not do.
    pub fn attach_trace_tracker(&mut self, tracker: TraceTracker) {
        let device = self.device.index();
        self.history.attach_tracker(device, tracker);
        self.refresh_plain();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(name: &str, filename: &str) -> Frame {
        Frame {
            name: Arc::from(name),
            filename: Arc::from(filename),
            line: 1,
        }
    }

    /// Release-build frame names are bare, so the files tell: this crate's, the C ABI
    /// crate's and the unwinder's sources (in a workspace or a registry), c10-core's
    /// `DataPtr`, std's shims; not other files of those directories' neighbours.
    #[test]
    fn machinery_files() {
        let registry = "/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f";
        for file in [
            "/work/ws/crates/c10-cuda/src/front.rs",
            "crates/c10-cuda/src/call_site.rs",
            "/work/ws/crates/c10-cuda/src/config/knobs.rs",
            &format!("{registry}/c10-cuda-0.1.0/src/call_site.rs"),
            &format!("{registry}/backtrace-0.3.76/src/backtrace/libunwind.rs"),
            "/work/ws/crates/c10-cuda-capi/src/guard.rs",
            "/work/ws/crates/c10-core/src/data_ptr.rs",
            &format!("{registry}/c10-core-0.1.0/src/data_ptr.rs"),
            "/rustc/5980/library/std/src/panicking.rs",
            "/rustc/5980/library/std/src/panic.rs",
            "/rustc/5980/library/core/src/ops/function.rs",
            "/rustc/5980/library/core/src/panic/unwind_safe.rs",
        ] {
            assert!(is_machinery_file(file), "{file}");
        }
        for file in [
            "??",
            "/work/ws/crates/c10-cuda/tests/it/history_frames.rs",
            "/work/ws/crates/c10-cuda/examples/memory-history.rs",
            "/work/ws/crates/c10-core/src/allocator.rs",
            "/work/app/src/main.rs",
            "/work/c10-cuda-tools/src/main.rs",
            "/work/backtrace-demo/src/main.rs",
            "/rustc/5980/library/core/src/mem/mod.rs",
            "/rustc/5980/library/std/src/sys/backtrace.rs",
        ] {
            assert!(!is_machinery_file(file), "{file}");
        }
    }

    /// Bare names (release builds, inlined frames) of the machinery's frames are recognized by
    /// their files; full names as before; the user's frames are not.
    #[test]
    fn machinery_frames_by_name_or_file() {
        let ws = "/work/ws/crates";
        assert!(is_machinery(&frame(
            "full_frames",
            &format!("{ws}/c10-cuda/src/call_site.rs")
        )));
        assert!(is_machinery(&frame(
            "raw_alloc<c10_cuda::sim::SimDevice>",
            &format!("{ws}/c10-cuda/src/front.rs")
        )));
        assert!(is_machinery(&frame("c10_cuda::front::delete_block", "??")));
        assert!(is_machinery(&frame("backtrace::backtrace::trace", "??")));
        assert!(is_machinery(&frame(
            "drop_in_place<c10_core::data_ptr::DataPtr>",
            "/rustc/5980/library/core/src/ptr/mod.rs"
        )));
        assert!(!is_machinery(&frame(
            "drop_in_place<app::Tensor>",
            "/rustc/5980/library/core/src/ptr/mod.rs"
        )));
        // The C ABI's entry point starts a C program's stack; its internals are cut.
        assert!(!is_machinery(&frame(
            "tm_malloc",
            &format!("{ws}/c10-cuda-capi/src/lib.rs")
        )));
        assert!(is_machinery(&frame(
            "guard<*mut core::ffi::c_void>",
            &format!("{ws}/c10-cuda-capi/src/guard.rs")
        )));
        assert!(!is_machinery(&frame("main", "/work/app/src/main.rs")));
        assert!(!is_machinery(&frame("app::main", "??")));
    }
}
