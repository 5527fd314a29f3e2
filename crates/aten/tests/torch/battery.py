#!/usr/bin/env python3
"""Writes battery.json: aten's differential battery, every expected value produced by real torch.

Each case names an operation, its inputs (a dtype, the values of a contiguous base tensor and a
chain of views over it, so transposed, sliced, offset, expanded and as_strided inputs are
exact), and what torch returned: the result's dtype, shape, strides and values, or the first
line of torch's error. `crates/aten/tests/it/torch_battery.rs` rebuilds each input with aten's view
functions, runs aten's operation and compares.

The file: {"torch": VERSION, "generator": PATH, "cases": [CASE, ...]}, one case a line, each
positional to keep the file small:

    CASE    = [op, [ARG, ...], {keyword arguments}, EXPECT]
    ARG     = [dtype, base shape, base values (row-major), [[view, args...], ...]]
            | {"int": v} | {"float": v} | {"bool": v}        (a Python scalar)
    EXPECT  = {"outputs": [[dtype, shape, strides, values (row-major)], ...]}
            | {"dtype": name}                               (promote_types, result_type)
            | {"error": first line of torch's message}

Non-finite floats are the strings "nan", "inf" and "-inf"; float32 results have 9 significant
digits (which identify a float32), float64 results all of Python's repr.

Run it where torch can be installed (`pip install torch`; CPU is enough), from anywhere:

    python3 crates/aten/tests/torch/battery.py            # rewrites battery.json beside it
    python3 crates/aten/tests/torch/battery.py --check    # exits 1 if the file would change

The cases are drawn from a seeded generator, so the same torch version writes the same file.
Documented differences (Half/BFloat16 arithmetic, integer matmul, float -> int conversions out
of range, K-dimensional cross_entropy) are left out; aten's own tests state them.
"""

import argparse
import json
import math
import pathlib
import random
import sys

import torch

SEED = 19
HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE / "battery.json"

DT = {
    "bool": torch.bool,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
}
NAME = {v: k for k, v in DT.items()}
INTS = ["uint8", "int8", "int16", "int32", "int64"]
FLOATS = ["float32", "float64"]

rng = random.Random(SEED)


def enc(v):
    """A value as JSON: non-finite floats as strings."""
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
    return v


def values(dtype, n, kind="any"):
    """n values that every dtype holds exactly (floats are multiples of 1/8 or 1/4)."""
    out = []
    for _ in range(n):
        if dtype == "bool":
            out.append(rng.random() < 0.5)
        elif dtype in INTS:
            lo = 0 if dtype == "uint8" else -9
            if kind == "nonzero":
                v = 0
                while v == 0:
                    v = rng.randint(1 if dtype == "uint8" else -5, 5)
            elif kind == "small":
                v = rng.randint(0 if dtype == "uint8" else -3, 3)
            elif kind == "exponent":
                v = rng.randint(0, 3)
            else:
                v = rng.randint(lo, 9)
            out.append(v)
        else:
            if kind == "positive":
                out.append(rng.randint(1, 32) / 8)
            elif kind == "nonzero":
                v = 0
                while v == 0:
                    v = rng.randint(-24, 24)
                out.append(v / 8)
            elif kind == "exponent":
                out.append(rng.randint(-8, 8) / 4)
            elif dtype in ("float16", "bfloat16"):
                out.append(rng.randint(-16, 16) / 4)
            else:
                out.append(rng.randint(-32, 32) / 8)
    return out


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def layout(dtype, shape, style, kind="any"):
    """An input spec of logical `shape` in one of the layout styles."""
    nd = len(shape)
    if style == "contig" or nd == 0:
        base, view = list(shape), []
    elif style == "t":
        base = list(reversed(shape))
        view = [["permute", list(reversed(range(nd)))]]
    elif style == "perm" and nd == 3:
        perm = [2, 0, 1]
        base = [0, 0, 0]
        for i, p in enumerate(perm):
            base[p] = shape[i]
        view = [["permute", perm]]
    elif style == "slice":
        base = list(shape[:-1]) + [2 * shape[-1]]
        view = [["slice", nd - 1, 0, None, 2]]
    elif style == "narrow":
        base = [shape[0] + 2] + list(shape[1:])
        view = [["narrow", 0, 1, shape[0]]]
    elif style == "expand" and shape[0] > 1:
        base = [1] + list(shape[1:])
        view = [["expand", list(shape)]]
    elif style == "tslice" and nd >= 2:
        # A transpose with a gap: not dense, dims in reverse order.
        rev = list(reversed(shape))
        base = [2 * rev[0]] + rev[1:]
        view = [["slice", 0, 0, None, 2], ["permute", list(reversed(range(nd)))]]
    else:
        base, view = list(shape), []
    data = values(dtype, numel(base), kind)
    return {"dtype": dtype, "shape": base, "data": [enc(v) for v in data], "view": view}


