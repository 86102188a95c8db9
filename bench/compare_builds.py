#!/usr/bin/env python3
"""Two builds of towerflow_bench_train against each other, problem by problem: what each build's
kernel choice measured for every convolution pass and matrix product of a model, and the
training throughput, e.g. the same source built against oneDNN 2.6 and oneDNN 3.2.

Each round runs, one after the other (alternating, so that a noisy machine hurts them alike):
  * A: towerflow_bench_train --kernel_choice auto --json  (TOWERFLOW_KERNEL_CACHE=none: measured)
  * B: the same, with the other binary
for each model of --models. Per problem the figure is each candidate's median over the rounds of
the best time the choice measured (core/kernel_choice.h); images/s is the median over rounds.

    bench/compare_builds.py --a PATH --a-label oneDNN-2.6 --b build/bin/towerflow_bench_train
                            --b-label oneDNN-3.2 [--models resnet20,tfcnn] [--rounds 3]
                            [--precision fp32] [--threads 2] [--out PREFIX]

Writes PREFIX.{jsonl,md} (default bench/results/builds-<cpu>-<date>) and prints one JSON line per
run.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
from airbench94 import cpu_slug  # noqa: E402
from straggler import cpu_model  # noqa: E402


def run(binary, model, a):
    cmd = [binary, "--model", model, "--batch", str(a.batch), "--threads", str(a.threads), "--steps",
           str(a.steps), "--warmup", "1", "--precision", a.precision, "--kernel_choice", "auto", "--json"]
    env = dict(os.environ, TOWERFLOW_KERNEL_CACHE="none")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    result = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    return cmd, result


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="towerflow_bench_train of build A")
    p.add_argument("--a-label", default="A")
    p.add_argument("--b", required=True, help="towerflow_bench_train of build B")
    p.add_argument("--b-label", default="B")
    p.add_argument("--models", default="resnet20,tfcnn")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--precision", default="fp32")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    date = datetime.date.today().isoformat()
    out = a.out or os.path.join(REPO, "bench", "results", f"builds-{cpu_slug()}-{date}")
    builds = [(a.a_label, a.a), (a.b_label, a.b)]
    runs = []  # (label, model, round, result)
    commands = {}
    with open(out + ".jsonl", "w") as jl:
        for r in range(a.rounds):
            for model in a.models.split(","):
                for label, binary in builds:
                    cmd, res = run(binary, model, a)
                    commands[(label, model)] = " ".join([f"towerflow_bench_train ({label})"] + cmd[1:])
                    runs.append((label, model, r, res))
                    line = {"build": label, "model": model, "round": r, "img_per_s": res["img_per_s"],
                            "kernel_choices": res.get("kernel_choices", [])}
                    jl.write(json.dumps(line) + "\n")
                    print(json.dumps({k: line[k] for k in ("build", "model", "round", "img_per_s")}), flush=True)

    md = [f"# Two builds, problem by problem: {a.a_label} against {a.b_label}", "",
          f"{cpu_model()}, {date}; {a.rounds} alternating rounds; batch {a.batch}, {a.threads} threads, "
          f"{a.precision}. Per problem: each candidate's best time in the kernel choice's measurement "
          "(median over rounds); throughput: median images/s over the rounds.", ""]
    for model in a.models.split(","):
        md += [f"## {model}", ""]
        img = {label: statistics.median(res["img_per_s"] for l, m, _, res in runs if l == label and m == model)
               for label, _ in builds}
        md += [f"- images/s with `--kernel_choice auto`: {a.a_label} {img[a.a_label]:.1f}, {a.b_label} "
               f"{img[a.b_label]:.1f} ({img[a.b_label] / img[a.a_label]:.2f}x)", ""]
        problems = {}  # (layer, pass, problem) -> label -> candidate -> [ms]
        chosen = {}
        for label, m, _, res in runs:
            if m != model:
                continue
            for c in res.get("kernel_choices", []):
                key = (c["layer"], c["pass"], c["problem"])
                for cand, ms in c["ms"].items():
                    problems.setdefault(key, {}).setdefault(label, {}).setdefault(cand, []).append(ms)
                chosen.setdefault(key, {}).setdefault(label, []).append(c["chosen"])
        cands = sorted({c for v in problems.values() for per in v.values() for c in per})
        head = ["layer", "pass", "problem"] + [f"{lab} {c} ms" for lab, _ in builds for c in cands]
        head += [f"{a.b_label} / {a.a_label} ({c})" for c in cands if c != "towerflow"] + ["chosen"]
        md += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for key, per in problems.items():
            med = {(lab, c): statistics.median(per[lab][c]) if c in per.get(lab, {}) else None
                   for lab, _ in builds for c in cands}
            row = list(key) + [f"{med[(lab, c)]:.2f}" if med[(lab, c)] is not None else "-"
                               for lab, _ in builds for c in cands]
            for c in cands:
                if c == "towerflow":
                    continue
                x, y = med[(a.a_label, c)], med[(a.b_label, c)]
                row.append(f"{y / x:.2f}" if x and y else "-")
            row.append(", ".join(f"{lab}: {max(set(v), key=v.count)}" for lab, v in chosen[key].items()))
            md.append("| " + " | ".join(row) + " |")
        md += ["", "Commands (each under TOWERFLOW_KERNEL_CACHE=none):", ""]
        md += [f"    {commands[(lab, model)]}" for lab, _ in builds] + [""]
    with open(out + ".md", "w") as f:
        f.write("\n".join(md))
    print(f"wrote {out}.md and {out}.jsonl", file=sys.stderr)


if __name__ == "__main__":
    main()
