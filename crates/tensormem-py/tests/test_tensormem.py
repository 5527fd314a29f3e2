"""The tensormem Python module: replay, advise, explain and dump from Python, with snapshots
given as a path, bytes, or the dict torch.cuda.memory._snapshot() returns.

Tests that read the real snapshots look for ../shared/data beside the checkout (or
$TENSORMEM_SHARED/data): without it they are skipped (pytest prints why), except under
CI=true, where a missing folder is a failure, as in the Rust tests.
"""

import os
import pathlib
import pickle

import pytest

import tensormem

ROOT = pathlib.Path(__file__).resolve().parents[3]
MIB = 1 << 20


def shared_snapshot(name):
    base = os.environ.get("TENSORMEM_SHARED")
    folder = (pathlib.Path(base) if base else ROOT.parent / "shared") / "data" / "snapshots"
    if not folder.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"shared data folder {folder} is missing, and CI=true forbids skipping")
        pytest.skip(f"shared data folder {folder} is missing (set TENSORMEM_SHARED)")
    return folder / name


def synthetic():
    """A small snapshot dict as torch.cuda.memory._snapshot() returns it: three allocations
    from an empty allocator, each with a stack; the frame dicts are shared, as PyTorch's are."""
    frame = {"name": "forward", "filename": "/home/me/model.py", "line": 7}
    stack = [frame]
    events = [
        ("segment_alloc", 0x7F0000000000, 20 * MIB),
        ("alloc", 0x7F0000000000, 3 * MIB),
        ("alloc", 0x7F0000300000, 5 * MIB),
        ("free_requested", 0x7F0000000000, 3 * MIB),
        ("free_completed", 0x7F0000000000, 3 * MIB),
        ("alloc", 0x7F0000000000, 2 * MIB),
    ]
    trace = [
        {"action": a, "addr": addr, "size": size, "stream": 0, "time_us": 1000 + i, "frames": stack}
        for i, (a, addr, size) in enumerate(events)
    ]
    blocks = [
        {"address": 0x7F0000000000, "size": 3 * MIB, "requested_size": 2 * MIB, "state": "active_allocated", "frames": stack},
        {"address": 0x7F0000300000, "size": 5 * MIB, "requested_size": 5 * MIB, "state": "active_allocated", "frames": stack},
        {"address": 0x7F0000800000, "size": 12 * MIB, "requested_size": 0, "state": "inactive", "frames": []},
    ]
    segment = {
        "device": 0, "address": 0x7F0000000000, "total_size": 20 * MIB, "allocated_size": 8 * MIB,
        "active_size": 8 * MIB, "requested_size": 7 * MIB, "stream": 0, "segment_type": "large",
        "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks,
    }
    return {"segments": [segment], "device_traces": [trace], "external_annotations": []}


REPORT_KEYS = {
    "file", "device", "events", "config", "alloc_conf", "parity", "peak_reserved_bytes",
    "peak_event_index", "peak_allocated_bytes", "recorded_peak_reserved_bytes",
    "lower_bound_bytes", "device_mallocs", "num_alloc_retries", "num_ooms", "failed_allocs",
    "skipped_frees", "empty_cache_calls", "sweep", "memory_stats",
    "torch_version", "torch_version_detected", "parity_by_version",
}


def test_replay_a_dict_built_in_python():
    r = tensormem.replay(synthetic())
    assert set(r) == REPORT_KEYS
    assert r["file"] == "<dict>"
    assert r["config"] == "default" and r["alloc_conf"] == ""
    p = r["parity"]
    assert (p["alloc_address_match"], p["alloc_total"]) == (3, 3)
    assert p["first_divergence"] is None
    assert r["peak_reserved_bytes"] == 20 * MIB
    # Both versions' rules reproduce it: the newest (torch 2.15, 123 stats keys) is used.
    assert (r["torch_version"], r["torch_version_detected"]) == ("2.15", True)
    assert [v["torch_version"] for v in r["parity_by_version"]] == ["2.7", "2.15"]
    assert all(v["alloc_address_match"] == 3 for v in r["parity_by_version"])
    assert len(r["memory_stats"]) == 123
    assert r["memory_stats"]["allocated_bytes.all.current"] == 8 * MIB


