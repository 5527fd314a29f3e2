"""Record a PyTorch model's forward and backward as a DTR operator log.

The log is in the DTR prototype's format (one JSON object per line, scalars as strings; see
``shared/reference/dtr.md``), so ``tensormem dtr LOG`` (and simrd) replay it::

    import torch, torchvision, tensormem.record as rec
    with torch.device("meta"):
        model = torchvision.models.resnet50(weights=None)
        x = torch.randn(32, 3, 224, 224)
    text = rec.record(model, (x,), path="resnet50-32.log.gz")

or from a shell: ``python -m tensormem.record resnet50 --batch 32 -o resnet50-32.log.gz``.

What is written, per operator call that ``__torch_dispatch__`` sees:

- the model's parameters and buffers, then the example inputs, are ``CONSTANT``s with their
  storage's bytes (``MEMORY``) right after ``START``, as the prototype marks weights and
  inputs; any other tensor argument seen for the first time is a ``CONSTANT`` there and then;
- a call is a ``CALL`` with its tensor arguments (``ARGS``), its new tensors (``RESULT``), a
  ``MEMORY`` per result (a fresh result's storage bytes, a view's own bytes) and an ``ALIAS``
  per result: the index of the argument whose storage it shares (views), or ``-1``;
- an in-place or ``out=`` call on a tensor an operator made is a ``MUTATE`` with the indices of
  the written arguments (mutations of constants, such as batch norm's running statistics, are
  not logged: the prototype treats constants as immutable);
- ``RELEASE`` when a tensor object dies (the tensor itself, not just the Python name: autograd's
  saved tensors keep it alive);
- ``ANNOTATE`` ``START`` first, ``BACKWARD`` before the backward pass, and right after
  ``START`` one annotation ``COST <mode> ...`` saying what ``TIME`` holds:

  - ``flops``: the call's FLOPs as ``torch.utils.flop_counter`` counts them (matrix products,
    convolutions, attention); a call it does not count is charged one per element it writes
    (at least 1), so that no call is free to recompute;
  - ``roofline`` (the default): nanoseconds on a nominal GPU,
    ``max(flops / FLOP_S, bytes / BYTES_S) + LAUNCH_NS``, with the FLOPs above and the bytes
    the call reads and writes (the figures are in the annotation);
  - ``time``: measured wall-clock nanoseconds of each call (needs a real device, not meta).

Everything runs on the ``meta`` device by default: no memory is touched, so a model of any
size records on a laptop (``--cost time`` needs ``--device cpu``).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import sys
import time
import weakref
from typing import Any, Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

try:  # torch >= 2.1
    from torch.utils.flop_counter import flop_registry as _FLOP_REGISTRY
except ImportError:  # pragma: no cover - older torch
    _FLOP_REGISTRY = {}

COST_MODES = ("roofline", "flops", "time")

#: The nominal GPU of ``--cost roofline`` (about a Titan V, the DTR paper's GPU): fp32 FLOP/s,
#: memory bytes/s and a per-call launch floor in ns.
ROOFLINE_FLOP_S = 15e12
ROOFLINE_BYTES_S = 650e9
ROOFLINE_LAUNCH_NS = 1000

_aten = torch.ops.aten
#: Calls that only read metadata, or make no tensor: never logged.
_SKIP = {
    _aten.sym_size,
    _aten.sym_stride,
    _aten.sym_numel,
    _aten.sym_storage_offset,
    _aten.is_same_size,
    _aten._local_scalar_dense,
}


def _storage_key(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError, AttributeError):
        return None


def _view_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _storage_bytes(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):
        return _view_bytes(t)


def _line(obj: dict) -> str:
    # The prototype's key order: sorted; scalars as strings.
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


class Recorder(TorchDispatchMode):
    """A ``TorchDispatchMode`` that writes every operator call as a DTR log line.

    Use ``with Recorder(cost=...) as r:`` around the model's forward and backward, then
    ``r.text()``; :func:`record` does all of it. ``r.calls`` and ``r.mutates`` count what was
    logged; ``r.counted_flops`` sums ``torch.utils.flop_counter``'s FLOPs.
    """

    def __init__(self, cost: str = "roofline"):
        super().__init__()
        if cost not in COST_MODES:
            raise ValueError(f"unknown cost mode {cost!r} (use {', '.join(COST_MODES)})")
        self.cost = cost
        self.lines: list[str] = []
        # id(tensor) -> (weak reference, name); the reference's callback logs the RELEASE.
        self._names: dict[int, tuple[weakref.ref, str]] = {}
        self._constants: set[str] = set()
        self._next = 0
        self.calls = 0
        self.mutates = 0
        self.counted_flops = 0
        self._annotate("START")
        if cost == "roofline":
            self._annotate(
                f"COST roofline flop/s={ROOFLINE_FLOP_S:g} bytes/s={ROOFLINE_BYTES_S:g} "
                f"launch_ns={ROOFLINE_LAUNCH_NS}"
            )
        elif cost == "flops":
            self._annotate("COST flops torch.utils.flop_counter, else 1 per element written")
        else:
            self._annotate("COST time ns measured")

    # -- the log ---------------------------------------------------------------------------

    def _annotate(self, what: str) -> None:
        self.lines.append(_line({"INSTRUCTION": "ANNOTATE", "ANNOTATION": what}))

    def declare(self, tensors: Iterable[torch.Tensor]) -> None:
        """Writes a ``CONSTANT`` for each tensor not named yet (parameters, buffers, inputs),
        in order: they exist before the first call, as in a training process (and as the
        prototype declares the weights it wraps), so a simulated allocator places them before
        any activation."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._arg_name(t)

    def annotate(self, what: str) -> None:
        """Writes an ``ANNOTATE`` line (``BACKWARD`` before the backward pass)."""
        self._annotate(what)

    def text(self) -> str:
        """The log so far, one JSON object per line."""
        return "\n".join(self.lines) + "\n"

    def _name_of(self, t: torch.Tensor) -> str | None:
        entry = self._names.get(id(t))
        if entry is not None and entry[0]() is t:
            return entry[1]
        return None

    def _define(self, t: torch.Tensor) -> str:
        name = f"x{self._next}"
        self._next += 1
        key = id(t)

        def released(ref: weakref.ref, key: int = key, name: str = name) -> None:
            entry = self._names.get(key)
            if entry is not None and entry[0] is ref:
                del self._names[key]
            self.lines.append(_line({"INSTRUCTION": "RELEASE", "NAME": name}))

        self._names[key] = (weakref.ref(t, released), name)
        return name

    def _arg_name(self, t: torch.Tensor) -> str:
        name = self._name_of(t)
        if name is None:
            name = self._define(t)
            self._constants.add(name)
            self.lines.append(_line({"INSTRUCTION": "CONSTANT", "NAME": name}))
            self.lines.append(
                _line({"INSTRUCTION": "MEMORY", "MEMORY": str(_storage_bytes(t)), "NAME": name})
            )
        return name

    # -- costs -----------------------------------------------------------------------------

    def _flops(self, func, args, kwargs, out) -> int:
        fn = _FLOP_REGISTRY.get(func._overloadpacket)
        if fn is None:
            return 0
        try:
            return int(fn(*args, **kwargs, out_val=out))
        except Exception:  # a formula that does not take this overload's arguments
            return 0

    def _cost(self, func, args, kwargs, out, ins, fresh, elapsed_ns: int) -> int:
        if self.cost == "time":
            return max(1, elapsed_ns)
        flops = self._flops(func, args, kwargs, out)
        self.counted_flops += flops
        written = sum(t.numel() for t in fresh)
        if self.cost == "flops":
            return max(1, flops if flops > 0 else written)
        moved = sum(_view_bytes(t) for t in ins) + sum(_view_bytes(t) for t in fresh)
        ns = max(flops / ROOFLINE_FLOP_S, moved / ROOFLINE_BYTES_S) * 1e9
        return int(round(ns)) + ROOFLINE_LAUNCH_NS

    # -- dispatch --------------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._overloadpacket in _SKIP:
            return func(*args, **kwargs)
        # Tensor arguments in schema order, and which of them the call writes.
        ins: list[torch.Tensor] = []
        written: list[int] = []
        schema = func._schema
        for i, a in enumerate(schema.arguments):
            if i < len(args) and not a.kwarg_only:
                v = args[i]
            elif a.name in kwargs:
                v = kwargs[a.name]
            else:
                continue
            writes = a.alias_info is not None and a.alias_info.is_write
            for t in tree_flatten(v)[0]:
                if isinstance(t, torch.Tensor):
                    if writes:
                        written.append(len(ins))
                    ins.append(t)
        start = time.perf_counter_ns()
        out = func(*args, **kwargs)
        elapsed = time.perf_counter_ns() - start
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if not outs and not written:
            return out
        arg_names = [self._arg_name(t) for t in ins]
        # Mutated tensors an operator made (constants are immutable, as in the prototype).
        mutated = [k for k in written if arg_names[k] not in self._constants]
        seen = set()
        results = []  # (tensor, alias index or -1)
        in_keys = [_storage_key(t) for t in ins]
        for t in outs:
            if id(t) in seen or self._name_of(t) is not None:
                continue  # an argument returned (in-place, out=) or one result twice
            seen.add(id(t))
            key = _storage_key(t)
            alias = -1
            if key is not None:
                for k, ik in enumerate(in_keys):
                    if ik == key:
                        alias = k
                        break
            results.append((t, alias))
        fresh = [t for t, a in results if a < 0] + [ins[k] for k in mutated]
        cost = self._cost(func, args, kwargs, out, ins, fresh, elapsed)
        op = func._overloadpacket.__name__
        if mutated:
            self.mutates += 1
            self.lines.append(
                _line(
                    {
                        "ARGS": arg_names,
                        "INSTRUCTION": "MUTATE",
                        "MUTATE": mutated,
                        "NAME": op,
                        "TIME": str(cost if not results else max(1, cost // 2)),
                    }
                )
            )
            if results:
                cost = max(1, cost - cost // 2)
        if results:
            self.calls += 1
            names = [self._define(t) for t, _ in results]
            self.lines.append(
                _line(
                    {
                        "ARGS": arg_names,
                        "INSTRUCTION": "CALL",
                        "NAME": op,
                        "RESULT": names,
                        "TIME": str(cost),
                    }
                )
            )
            for (t, alias), name in zip(results, names):
                size = _view_bytes(t) if alias >= 0 else _storage_bytes(t)
                self.lines.append(_line({"INSTRUCTION": "MEMORY", "MEMORY": str(size), "NAME": name}))
                self.lines.append(_line({"ALIAS": str(alias), "INSTRUCTION": "ALIAS", "NAME": name}))
        return out


def _tensors(x: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


def default_loss(output: Any) -> torch.Tensor:
    """The sum of every floating-point output that requires grad (what ``record`` backs
    through when no ``loss_fn`` is given)."""
    parts = [t.sum() for t in _tensors(output) if t.requires_grad and t.is_floating_point()]
    if not parts:
        raise ValueError("the model's output has no floating-point tensor that requires grad")
    loss = parts[0]
    for p in parts[1:]:
        loss = loss + p
    return loss


def record(
    model: Callable,
    example_inputs: Iterable[Any] | Any,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    cost: str = "roofline",
    path: str | None = None,
    backward: bool = True,
) -> str:
    """Records one forward (and backward) of ``model(*example_inputs)`` and returns the log.

    ``loss_fn(output)`` makes the scalar to back through (default :func:`default_loss`).
    The model's parameters and buffers, then the inputs, are declared as constants first.
    Parameters' gradients are set to ``None`` first, so the recorded backward makes them.
    With ``path`` the log is also written there (gzip-compressed when it ends in ``.gz``).
    The tensors must already be on the device to record on (``meta`` for no memory at all).

    Raises ``ValueError`` for an unknown cost mode or a model output with nothing to back
    through.
    """
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    if isinstance(model, torch.nn.Module):
        model.zero_grad(set_to_none=True)
    rec = Recorder(cost=cost)
    if isinstance(model, torch.nn.Module):
        rec.declare(model.parameters())
        rec.declare(model.buffers())
    rec.declare(_tensors(example_inputs))
    with rec:
        out = model(*example_inputs)
        if backward:
            loss = (loss_fn or default_loss)(out)
            rec.annotate("BACKWARD")
            loss.backward()
            del loss
        del out
    text = rec.text()
    if path is not None:
        write_log(text, path)
    return text


def write_log(text: str, path: str) -> None:
    """Writes a log, gzip-compressed (reproducibly: no time stamp) when ``path`` ends in
    ``.gz``."""
    data = text.encode()
    if str(path).endswith(".gz"):
        buf = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as g:
            g.write(data)
        data = buf.getvalue()
    with open(path, "wb") as f:
        f.write(data)


# -- models by name (the corpus and the command line) ---------------------------------------


class GPT(torch.nn.Module):
    """A GPT-style decoder in a few lines: token and position embeddings, ``layers`` pre-norm
    blocks (causal self-attention through ``scaled_dot_product_attention``, a 4x MLP with
    GELU), a final norm and a tied output head."""

    def __init__(self, vocab=8192, dim=512, heads=8, layers=6, ctx=512):
        super().__init__()
        self.heads = heads
        self.tok = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Embedding(ctx, dim)
        self.blocks = torch.nn.ModuleList(
            torch.nn.ModuleDict(
                {
                    "ln1": torch.nn.LayerNorm(dim),
                    "qkv": torch.nn.Linear(dim, 3 * dim),
                    "proj": torch.nn.Linear(dim, dim),
                    "ln2": torch.nn.LayerNorm(dim),
                    "up": torch.nn.Linear(dim, 4 * dim),
                    "down": torch.nn.Linear(4 * dim, dim),
                }
            )
            for _ in range(layers)
        )
        self.ln = torch.nn.LayerNorm(dim)

    def forward(self, idx):
        b, t = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["ln1"](x)).split(x.shape[-1], dim=-1)
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + blk["proj"](a.transpose(1, 2).reshape(b, t, -1))
            x = x + blk["down"](torch.nn.functional.gelu(blk["up"](blk["ln2"](x))))
        return self.ln(x) @ self.tok.weight.t()


class LSTMModel(torch.nn.Module):
    """An LSTM language-model step: ``layers`` stacked ``torch.nn.LSTM`` layers and a linear
    head on every time step."""

    def __init__(self, inp=512, hidden=1024, layers=2, out=1000):
        super().__init__()
        self.lstm = torch.nn.LSTM(inp, hidden, num_layers=layers)
        self.head = torch.nn.Linear(hidden, out)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.head(y)


class TransformerModel(torch.nn.Module):
    """``torch.nn.Transformer`` (encoder-decoder) with a linear head."""

    def __init__(self, dim=512, heads=8, layers=6, out=1000):
        super().__init__()
        self.t = torch.nn.Transformer(
            dim, heads, layers, layers, dim_feedforward=4 * dim, batch_first=True
        )
        self.head = torch.nn.Linear(dim, out)

    def forward(self, src, tgt):
        return self.head(self.t(src, tgt))


class UNet(torch.nn.Module):
    """A U-Net (Ronneberger et al.) in a few lines: ``depth`` levels of two 3x3 conv + batch
    norm + ReLU blocks, max-pool down, bilinear upsampling and skip concatenation up."""

    def __init__(self, base=32, depth=4, classes=2):
        super().__init__()

        def block(i, o):
            return torch.nn.Sequential(
                torch.nn.Conv2d(i, o, 3, padding=1, bias=False),
                torch.nn.BatchNorm2d(o),
                torch.nn.ReLU(inplace=True),
                torch.nn.Conv2d(o, o, 3, padding=1, bias=False),
                torch.nn.BatchNorm2d(o),
                torch.nn.ReLU(inplace=True),
            )

        chans = [base * 2**k for k in range(depth + 1)]
        self.down = torch.nn.ModuleList(
            [block(3, chans[0])] + [block(chans[k], chans[k + 1]) for k in range(depth)]
        )
        self.up = torch.nn.ModuleList(
            block(chans[k + 1] + chans[k], chans[k]) for k in reversed(range(depth))
        )
        self.head = torch.nn.Conv2d(chans[0], classes, 1)

    def forward(self, x):
        skips = []
        for k, blk in enumerate(self.down):
            if k > 0:
                x = torch.nn.functional.max_pool2d(x, 2)
            x = blk(x)
            skips.append(x)
        skips.pop()
        for blk in self.up:
            x = torch.nn.functional.interpolate(x, scale_factor=2, mode="bilinear")
            x = blk(torch.cat([x, skips.pop()], dim=1))
        return self.head(x)


def _classification(weights_fn: str, size: int = 224, **extra):
    def make(batch: int):
        import torchvision

        model = getattr(torchvision.models, weights_fn)(weights=None, **extra)
        return model, (torch.randn(batch, 3, size, size),)

    return make


def _segmentation(name: str, size: int = 512):
    def make(batch: int):
        import torchvision

        model = getattr(torchvision.models.segmentation, name)(
            weights=None, weights_backbone=None, num_classes=21, aux_loss=False
        )
        return model, (torch.randn(batch, 3, size, size),)

    return make


def _unet(batch: int):
    return UNet(), (torch.randn(batch, 3, 256, 256),)


def _gpt(batch: int):
    return GPT(), (torch.randint(0, 8192, (batch, 512)),)


def _lstm(batch: int):
    return LSTMModel(), (torch.randn(128, batch, 512),)


def _transformer(batch: int):
    return TransformerModel(), (torch.randn(batch, 256, 512), torch.randn(batch, 256, 512))


#: Models by name: a function of the batch size giving ``(model, example inputs)``.
MODELS: dict[str, Callable[[int], tuple[torch.nn.Module, tuple]]] = {
    "resnet50": _classification("resnet50"),
    "resnet18": _classification("resnet18"),
    "inception_v3": _classification("inception_v3", 299, init_weights=False),
    "densenet201": _classification("densenet201"),
    "mobilenet_v3_large": _classification("mobilenet_v3_large"),
    "efficientnet_b0": _classification("efficientnet_b0"),
    "vit_b_16": _classification("vit_b_16"),
    "swin_t": _classification("swin_t"),
    "convnext_tiny": _classification("convnext_tiny"),
    "vgg16": _classification("vgg16"),
    "regnet_y_1_6gf": _classification("regnet_y_1_6gf"),
    "shufflenet_v2_x1_0": _classification("shufflenet_v2_x1_0"),
    "fcn_resnet50": _segmentation("fcn_resnet50"),
    "deeplabv3_mobilenet_v3_large": _segmentation("deeplabv3_mobilenet_v3_large"),
    "unet": _unet,
    "gpt": _gpt,
    "lstm": _lstm,
    "transformer": _transformer,
}


#: The corpus (``--corpus DIR``): ``(model, batch)``, two batch sizes for some.
CORPUS: list[tuple[str, int]] = [
    ("resnet50", 32),
    ("resnet50", 64),
    ("resnet18", 64),
    ("inception_v3", 32),
    ("densenet201", 32),
    ("mobilenet_v3_large", 64),
    ("efficientnet_b0", 32),
    ("vit_b_16", 32),
    ("swin_t", 32),
    ("convnext_tiny", 32),
    ("vgg16", 32),
    ("regnet_y_1_6gf", 32),
    ("shufflenet_v2_x1_0", 64),
    ("fcn_resnet50", 4),
    ("deeplabv3_mobilenet_v3_large", 8),
    ("unet", 8),
    ("gpt", 4),
    ("gpt", 8),
    ("lstm", 32),
    ("transformer", 16),
]


def build(name: str, batch: int, device: str = "meta"):
    """Builds model ``name`` (a key of :data:`MODELS`, or ``module:function`` returning
    ``(model, inputs)`` for a batch size) with its example inputs on ``device``, in training
    mode."""
    if name in MODELS:
        make = MODELS[name]
    elif ":" in name:
        import importlib

        mod, fn = name.split(":", 1)
        make = getattr(importlib.import_module(mod), fn)
    else:
        raise ValueError(f"unknown model {name!r} (use one of {', '.join(MODELS)} or module:function)")
    try:
        with torch.device(device):
            model, inputs = make(batch)
    except (NotImplementedError, RuntimeError):
        # A constructor that reads tensor values (regnet's widths) cannot run on meta: build
        # on the CPU, then move.
        model, inputs = make(batch)
    model = model.to(device).train()
    inputs = tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in inputs)
    return model, inputs


def main(argv: list[str] | None = None) -> int:
    """``python -m tensormem.record``: records a named model; prints a one-line summary."""
    p = argparse.ArgumentParser(
        prog="python -m tensormem.record",
        description="Record a model's forward and backward as a DTR operator log "
        "(replay it with `tensormem dtr LOG`).",
    )
    p.add_argument("model", nargs="?", help=f"one of {', '.join(MODELS)}, or module:function")
    p.add_argument(
        "--corpus",
        metavar="DIR",
        help="record every model of the corpus (CORPUS) into DIR/<model>-<batch>.log.gz",
    )
    p.add_argument("--batch", type=int, default=8, help="batch size (default 8)")
    p.add_argument("--device", default="meta", help="device to record on (default meta)")
    p.add_argument("--cost", choices=COST_MODES, default="roofline", help="what TIME holds")
    p.add_argument("-o", "--output", help="the log file (.gz: compressed; default stdout)")
    p.add_argument("--forward-only", action="store_true", help="no backward pass")
    a = p.parse_args(argv)
    if (a.model is None) == (a.corpus is None):
        p.error("give a model or --corpus DIR")
    if a.cost == "time" and a.device == "meta":
        p.error("--cost time measures real calls: use --device cpu (or cuda)")
    if a.corpus is not None:
        import os

        os.makedirs(a.corpus, exist_ok=True)
        for name, batch in CORPUS:
            model, inputs = build(name, batch, a.device)
            path = os.path.join(a.corpus, f"{name}-{batch}.log.gz")
            text = record(model, inputs, cost=a.cost, path=path)
            calls = text.count('"INSTRUCTION":"CALL"')
            print(f"{path}: {calls} calls", file=sys.stderr)
        return 0
    try:
        model, inputs = build(a.model, a.batch, a.device)
    except (ValueError, ImportError, AttributeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = record(model, inputs, cost=a.cost, path=a.output, backward=not a.forward_only)
    if a.output is None:
        sys.stdout.write(text)
    else:
        calls = text.count('"INSTRUCTION":"CALL"')
        print(f"{a.output}: {a.model} batch {a.batch}, {calls} calls, cost {a.cost}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