def dec(v):
    """A JSON value back as a Python number."""
    return float(v) if isinstance(v, str) else v


def build(spec):
    """The torch tensor an input spec describes."""
    data = [dec(v) for v in spec["data"]]
    if spec["dtype"] == "bool":
        t = torch.tensor(data, dtype=torch.bool)
    else:
        t = torch.tensor(data, dtype=torch.float64).to(DT[spec["dtype"]])
    t = t.reshape(spec["shape"])
    for v in spec["view"]:
        name, args = v[0], v[1:]
        if name == "permute":
            t = t.permute(*args[0])
        elif name == "slice":
            dim, start, end, step = args
            idx = [slice(None)] * t.dim()
            idx[dim] = slice(start, end, step)
            t = t[tuple(idx)]
        elif name == "narrow":
            t = t.narrow(*args)
        elif name == "expand":
            t = t.expand(*args[0])
        elif name == "as_strided":
            t = t.as_strided(args[0], args[1], args[2])
        elif name == "select":
            t = t.select(*args)
        elif name == "unsqueeze":
            t = t.unsqueeze(args[0])
        else:
            raise ValueError(name)
    return t


def scalar_value(s):
    if "int" in s:
        return s["int"]
    if "float" in s:
        return float(dec(s["float"]))
    return s["bool"]


def arg_value(a):
    return scalar_value(a["scalar"]) if "scalar" in a else build(a)


def pack_arg(a):
    if "scalar" in a:
        return a["scalar"]
    return [a["dtype"], a["shape"], a["data"], a["view"]]


def pack(c):
    """A case in the file's positional form (see the module docs)."""
    e = c["expect"]
    if "values" in e:
        e = {"outputs": [e]}
    if "outputs" in e:
        e = {"outputs": [[o["dtype"], o["shape"], o["strides"], o["values"]] for o in e["outputs"]]}
    return [c["op"], [pack_arg(a) for a in c["args"]], c.get("kwargs", {}), e]


def describe(t):
    flat = t.detach().reshape(-1)
    if t.dtype in (torch.float16, torch.bfloat16):
        flat = flat.double()
    vals = flat.tolist()
    if t.dtype == torch.float32:
        # Nine significant digits identify a float32 exactly.
        vals = [float(f"{v:.9g}") for v in vals]
    return {
        "dtype": NAME[t.dtype],
        "shape": list(t.shape),
        "strides": list(t.stride()),
        "values": [enc(v) for v in vals],
    }


