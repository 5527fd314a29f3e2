//! The `tensormem` Python module: a thin PyO3 binding over the `tensormem` crate.
//!
//! ```python
//! import pickle, tensormem
//! snap = torch.cuda.memory._snapshot()          # or a path, or the bytes of a pickle
//! r = tensormem.replay(snap, from_empty=True, sweep=True)   # the same dict as `--json`
//! a = tensormem.advise(snap, device_memory="40GiB")
//! ```
//!
//! Every function takes a snapshot as a path (`str` or `os.PathLike`), a file object opened
//! for reading (`open(path, "rb")`, `gzip.open`, `io.BytesIO`), the bytes of a pickle or JSON
//! file (`bytes`, `bytearray`, `memoryview`), or the dict `torch.cuda.memory._snapshot()`
//! returns, and returns what the CLI's `--json` prints: `replay`, `advise`, `explain` and
//! `diff` as a `dict` subclass of `tensormem._result` that notebooks display as a table
//! (`_repr_html_`), nested values as plain dicts and lists. Errors raise
//! `tensormem.TensormemError` with the CLI's message, option names given as the Python
//! arguments (`device_memory`); a field of a snapshot dict with an invalid value (a negative
//! or non-integer size) is named (`device_traces[0][3]['size']`). The work runs without the
//! GIL. `dtr_log` reads a DTR operator log (as `tensormem.record` writes them) and gives its
//! no-eviction figures.

use std::collections::HashMap;
use std::path::PathBuf;

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyMemoryView, PyString, PyTuple,
};
use serde_json::Value as Json;
use tensormem::model::Snapshot;
use tensormem_pickle::Value;

create_exception!(
    tensormem,
    TensormemError,
    PyException,
    "A tensormem failure: bad input or options; the message is the command line's."
);

/// Nesting deeper than this is refused (snapshots nest about 6 deep).
const MAX_DEPTH: usize = 64;

fn error(message: impl std::fmt::Display) -> PyErr {
    TensormemError::new_err(python_names(&message.to_string()))
}

/// The command's messages with its option names (`--device-memory`, `--alloc-conf`) as the
/// Python arguments that carry them (`device_memory`, `alloc_conf`). Only a `--` that starts
/// the message or follows a space or `(` is an option (file names keep theirs).
fn python_names(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(i) = rest.find("--") {
        let starts_word = rest[..i]
            .chars()
            .next_back()
            .is_none_or(|c| c == ' ' || c == '(');
        let after = &rest[i + 2..];
        let n = after
            .find(|c: char| !(c.is_ascii_lowercase() || c == '-'))
            .unwrap_or(after.len());
        out.push_str(&rest[..i]);
        if starts_word && n > 0 {
            out.push_str(&after[..n].replace('-', "_"));
        } else {
            out.push_str("--");
            out.push_str(&after[..n]);
        }
        rest = &after[n..];
    }
    out.push_str(rest);
    out
}

/// Converts a Python object of plain builtins to a pickle value. Containers already converted
/// (PyTorch shares frame dicts between entries) are shared, not copied.
struct Converter {
    seen: HashMap<usize, Value>,
}

