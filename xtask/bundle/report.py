"""Sums up a GPU bundle run: $OUT/gpu-report.md and $OUT/gpu-report.json.

    python3 report.py OUT_DIR BUNDLE_DIR

Reads what run.sh left in OUT_DIR: steps.tsv (step, status, seconds, exit), each step's log,
gpu-bench.json and train-compare.json. For test binaries it counts libtest's results and names
the failed tests; for the bench it copies its table; for the training loop, the losses and peaks.
"""

import json
import os
import re
import sys


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return None


def load_json(path):
    text = read(path)
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def test_figures(log):
    passed = failed = ignored = 0
    for m in re.finditer(r"test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored", log):
        passed += int(m.group(1))
        failed += int(m.group(2))
        ignored += int(m.group(3))
    failures = re.findall(r"^test (\S+) \.\.\. FAILED", log, re.M)
    panics = re.findall(r"^thread '([^']+)' panicked at (.+)$", log, re.M)
    return {
        "passed": passed,
        "failed": failed,
        "ignored": ignored,
        "failed_tests": failures,
        "panics": [f"{t}: {where}" for t, where in panics][:20],
    }


def tail(log, lines=25):
    return "\n".join((log or "").rstrip().splitlines()[-lines:])


def main(out, bundle):
    steps = []
    for line in (read(os.path.join(out, "steps.tsv")) or "").splitlines():
        parts = line.split("\t")
        if len(parts) != 4:
            continue
        name, status, seconds, code = parts
        try:
            seconds = float(seconds)
        except ValueError:
            seconds = None
        log = read(os.path.join(out, f"{name}.log")) or ""
        entry = {"step": name, "status": status, "seconds": seconds, "exit": code, "figures": {}}
        if name.startswith("test-"):
            entry["figures"] = test_figures(log)
        elif name == "probe":
            entry["figures"] = {"output": log.strip()}
        elif name == "gpu-bench":
            entry["figures"] = load_json(os.path.join(out, "gpu-bench.json")) or {}
        elif name == "torch-train-compare":
            entry["figures"] = load_json(os.path.join(out, "train-compare.json")) or {}
        elif name == "torch-pluggable":
            entry["figures"] = {"output": tail(log, 3)}
        if status != "passed":
            entry["log_tail"] = tail(log)
        steps.append(entry)

    manifest = load_json(os.path.join(bundle, "manifest.json"))
    environment = read(os.path.join(out, "environment.log"))
    report = {
        "ok": bool(steps) and all(s["status"] == "passed" for s in steps),
        "steps": steps,
        "manifest": manifest,
        "environment": environment,
    }
    with open(os.path.join(out, "gpu-report.json"), "w") as f:
        json.dump(report, f, indent=2)

    md = ["# GPU bundle report", ""]
    if manifest:
        md.append(f"Bundle: commit {manifest.get('commit', '?')}, built {manifest.get('built', '?')}.")
    md += ["", "```", (environment or "").strip(), "```", ""]
    md += ["| step | status | seconds | figures |", "|---|---|---:|---|"]
    for s in steps:
        fig = s["figures"]
        if s["step"].startswith("test-"):
            text = f"{fig['passed']} passed, {fig['failed']} failed, {fig['ignored']} ignored"
            if fig["failed_tests"]:
                text += ": " + ", ".join(fig["failed_tests"])
        elif s["step"] == "torch-train-compare" and fig:
            mib = 1 << 20
            text = (
                ("losses bitwise equal" if fig.get("bitwise_equal_losses") else
                 f"max relative loss difference {fig.get('max_relative_loss_difference')}")
                + f"; peak allocated native {fig['peak_allocated_native'] / mib:.1f} MiB vs ours "
                f"{fig['peak_allocated_tensormem'] / mib:.1f} MiB; peak reserved native "
                f"{fig['peak_reserved_native'] / mib:.1f} MiB vs ours "
                f"{fig['peak_reserved_tensormem'] / mib:.1f} MiB"
            )
        elif s["step"] == "probe":
            text = fig.get("output", "").replace("\n", "; ")
        elif s["step"] == "gpu-bench":
            text = "table below" if fig else "no result"
        else:
            text = fig.get("output", "").replace("\n", "; ") if isinstance(fig, dict) else ""
        secs = "-" if s["seconds"] is None else f"{s['seconds']:.1f}"
        md.append(f"| {s['step']} | {s['status']} | {secs} | {text} |")
    bench_log = read(os.path.join(out, "gpu-bench.log"))
    if bench_log:
        table = [l for l in bench_log.splitlines() if l.startswith("|") or "expandable_segments" in l]
        if table:
            md += ["", "## GPU bench (ns per alloc+free pair, cold / warm; peak device memory)", ""] + table
    for s in steps:
        if s["status"] != "passed" and s.get("log_tail"):
            md += ["", f"## {s['step']}: {s['status']} (last lines)", "", "```", s["log_tail"], "```"]
    md.append("")
    md.append("Overall: " + ("all steps passed" if report["ok"] else "SOME STEPS DID NOT PASS"))
    with open(os.path.join(out, "gpu-report.md"), "w") as f:
        f.write("\n".join(md) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: report.py OUT_DIR BUNDLE_DIR")
    main(sys.argv[1], sys.argv[2])