def run(case):
    """torch's answer to a case."""
    op, args, kw = case["op"], case["args"], case.get("kwargs", {})
    try:
        if op == "promote_types":
            return {"dtype": NAME[torch.promote_types(DT[kw["a"]], DT[kw["b"]])]}
        vals = [arg_value(a) for a in args]
        if op == "result_type":
            return {"dtype": NAME[torch.result_type(vals[0], vals[1])]}
        x = vals[0]
        if op in ("add", "sub", "mul", "pow", "floor_divide"):
            r = getattr(torch, op)(x, vals[1])
        elif op == "div":
            r = torch.div(x, vals[1], rounding_mode=kw.get("rounding_mode"))
        elif op == "threshold_backward":
            r = torch.ops.aten.threshold_backward(x, vals[1], kw["threshold"])
        elif op in ("add_", "sub_", "mul_", "div_"):
            getattr(x, op)(vals[1])
            r = x
        elif op == "relu_":
            x.relu_()
            r = x
        elif op in ("neg", "exp", "log", "sqrt", "relu", "sigmoid", "tanh"):
            r = getattr(torch, op)(x)
        elif op == "gelu":
            r = torch.nn.functional.gelu(x)
        elif op == "to":
            r = x.to(DT[kw["dtype"]])
        elif op == "clone":
            r = x.clone()
        elif op == "contiguous":
            r = x.contiguous()
        elif op in ("sum", "mean", "amax"):
            # An empty dims list reduces every dimension (cases have keepdim=False then).
            dims = kw["dims"]
            f = getattr(torch, op)
            r = f(x, dims, keepdim=kw["keepdim"]) if dims else f(x)
        elif op == "max":
            r = x.max()
        elif op == "max_dim":
            v, i = x.max(kw["dim"], keepdim=kw["keepdim"])
            return {"outputs": [describe(v), describe(i)]}
        elif op in ("softmax", "log_softmax"):
            r = getattr(torch, op)(x, kw["dim"])
        elif op == "cross_entropy":
            r = torch.nn.functional.cross_entropy(x, vals[1], reduction=kw["reduction"])
        elif op == "nll_loss":
            r = torch.nn.functional.nll_loss(x, vals[1], reduction=kw["reduction"])
        elif op in ("mm", "bmm", "matmul"):
            r = getattr(torch, op)(x, vals[1])
        else:
            raise ValueError(op)
        return describe(r)
    except (RuntimeError, NotImplementedError, IndexError, ValueError, TypeError) as e:
        if isinstance(e, ValueError) and str(e) == op:
            raise
        return {"error": str(e).split("\n")[0]}


cases = []


def case(op, args, kwargs=None, tag=""):
    c = {"op": op, "args": args}
    if kwargs:
        c["kwargs"] = kwargs
    if tag:
        c["tag"] = tag
    cases.append(c)


def scalar(v):
    if isinstance(v, bool):
        return {"scalar": {"bool": v}}
    if isinstance(v, int):
        return {"scalar": {"int": v}}
    return {"scalar": {"float": enc(v)}}


STYLES2 = ["contig", "t", "slice", "narrow", "expand", "tslice"]


def shape_for(style):
    if style == "perm":
        return [2, 3, 2]
    return [2, rng.choice([2, 3])]


# --- type promotion tables ------------------------------------------------------------------
for a in DT:
    for b in DT:
        case("promote_types", [], {"a": a, "b": b})

for ta in ["bool", "uint8", "int32", "int64", "float16", "float32", "float64"]:
    for tb in ["bool", "uint8", "int8", "int64", "float32", "float64", "bfloat16"]:
        for kind in ["dim", "zero_dim", "scalar"]:
            a = layout(ta, [2], "contig")
            if kind == "dim":
                b = layout(tb, [2], "contig")
            elif kind == "zero_dim":
                b = layout(tb, [], "contig")
            else:
                b = scalar({"bool": True, "uint8": 3, "int8": -2, "int64": 7, "float32": 2.5,
                            "float64": -0.5, "bfloat16": 1.5}[tb])
            case("result_type", [a, b], tag=kind)
for ta in ["bool", "int32", "float32", "float64"]:
    for tb in ["bool", "int64", "float64"]:
        case("result_type", [layout(ta, [], "contig"), scalar({"bool": False, "int64": 4,
                                                               "float64": 0.25}[tb])], tag="zero_dim+scalar")

# --- binary tensor-tensor --------------------------------------------------------------------
PAIRS = [("float32", "float32"), ("float64", "float64"), ("float32", "float64"),
         ("int64", "int64"), ("int32", "int64"), ("uint8", "int8"), ("bool", "bool"),
         ("bool", "int64"), ("int64", "float32"), ("int16", "uint8"), ("float64", "int32"),
         ("uint8", "uint8"), ("int8", "int8")]
BINARY = [("add", {}), ("sub", {}), ("mul", {}), ("div", {}),
          ("div", {"rounding_mode": "trunc"}), ("div", {"rounding_mode": "floor"}),
          ("floor_divide", {}), ("pow", {}), ("threshold_backward", {"threshold": 0.5})]