impl Converter {
    fn convert(&mut self, obj: &Bound<'_, PyAny>, depth: usize) -> PyResult<Value> {
        if depth > MAX_DEPTH {
            return Err(error(
                "the snapshot nests too deeply to be a memory snapshot",
            ));
        }
        if obj.is_none() {
            return Ok(Value::None);
        }
        if let Ok(b) = obj.cast::<PyBool>() {
            return Ok(Value::Bool(b.is_true()));
        }
        if obj.is_instance_of::<PyInt>() {
            return match obj.extract::<i64>() {
                Ok(i) => Ok(Value::Int(i)),
                Err(_) => Err(error(format!(
                    "the snapshot holds an integer outside the 64-bit range: {obj}"
                ))),
            };
        }
        if let Ok(f) = obj.cast::<PyFloat>() {
            return Ok(Value::Float(f.value()));
        }
        if let Ok(s) = obj.cast::<PyString>() {
            return Ok(Value::str(&s.to_cow()?));
        }
        if let Ok(b) = obj.cast::<PyBytes>() {
            return Ok(Value::bytes(b.as_bytes()));
        }
        let key = obj.as_ptr() as usize;
        if let Some(v) = self.seen.get(&key) {
            return Ok(v.clone());
        }
        let v = if let Ok(d) = obj.cast::<PyDict>() {
            let mut entries = Vec::with_capacity(d.len());
            for (k, v) in d.iter() {
                entries.push((self.convert(&k, depth + 1)?, self.convert(&v, depth + 1)?));
            }
            Value::dict(entries)
        } else if let Ok(l) = obj.cast::<PyList>() {
            let mut items = Vec::with_capacity(l.len());
            for x in l.iter() {
                items.push(self.convert(&x, depth + 1)?);
            }
            Value::list(items)
        } else if let Ok(t) = obj.cast::<PyTuple>() {
            let mut items = Vec::with_capacity(t.len());
            for x in t.iter() {
                items.push(self.convert(&x, depth + 1)?);
            }
            Value::tuple(items)
        } else {
            let ty = obj.get_type().name()?;
            return Err(error(format!(
                "not a PyTorch memory snapshot: found a value of type {ty} (expected plain dicts, lists, strings and numbers)"
            )));
        };
        // The object stays alive (the caller holds the root) while this map is used.
        self.seen.insert(key, v.clone());
        Ok(v)
    }
}

/// The bytes of an input given as data rather than a path: `bytes`, `bytearray`, `memoryview`
/// (any buffer; a non-contiguous one is copied in C order, as `bytes(view)` does), or a readable
/// file object (anything with a `read()` method but `str`: binary files, `gzip.open`,
/// `io.BytesIO`; a text file's `str` is taken as UTF-8, for JSON), with the name messages use
/// (`<bytes>`, `<bytearray>`, `<memoryview>`, a file object's `name`, else `<file>`). `None`
/// for anything else (a path, a dict).
fn input_bytes(obj: &Bound<'_, PyAny>) -> PyResult<Option<(Vec<u8>, String)>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(Some((b.as_bytes().to_vec(), "<bytes>".into())));
    }
    if let Ok(b) = obj.cast::<PyByteArray>() {
        return Ok(Some((b.to_vec(), "<bytearray>".into())));
    }
    if obj.is_instance_of::<PyMemoryView>() {
        let copy = obj.py().get_type::<PyBytes>().call1((obj,))?;
        let b = copy.cast::<PyBytes>()?;
        return Ok(Some((b.as_bytes().to_vec(), "<memoryview>".into())));
    }
    if obj.is_instance_of::<PyString>() || !obj.hasattr("read")? {
        return Ok(None);
    }
    let name = obj
        .getattr("name")
        .ok()
        .and_then(|n| n.extract::<String>().ok())
        .unwrap_or_else(|| "<file>".into());
    let data = obj.call_method0("read").map_err(|e| {
        let hint = if e.is_instance_of::<pyo3::exceptions::PyUnicodeDecodeError>(obj.py()) {
            " (open a pickle in binary mode: open(path, \"rb\"))"
        } else {
            ""
        };
        error(format!("{name}: read() failed: {e}{hint}"))
    })?;
    if let Ok(b) = data.cast::<PyBytes>() {
        return Ok(Some((b.as_bytes().to_vec(), name)));
    }
    if let Ok(t) = data.cast::<PyString>() {
        return Ok(Some((t.to_cow()?.as_bytes().to_vec(), name)));
    }
    let ty = data.get_type().name()?;
    Err(error(format!(
        "{name}: read() returned {ty}, expected bytes or str"
    )))
}

/// Loads `snap`: a path, bytes-like data or a file object ([`input_bytes`]), or a snapshot
/// dict; returns the model and its name for messages.
fn load(snap: &Bound<'_, PyAny>) -> PyResult<(Snapshot, String)> {
    if let Some((bytes, name)) = input_bytes(snap)? {
        let s = snap
            .py()
            .detach(|| tensormem::load::load_bytes(&bytes, &name))
            .map_err(error)?;
        return Ok((s, name));
    }
    if snap.is_instance_of::<PyDict>() || snap.is_instance_of::<PyList>() {
        let name = "<dict>".to_string();
        let value = Converter {
            seen: HashMap::new(),
        }
        .convert(snap, 0)?;
        let s = tensormem::load::load_value(&value, &name).map_err(error)?;
        return Ok((s, name));
    }
    if let Ok(path) = snap.extract::<PathBuf>() {
        let name = path.display().to_string();
        let s = tensormem::load::load_path(&path).map_err(error)?;
        return Ok((s, name));
    }
    let ty = snap.get_type().name()?;
    Err(error(format!(
        "expected a path, a file object, the bytes of a snapshot file (bytes, bytearray, memoryview), or the dict torch.cuda.memory._snapshot() returns; found {ty}"
    )))
}