def test_torch_version_option():
    r = tensormem.replay(synthetic(), torch_version="2.7")
    assert (r["torch_version"], r["torch_version_detected"]) == ("2.7", False)
    assert r["parity_by_version"] is None
    assert len(r["memory_stats"]) == 122
    with pytest.raises(tensormem.TensormemError) as e:
        tensormem.replay(synthetic(), torch_version="1.0")
    assert str(e.value).startswith("torch_version: ")


def test_sweep_top_and_options():
    r = tensormem.replay(synthetic(), from_empty=True, sweep=True, top=2, device_memory="1GiB")
    assert r["parity"] is None
    assert [row["config"] for row in r["sweep"]] == [
        "default", "max_split_size_mb:128", "roundup_power2_divisions:4", "expandable_segments:True",
    ]
    sites = r["top_sites"]
    # At the peak (the 20 MiB segment holding the most): the 3 MiB and 5 MiB allocations.
    assert sites == [{"site": "/home/me/model.py:7:forward", "bytes": 8 * MIB, "count": 2}]
    r2 = tensormem.replay(synthetic(), alloc_conf="expandable_segments:True", from_empty=True, device_memory=1 << 30)
    assert r2["alloc_conf"] == "expandable_segments:True"


def test_path_bytes_and_dict_give_the_same_report(tmp_path):
    d = synthetic()
    f = tmp_path / "snap.pickle"
    f.write_bytes(pickle.dumps(d))
    by_path = tensormem.replay(str(f))
    by_pathlike = tensormem.replay(f)
    by_bytes = tensormem.replay(f.read_bytes())
    by_dict = tensormem.replay(d)
    for r in (by_path, by_pathlike, by_bytes, by_dict):
        r.pop("file")
    assert by_path == by_pathlike == by_bytes == by_dict


def test_errors_are_exceptions_with_the_cli_message(tmp_path):
    # The command's message, naming the Python argument where the command names its option.
    with pytest.raises(tensormem.TensormemError) as e:
        tensormem.replay(synthetic(), alloc_conf="max_split_size_mb:5")
    assert str(e.value).startswith("alloc_conf: ")
    with pytest.raises(tensormem.TensormemError) as e:
        tensormem.replay(synthetic(), device_memory="-5")
    assert str(e.value) == "device_memory: invalid size '-5': a size cannot be negative (expected e.g. 40GiB)"
    with pytest.raises(tensormem.TensormemError) as e:
        tensormem.replay(synthetic(), history_only=True)
    assert str(e.value) == "history_only: applies to what-if replays: add from_empty or sweep"
    with pytest.raises(tensormem.TensormemError) as e:
        tensormem.diff(synthetic(), synthetic(), top=0)
    assert str(e.value) == "top: expected at least 1 call site"
    with pytest.raises(tensormem.TensormemError) as e:
        tensormem.replay(str(tmp_path / "a--b.pickle"))
    assert "a--b.pickle" in str(e.value)  # a file name keeps its dashes
    with pytest.raises(tensormem.TensormemError) as e:
        tensormem.replay({"not": "a snapshot"})
    assert str(e.value) == "<dict>: not a PyTorch memory snapshot: the top-level dict has no 'segments' key"
    with pytest.raises(tensormem.TensormemError) as e:
        tensormem.replay(str(tmp_path / "missing.pickle"))
    assert str(e.value).startswith(f"cannot read {tmp_path / 'missing.pickle'}: ")
    with pytest.raises(tensormem.TensormemError) as e:
        tensormem.replay(b"\x80\x04garbage")
    assert str(e.value).startswith("<bytes>: ")
    with pytest.raises(tensormem.TensormemError) as e:
        tensormem.replay(42)
    assert "expected a path" in str(e.value)
    state_only = synthetic()
    del state_only["device_traces"]
    with pytest.raises(tensormem.TensormemError) as e:
        tensormem.advise(state_only)
    assert str(e.value) == "advise: <dict> holds state only (no memory history to replay)"


