"""tensormem: PyTorch's CUDA caching allocator and DTR, re-implemented in Rust.

- ``replay``, ``advise``, ``explain``, ``dump``, ``diff``: PyTorch memory snapshots (given as a path, a
  file object, the bytes of a pickle or JSON file as ``bytes``/``bytearray``/``memoryview``, or
  the dict ``torch.cuda.memory._snapshot()`` returns) through our allocator; they return what
  the CLI's ``--json`` prints, as a dict subclass (``ReplayResult``, ``AdviseResult``,
  ``ExplainResult``, ``DiffResult``) that notebooks display as a table. Errors raise
  ``TensormemError`` with the CLI's message.
- ``dtr_log``: a DTR operator log's no-eviction figures, read as ``tensormem dtr`` reads it;
  ``dtr_advise_log``: its device-budget advice (``tensormem dtr --device-budget --advise``).
- ``dtr_advise(model, example_inputs)`` (needs torch, imported only when called): records the
  model on the ``meta`` device and gives that advice.
- ``tensormem.record`` (needs torch, imported only there): records a model's forward and
  backward as a DTR operator log that ``tensormem dtr`` replays.
"""

from ._native import (
    TensormemError,
    __version__,
    advise,
    diff,
    dtr_advise_log,
    dtr_log,
    dump,
    explain,
    replay,
)
from .dtr import dtr_advise
from ._result import AdviseResult, DiffResult, ExplainResult, ReplayResult, Result

__all__ = [
    "AdviseResult",
    "DiffResult",
    "ExplainResult",
    "ReplayResult",
    "Result",
    "TensormemError",
    "__version__",
    "advise",
    "diff",
    "dtr_advise",
    "dtr_advise_log",
    "dtr_log",
    "dump",
    "explain",
    "replay",
]
