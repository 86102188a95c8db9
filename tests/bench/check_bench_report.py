#!/usr/bin/env python3
"""Checks a report of bench/suite.py: the JSON-lines file parses, holds the rows a run must make,
and the markdown report's tables are well formed.

    check_bench_report.py STEM [--models tfcnn,resnet20] [--devices 1,2] [--peers skipped|compared]

STEM is the path without .jsonl / .md. Exit status 0 when all is well; otherwise every problem
is printed.
"""
import argparse
import json
import re
import sys

KERNEL_OPS = ["conv_fwd", "conv_bwd_input", "conv_bwd_weight", "bn_relu_fwd", "bn_relu_bwd", "maxpool_fwd",
              "maxpool_bwd", "gemm_fwd", "gemm_bwd_input", "gemm_bwd_weight"]
REDUCTIONS = ["all_reduce", "bucketed", "parameter_device"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("stem")
    ap.add_argument("--models", default="tfcnn,resnet20")
    ap.add_argument("--devices", default="1,2")
    ap.add_argument("--peers", choices=["skipped", "compared"], default="skipped")
    a = ap.parse_args()
    problems = []

    rows = []
    with open(a.stem + ".jsonl") as f:
        for i, line in enumerate(f, 1):
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                problems.append(f"jsonl line {i}: not JSON ({e})")
                continue
            if not isinstance(r, dict) or "section" not in r or not r.get("cpu"):
                problems.append(f"jsonl line {i}: not an object with a section and a cpu: {line[:80]}")
                continue
            if r["section"] not in ("machine", "skip", "error", "gpu_machine") and not (
                    r.get("command") or r.get("skipped") or r.get("command_towerflow")):
                problems.append(f"jsonl line {i}: {r['section']} row without the command that reproduces it")
            rows.append(r)
    sec = lambda s: [r for r in rows if r["section"] == s]

    m = sec("machine")
    if len(m) != 1:
        problems.append(f"{len(m)} machine rows, want 1")
    else:
        for k in ("cpu_model", "logical_cpus", "isa_extensions", "memory_gib", "commit", "date"):
            if k not in m[0]:
                problems.append(f"machine row lacks {k}")
    for r in sec("error"):
        problems.append(f"error row: {r}")

    fp32 = [r for r in sec("peak") if r["kind"] == "fp32_fma" and (r.get("gflop_per_s") or 0) > 0]
    if not fp32:
        problems.append("no fp32 FMA peak measured")
    if not [r for r in sec("peak") if r["kind"] == "bf16_dot"]:
        problems.append("no bf16 peak row (measured, or skipped with a reason)")
    for kind in ("copy", "triad"):
        if not [r for r in sec("bandwidth") if r["kind"] == kind and r["gb_per_s"] > 0]:
            problems.append(f"no memory {kind} bandwidth")

    for model in ("resnet20", "tfcnn"):
        for op in KERNEL_OPS:
            if op.startswith("bn") and model == "tfcnn" or (op.startswith(("maxpool", "gemm")) and model == "resnet20"):
                continue
            got = [r for r in sec("kernel") if r["model"] == model and r["op"] == op]
            if not got:
                problems.append(f"no kernel row {model} {op}")
            for r in got:
                if not (r["ms"] > 0 and r.get("share_of_bound") is not None and r.get("bound") in ("compute", "memory")):
                    problems.append(f"kernel row without time, bound or share: {r}")

    for model, ops in (("resnet20", ("conv_fwd", "conv_bwd_input", "conv_bwd_weight")),
                       ("tfcnn", ("conv_fwd", "conv_bwd_input", "conv_bwd_weight", "gemm_fwd"))):
        for op in ops:
            got = [r for r in sec("kernel_bf16") if r["model"] == model and r["op"] == op]
            if not got:
                problems.append(f"no bf16 kernel row {model} {op}")
            for r in got:
                if not (r["ms"] > 0 and r.get("share_of_peak") is not None and r.get("peak") in ("bf16_dot", "bf16_amx", "fp32_fma")):
                    problems.append(f"bf16 kernel row without time, peak or share: {r}")

    for r in sec("kernel_bf16_second"):
        if not (r.get("kernels") and r["ms"] > 0 and r["gflop_per_s"] > 0):
            problems.append(f"bf16 kernel row of the second kernels without kernels or time: {r}")

    for model in a.models.split(","):
        got = [r for r in sec("compare_bf16") if r["model"] == model]
        if len(got) != 1:
            problems.append(f"{len(got)} bf16 training comparisons for {model}, want 1")
        for r in got:
            if not (r.get("fp32_img_per_s") and r.get("bf16_img_per_s") and r.get("bf16_kernels")):
                problems.append(f"bf16 comparison without fp32 and bf16 figures or the kernels: {r}")
            d = r.get("vs_fp32") or {}
            if not d or not (d["ratio_min"] <= d["ratio_median"] <= d["ratio_max"]):
                problems.append(f"bf16 comparison without a ratio to fp32 inside its spread: {r}")
            if r.get("second_kernels"):
                d = r.get("second_vs_automatic") or {}
                if not (r.get("second_img_per_s") and d and d["ratio_min"] <= d["ratio_median"] <= d["ratio_max"]):
                    problems.append(f"bf16 comparison of a second set of kernels without figures: {r}")
        bf16_runs = [r for r in sec("train") if r.get("comparison") == "bf16" and r["model"] == model]
        if {r.get("precision") for r in bf16_runs} != {"fp32", "bf16"}:
            problems.append(f"bf16 comparison of {model} lacks its fp32 or bf16 training rows")

    train = [r for r in sec("train") if not r.get("comparison")]
    for model in a.models.split(","):
        for d in (int(x) for x in a.devices.split(",")):
            for red in (["all_reduce"] if d == 1 else REDUCTIONS):
                got = [r for r in train if r["model"] == model and r["devices"] == d and r["reduction"].startswith(red)]
                if not got:
                    problems.append(f"no training row {model} devices={d} {red}")
                for r in got:
                    for k in ("img_per_s", "gflop_per_s", "fwd_macs_per_img", "share_of_fp32_peak", "check"):
                        if r.get(k) is None:
                            problems.append(f"training row {model} {d} {red} lacks {k}")
                    if r.get("check") != "ok":
                        problems.append(f"training row {model} {d} {red}: check {r.get('check')}")

    # The traced steps' memory-bound kernels, each against its bound: the figures agree with one
    # another (x bound = time over the bound's time; GB/s = bytes over time) and the kernels the
    # models must run are there.
    expected_kernels = {"tfcnn": ("max_pool_backward", "sgd_update"),
                        "resnet20": ("batch_norm_relu_backward", "batch_norm_add_relu_backward", "sgd_update")}
    for model in a.models.split(","):
        got = [r for r in sec("trace_kernel") if r["model"] == model and r["precision"] == "fp32"]
        names = {r["kernel"] for r in got}
        for k in expected_kernels.get(model, ()):
            if k not in names:
                problems.append(f"no traced kernel {k} for {model} in fp32 (got {sorted(names)})")
    for r in sec("trace_kernel"):
        if not (r["ms_per_step"] > 0 and r["bound_ms_per_step"] > 0 and r["calls_per_step"] > 0):
            problems.append(f"traced kernel row without time, bound or calls: {r}")
            continue
        if abs(r["over_bound"] - r["ms_per_step"] / r["bound_ms_per_step"]) > 1e-6 * max(1, r["over_bound"]):
            problems.append(f"traced kernel row whose x bound is not its time over its bound's: {r}")
        gbs = r["mib_per_call"] * r["calls_per_step"] * (1 << 20) / (r["ms_per_step"] * 1e6)
        if abs(gbs - r["gb_per_s"]) > 1e-6 * max(1, gbs):
            problems.append(f"traced kernel row whose GB/s is not its bytes over its time: {r}")
        if r["in_cache"] != (r["mib_per_call"] < 1):
            problems.append(f"traced kernel row in cache or not against its MiB a call: {r}")

    for s in ("allreduce", "alloc", "data"):
        if not sec(s):
            problems.append(f"no {s} rows")
    if a.peers == "skipped":
        if len([r for r in sec("skip") if r["what"].startswith("peer")]) < 2:
            problems.append("peers neither run nor reported skipped")
    else:
        for r in sec("compare"):
            if not (r["ratio_min"] <= r["ratio_median"] <= r["ratio_max"]):
                problems.append(f"compare row with the median outside its spread: {r}")
        if not sec("compare"):
            problems.append("no comparison rows")

    md = open(a.stem + ".md").read()
    if not md.startswith("# towerflow benchmarks on ") or m and m[0]["cpu_model"] not in md.splitlines()[0]:
        problems.append("report does not open with the CPU model")
    for heading in ("## towerflow against the peers", "## bf16 training", "## The machine's limits",
                    "## Training (towerflow)", "## Kernels", "## bf16 kernels", "## All-reduce", "## Allocator",
                    "## Data pipeline", "## Memory-bound kernels in a training step against their bound"):
        if heading not in md:
            problems.append(f"report lacks the section '{heading}'")
    cells = lambda line: len(re.findall(r"(?<!\\)\|", line)) - 1
    lines = md.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and (i == 0 or not lines[i - 1].startswith("|")):  # a table's header
            width = cells(line)
            j = i + 1
            if j >= len(lines) or not re.fullmatch(r"\|(---\|)+", lines[j]) or cells(lines[j]) != width:
                problems.append(f"report line {i + 1}: table header without its separator row")
            while j < len(lines) and lines[j].startswith("|"):
                if cells(lines[j]) != width:
                    problems.append(f"report line {j + 1}: {cells(lines[j])} cells, header has {width}")
                j += 1
            if j == i + 2:
                problems.append(f"report line {i + 1}: empty table")
    for r in train:
        if r["command"] not in md:
            problems.append(f"report lacks the command {r['command']}")

    for p in problems:
        print("FAIL:", p)
    print(f"{len(rows)} rows, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