/// `doc` as an instance of `class` of `tensormem._result`: the `--json` dict as a `dict`
/// subclass that notebooks display as a table (`_repr_html_`).
fn result<'py>(py: Python<'py>, class: &str, doc: &Json) -> PyResult<Bound<'py, PyAny>> {
    let dict = to_py(py, doc)?;
    py.import("tensormem._result")?
        .getattr(class)?
        .call1((dict,))
}

/// A size given as bytes (int) or text ("40GiB"); `None` stays `None`.
fn size_arg(v: Option<&Bound<'_, PyAny>>) -> PyResult<Option<String>> {
    match v {
        None => Ok(None),
        Some(v) if v.is_none() => Ok(None),
        Some(v) if v.is_instance_of::<PyInt>() && !v.is_instance_of::<PyBool>() => {
            Ok(Some(v.extract::<i128>()?.to_string()))
        }
        Some(v) => v.extract::<String>().map(Some).map_err(|_| {
            error("--device-memory: expected a number of bytes or a size such as \"40GiB\"")
        }),
    }
}

/// `since=`/`until=` as the command's `--since`/`--until`: an event index (`int`) or a time
/// since the trace's first event (`"1.5s"`, `"250ms"`).
fn window_arg(
    since: Option<&Bound<'_, PyAny>>,
    until: Option<&Bound<'_, PyAny>>,
) -> PyResult<tensormem::window::Window> {
    let text = |name: &str, v: Option<&Bound<'_, PyAny>>| -> PyResult<Option<String>> {
        match v {
            None => Ok(None),
            Some(v) if v.is_none() => Ok(None),
            Some(v) if v.is_instance_of::<PyInt>() && !v.is_instance_of::<PyBool>() => {
                Ok(Some(v.extract::<i128>()?.to_string()))
            }
            Some(v) => v.extract::<String>().map(Some).map_err(|_| {
                error(format!(
                    "{name}: expected an event index (int) or a time such as \"1.5s\""
                ))
            }),
        }
    };
    tensormem::window::Window::parse(
        text("since", since)?.as_deref(),
        text("until", until)?.as_deref(),
    )
    .map_err(error)
}

/// JSON -> Python objects.
fn to_py<'py>(py: Python<'py>, v: &Json) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Json::Null => py.None().into_bound(py),
        Json::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Json::Number(n) => {
            if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any()
            }
        }
        Json::String(s) => PyString::new(py, s).into_any(),
        Json::Array(items) => {
            let list = PyList::empty(py);
            for x in items {
                list.append(to_py(py, x)?)?;
            }
            list.into_any()
        }
        Json::Object(map) => {
            let dict = PyDict::new(py);
            for (k, x) in map {
                dict.set_item(k, to_py(py, x)?)?;
            }
            dict.into_any()
        }
    })
}

