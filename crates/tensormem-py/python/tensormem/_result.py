"""The results of ``replay``, ``advise``, ``explain`` and ``diff``: the command's ``--json`` dict,
as a ``dict`` subclass (index it, iterate it, compare it with a dict, ``json.dumps`` or pickle it,
as before) that a notebook (Jupyter, VS Code) shows as a table through ``_repr_html_``.

The table holds the figures the command's text report leads with; sizes print as the command
prints them (PyTorch's ``format_size``: ``"20.00 MiB"``), a figure the snapshot cannot give
(``None``) as ``unknown``. Every string from the snapshot (file names, call sites) is
HTML-escaped.
"""

from html import escape
from typing import Any, Dict, Iterable, List, Optional, Sequence

__all__ = ["Result", "ReplayResult", "AdviseResult", "ExplainResult", "DiffResult"]

_KIB = 1 << 10
_MIB = 1 << 20
_GIB = 1 << 30


def format_size(n: Optional[int]) -> str:
    """Bytes as the command prints them (PyTorch's ``format_size``); ``None`` as ``unknown``."""
    if n is None:
        return "unknown"
    if n <= _KIB:
        return f"{n} bytes"
    if n <= _MIB:
        return f"{n / 1024:.2f} KiB"
    if n <= _GIB:
        return f"{n / _MIB:.2f} MiB"
    return f"{n / _GIB:.2f} GiB"


def _cell(v: Any) -> str:
    if v is None:
        return "unknown"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


_STYLE = (
    "<style>.tensormem-result table{border-collapse:collapse;margin:4px 0 10px}"
    ".tensormem-result th,.tensormem-result td{padding:2px 8px;border-bottom:1px solid #ddd;"
    "text-align:left;vertical-align:top}"
    ".tensormem-result td.n{text-align:right;white-space:nowrap}"
    ".tensormem-result pre{margin:2px 0;white-space:pre-wrap}</style>"
)


def _table(head: Sequence[str], rows: Iterable[Sequence[Any]], numeric: Sequence[bool]) -> str:
    out = ["<table><tr>"]
    out += [f"<th>{escape(h)}</th>" for h in head]
    out.append("</tr>")
    for row in rows:
        out.append("<tr>")
        for v, n in zip(row, numeric):
            cls = ' class="n"' if n else ""
            out.append(f"<td{cls}>{escape(_cell(v))}</td>")
        out.append("</tr>")
    out.append("</table>")
    return "".join(out)


def _facts(pairs: Iterable[Sequence[Any]]) -> str:
    return _table(("", ""), pairs, (False, True))


def _sites(title: str, sites: Optional[List[Dict[str, Any]]]) -> str:
    if not sites:
        return ""
    rows = [(format_size(s["bytes"]), s["count"], s["site"]) for s in sites]
    return f"<b>{escape(title)}</b>" + _table(("bytes", "allocs", "site"), rows, (True, True, False))


class Result(dict):  # type: ignore[type-arg]
    """A command's ``--json`` dict that a notebook shows as a table (see the module)."""

    command = ""

    def _title(self) -> str:
        return f"<b>tensormem {self.command} {escape(str(self.get('file', '')))}</b>"

    def _body(self) -> str:
        return _facts((k, v) for k, v in self.items() if not isinstance(v, (dict, list)))

    def _repr_html_(self) -> str:
        """The notebook display: the title, then the report's leading figures as tables."""
        return f'<div class="tensormem-result">{_STYLE}{self._title()}{self._body()}</div>'


class ReplayResult(Result):
    """What ``tensormem.replay`` returns: the ``tensormem replay --json`` dict."""

    command = "replay"

    def _body(self) -> str:
        if self.get("state_only"):
            facts = _facts(
                [
                    ("state only (a dump, no history)", "yes"),
                    ("segments", self.get("segments")),
                    ("reserved", format_size(self.get("reserved_bytes"))),
                    ("allocated", format_size(self.get("allocated_bytes"))),
                ]
            )
            unknown = self.get("unknown") or []
            items = "".join(f"<li>{escape(u)}</li>" for u in unknown)
            return facts + (f"<b>Unknown</b><ul>{items}</ul>" if items else "") + _sites(
                "Top call sites in the dump", self.get("top_sites")
            )
        p = self.get("parity")
        rows: List[Sequence[Any]] = [
            ("config", self.get("config")),
            ("history events", self.get("events")),
        ]
        w = self.get("window")
        if w:
            rows.append(("window (events)", f"{w['since_event']}..{w['until_event'] - 1}"))
        if p:
            rows.append(("allocations at the recorded address", f"{p['alloc_address_match']} of {p['alloc_total']}"))
            rows.append(
                ("segment decisions as recorded", f"{p['segment_decision_match']} of {p['segment_decision_total']}")
            )
        rows.append(("peak reserved", format_size(self.get("peak_reserved_bytes"))))
        if p:
            # Only a parity replay has a recording to compare with (null in what-if mode).
            rows.append(("recorded peak reserved", format_size(self.get("recorded_peak_reserved_bytes"))))
        rows += [
            ("peak allocated", format_size(self.get("peak_allocated_bytes"))),
            ("lower bound (peak of live bytes)", format_size(self.get("lower_bound_bytes"))),
            ("device mallocs", self.get("device_mallocs")),
            ("alloc retries", self.get("num_alloc_retries")),
            ("OOMs", self.get("num_ooms")),
        ]
        out = _facts(rows)
        sweep = self.get("sweep") or []
        if sweep:
            out += "<b>What-if replays</b>" + _table(
                ("config", "peak reserved", "frag", "mallocs", "retries", "OOMs"),
                [
                    (
                        s["config"],
                        format_size(s["peak_reserved_bytes"]),
                        s["fragmentation"],
                        s["device_mallocs"],
                        s["num_alloc_retries"],
                        s["num_ooms"],
                    )
                    for s in sweep
                ],
                (False, True, True, True, True, True),
            )
        return out + _sites("Top call sites at the reserved peak", self.get("top_sites"))