def test_dump_round_trips_through_pickle(tmp_path):
    out = tmp_path / "ours.pickle"
    data = tensormem.dump(synthetic(), path=str(out), alloc_conf="expandable_segments:True", from_empty=True)
    assert out.read_bytes() == data
    d = pickle.loads(data)
    assert set(d) == {"segments", "device_traces", "allocator_settings", "external_annotations"}
    allocs = [e for e in d["device_traces"][0] if e["action"] == "alloc"]
    assert [e["time_us"] for e in allocs] == [1001, 1002, 1005]
    assert all(e["frames"] == [{"name": "forward", "filename": "/home/me/model.py", "line": 7}] for e in allocs)
    # What we dumped replays back through the module with full parity.
    back = tensormem.replay(d)
    assert back["parity"]["alloc_address_match"] == back["parity"]["alloc_total"] == 3


def test_advise_and_explain_on_a_dict():
    a = tensormem.advise(synthetic(), device_memory="64MiB")
    assert a["device_memory_bytes"] == 64 * MIB
    best = a["candidates"][0]
    assert best["fits"] and best["min_device_memory_bytes"] <= 64 * MIB
    assert best["apply"][0].startswith(("export PYTORCH_CUDA_ALLOC_CONF=", "unset PYTORCH_CUDA_ALLOC_CONF"))
    e = tensormem.explain(synthetic())
    assert e["moment"] == "dump" and e["request"] is None
    assert e["reserved_bytes"] == 20 * MIB and e["inactive_split_bytes"] == 12 * MIB
    assert any("no oom trace entry" in u for u in e["unknown"])


def test_replay_a_shared_snapshot_loaded_with_pickle():
    path = shared_snapshot("lm_small_forward_from_empty.pickle")
    with open(path, "rb") as f:
        d = pickle.load(f)  # exactly the dict torch.cuda.memory._snapshot() returned
    r = tensormem.replay(d)
    p = r["parity"]
    assert (p["alloc_address_match"], p["alloc_total"]) == (36, 36)
    assert (p["segment_decision_match"], p["segment_decision_total"]) == (9, 9)
    assert r["peak_reserved_bytes"] == r["recorded_peak_reserved_bytes"]
    by_path = tensormem.replay(str(path))
    r.pop("file"), by_path.pop("file")
    assert r == by_path
    s = tensormem.replay(d, from_empty=True, sweep=True, top=3)
    assert len(s["sweep"]) == 4 and len(s["top_sites"]) == 3
    assert s["top_sites"][0]["bytes"] >= s["top_sites"][1]["bytes"]


def test_advise_and_explain_on_shared_snapshots():
    d = pickle.loads(shared_snapshot("gpt2small_trainstep_steady.pickle").read_bytes())
    a = tensormem.advise(d)
    assert a["candidates"][0]["min_device_memory_bytes"] >= a["lower_bound_bytes"]
    e = tensormem.explain(str(shared_snapshot("opt1.3b_inference_at_oom_state.pickle")))
    assert e["moment"] == "dump" and e["advice"] is None
    assert e["top_sites"][0]["site"].endswith(":allocate")


def test_dtr_log_reads_text_and_bad_logs_raise_with_the_line():
    good = (
        '{"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}\n'
        '{"INSTRUCTION":"CONSTANT","NAME":"x1"}\n{"INSTRUCTION":"MEMORY","MEMORY":"64","NAME":"x1"}\n'
        '{"ARGS":["x1"],"INSTRUCTION":"CALL","NAME":"relu","RESULT":["x2"],"TIME":"100"}\n'
        '{"INSTRUCTION":"MEMORY","MEMORY":"128","NAME":"x2"}\n{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"x2"}\n'
    )
    facts = tensormem.dtr_log(good)
    assert facts == {"events": 3, "calls": 1, "mutates": 0, "constants": 1, "releases": 0,
                     "peak_bytes": 192, "compute": 100, "cost": None}

    with pytest.raises(tensormem.TensormemError, match="line 2"):
        tensormem.dtr_log('{"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}\n{"INSTRUCTION":"NOPE"}\n')
    with pytest.raises(tensormem.TensormemError, match="not a valid gzip file"):
        tensormem.dtr_log(b"\x1f\x8b" + b"\0" * 30)