/// replay(snap, alloc_conf=None, from_empty=False, sweep=False, device_memory=None, top=None, device=None, torch_version=None, history_only=False, stack=False, html=None, plot=None, since=None, until=None)
/// --
///
/// Replays the snapshot's history through the caching allocator, as `tensormem replay
/// --json`: parity with PyTorch's decisions (default) or, with `from_empty=True`, the whole
/// job from an empty allocator (the blocks live when recording began first, then the history;
/// `history_only=True` leaves those blocks out, as `--history-only`); `alloc_conf` is a PYTORCH_CUDA_ALLOC_CONF
/// string (default: the recorded settings); `sweep=True` adds the standard configurations;
/// `device_memory` (bytes or "80GiB") sizes the simulated device; `top=N` adds the call sites
/// holding the most bytes; `torch_version` ("2.7", "2.15") follows that PyTorch version's
/// rules (default: parity detects the version, what-if uses the newest); `stack=True` groups
/// the call sites by their whole stack (`--stack`); `html=PATH` writes the self-contained page
/// of `--html`, `plot=PATH` the SVG of `--plot`; `since`/`until` (an event index, or a time
/// since the first event such as "1.5s") measure the peaks in that window, as
/// `--since`/`--until`. Returns the `--json` dict as a
/// `ReplayResult` (a dict that notebooks show as a table).
#[pyfunction]
#[pyo3(signature = (snap, alloc_conf=None, from_empty=false, sweep=false, device_memory=None, top=None, device=None, torch_version=None, history_only=false, stack=false, html=None, plot=None, since=None, until=None))]
#[allow(clippy::too_many_arguments)]
fn replay<'py>(
    py: Python<'py>,
    snap: &Bound<'py, PyAny>,
    alloc_conf: Option<String>,
    from_empty: bool,
    sweep: bool,
    device_memory: Option<&Bound<'py, PyAny>>,
    top: Option<usize>,
    device: Option<usize>,
    torch_version: Option<String>,
    history_only: bool,
    stack: bool,
    html: Option<PathBuf>,
    plot: Option<PathBuf>,
    since: Option<&Bound<'py, PyAny>>,
    until: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let window = window_arg(since, until)?;
    let (s, name) = load(snap)?;
    if stack && top.is_none() {
        return Err(error(
            "stack: needs top=N (the call sites to group by stack)",
        ));
    }
    let req = tensormem::session::ReplayRequest {
        alloc_conf,
        device_memory: size_arg(device_memory)?,
        from_empty,
        sweep,
        history_only,
        device,
        top,
        full_stack: stack,
        torch_version,
        series: html.is_some() || plot.is_some(),
        html: html.is_some(),
        plot: plot.is_some(),
        window,
        ..Default::default()
    };
    let doc = py
        .detach(|| -> Result<Json, String> {
            use tensormem::session::ReplayReport;
            let report = tensormem::session::run(&s, &name, &req, &mut |_, _, _| {})
                .map_err(|e| e.to_string())?;
            let write = |option: &str, path: &PathBuf, bytes: &[u8]| {
                std::fs::write(path, bytes).map_err(|e| format!("{option} {}: {e}", path.display()))
            };
            match &report {
                ReplayReport::Replayed(r) => {
                    if let Some(path) = &plot {
                        tensormem::plot::plot(
                            path,
                            &name,
                            &tensormem::plot::curves(&r.main, &r.sweep),
                        )
                        .map_err(|e| format!("plot {}: {e}", path.display()))?;
                    }
                    if let Some(path) = &html {
                        let page = tensormem::html::replay_page(&s, r, top.unwrap_or(10))
                            .map_err(|e| e.to_string())?;
                        write("html", path, page.as_bytes())?;
                    }
                }
                ReplayReport::StateOnly(st) => {
                    if let Some(path) = &html {
                        let page = tensormem::html::state_page(&s, st, top.unwrap_or(10))
                            .map_err(|e| e.to_string())?;
                        write("html", path, page.as_bytes())?;
                    }
                }
            }
            Ok(report.json(&s))
        })
        .map_err(error)?;
    result(py, "ReplayResult", &doc)
}

