"""A small real training loop on torch's native CUDA allocator and on libtensormem_alloc.so.

Run by the GPU bundle (`cargo xtask gpu-bundle`, then `run.sh` where a GPU is lent), each mode in
its own process (an allocator can only be chosen before the first CUDA allocation):

    python torch_train.py native OUT.json
    python torch_train.py tensormem PATH/libtensormem_alloc.so OUT.json
    python torch_train.py compare NATIVE.json TENSORMEM.json [REPORT.json]

The model is a `torch.nn.TransformerEncoder` (2 layers, d_model 256, 4 heads) with a linear
head, trained for 8 AdamW steps on fixed random data (seed 0, deterministic algorithms). Each
run writes its losses and its peaks: `torch.cuda.max_memory_allocated/reserved` for the native
allocator, our `tm_memory_stats_json` (`allocated_bytes.all.peak`, `reserved_bytes.all.peak`)
for tensormem's. `compare` exits non-zero unless the losses agree (bitwise, or to 1e-6 relative
where a library picks another kernel) and prints both peaks side by side.
"""

import json
import os
import sys
import time

# Deterministic cuBLAS needs this before CUDA starts.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

STEPS = 8
BATCH, SEQ, D_MODEL, HEADS, LAYERS, CLASSES = 16, 128, 256, 4, 2, 10


def train(mode, lib=None):
    import torch

    assert torch.cuda.is_available(), "torch sees no CUDA device"
    stats = None
    if mode == "tensormem":
        allocator = torch.cuda.memory.CUDAPluggableAllocator(lib, "tm_malloc", "tm_free")
        torch.cuda.memory.change_current_allocator(allocator)
        import ctypes

        handle = ctypes.CDLL(lib)
        handle.tm_memory_stats_json.restype = ctypes.c_ssize_t
        handle.tm_memory_stats_json.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
        handle.tm_last_error.restype = ctypes.c_char_p

        def stats():
            n = handle.tm_memory_stats_json(0, None, 0)
            assert n > 0, handle.tm_last_error()
            buf = ctypes.create_string_buffer(n + 1)
            assert handle.tm_memory_stats_json(0, buf, n + 1) == n
            return json.loads(buf.value)

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    gen = torch.Generator().manual_seed(0)
    inputs = torch.randn(STEPS, BATCH, SEQ, D_MODEL, generator=gen)
    labels = torch.randint(0, CLASSES, (STEPS, BATCH), generator=gen)
    layer = torch.nn.TransformerEncoderLayer(
        D_MODEL, HEADS, dim_feedforward=4 * D_MODEL, dropout=0.0, batch_first=True
    )
    encoder = torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
    head = torch.nn.Linear(D_MODEL, CLASSES)
    model = torch.nn.ModuleDict({"encoder": encoder, "head": head}).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    losses = []
    started = time.perf_counter()
    for step in range(STEPS):
        x = inputs[step].cuda()
        y = labels[step].cuda()
        logits = model["head"](model["encoder"](x).mean(dim=1))
        loss = torch.nn.functional.cross_entropy(logits, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started

    out = {"mode": mode, "losses": losses, "seconds": seconds, "torch": torch.__version__}
    if mode == "native":
        out["peak_allocated"] = torch.cuda.max_memory_allocated()
        out["peak_reserved"] = torch.cuda.max_memory_reserved()
    else:
        s = stats()
        out["peak_allocated"] = s["allocated_bytes.all.peak"]
        out["peak_reserved"] = s["reserved_bytes.all.peak"]
        out["num_device_alloc"] = s.get("num_device_alloc")
    return out


def compare(native, ours):
    diffs = [abs(a - b) / max(abs(a), 1e-12) for a, b in zip(native["losses"], ours["losses"])]
    same_length = len(native["losses"]) == len(ours["losses"]) == STEPS
    bitwise = same_length and native["losses"] == ours["losses"]
    ok = same_length and max(diffs, default=1.0) <= 1e-6
    mib = 1 << 20
    report = {
        "ok": ok,
        "bitwise_equal_losses": bitwise,
        "max_relative_loss_difference": max(diffs, default=None),
        "losses_native": native["losses"],
        "losses_tensormem": ours["losses"],
        "peak_allocated_native": native["peak_allocated"],
        "peak_allocated_tensormem": ours["peak_allocated"],
        "peak_reserved_native": native["peak_reserved"],
        "peak_reserved_tensormem": ours["peak_reserved"],
        "seconds_native": native["seconds"],
        "seconds_tensormem": ours["seconds"],
    }
    print(f"losses: {'bitwise equal' if bitwise else 'max relative difference %.3g' % max(diffs, default=float('nan'))}")
    for step, (a, b) in enumerate(zip(native["losses"], ours["losses"])):
        print(f"  step {step}: native {a:.9f}  tensormem {b:.9f}")
    print(
        f"peak allocated: native {native['peak_allocated'] / mib:.2f} MiB, "
        f"tensormem {ours['peak_allocated'] / mib:.2f} MiB"
    )
    print(
        f"peak reserved:  native {native['peak_reserved'] / mib:.2f} MiB, "
        f"tensormem {ours['peak_reserved'] / mib:.2f} MiB"
    )
    print(f"time for {STEPS} steps: native {native['seconds']:.3f} s, tensormem {ours['seconds']:.3f} s")
    return report


def main(argv):
    if len(argv) == 3 and argv[1] == "native":
        result = train("native")
        out = argv[2]
    elif len(argv) == 4 and argv[1] == "tensormem":
        result = train("tensormem", argv[2])
        out = argv[3]
    elif len(argv) in (4, 5) and argv[1] == "compare":
        with open(argv[2]) as f:
            native = json.load(f)
        with open(argv[3]) as f:
            ours = json.load(f)
        report = compare(native, ours)
        if len(argv) == 5:
            with open(argv[4], "w") as f:
                json.dump(report, f, indent=2)
        return 0 if report["ok"] else 1
    else:
        sys.stderr.write(__doc__)
        return 2
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"{result['mode']}: losses {['%.6f' % l for l in result['losses']]}")
    print(f"{result['mode']}: peak allocated {result['peak_allocated']}, peak reserved {result['peak_reserved']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