class AdviseResult(Result):
    """What ``tensormem.advise`` returns: the ``tensormem advise --json`` dict."""

    command = "advise"

    def _body(self) -> str:
        dm = self.get("device_memory_bytes")
        out = _facts(
            [
                ("replayed", self.get("mode")),
                ("history events", self.get("events")),
                ("blocks live when recording began", f"{self.get('start_blocks')} ({format_size(self.get('start_bytes'))})"),
                ("lower bound (peak of live bytes)", format_size(self.get("lower_bound_bytes"))),
                ("device memory", "unconstrained" if dm is None else format_size(dm)),
                ("replays", self.get("replays")),
            ]
        )
        cands = self.get("candidates") or []
        out += "<b>Allocator settings, best first</b>" + _table(
            ("rank", "config", "fits", "min device memory", "retries there", "peak reserved", "frag", "OOMs"),
            [
                (
                    i + 1,
                    c["config"],
                    c["fits"],
                    "does not fit" if c["min_device_memory_bytes"] is None else format_size(c["min_device_memory_bytes"]),
                    "-" if c["retries_at_min_device_memory"] is None else c["retries_at_min_device_memory"],
                    format_size(c["peak_reserved_bytes"]),
                    c["fragmentation"],
                    c["failed_allocs"],
                )
                for i, c in enumerate(cands)
            ],
            (True, False, False, True, True, True, True, True),
        )
        if cands and cands[0]["fits"]:
            lines = "\n".join(cands[0]["apply"])
            out += f"<b>Best: {escape(cands[0]['config'])}</b><pre>{escape(lines)}</pre>"
        elif cands:
            out += "<b>No setting runs the job without OOM on this device memory.</b>"
        return out


class ExplainResult(Result):
    """What ``tensormem.explain`` returns: the ``tensormem explain --json`` dict."""

    command = "explain"

    def _body(self) -> str:
        out = f"<p>{escape(str(self.get('verdict', '')))}</p>"
        req = self.get("request")
        rows: List[Sequence[Any]] = [("moment", self.get("moment"))]
        if req:
            rows += [
                ("failed request", f"{format_size(req['size'])} on stream {req['stream']} ({req['pool']} pool)"),
                ("free on the device", format_size(req["device_free"])),
                ("at event", req["event_index"]),
            ]
        rows += [
            ("reserved", format_size(self.get("reserved_bytes"))),
            ("allocated", format_size(self.get("allocated_bytes"))),
            ("reserved but unallocated in split segments", format_size(self.get("inactive_split_bytes"))),
        ]
        out += _facts(rows)
        pools = self.get("pools") or []
        if pools:
            out += "<b>Largest free block per pool and stream</b>" + _table(
                ("pool", "stream", "segments", "reserved", "free", "largest free block"),
                [
                    (
                        p["pool"],
                        p["stream"],
                        p["segments"],
                        format_size(p["reserved_bytes"]),
                        format_size(p["free_bytes"]),
                        format_size(p["largest_free_block"]),
                    )
                    for p in pools
                ],
                (False, True, True, True, True, True),
            )
        out += _sites("Top call sites holding memory", self.get("top_sites"))
        unknown = self.get("unknown") or []
        if unknown:
            out += "<b>Unknown</b><ul>" + "".join(f"<li>{escape(u)}</li>" for u in unknown) + "</ul>"
        return out


class DiffResult(Result):
    """What ``tensormem.diff`` returns: the ``tensormem diff --json`` dict."""

    command = "diff"

    def _title(self) -> str:
        a, b = self.get("a") or {}, self.get("b") or {}
        return f"<b>tensormem diff {escape(str(a.get('file', '')))} {escape(str(b.get('file', '')))}</b>"

    def _body(self) -> str:
        a, b = self.get("a") or {}, self.get("b") or {}

        def row(label: str, key: str, size: bool) -> Sequence[Any]:
            x, y = a.get(key), b.get(key)
            fmt = format_size if size else _cell
            if x is None or y is None:
                change = "unknown"
            elif size:
                d = y - x
                change = ("+" if d >= 0 else "-") + format_size(abs(d))
            elif isinstance(x, float):
                change = f"{y - x:+.3f}"
            else:
                change = f"{y - x:+d}"
            return (label, fmt(x), fmt(y), change)

        out = _table(
            ("", "A", "B", "change"),
            [
                row("history events", "events", False),
                row("segments at the dump", "segments", False),
                row("reserved at the dump", "reserved_bytes_at_dump", True),
                row("allocated at the dump", "allocated_bytes_at_dump", True),
                row("peak reserved", "peak_reserved_bytes", True),
                row("peak allocated", "peak_allocated_bytes", True),
                row("lower bound (live peak)", "lower_bound_bytes", True),
                row("blocks live before recording", "start_blocks", False),
                row("fragmentation", "fragmentation", False),
            ],
            (False, True, True, True),
        )
        sites = self.get("sites") or []
        if sites:
            out += f"<b>Call sites that grew or shrank: {len(sites)} of {self.get('sites_changed')} shown</b>"
            out += _table(
                ("A bytes", "B bytes", "change", "site"),
                [
                    (
                        format_size(s["a_bytes"]),
                        format_size(s["b_bytes"]),
                        ("+" if s["change_bytes"] >= 0 else "-") + format_size(abs(s["change_bytes"])),
                        s["site"],
                    )
                    for s in sites
                ],
                (True, True, True, False),
            )
        return out