/// advise(snap, device_memory=None, device=None, history_only=False, html=None, since=None, until=None)
/// --
///
/// Searches the allocator settings, as `tensormem advise --json`: each candidate's peak
/// reserved bytes, fragmentation, device mallocs and the smallest device memory on which a
/// full replay of the whole job runs it without OOM, best first, with the line to paste.
/// `device_memory` (bytes or "40GiB") is the device to fit; `history_only=True` replays the
/// recorded history alone (`--history-only`); `html=PATH` writes the page of `--html`;
/// `since`/`until` as `--since`/`--until` (the job runs to `until`, peaks measured from
/// `since`). Returns
/// an `AdviseResult` (the dict, shown as a table in notebooks).
#[pyfunction]
#[pyo3(signature = (snap, device_memory=None, device=None, history_only=false, html=None, since=None, until=None))]
#[allow(clippy::too_many_arguments)]
fn advise<'py>(
    py: Python<'py>,
    snap: &Bound<'py, PyAny>,
    device_memory: Option<&Bound<'py, PyAny>>,
    device: Option<usize>,
    history_only: bool,
    html: Option<PathBuf>,
    since: Option<&Bound<'py, PyAny>>,
    until: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let window = window_arg(since, until)?;
    let (s, name) = load(snap)?;
    let device_memory = match size_arg(device_memory)? {
        Some(text) => Some(tensormem::session::device_memory(Some(&text)).map_err(error)? as u64),
        None => None,
    };
    let opts = tensormem::advise::AdviseOptions {
        device_memory,
        device,
        history_only,
        window,
        ..Default::default()
    };
    let doc = py
        .detach(|| -> Result<_, String> {
            let advice = tensormem::advise::advise(&s, &name, &opts).map_err(|e| e.to_string())?;
            if let Some(path) = &html {
                let page =
                    tensormem::html::advise_page(&s, &advice, 10).map_err(|e| e.to_string())?;
                std::fs::write(path, page).map_err(|e| format!("html {}: {e}", path.display()))?;
            }
            Ok(advice)
        })
        .map_err(error)?;
    result(
        py,
        "AdviseResult",
        &serde_json::to_value(&doc).map_err(error)?,
    )
}

/// diff(a, b, top=10, html=None, since=None, until=None)
/// --
///
/// Compares two snapshots, as `tensormem diff --json`: segments and bytes at each dump, each
/// history's parity peaks, whole-job lower bound and fragmentation (`None` for a state-only
/// snapshot), and the `top` call sites that grew or shrank, the largest change first;
/// `html=PATH` writes the page of `--html`; `since`/`until` as `--since`/`--until` on each
/// history. Returns
/// a `DiffResult` (the dict, shown as a table in notebooks).
#[pyfunction]
#[pyo3(signature = (a, b, top=10, html=None, since=None, until=None))]
fn diff<'py>(
    py: Python<'py>,
    a: &Bound<'py, PyAny>,
    b: &Bound<'py, PyAny>,
    top: usize,
    html: Option<PathBuf>,
    since: Option<&Bound<'py, PyAny>>,
    until: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    if top == 0 {
        return Err(error("top: expected at least 1 call site"));
    }
    let window = window_arg(since, until)?;
    let (sa, name_a) = load(a)?;
    let (sb, name_b) = load(b)?;
    let doc = py
        .detach(|| -> Result<_, String> {
            let d = tensormem::diff::diff_in(&sa, &name_a, &sb, &name_b, top, &window)
                .map_err(|e| e.to_string())?;
            if let Some(path) = &html {
                std::fs::write(path, tensormem::html::diff_page(&d))
                    .map_err(|e| format!("html {}: {e}", path.display()))?;
            }
            Ok(d)
        })
        .map_err(error)?;
    result(
        py,
        "DiffResult",
        &serde_json::to_value(&doc).map_err(error)?,
    )
}

/// explain(snap, top=5, since=None, until=None)
/// --
///
/// Explains an out-of-memory error, as `tensormem explain --json`: the failed request, free
/// bytes per segment, the largest free block per pool and stream, the bytes stuck in split
/// segments, the top call sites, the advise result, and which figures are unknown;
/// `since`/`until` pick the first `oom` entry inside that window. Returns an
/// `ExplainResult` (the dict, shown as a table in notebooks).
#[pyfunction]
#[pyo3(signature = (snap, top=5, since=None, until=None))]
fn explain<'py>(
    py: Python<'py>,
    snap: &Bound<'py, PyAny>,
    top: usize,
    since: Option<&Bound<'py, PyAny>>,
    until: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let window = window_arg(since, until)?;
    let (s, name) = load(snap)?;
    let opts = tensormem::explain::ExplainOptions {
        top,
        window,
        ..Default::default()
    };
    let doc = py
        .detach(|| tensormem::explain::explain(&s, &name, &opts))
        .map_err(error)?;
    result(
        py,
        "ExplainResult",
        &serde_json::to_value(&doc).map_err(error)?,
    )
}