for op, kw in BINARY:
    rhs_kind = "nonzero" if op in ("div", "floor_divide") else ("exponent" if op == "pow" else "any")
    lhs_kind = "small" if op == "pow" else "any"
    for ta, tb in PAIRS:
        sa, sb = rng.choice(STYLES2), rng.choice(STYLES2)
        shape = shape_for(sa)
        case(op, [layout(ta, shape, sa, lhs_kind), layout(tb, shape, sb, rhs_kind)], kw)
        # Broadcasting: a row, a column or a zero-dim tensor against a 2-d operand.
        a = layout(ta, [2, 3], rng.choice(STYLES2), lhs_kind)
        other = rng.choice([([3], "slice"), ([2, 1], "contig"), ([], "contig")])
        b = layout(tb, other[0], other[1], rhs_kind)
        if rng.random() < 0.5 and op not in ("div", "floor_divide", "pow"):
            case(op, [b, a], kw, "broadcast")
        else:
            case(op, [a, b], kw, "broadcast")
    # Zero divisors: an error for integer rounding divisions, inf or NaN for true division.
    if op in ("div", "floor_divide"):
        zeros = {"dtype": "int64", "shape": [3], "data": [1, 0, -2], "view": []}
        case(op, [layout("int64", [3], "contig"), zeros], kw, "zero")

# Three-dimensional and permuted operands, and mixed layouts TensorIterator orders by stride.
for op in ["add", "mul"]:
    for sa, sb in [("perm", "perm"), ("perm", "contig"), ("contig", "perm"), ("t", "t"),
                   ("t", "slice"), ("slice", "t"), ("expand", "t"), ("tslice", "contig")]:
        shape = [2, 3, 2]
        case(op, [layout("float32", shape, sa), layout("float32", shape, sb)], tag="layout3d")
for sizes, strides in [([2, 3, 1, 2], [6, 1, 999, 3]), ([2, 3, 2, 1], [6, 1, 3, 77]),
                       ([1, 3, 2, 2], [1, 1, 6, 3]), ([3, 1], [1, 0]), ([2, 2, 1], [2, 1, 4]),
                       ([3, 1], [2, 1]), ([1, 2], [1, 3]), ([2, 3, 4], [1, 1, 1]), ([3, 2], [0, 3])]:
    span = 1 + sum((s - 1) * st for s, st in zip(sizes, strides))
    base = {"dtype": "float32", "shape": [span], "data": values("float32", span), "view":
            [["as_strided", sizes, strides, 0]]}
    case("exp", [base], tag="as_strided")
    case("add", [base, base], tag="as_strided")
    case("add", [base, scalar(1)], tag="as_strided")
    case("pow", [base, scalar(2)], tag="as_strided")
    case("clone", [base], tag="as_strided")
    case("to", [base], {"dtype": "float64"}, tag="as_strided")
# Empty tensors.
for sizes, perm in [([0, 3], [1, 0]), ([3, 0, 2], [2, 0, 1])]:
    empty = {"dtype": "float32", "shape": sizes, "data": [], "view": [["permute", perm]]}
    case("exp", [empty], tag="empty")
    case("add", [empty, scalar(1.0)], tag="empty")
    case("clone", [empty], tag="empty")

# --- binary tensor-scalar --------------------------------------------------------------------
SCALARS = [2, -3, 2.5, -0.5, True, 0, 1]
for op, kw in BINARY[:-1]:
    for dtype in ["float32", "float64", "int64", "int32", "uint8", "bool", "int8"]:
        for s in rng.sample(SCALARS, 4):
            if s == 0 and op not in ("div", "floor_divide", "pow"):
                continue
            shape = shape_for("contig")
            style = rng.choice(STYLES2)
            a = layout(dtype, shape, style, "small" if op == "pow" else "any")
            case(op, [a, scalar(s)], kw, "scalar")

# --- in place --------------------------------------------------------------------------------
for op in ["add_", "sub_", "mul_", "div_"]:
    for ta, tb in [("float32", "float32"), ("float32", "float64"), ("float64", "float32"),
                   ("int64", "int64"), ("int64", "float32"), ("int32", "int64"),
                   ("bool", "bool"), ("bool", "int64"), ("float32", "int64")]:
        style = rng.choice(["contig", "t", "slice", "narrow", "tslice"])
        shape = shape_for(style)
        kind = "nonzero" if op == "div_" else "any"
        case(op, [layout(ta, shape, style), layout(tb, [shape[-1]], "contig", kind)], tag="in_place")
    for s in [2, 2.5, True]:
        for dtype in ["float32", "int64", "bool"]:
            case(op, [layout(dtype, [2, 3], rng.choice(["contig", "t"])), scalar(s)], tag="in_place_scalar")