def test_dtr_advise_log_answers_per_strategy_and_limit(tmp_path):
    # A 6-layer chain of 1 MiB activations and its backward (as the CLI's tests build it).
    mib = 1 << 20
    lines = ['{"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}',
             '{"INSTRUCTION":"CONSTANT","NAME":"x0"}', '{"INSTRUCTION":"MEMORY","MEMORY":"%d","NAME":"x0"}' % mib]

    def call(name, args, out, t):
        lines.append('{"ARGS":[%s],"INSTRUCTION":"CALL","NAME":"%s","RESULT":["%s"],"TIME":"%d"}'
                     % (",".join('"%s"' % a for a in args), name, out, t))
        lines.append('{"INSTRUCTION":"MEMORY","MEMORY":"%d","NAME":"%s"}' % (mib, out))
        lines.append('{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"%s"}' % out)

    for i in range(1, 7):
        call("f", ["x%d" % (i - 1)], "x%d" % i, 10)
    lines.append('{"ANNOTATION":"BACKWARD","INSTRUCTION":"ANNOTATE"}')
    call("loss", ["x6"], "g6", 10)
    for i in range(5, 0, -1):
        call("f_backward", ["g%d" % (i + 1), "x%d" % i], "g%d" % i, 20)
        lines.append('{"INSTRUCTION":"RELEASE","NAME":"g%d"}' % (i + 1))
        lines.append('{"INSTRUCTION":"RELEASE","NAME":"x%d"}' % (i + 1))
    text = "\n".join(lines) + "\n"
    svg = tmp_path / "chain.svg"
    a = tensormem.dtr_advise_log(text, strategies=["window"], step=0.25, overhead_limit=1.5, plot=svg)
    assert a["peak_bytes"] == 9 * mib and a["operator_calls"] == 12
    assert a["ratios"] == [0.25, 0.5, 0.75, 1.0] and a["limits"] == [1.1, 1.25, 1.5]
    assert [r["run"] for r in a["advice"]] == ["window dtr-eq", "allocator-blind dtr-eq"]
    assert [p["device_bytes"] for p in a["advice"][1]["points"]] == [
        int(r * 9 * mib) for r in (0.25, 0.5, 0.75, 1.0)]
    # At the whole peak nothing is evicted: the blind run's overhead there is simrd's clock
    # (1 + the compute) over the compute.
    base = a["baseline_compute"]
    assert base == 6 * 10 + 10 + 5 * 20
    assert a["advice"][1]["points"][-1]["overhead"] == (1 + base) / base
    assert a["best"] is None or a["best"]["run"] == "window dtr-eq"
    assert svg.read_text().startswith("<svg")
    with pytest.raises(tensormem.TensormemError, match="strategies: unknown strategy 'belady'"):
        tensormem.dtr_advise_log(text, strategies="belady")
    with pytest.raises(tensormem.TensormemError, match="plot .*needs a .svg extension"):
        tensormem.dtr_advise_log(text, plot=tmp_path / "chain.png")


def test_whole_job_history_only_and_diff():
    d = pickle.loads(shared_snapshot("gpt2small_trainstep_steady.pickle").read_bytes())
    whole = tensormem.advise(d, device_memory="12.5GiB")
    old = tensormem.advise(d, device_memory="12.5GiB", history_only=True)
    assert (whole["mode"], old["mode"]) == ("whole job", "history only")
    # 229 blocks live from before recording: the whole job needs more than the history alone.
    assert whole["start_blocks"] == 229 and old["left_out"][0] == 229
    assert whole["lower_bound_bytes"] > 12.5 * 2**30 > old["lower_bound_bytes"]
    assert not any(c["fits"] for c in whole["candidates"])
    r = tensormem.replay(d, from_empty=True, history_only=True)
    assert r["lower_bound_bytes"] == old["lower_bound_bytes"]
    same = tensormem.diff(d, d)
    assert same["sites"] == [] and same["a"]["peak_reserved_bytes"] == same["b"]["peak_reserved_bytes"]
    other = tensormem.diff(str(shared_snapshot("opt1.3b_inference_at_oom_state.pickle")), d, top=2)
    assert other["a"]["peak_reserved_bytes"] is None and other["a"]["moment"] == "dump"
    assert len(other["sites"]) == 2