/// dump(snap, path=None, alloc_conf=None, from_empty=False, device_memory=None)
/// --
///
/// Replays like `replay` and returns our snapshot and history as pickle bytes in PyTorch's
/// format (what `tensormem replay --dump` writes), with the recorded stacks, times and
/// metadata attached; also writes them to `path` when given. `pickle.loads` reads it, and
/// PyTorch's memory viewer opens it.
#[pyfunction]
#[pyo3(signature = (snap, path=None, alloc_conf=None, from_empty=false, device_memory=None))]
fn dump<'py>(
    py: Python<'py>,
    snap: &Bound<'py, PyAny>,
    path: Option<PathBuf>,
    alloc_conf: Option<String>,
    from_empty: bool,
    device_memory: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let (s, name) = load(snap)?;
    let req = tensormem::session::ReplayRequest {
        alloc_conf,
        device_memory: size_arg(device_memory)?,
        from_empty,
        keep_history: true,
        ..Default::default()
    };
    let bytes = py
        .detach(|| -> Result<Vec<u8>, tensormem::Error> {
            match tensormem::session::run(&s, &name, &req, &mut |_, _, _| {})? {
                tensormem::session::ReplayReport::Replayed(r) => Ok(tensormem::dump::dump_pickle(
                    &s, r.device, &r.main, &r.config,
                )),
                tensormem::session::ReplayReport::StateOnly(_) => {
                    Err(tensormem::Error::NeedsHistory {
                        what: "dump",
                        file: name.clone(),
                    })
                }
            }
        })
        .map_err(error)?;
    if let Some(p) = &path {
        std::fs::write(p, &bytes).map_err(|e| error(format!("--dump {}: {e}", p.display())))?;
    }
    Ok(PyBytes::new(py, &bytes))
}

/// Reads a DTR operator log given as a path (plain or gzip), a file object, its text (a `str`
/// starting with `{`) or its bytes (as `dtr_log` reads it); returns it and its name for
/// messages.
fn read_dtr_log(py: Python<'_>, log: &Bound<'_, PyAny>) -> PyResult<(checkpoint::Log, String)> {
    use checkpoint::log;
    let text = log
        .cast::<PyString>()
        .ok()
        .map(|s| s.to_string())
        .filter(|s| s.trim_start().starts_with('{'));
    if let Some(text) = text {
        return Ok((log::parse(&text).map_err(error)?, "<str>".to_string()));
    }
    if let Some((bytes, name)) = input_bytes(log)? {
        let bytes = if log::is_gzip(&bytes) {
            log::gunzip(&bytes).map_err(|e| error(format!("{name}: not a valid gzip file: {e}")))?
        } else {
            bytes
        };
        let text =
            String::from_utf8(bytes).map_err(|_| error(format!("{name}: not UTF-8 text")))?;
        return Ok((log::parse(&text).map_err(error)?, name));
    }
    if let Ok(path) = log.extract::<PathBuf>() {
        let name = path.display().to_string();
        let parsed = py.detach(|| log::parse_file(&path)).map_err(error)?;
        return Ok((parsed, name));
    }
    let ty = log.get_type().name()?;
    Err(error(format!(
        "expected a path, a file object, the text or the bytes of an operator log; found {ty}"
    )))
}

/// dtr_log(log)
/// --
///
/// Parses a DTR operator log (a path to a plain or gzip-compressed file, its text as `str`
/// (a `str` starting with `{`), or its bytes) with the same reader as `tensormem dtr`, and runs it without a budget (simrd's
/// baseline). Returns `{"events", "calls", "mutates", "constants", "releases", "peak_bytes",
/// "compute", "cost"}`: `peak_bytes` is the no-eviction peak, `compute` the summed `TIME`,
/// `cost` the log's `COST` annotation (what `TIME` holds) or `None`. Errors (a bad line, an
/// inconsistent log) raise `TensormemError` naming the line.
#[pyfunction]
fn dtr_log<'py>(py: Python<'py>, log: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    use checkpoint::log::Event;
    let (parsed, _) = read_dtr_log(py, log)?;
    let base = py
        .detach(|| checkpoint::sim::baseline(&parsed))
        .map_err(error)?;
    let count = |f: fn(&Event) -> bool| parsed.events.iter().filter(|e| f(&e.event)).count();
    let doc = serde_json::json!({
        "events": parsed.events.len(),
        "calls": count(|e| matches!(e, Event::Call { .. })),
        "mutates": count(|e| matches!(e, Event::Mutate { .. })),
        "constants": count(|e| matches!(e, Event::Constant { .. })),
        "releases": count(|e| matches!(e, Event::Release { .. })),
        "peak_bytes": base.peak_bytes,
        "compute": base.compute_ns,
        "cost": parsed.cost_annotation(),
    });
    to_py(py, &doc)
}

