#!/usr/bin/env bash
# tensormem's GPU bundle: runs every GPU check with no cargo (written by `cargo xtask gpu-bundle`).
#
#   bash target/gpu-bundle/run.sh          # outputs to $OUT (the device tool sets it), else ./gpu-out
#
# Steps, in order, each under its own timeout and all within GPU_BUNDLE_BUDGET_S seconds (470):
#   probe (stops everything, exit 2, when there is no driver or no device), every GPU test binary
#   (--test-threads=1), the GPU bench, PyTorch on libtensormem_alloc.so (CUDAPluggableAllocator),
#   the training loop on torch's allocator and on ours. Every step's output goes to $OUT/<step>.log;
#   $OUT/gpu-report.md and $OUT/gpu-report.json sum up (step, status, seconds, figures).
# Exit status: 0 all passed, 1 some step failed or timed out, 2 no usable GPU.
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
BUDGET="${GPU_BUNDLE_BUDGET_S:-470}"
START=$(date +%s)
STEPS="$OUT/steps.tsv"
: > "$STEPS"
PYTHON="${TENSORMEM_TORCH_PYTHON:-python3}"

# Libraries the binaries load at run time: the driver (system), nvrtc (CUDA toolkit or the pip
# wheels torch depends on).
LIBDIRS=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && LIBDIRS="$LIBDIRS:$d"
done
if command -v "$PYTHON" >/dev/null 2>&1; then
  PIPLIBS="$("$PYTHON" - <<'EOF' 2>/dev/null
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
dirs = []
for r in roots:
    dirs += glob.glob(os.path.join(r, "nvidia", "*", "lib"))
    dirs += glob.glob(os.path.join(r, "torch", "lib"))
print(":".join(d for d in dirs if os.path.isdir(d)))
EOF
)"
  [ -n "$PIPLIBS" ] && LIBDIRS="$LIBDIRS:$PIPLIBS"
fi
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}$LIBDIRS"

{
  echo "bundle: $(cat "$HERE/manifest.json" 2>/dev/null | tr -d '\n' | head -c 400)"
  echo "host: $(uname -a)"
  echo "glibc: $(getconf GNU_LIBC_VERSION 2>/dev/null || echo unknown)"
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
} > "$OUT/environment.log" 2>&1

remaining() { echo $(( BUDGET - ($(date +%s) - START) )); }

# step NAME TIMEOUT_S COMMAND...: runs COMMAND in $OUT with min(TIMEOUT_S, time left), output to
# $OUT/NAME.log, one line "name<TAB>status<TAB>seconds<TAB>exit" to steps.tsv.
step() {
  local name="$1" limit="$2"
  shift 2
  local left
  left=$(remaining)
  if [ "$left" -lt 5 ]; then
    printf '%s\tskipped\t0\t-\n' "$name" >> "$STEPS"
    echo "[$name] skipped: the bundle's time budget (${BUDGET} s) is spent"
    return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "[$name] (timeout ${limit} s) $*"
  local t0 rc status
  t0=$(date +%s%N)
  (cd "$OUT" && timeout --kill-after=5 "$limit" "$@") > "$OUT/$name.log" 2>&1
  rc=$?
  local ms secs
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  secs=$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))
  case $rc in
    0) status=passed ;;
    124|137) status=timeout ;;
    *) status=failed ;;
  esac
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$secs" "$rc" >> "$STEPS"
  echo "[$name] $status (exit $rc, ${secs} s)"
  [ $rc -eq 0 ]
}

report() {
  if command -v "$PYTHON" >/dev/null 2>&1 && "$PYTHON" "$HERE/report.py" "$OUT" "$HERE"; then
    :
  elif command -v python3 >/dev/null 2>&1 && python3 "$HERE/report.py" "$OUT" "$HERE"; then
    :
  else
    { echo "# GPU bundle report (no python: steps only)"; cat "$STEPS"; } > "$OUT/gpu-report.md"
  fi
  cat "$OUT/gpu-report.md"
}

if ! step probe 30 "$HERE/bin/cuda-probe"; then
  cat "$OUT/probe.log"
  echo "gpu-bundle: NO USABLE GPU: the CUDA probe failed (above: what it looked for and found)." >&2
  echo "gpu-bundle: nothing else was run; run this bundle on a machine with an NVIDIA driver and a device." >&2
  report > /dev/null
  exit 2
fi
cat "$OUT/probe.log"

# One GPU test binary per crate (each was up to four binaries of 90 s each before issue 33).
for bin in "$HERE"/tests/*; do
  [ -x "$bin" ] || continue
  step "test-$(basename "$bin")" 240 "$bin" --test-threads=1
done

step gpu-bench 200 "$HERE/bin/gpu-bench" run "$HERE/traces" --json "$OUT/gpu-bench.json" --seconds 15

LIB="$HERE/lib/libtensormem_alloc.so"
if command -v "$PYTHON" >/dev/null 2>&1 && "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
  step torch-pluggable 90 env -u TENSORMEM_ALLOC_BACKEND "$PYTHON" "$HERE/py/torch_pluggable.py" "$LIB"
  step torch-train-native 90 "$PYTHON" "$HERE/py/torch_train.py" native "$OUT/train-native.json"
  step torch-train-tensormem 90 env -u TENSORMEM_ALLOC_BACKEND "$PYTHON" "$HERE/py/torch_train.py" tensormem "$LIB" "$OUT/train-tensormem.json"
  step torch-train-compare 20 "$PYTHON" "$HERE/py/torch_train.py" compare "$OUT/train-native.json" "$OUT/train-tensormem.json" "$OUT/train-compare.json"
else
  printf 'torch\tfailed\t0\t-\n' >> "$STEPS"
  echo "[torch] FAILED: \`$PYTHON\` has no CUDA build of torch (set TENSORMEM_TORCH_PYTHON)" | tee "$OUT/torch.log"
fi

report
if grep -qv $'\tpassed\t' "$STEPS"; then
  exit 1
fi
exit 0
