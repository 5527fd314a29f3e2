"""PyTorch on tensormem's allocator: libtensormem_alloc.so loaded as a CUDAPluggableAllocator.

Run by `cargo xtask gpu-test` on a machine with a GPU and torch (CUDA build):

    python crates/c10-cuda-capi/tests/torch_pluggable.py target/debug/libtensormem_alloc.so

Every CUDA tensor's memory then comes from tm_malloc and goes back through tm_free; the checks
read our own statistics through the C ABI (ctypes), since torch.cuda.memory_stats() does not
see a pluggable allocator. Exits non-zero on the first failed check.
"""

import ctypes
import json
import sys

import torch


def main(path):
    assert torch.cuda.is_available(), "torch sees no CUDA device"
    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "tm_malloc", "tm_free")
    torch.cuda.memory.change_current_allocator(allocator)

    lib = ctypes.CDLL(path)  # the same library, already loaded by torch: the same allocator
    lib.tm_memory_stats_json.restype = ctypes.c_ssize_t
    lib.tm_memory_stats_json.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    lib.tm_last_error.restype = ctypes.c_char_p
    lib.tm_snapshot_pickle.argtypes = [ctypes.c_char_p]
    lib.tm_record_history.argtypes = [ctypes.c_size_t, ctypes.c_int]

    def stats():
        n = lib.tm_memory_stats_json(0, None, 0)
        assert n > 0, lib.tm_last_error()
        buf = ctypes.create_string_buffer(n + 1)
        assert lib.tm_memory_stats_json(0, buf, n + 1) == n
        return json.loads(buf.value)

    assert lib.tm_record_history(10000, 3) == 0

    def allocated():
        return stats()["allocated_bytes.all.current"]

    # A tensor's bytes come from our allocator: 4000 bytes are a 4096-byte block.
    base = allocated()
    x = torch.empty(1000, dtype=torch.float32, device="cuda")
    assert allocated() == base + 4096, stats()

    # Kernels work on it, and on large blocks (matmul of 64 MiB operands).
    x.fill_(2.0)
    assert x.sum().item() == 2000.0
    a = torch.randn(4096, 4096, device="cuda")
    b = torch.eye(4096, device="cuda")
    c = a @ b
    torch.cuda.synchronize()
    assert torch.equal(c, a), "a @ I == a"
    assert stats()["reserved_bytes.large_pool.current"] >= 3 * 64 * 2**20, stats()

    # PyTorch frees through tm_free (cuBLAS may keep a workspace: count what the tensors held).
    held = allocated()
    del a, b, c
    assert allocated() == held - 3 * 64 * 2**20, stats()
    del x
    assert allocated() == held - 3 * 64 * 2**20 - 4096, stats()

    # A side stream: the allocation is made for it, and freed.
    held = allocated()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        y = torch.ones(1 << 20, device="cuda")
        assert y.sum().item() == float(1 << 20)
    torch.cuda.synchronize()
    assert allocated() == held + 4 * 2**20, stats()
    del y
    assert allocated() == held, stats()

    path_out = b"torch_pluggable_snapshot.pickle"
    assert lib.tm_snapshot_pickle(path_out) == 0, lib.tm_last_error()
    import pickle

    with open(path_out, "rb") as f:
        snapshot = pickle.load(f)
    allocs = [e for e in snapshot["device_traces"][0] if e["action"] == "alloc"]
    assert allocs and all(e["frames"] for e in allocs), "stacks recorded"
    print(f"torch_pluggable: ok ({len(allocs)} allocations through tm_malloc)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: torch_pluggable.py PATH/libtensormem_alloc.so")
    main(sys.argv[1])