def test_stubs_match_the_native_signatures():
    import ast
    import inspect

    import tensormem._native as native

    folder = pathlib.Path(tensormem.__file__).parent
    assert (folder / "py.typed").is_file()
    stub = ast.parse((folder / "_native.pyi").read_text())
    stubbed = {f.name: f for f in stub.body if isinstance(f, ast.FunctionDef)}
    public = {n for n in dir(native) if callable(getattr(native, n)) and not n.startswith("_")} - {"TensormemError"}
    assert set(stubbed) == public
    for name, f in stubbed.items():
        params = [a.arg for a in f.args.args]
        signature = inspect.signature(getattr(native, name)).parameters
        assert params == list(signature), name
        defaults = [ast.literal_eval(d) for d in f.args.defaults]
        assert defaults == [p.default for p in signature.values() if p.default is not p.empty], name
        # Every function has a docstring (the signature line, then what it does).
        assert getattr(native, name).__doc__, name


def test_html_plot_and_stack_arguments(tmp_path):
    page, svg = tmp_path / "r.html", tmp_path / "r.svg"
    r = tensormem.replay(synthetic(), from_empty=True, sweep=True, top=1, stack=True, html=str(page), plot=svg)
    assert page.read_text().startswith("<!DOCTYPE html>") and svg.read_text().lstrip().startswith("<")
    assert "stack" in r["top_sites"][0]
    state = synthetic()
    del state["device_traces"]
    tensormem.replay(state, html=tmp_path / "s.html")
    assert "Segments at the dump" in (tmp_path / "s.html").read_text()
    tensormem.advise(synthetic(), html=tmp_path / "a.html")
    assert "Allocator settings, best first" in (tmp_path / "a.html").read_text()
    with pytest.raises(tensormem.TensormemError) as e:
        tensormem.replay(synthetic(), stack=True)
    assert str(e.value) == "stack: needs top=N (the call sites to group by stack)"


def test_file_objects_bytearray_and_memoryview_are_accepted_wherever_a_path_is(tmp_path):
    import gzip
    import io

    d = synthetic()
    data = pickle.dumps(d)
    f = tmp_path / "snap.pickle"
    f.write_bytes(data)
    by_path = tensormem.replay(str(f))
    with open(f, "rb") as fh:
        by_file = tensormem.replay(fh)
    assert by_file["file"] == str(f)  # a file object is named by its name
    by_bytesio = tensormem.replay(io.BytesIO(data))
    assert by_bytesio["file"] == "<file>"
    by_bytearray = tensormem.replay(bytearray(data))
    assert by_bytearray["file"] == "<bytearray>"
    by_view = tensormem.replay(memoryview(data))
    assert by_view["file"] == "<memoryview>"
    # A non-contiguous view is copied in C order, as bytes(view) does.
    doubled = bytes(b for x in data for b in (x, 0))
    by_strided = tensormem.replay(memoryview(doubled)[::2])
    gz = tmp_path / "snap.pickle.gz"
    gz.write_bytes(gzip.compress(data))
    with gzip.open(gz) as fh:
        by_gzip = tensormem.replay(fh)
    # JSON read from a text-mode file object (str).
    js = tmp_path / "snap.json"
    import json

    js.write_text(json.dumps(d))
    with open(js) as fh:
        by_text = tensormem.replay(fh)
    reports = [by_path, by_file, by_bytesio, by_bytearray, by_view, by_strided, by_gzip, by_text]
    for r in reports:
        r.pop("file")
    assert all(r == by_path for r in reports)
    # Every function takes them: advise, explain, diff, dump, dtr_log.
    assert tensormem.advise(io.BytesIO(data), device_memory="64MiB")["candidates"][0]["fits"]
    assert tensormem.explain(bytearray(data))["reserved_bytes"] == 20 * MIB
    assert tensormem.diff(io.BytesIO(data), memoryview(data))["sites"] == []
    assert tensormem.dump(bytearray(data)) == tensormem.dump(d)
    log = b'{"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}\n{"INSTRUCTION":"CONSTANT","NAME":"x1"}\n{"INSTRUCTION":"MEMORY","MEMORY":"64","NAME":"x1"}\n'
    assert tensormem.dtr_log(io.BytesIO(log))["peak_bytes"] == 64
    assert tensormem.dtr_log(bytearray(gzip.compress(log)))["peak_bytes"] == 64
    # A text-mode pickle cannot be read: the message says to open it in binary mode.
    with open(f, encoding="utf-8") as fh, pytest.raises(tensormem.TensormemError) as e:
        tensormem.replay(fh)
    assert str(e.value).startswith(f"{f}: read() failed: ") and 'open(path, "rb")' in str(e.value)

    class Odd:
        def read(self):
            return 42

    with pytest.raises(tensormem.TensormemError) as e:
        tensormem.replay(Odd())
    assert str(e.value) == "<file>: read() returned int, expected bytes or str"
    with pytest.raises(tensormem.TensormemError) as e:
        tensormem.replay(bytearray())
    assert str(e.value) == "<bytearray>: the file is empty"