for dtype in ["float32", "float64", "int32", "bool"]:
    case("relu_", [layout(dtype, [2, 3], rng.choice(["contig", "t", "slice"]))], tag="in_place")
case("add_", [layout("float32", [2, 3], "expand"), layout("float32", [3], "contig")], tag="overlap")

# --- unary -----------------------------------------------------------------------------------
for op in ["neg", "exp", "log", "sqrt", "relu", "sigmoid", "tanh", "gelu"]:
    for dtype in ["float32", "float64", "int64", "int32", "uint8", "bool", "int8"]:
        for style in rng.sample(["contig", "t", "slice", "narrow", "expand", "tslice", "perm"], 2):
            kind = "positive" if op in ("log", "sqrt") and dtype in FLOATS and rng.random() < 0.7 else "any"
            case(op, [layout(dtype, shape_for(style), style, kind)])
for op in ["relu", "exp", "sigmoid", "tanh", "neg"]:
    case(op, [{"dtype": "float32", "shape": [4], "data": ["nan", "inf", "-inf", -0.0], "view": []}], tag="special")

# --- conversions -----------------------------------------------------------------------------
CONV = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
        "float64"]
for src in CONV:
    for dst in CONV:
        style = rng.choice(["contig", "t", "slice", "tslice"])
        shape = rng.choice([shape_for(style), [2, 3], [3]])
        case("to", [layout(src, shape, style)], {"dtype": dst})
# Defined out-of-range conversions: float -> uint8 goes through int64; integers wrap.
for src in ["float32", "float64", "float16"]:
    case("to", [{"dtype": src, "shape": [6], "data": [-1.0, -1.5, -200.0, 256.0, 300.75, 255.5], "view": []}],
         {"dtype": "uint8"}, "uint8_wrap")
for dst in ["uint8", "int8", "int16"]:
    case("to", [{"dtype": "int64", "shape": [4], "data": [300, -1, 70000, -129], "view": []}],
         {"dtype": dst}, "int_wrap")
for style in ["contig", "t", "slice", "narrow", "expand", "tslice", "perm"]:
    for dtype in ["float32", "int64"]:
        t = layout(dtype, shape_for(style), style)
        case("clone", [t])
        case("contiguous", [t])

# --- reductions ------------------------------------------------------------------------------
for dtype in ["float32", "float64", "int32", "uint8", "bool", "int64"]:
    for dims, keep in [([], False), ([0], False), ([1], True), ([-1], False), ([1, 0], True)]:
        style = rng.choice(["contig", "t", "slice", "expand", "tslice"])
        t = layout(dtype, shape_for(style), style)
        case("sum", [t], {"dims": dims, "keepdim": keep})
        case("mean", [t], {"dims": dims, "keepdim": keep})
        if dtype != "bool":
            case("amax", [t], {"dims": dims, "keepdim": keep})
    for dim, keep in [(0, False), (1, True), (-1, False)]:
        style = rng.choice(["contig", "t", "slice"])
        if dtype != "bool":
            case("max_dim", [layout(dtype, shape_for(style), style)], {"dim": dim, "keepdim": keep})
    if dtype != "bool":
        case("max", [layout(dtype, shape_for("t"), "t")])
case("max", [{"dtype": "float32", "shape": [0], "data": [], "view": []}], tag="empty")
case("max_dim", [{"dtype": "float32", "shape": [0, 2], "data": [], "view": []}], {"dim": 0, "keepdim": False}, "empty")
case("amax", [{"dtype": "float32", "shape": [0, 2], "data": [], "view": []}], {"dims": [0], "keepdim": False}, "empty")
case("sum", [{"dtype": "float32", "shape": [0, 2], "data": [], "view": []}], {"dims": [0], "keepdim": False}, "empty")
case("max", [{"dtype": "float32", "shape": [3], "data": [1.0, "nan", 5.0], "view": []}], tag="nan")
case("max_dim", [{"dtype": "float32", "shape": [3], "data": [1.0, "nan", 5.0], "view": []}], {"dim": 0, "keepdim": False}, "nan")

