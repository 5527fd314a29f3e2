"""tensormem.dtr_advise: a model's device-budget advice, recorded on the meta device.

Needs torch: without it the whole module is skipped and pytest's -ra summary says so (the
log-only half, ``dtr_advise_log``, is tested without torch in test_tensormem.py).
"""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: tensormem.dtr_advise needs it")

import tensormem  # noqa: E402
from tensormem import record as rec  # noqa: E402


def cpu_mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    return model, torch.randn(3, 4)


def test_a_cpu_model_is_advised_on_meta_and_left_as_it_was(tmp_path):
    model, x = cpu_mlp()
    before = [p.detach().clone() for p in model.parameters()]
    log = tmp_path / "mlp.log.gz"
    svg = tmp_path / "mlp.svg"
    a = tensormem.dtr_advise(model, x, strategies=["window", "callback"], log_path=str(log), plot=str(svg))
    # The model and its input are untouched: still on the CPU, same values, no gradients.
    assert all(p.device.type == "cpu" and p.grad is None for p in model.parameters())
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert x.device.type == "cpu"
    # The recorded log is the MLP of test_record.py: its no-eviction peak is 672 bytes.
    assert a["peak_bytes"] == 672 == tensormem.dtr_log(str(log))["peak_bytes"]
    assert a["cost"].startswith("roofline ")
    assert [r["run"] for r in a["advice"]] == ["window dtr-eq", "callback dtr-eq", "allocator-blind dtr-eq"]
    assert a["limits"] == [1.1, 1.25, 1.5, 2.0]
    assert len(a["ratios"]) == 20
    blind = a["advice"][-1]
    # At ratio 1.0 nothing is evicted: the overhead is simrd's clock (1 + compute) / compute.
    base = a["baseline_compute"]
    assert blind["points"][-1] == {"ratio": 1.0, "device_bytes": 672, "status": "OK",
                                   "overhead": (1 + base) / base}
    for row in a["advice"]:
        for ans in row["smallest"]:
            if ans is not None:
                assert ans["overhead"] <= ans["overhead_limit"]
                assert ans["device_bytes"] == int(ans["ratio"] * 672)  # simrd: int(peak * r)
    # The same answer as the log's own advice, and as the meta model recorded by hand.
    assert tensormem.dtr_advise_log(str(log), strategies="window,callback")["advice"] == a["advice"]
    with torch.device("meta"):
        m2 = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        x2 = torch.randn(3, 4)
    text = rec.record(m2, (x2,))
    assert tensormem.dtr_advise_log(text, strategies=["window", "callback"])["advice"] == a["advice"]
    drawn = svg.read_text()
    assert drawn.startswith("<svg") and "allocator-blind dtr-eq" in drawn


def test_bad_options_raise_with_the_python_names():
    model, x = cpu_mlp()
    with pytest.raises(tensormem.TensormemError, match="strategies: unknown strategy 'belady'"):
        tensormem.dtr_advise(model, x, strategies="belady")
    with pytest.raises(tensormem.TensormemError, match="step 2"):
        tensormem.dtr_advise(model, x, step=2.0)
    with pytest.raises(ValueError, match="meta"):
        tensormem.dtr_advise(model, x, cost="time")