@pytest.mark.parametrize(
    "where, value, field, found",
    [
        ("trace", -512, "device_traces[0][1]['size']", "-512"),
        ("trace", 3.5 * MIB, "device_traces[0][1]['size']", "float"),
        ("trace", "5MiB", "device_traces[0][1]['size']", "str"),
        ("block", -1, "segments[0]['blocks'][0]['requested_size']", "-1"),
        ("block_size", 2.0, "segments[0]['blocks'][0]['size']", "float"),
        ("segment", -20 * MIB, "segments[0]['total_size']", str(-20 * MIB)),
        ("time", "soon", "device_traces[0][1]['time_us']", "str"),
    ],
)
def test_invalid_sizes_in_a_dict_are_errors_naming_the_field(where, value, field, found):
    d = synthetic()
    if where == "trace":
        d["device_traces"][0][1] = dict(d["device_traces"][0][1], size=value)
    elif where == "time":
        d["device_traces"][0][1] = dict(d["device_traces"][0][1], time_us=value)
    elif where == "block":
        d["segments"][0]["blocks"][0]["requested_size"] = value
    elif where == "block_size":
        d["segments"][0]["blocks"][0]["size"] = value
    else:
        d["segments"][0]["total_size"] = value
    for call in (tensormem.replay, tensormem.advise, tensormem.explain):
        with pytest.raises(tensormem.TensormemError) as e:
            call(d)
        assert str(e.value) == (
            f"<dict>: not a PyTorch memory snapshot: {field} should be a non-negative integer, found {found}"
        )