/// Names given as one string ("window,callback") or a list of strings; `None` stays empty.
fn names_arg(v: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Vec<String>> {
    match v {
        None => Ok(Vec::new()),
        Some(v) if v.is_none() => Ok(Vec::new()),
        Some(v) => {
            if let Ok(s) = v.extract::<String>() {
                return Ok(s.split(',').map(str::to_string).collect());
            }
            v.extract::<Vec<String>>()
                .map_err(|_| error(format!("{what}: expected a name or a list of names")))
        }
    }
}

/// dtr_advise_log(log, strategies=None, heuristics=None, step=None, alloc_conf=None, overhead_limit=2.0, plot=None)
/// --
///
/// The device-budget advice of a DTR operator log, as `tensormem dtr LOG --device-budget
/// --advise --json`: per eviction strategy (default all; a name, "a,b" or a list) and
/// heuristic (default "dtr-eq"), and for the allocator-blind run, the smallest device memory
/// (ratio of the no-eviction peak, bytes, overhead there) at which the model trains within
/// each overhead limit (1.1, 1.25, 1.5, 2.0, those up to `overhead_limit`, the thrashing
/// cut), from a sweep of ratios `step, 2·step, ..., 1.0` (default 0.05) under the caching
/// allocator (`alloc_conf`, default PyTorch's settings); `best` is the strategy needing the
/// least memory within 1.5x. `plot=PATH` writes the SVG of `--advise --plot`. `log` is what
/// `dtr_log` reads: a path
/// (plain or gzip), a file object, the log's text, or its bytes.
#[pyfunction]
#[pyo3(signature = (log, strategies=None, heuristics=None, step=None, alloc_conf=None, overhead_limit=2.0, plot=None))]
#[allow(clippy::too_many_arguments)]
fn dtr_advise_log<'py>(
    py: Python<'py>,
    log: &Bound<'py, PyAny>,
    strategies: Option<&Bound<'py, PyAny>>,
    heuristics: Option<&Bound<'py, PyAny>>,
    step: Option<f64>,
    alloc_conf: Option<String>,
    overhead_limit: f64,
    plot: Option<PathBuf>,
) -> PyResult<Bound<'py, PyAny>> {
    let strategies = names_arg(strategies, "strategies")?;
    let heuristics = names_arg(heuristics, "heuristics")?;
    let options = tensormem::dtr::advise_options(
        &heuristics,
        &strategies,
        step,
        alloc_conf.as_deref(),
        overhead_limit,
    )
    .map_err(|e| {
        error(
            e.replace("--strategy", "strategies")
                .replace("--heuristic", "heuristics"),
        )
    })?;
    let (parsed, name) = read_dtr_log(py, log)?;
    let doc = py
        .detach(|| -> Result<Json, String> {
            let a = tensormem::dtr::advise(&parsed, &name, &options)?;
            if let Some(p) = &plot {
                a.plot(p).map_err(|e| e.replacen("--plot", "plot", 1))?;
            }
            Ok(a.to_json())
        })
        .map_err(error)?;
    to_py(py, &doc)
}

/// The native module `tensormem._native` (re-exported by the `tensormem` package).
#[pymodule]
#[pyo3(name = "_native")]
fn tensormem_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("TensormemError", m.py().get_type::<TensormemError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(replay, m)?)?;
    m.add_function(wrap_pyfunction!(advise, m)?)?;
    m.add_function(wrap_pyfunction!(explain, m)?)?;
    m.add_function(wrap_pyfunction!(diff, m)?)?;
    m.add_function(wrap_pyfunction!(dump, m)?)?;
    m.add_function(wrap_pyfunction!(dtr_log, m)?)?;
    m.add_function(wrap_pyfunction!(dtr_advise_log, m)?)?;
    Ok(())
}
