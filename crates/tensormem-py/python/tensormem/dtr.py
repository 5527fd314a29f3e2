"""``tensormem.dtr_advise``: how much device memory would rematerialization need for a model.

Records one forward and backward of the model with :mod:`tensormem.record` (on the ``meta``
device: no memory is touched, the model and its inputs are left as they are) and runs
``tensormem dtr LOG --device-budget --advise`` on the log. Needs torch, imported only when
called.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Union

from ._native import dtr_advise_log


def _meta_copy(model: Any) -> Any:
    """The model with its parameters and buffers on the ``meta`` device: the model itself
    when they already are, else a copy whose tensors are new meta tensors (no data copied;
    the model is not changed)."""
    import torch

    if not isinstance(model, torch.nn.Module):
        return model
    tensors = list(model.parameters()) + list(model.buffers())
    if all(t.device.type == "meta" for t in tensors):
        return model
    memo: Dict[int, Any] = {}
    for p in model.parameters():
        memo[id(p)] = torch.nn.Parameter(
            torch.empty_like(p, device="meta"), requires_grad=p.requires_grad
        )
    for b in model.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    return copy.deepcopy(model, memo)


def _meta_inputs(example_inputs: Any) -> Any:
    import torch
    from torch.utils._pytree import tree_map

    def to_meta(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.device.type != "meta":
            return x.detach().to("meta").requires_grad_(x.requires_grad)
        return x

    return tree_map(to_meta, example_inputs)


def dtr_advise(
    model: Callable,
    example_inputs: Union[Iterable[Any], Any],
    loss_fn: Optional[Callable[[Any], Any]] = None,
    cost: str = "roofline",
    strategies: Optional[Union[str, Sequence[str]]] = None,
    heuristics: Optional[Union[str, Sequence[str]]] = None,
    step: Optional[float] = None,
    alloc_conf: Optional[str] = None,
    overhead_limit: float = 2.0,
    plot: Optional[str] = None,
    log_path: Optional[str] = None,
) -> Dict[str, Any]:
    """The smallest device memory at which ``model(*example_inputs)`` trains under DTR.

    Records one forward and backward (``loss_fn(output)``, default the sum of the outputs
    that require grad) with :func:`tensormem.record.record` on the ``meta`` device (a model
    elsewhere is copied there without its data; ``cost="time"`` is refused, meta runs take no
    time), then returns what ``tensormem dtr LOG --device-budget --advise --json`` prints (see
    :func:`tensormem.dtr_advise_log`): per eviction strategy and for the allocator-blind run,
    the smallest ratio of the no-eviction peak, the device bytes and the overhead there at
    which the step completes within each overhead limit, and ``best``. ``log_path`` keeps the
    log (gzip when it ends in ``.gz``); ``plot`` writes the SVG of ``--advise --plot``.

    Raises ``ImportError`` without torch, ``ValueError`` for a bad cost mode or a model output
    with nothing to back through, ``TensormemError`` for bad options.
    """
    try:
        from . import record as rec
    except ImportError as e:  # pragma: no cover - exercised only without torch
        raise ImportError(f"tensormem.dtr_advise needs torch ({e})") from e
    if cost == "time":
        raise ValueError("cost='time' needs a real device; dtr_advise records on meta")
    meta_model = _meta_copy(model)
    inputs = _meta_inputs(example_inputs)
    text = rec.record(meta_model, inputs, loss_fn=loss_fn, cost=cost, path=log_path)
    return dtr_advise_log(
        text,
        strategies=strategies,
        heuristics=heuristics,
        step=step,
        alloc_conf=alloc_conf,
        overhead_limit=overhead_limit,
        plot=plot,
    )


__all__: List[str] = ["dtr_advise"]
