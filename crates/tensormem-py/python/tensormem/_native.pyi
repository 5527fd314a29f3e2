"""Type stubs of the native extension ``tensormem._native`` (re-exported by ``tensormem``).

Every function takes a snapshot as a path, a file object opened for reading, the bytes of a
pickle or JSON file (``bytes``, ``bytearray``, ``memoryview``), or the dict
``torch.cuda.memory._snapshot()`` returns, and returns what the command's ``--json`` prints
(``replay``, ``advise``, ``explain``, ``diff``: as a dict subclass that notebooks display as a
table). Sizes are bytes (``int``) or text such as ``"40GiB"``. Errors raise ``TensormemError``.
"""

import os
from typing import IO, Any, Dict, Optional, Sequence, Union

from ._result import AdviseResult, DiffResult, ExplainResult, ReplayResult

Snapshot = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview, "IO[bytes]", "IO[str]", Dict[str, Any], list]
Size = Union[int, str]
Bound = Union[int, str]  # an event index, or a time since the first event such as "1.5s"
Report = Dict[str, Any]

__version__: str

class TensormemError(Exception):
    """A tensormem failure: bad input or options; the message is the command line's."""

def replay(
    snap: Snapshot,
    alloc_conf: Optional[str] = None,
    from_empty: bool = False,
    sweep: bool = False,
    device_memory: Optional[Size] = None,
    top: Optional[int] = None,
    device: Optional[int] = None,
    torch_version: Optional[str] = None,
    history_only: bool = False,
    stack: bool = False,
    html: Optional[Union[str, "os.PathLike[str]"]] = None,
    plot: Optional[Union[str, "os.PathLike[str]"]] = None,
    since: Optional[Bound] = None,
    until: Optional[Bound] = None,
) -> ReplayResult:
    """``tensormem replay --json``: parity (default), or the whole job from empty."""

def advise(
    snap: Snapshot,
    device_memory: Optional[Size] = None,
    device: Optional[int] = None,
    history_only: bool = False,
    html: Optional[Union[str, "os.PathLike[str]"]] = None,
    since: Optional[Bound] = None,
    until: Optional[Bound] = None,
) -> AdviseResult:
    """``tensormem advise --json``: the settings, best first, each verified by a full replay."""

def diff(
    a: Snapshot,
    b: Snapshot,
    top: int = 10,
    html: Optional[Union[str, "os.PathLike[str]"]] = None,
    since: Optional[Bound] = None,
    until: Optional[Bound] = None,
) -> DiffResult:
    """``tensormem diff --json``: two snapshots side by side, the call sites that changed."""

def explain(snap: Snapshot, top: int = 5, since: Optional[Bound] = None, until: Optional[Bound] = None) -> ExplainResult:
    """``tensormem explain --json``: the verdict, the failed request, free space, the advice."""

def dump(
    snap: Snapshot,
    path: Optional[Union[str, "os.PathLike[str]"]] = None,
    alloc_conf: Optional[str] = None,
    from_empty: bool = False,
    device_memory: Optional[Size] = None,
) -> bytes:
    """``tensormem replay --dump``: our snapshot and history as PyTorch-format pickle bytes."""

def dtr_log(log: Union[str, "os.PathLike[str]", bytes, bytearray, memoryview, "IO[bytes]", "IO[str]"]) -> Report:
    """A DTR operator log's no-eviction figures, read as ``tensormem dtr`` reads it."""

def dtr_advise_log(
    log: Union[str, "os.PathLike[str]", bytes, bytearray, memoryview, "IO[bytes]", "IO[str]"],
    strategies: Optional[Union[str, Sequence[str]]] = None,
    heuristics: Optional[Union[str, Sequence[str]]] = None,
    step: Optional[float] = None,
    alloc_conf: Optional[str] = None,
    overhead_limit: float = 2.0,
    plot: Optional[Union[str, "os.PathLike[str]"]] = None,
) -> Report:
    """``tensormem dtr LOG --device-budget --advise --json``: per strategy and for the
    allocator-blind run, the smallest device memory that trains within each overhead limit."""
