"""tensormem.record: operator logs of real PyTorch models, read back by the same parser as
`tensormem dtr` (tensormem.dtr_log).

Needs torch (torchvision for one test): without it the whole module is skipped and pytest's
-ra summary says so. Everything records on the meta device.
"""

import gzip
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: tensormem.record needs it")

import tensormem  # noqa: E402
from tensormem import record as rec  # noqa: E402
from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402


class LiveBytes(TorchDispatchMode):
    """Independent accounting of the same run: after every call, the bytes of all storages
    seen so far that PyTorch has not freed yet (weak references to the storages themselves,
    no log involved); `peak` is the largest such sum."""

    def __init__(self):
        super().__init__()
        self.live = {}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        for t in tree_flatten((args, kwargs, out))[0]:
            if isinstance(t, torch.Tensor):
                s = t.untyped_storage()
                if s._cdata not in self.live:
                    self.live[s._cdata] = (StorageWeakRef(s), s.nbytes())
        self.live = {k: v for k, v in self.live.items() if not v[0].expired()}
        self.peak = max(self.peak, sum(b for _, b in self.live.values()))
        return out


def mlp():
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        x = torch.randn(3, 4)
    return model, x


def ops(text):
    import json

    return [json.loads(line) for line in text.splitlines()]


def test_a_small_mlp_matches_hand_known_facts():
    model, x = mlp()
    with LiveBytes() as live:
        text = rec.record(model, (x,))
    lines = ops(text)
    calls = [l["NAME"] for l in lines if l["INSTRUCTION"] == "CALL"]
    # Two linear layers forward (addmm), the three products of the backward (the second
    # layer's input and weight gradients, the first layer's weight gradient: x needs none).
    assert calls.count("addmm") == 2
    assert calls.count("mm") == 3
    assert calls.count("relu") == 1 and calls.count("threshold_backward") == 1
    assert not [l for l in lines if l["INSTRUCTION"] == "MUTATE"]
    # Constants: the weights, biases and the input, with their bytes (fp32), in order of use.
    consts = [int(l["MEMORY"]) for i, l in enumerate(lines) if l["INSTRUCTION"] == "MEMORY"
              and lines[i - 1]["INSTRUCTION"] == "CONSTANT"]
    assert sorted(consts) == sorted([8 * 4 * 4, 8 * 4, 3 * 4 * 4, 2 * 8 * 4, 2 * 4])
    assert [l["ANNOTATION"] for l in lines if l["INSTRUCTION"] == "ANNOTATE"][::2] == ["START", "BACKWARD"]
    facts = tensormem.dtr_log(text)
    assert facts["calls"] == len(calls)
    assert facts["constants"] == 5
    assert facts["cost"].startswith("roofline ")
    # The no-eviction peak, by hand: 280 bytes of constants, then at threshold_backward the
    # saved relu output (96), the logits (24), the loss and its seed gradient (4 + 4), the
    # relu output's gradient (96), the second layer's weight and bias gradients (64 + 8) and
    # threshold_backward's result (96).
    assert facts["peak_bytes"] == 280 + 96 + 24 + 4 + 4 + 96 + 64 + 8 + 96 == 672
    # The same run accounted from PyTorch's own storages.
    assert live.peak == facts["peak_bytes"]
    # Every tensor the run made and dropped is released; the four gradients stay.
    made = {l["NAME"] for l in lines if l["INSTRUCTION"] == "MEMORY"} - {
        lines[i + 1]["NAME"] for i, l in enumerate(lines) if l["INSTRUCTION"] == "CONSTANT"
    }
    released = {l["NAME"] for l in lines if l["INSTRUCTION"] == "RELEASE"}
    kept = made - released
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads)
    assert len(kept) >= 4


def test_flops_cost_counts_the_products_exactly():
    model, x = mlp()
    r = rec.Recorder(cost="flops")
    with r:
        loss = model(x).sum()
        loss.backward()
    # addmm 2*3*4*8 + 2*3*8*2, then mm 2*3*2*8 (input grad), 2*2*3*8 (w2), 2*8*3*4 (w1).
    assert r.counted_flops == 192 + 96 + 96 + 96 + 192
    facts = tensormem.dtr_log(r.text())
    assert facts["cost"].startswith("flops ")
    # Every call costs at least 1; the products at least their FLOPs.
    assert facts["compute"] >= r.counted_flops + facts["calls"] - 5


def test_a_decoder_with_views_matches_pytorchs_own_accounting():
    with torch.device("meta"):
        model = rec.GPT(vocab=64, dim=32, heads=2, layers=2, ctx=16)
        idx = torch.randint(0, 64, (2, 16))
    with LiveBytes() as live:
        text = rec.record(model, (idx,))
    facts = tensormem.dtr_log(text)
    assert facts["mutates"] == 0
    aliases = sum(1 for l in ops(text) if l["INSTRUCTION"] == "ALIAS" and l["ALIAS"] != "-1")
    assert aliases > 10  # split, view, transpose, t, ...
    assert facts["peak_bytes"] == live.peak


def test_in_place_relu_is_a_mutate():
    torchvision = pytest.importorskip("torchvision", reason="torchvision is not installed")
    with torch.device("meta"):
        model = torchvision.models.resnet18(weights=None)
        x = torch.randn(2, 3, 64, 64)
    text = rec.record(model, (x,))
    facts = tensormem.dtr_log(text)
    lines = ops(text)
    mut = [l for l in lines if l["INSTRUCTION"] == "MUTATE"]
    # ReLU(inplace=True): 17 in the forward (stem + 2 per basic block x 8).
    assert sum(1 for m in mut if m["NAME"] == "relu_") == 17
    assert all(m["MUTATE"] == [0] for m in mut if m["NAME"] == "relu_")
    assert facts["mutates"] == len(mut)
    # 62 parameter tensors (conv and batch-norm weights, fc) plus the input, and the batch
    # norms' running statistics as constants too.
    params = sum(1 for _ in model.parameters())
    assert params == 62
    assert facts["constants"] >= params + 1


def test_the_command_line_writes_a_gzip_log(tmp_path):
    out = tmp_path / "gpt.log.gz"
    r = subprocess.run(
        [sys.executable, "-m", "tensormem.record", "gpt", "--batch", "1", "-o", str(out)],
        capture_output=True, text=True, check=True,
    )
    assert "calls, cost roofline" in r.stderr
    with gzip.open(out, "rt") as f:
        text = f.read()
    assert tensormem.dtr_log(str(out)) == tensormem.dtr_log(text)
    assert tensormem.dtr_log(out.read_bytes()) == tensormem.dtr_log(text)
    assert tensormem.dtr_log(text)["calls"] > 100


def test_the_command_line_refuses_time_on_meta_and_unknown_models():
    r = subprocess.run(
        [sys.executable, "-m", "tensormem.record", "gpt", "--cost", "time"],
        capture_output=True, text=True,
    )
    assert r.returncode == 2 and "--cost time" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "tensormem.record", "no_such_model"], capture_output=True, text=True
    )
    assert r.returncode == 2 and "unknown model 'no_such_model'" in r.stderr
    with pytest.raises(ValueError, match="unknown cost mode"):
        rec.Recorder(cost="joules")


def test_measured_time_on_cpu():
    model, _ = mlp()
    model = model.to_empty(device="cpu")
    x = torch.randn(3, 4)
    text = rec.record(model, (x,), cost="time")
    facts = tensormem.dtr_log(text)
    assert facts["cost"].startswith("time ")
    assert facts["compute"] > 0