# --- softmax and losses ----------------------------------------------------------------------
for op in ["softmax", "log_softmax"]:
    for dtype in FLOATS:
        for dim in [0, 1, -1]:
            style = rng.choice(["contig", "t", "slice", "tslice"])
            case(op, [layout(dtype, shape_for(style), style)], {"dim": dim})
    for row in [["inf", 0.0], ["-inf", 0.0], ["-inf", "-inf"], ["nan", 1.0], ["inf", "inf"], [1000.0, 0.0]]:
        case(op, [{"dtype": "float32", "shape": [2], "data": row, "view": []}], {"dim": 0}, "special")
    case(op, [layout("int64", [2, 3], "contig")], {"dim": 1}, "int")
for op in ["cross_entropy", "nll_loss"]:
    for dtype in FLOATS:
        for reduction in ["none", "mean", "sum"]:
            style = rng.choice(["contig", "t", "slice"])
            x = layout(dtype, [3, 4], style)
            target = {"dtype": "int64", "shape": [3], "data": [rng.randint(0, 3) for _ in range(3)], "view": []}
            case(op, [x, target], {"reduction": reduction})
            ignored = {"dtype": "int64", "shape": [3], "data": [1, -100, 2], "view": []}
            case(op, [x, ignored], {"reduction": reduction}, "ignore_index")
        case(op, [layout(dtype, [4], "contig"), {"dtype": "int64", "shape": [], "data": [2], "view": []}],
             {"reduction": "mean"}, "one_sample")
    for row, t in [(["inf", 0.0], 1), (["inf", 0.0], 0), (["-inf", 0.0], 1), (["-inf", 0.0], 0)]:
        case(op, [{"dtype": "float32", "shape": [1, 2], "data": row, "view": []},
                  {"dtype": "int64", "shape": [1], "data": [t], "view": []}], {"reduction": "none"}, "special")
    case(op, [layout("float32", [2, 3], "contig"), {"dtype": "int64", "shape": [2], "data": [7, 0], "view": []}],
         {"reduction": "mean"}, "error")
    case(op, [layout("float32", [2, 3], "contig"), {"dtype": "int64", "shape": [2], "data": [-100, -100], "view": []}],
         {"reduction": "mean"}, "all_ignored")

# --- matrix products -------------------------------------------------------------------------
for dtype in FLOATS:
    for sa, sb in [("contig", "contig"), ("t", "contig"), ("contig", "t"), ("t", "t"), ("slice", "narrow"),
                   ("expand", "tslice")]:
        case("mm", [layout(dtype, [3, 4], sa), layout(dtype, [4, 2], sb)])
        case("matmul", [layout(dtype, [3, 4], sa), layout(dtype, [4, 2], sb)])
    case("bmm", [layout(dtype, [2, 3, 4], "perm"), layout(dtype, [2, 4, 2], "contig")])
    for sa, sb in [([4], [4]), ([3, 4], [4]), ([4], [4, 2]), ([2, 3, 4], [4, 2]), ([2, 1, 3, 4], [2, 4, 5]),
                   ([4], [2, 4, 3])]:
        case("matmul", [layout(dtype, sa, "contig"), layout(dtype, sb, "contig")], tag="shapes")
case("mm", [layout("float32", [2, 3], "contig"), layout("float64", [3, 2], "contig")], tag="error")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if battery.json would change")
    args = parser.parse_args()
    for c in cases:
        c["expect"] = run(c)
    lines = ",\n".join(json.dumps(pack(c), separators=(",", ":")) for c in cases)
    text = ('{"torch":%s,"generator":"crates/aten/tests/torch/battery.py","cases":[\n%s\n]}\n'
            % (json.dumps(torch.__version__.split("+")[0]), lines))
    if args.check:
        same = OUT.exists() and OUT.read_text() == text
        print(f"{OUT.name}: {'up to date' if same else 'would change'} ({len(cases)} cases)")
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(cases)} cases, {len(text)} bytes, torch {torch.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