def test_results_are_dicts_with_a_notebook_display(tmp_path):
    import copy
    import json

    d = synthetic()
    r = tensormem.replay(d, top=2)
    assert type(r) is tensormem.ReplayResult and isinstance(r, dict)
    plain = dict(r)
    assert r == plain and json.loads(json.dumps(r)) == plain
    assert pickle.loads(pickle.dumps(r)) == r and type(pickle.loads(pickle.dumps(r))) is tensormem.ReplayResult
    assert copy.deepcopy(r) == r and repr(r) == repr(plain)
    html = r._repr_html_()
    assert html.startswith('<div class="tensormem-result">') and html.endswith("</div>")
    assert "<b>tensormem replay &lt;dict&gt;</b>" in html  # strings from the snapshot are escaped
    assert "<td>allocations at the recorded address</td><td class=\"n\">3 of 3</td>" in html
    assert "<td>peak reserved</td><td class=\"n\">20.00 MiB</td>" in html
    assert "/home/me/model.py:7:forward" in html
    assert "<td>recorded peak reserved</td><td class=\"n\">20.00 MiB</td>" in html
    sweep = tensormem.replay(d, from_empty=True, sweep=True)._repr_html_()
    assert "<b>What-if replays</b>" in sweep and "expandable_segments:True" in sweep
    assert "recorded peak reserved" not in sweep  # no recording to compare with in what-if mode
    assert "<td>window (events)</td><td class=\"n\">2..4</td>" in tensormem.replay(d, since=2, until=5)._repr_html_()
    state = synthetic()
    del state["device_traces"]
    s = tensormem.replay(state)._repr_html_()
    assert "state only" in s and "<b>Unknown</b>" in s
    a = tensormem.advise(d, device_memory="64MiB")
    assert type(a) is tensormem.AdviseResult
    ah = a._repr_html_()
    assert "<b>Allocator settings, best first</b>" in ah and "<td class=\"n\">64.00 MiB</td>" in ah
    from html import escape

    assert f"<b>Best: {escape(a['candidates'][0]['config'])}</b><pre>{escape(a['candidates'][0]['apply'][0])}" in ah
    tight = tensormem.advise(d, device_memory="1MiB")._repr_html_()
    assert "No setting runs the job without OOM on this device memory." in tight
    e = tensormem.explain(d)
    assert type(e) is tensormem.ExplainResult
    eh = e._repr_html_()
    assert eh.count("<b>Unknown</b>") == 1 and "reserved but unallocated in split segments" in eh
    assert "<td class=\"n\">12.00 MiB</td>" in eh
    df = tensormem.diff(d, state)
    assert type(df) is tensormem.DiffResult
    dh = df._repr_html_()
    assert "<b>tensormem diff &lt;dict&gt; &lt;dict&gt;</b>" in dh
    # The state-only side has no peaks: unknown, never 0.
    assert "<td>peak reserved</td><td class=\"n\">20.00 MiB</td><td class=\"n\">unknown</td><td class=\"n\">unknown</td>" in dh
    assert tensormem._result.format_size(1 << 20) == "1024.00 KiB"
    assert tensormem._result.format_size(1024) == "1024 bytes"


def test_stubs_name_the_result_classes_the_functions_return():
    import ast

    folder = pathlib.Path(tensormem.__file__).parent
    stub = ast.parse((folder / "_native.pyi").read_text())
    returns = {f.name: ast.unparse(f.returns) for f in stub.body if isinstance(f, ast.FunctionDef)}
    d = synthetic()
    got = {
        "replay": tensormem.replay(d),
        "advise": tensormem.advise(d, device_memory="64MiB"),
        "explain": tensormem.explain(d),
        "diff": tensormem.diff(d, d),
        "dump": tensormem.dump(d),
    }
    for name, value in got.items():
        assert returns[name] == type(value).__name__, name


def test_since_until_and_diff_html(tmp_path):
    d = synthetic()
    whole = tensormem.replay(d)
    assert "window" not in whole and whole["peak_reserved_bytes"] == 20 * MIB
    # Before event 1 nothing is allocated but the segment: the window's peak allocated is 0.
    first = tensormem.replay(d, until=1)
    assert first["window"] == {"since_event": 0, "until_event": 1, "since_us": 0, "until_us": 0}
    assert first["peak_allocated_bytes"] == 0 and first["events"] == 1
    late = tensormem.replay(d, since="3us", from_empty=True)
    assert late["window"]["since_event"] == 3
    # The state the window opens on counts: 3 + 5 MiB allocated after event 2.
    assert late["peak_allocated_bytes"] == 8 * MIB
    # Up to event 1: the first 3 MiB block alone.
    assert tensormem.replay(d, until=2)["peak_allocated_bytes"] == 3 * MIB
    a = tensormem.advise(d, until=2, device_memory="64MiB")
    assert a["window"]["until_event"] == 2
    with pytest.raises(tensormem.TensormemError) as e:
        tensormem.replay(d, since=99)
    assert str(e.value) == "since: event 99 is past the trace's last event (5)"
    with pytest.raises(tensormem.TensormemError) as e:
        tensormem.replay(d, until=1.5)
    assert str(e.value) == 'until: expected an event index (int) or a time such as "1.5s"'
    with pytest.raises(tensormem.TensormemError) as e:
        tensormem.explain(d, since=1)
    assert str(e.value).startswith("since: no oom entry in the window: events 1..5 of 6")
    page = tmp_path / "d.html"
    df = tensormem.diff(d, d, until=2, html=page)
    assert df["a"]["window"]["until_event"] == 2
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and "<h2>Side by side</h2>" in html
