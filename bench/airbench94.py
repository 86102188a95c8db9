#!/usr/bin/env python3
"""airbench94 in towerflow against the PyTorch reference, on the same files and the same cores.

Each round runs, one after the other (alternating, so that a noisy machine hurts them alike):
  * cifar10_train --recipe airbench94 --seed S  (towerflow, every tower of --devices)
  * bench/peers/airbench94_torch.py --seeds S   (PyTorch, --threads threads)
with the seeds of --seeds in turn. Both are timed as airbench times itself: the whitening, every
training step and the final six-view evaluation; the plain evaluations after each epoch (the
accuracy curve) are left out. For towerflow the time is read from its JSON lines: the whitening's
milliseconds from the start-up block, each training window's images / img_per_s, the final
evaluation's eval_s.

    bench/airbench94.py --data DIR [--build build] [--peer-python build/bench-venv/bin/python]
                        [--seeds 0,1,2] [--epochs 9.9] [--only towerflow|torch] [extra cifar10_train flags after --]
    bench/airbench94.py --combine A.jsonl B.jsonl ... [--out PREFIX]   # earlier runs reported together

Writes bench/results/airbench94-<cpu>-<date>.{jsonl,md} (and .png, the accuracy against time,
with matplotlib; each run's output, with the data and scratch folders as DATA_DIR and WORK, in -<impl>-<seed>.log) and prints one JSON line per run and per epoch. --epochs below 9.9 times a
shortened run (the schedule is the recipe's over the shorter run): for a first timing only.
"""
import argparse
import datetime
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
from straggler import cpu_model  # noqa: E402  (the model name with its family and model numbers)


def cpu_slug():
    m = cpu_model().lower()
    fam = re.search(r"family (\d+), model (\d+)", m)
    name = re.sub(r"[^a-z0-9]+", "-", m.split(" (family")[0]).strip("-")
    return f"{name}-f{fam.group(1)}m{fam.group(2)}" if fam else name


def portable(cmd, a, workdir):
    """The command as the report shows it: paths inside the repository relative to it, the data
    folder as DATA_DIR and the scratch folder as WORK."""
    text = " ".join(cmd).replace(REPO + os.sep, "").replace(workdir, "WORK")
    return text.replace(a.data, "DATA_DIR")


def towerflow_run(a, seed, workdir):
    """One cifar10_train run: its time, accuracies and (time, plain accuracy) per epoch."""
    train_dir = os.path.join(workdir, f"tw-{seed}")
    cmd = [os.path.join(a.build, "bin", "cifar10_train"), "--recipe", "airbench94", "--data_dir", a.data,
           "--seed", str(seed), "--epochs", str(a.epochs), "--train_dir", train_dir, "--start_over", "delete",
           "--progress", "json", "--log_every", "1", "--tensorboard=false"] + a.extra
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit(f"airbench94: {' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    with open(f"{a.out}-towerflow-{seed}.log", "w") as f:
        f.write(p.stdout.replace(workdir, "WORK").replace(a.data, "DATA_DIR"))
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    start = next(l for l in lines if l.get("event") == "start")
    lines = [l for l in lines if "event" not in l]  # the training and evaluation records
    whiten_ms = float(re.search(r"in (\d+) ms", start.get("whitening", "in 0 ms")).group(1))
    batch = int(re.match(r"(\d+)", start["batch"]).group(1))
    train_s, last_step, curve, final = whiten_ms / 1000.0, 0, [], None
    for l in lines:
        if "img_per_s" in l and "step" in l and "loss" in l:
            train_s += (l["step"] - last_step) * batch / l["img_per_s"]
            last_step = l["step"]
        elif "test_acc" in l and "views" in l:
            final = l
        elif "test_acc" in l:
            curve.append({"epoch": l["epoch"], "step": l["step"], "time_s": train_s, "val_acc": l["test_acc"],
                          "eval_s": l["eval_s"]})
    if final is None:  # --tta 0: the last plain evaluation is the final one
        final = {"test_acc": curve[-1]["val_acc"], "eval_s": curve[-1]["eval_s"]}
    return {"impl": "towerflow", "seed": seed, "time_s": train_s + final["eval_s"], "whiten_s": whiten_ms / 1000.0,
            "tta_eval_s": final["eval_s"], "acc_tta": final["test_acc"], "acc_plain": curve[-1]["val_acc"],
            "steps": last_step, "process_wall_s": wall, "curve": curve, "command": portable(cmd, a, workdir)}


def torch_run(a, seed, workdir):
    jsonl = os.path.join(workdir, f"torch-{seed}.jsonl")
    cmd = [a.peer_python, os.path.join(REPO, "bench", "peers", "airbench94_torch.py"), "--data", a.data, "--seeds",
           str(seed), "--epochs", str(a.epochs), "--threads", str(a.threads), "--jsonl", jsonl]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit(f"airbench94: {' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    with open(f"{a.out}-torch-{seed}.log", "w") as f:
        f.write((p.stdout + p.stderr).replace(workdir, "WORK").replace(a.data, "DATA_DIR"))
    lines = [json.loads(l) for l in open(jsonl)]
    run = next(l for l in lines if l.get("kind") == "run")
    curve = [{"epoch": l["epoch"], "step": l["step"], "time_s": l["time_s"], "val_acc": l["val_acc"]}
             for l in lines if l.get("kind") == "epoch"]
    return {"impl": "torch", "seed": seed, "time_s": run["time_s"], "whiten_s": run["whiten_s"],
            "tta_eval_s": run["tta_eval_s"], "acc_tta": run["acc_tta"], "acc_plain": run["acc_plain"],
            "steps": run["steps"], "torch": run.get("torch"), "process_wall_s": wall, "curve": curve,
            "command": portable(cmd, a, workdir)}


def plot(runs, path, machine):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in runs:
        xs = [c["time_s"] / 60 for c in r["curve"]] + [r["time_s"] / 60]
        ys = [100 * c["val_acc"] for c in r["curve"]] + [100 * r["acc_tta"]]
        ax.plot(xs, ys, marker="o", color="tab:blue" if r["impl"] == "towerflow" else "tab:orange",
                label=f"{r['impl']} seed {r['seed']}")
    ax.set_xlabel("minutes (whitening, training steps, final six-view evaluation)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"airbench94 on the JPEG copy of CIFAR-10, {machine}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="CIFAR-10 binary folder (both programs read it)")
    ap.add_argument("--combine", nargs="+", metavar="JSONL",
                    help="run nothing: report the runs of earlier reports' .jsonl files together "
                         "(the table, the mean time and accuracy of each program, and the plot)")
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--peer-python", default=os.path.join(REPO, "build", "bench-venv", "bin", "python"))
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--epochs", type=float, default=9.9)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--only", choices=["towerflow", "torch"])
    ap.add_argument("--out", default=None, help="results prefix (default bench/results/airbench94-<cpu>-<date>)")
    ap.add_argument("extra", nargs="*", help="flags for cifar10_train, after --")
    a = ap.parse_args()
    if not a.combine and not a.data:
        ap.error("--data DIR is required (the CIFAR-10 binary folder), unless --combine names earlier reports")
    seeds = [int(s) for s in a.seeds.split(",")]
    a.out = out = a.out or os.path.join(REPO, "bench", "results",
                                        f"airbench94-{cpu_slug()}-{datetime.date.today().isoformat()}")
    runs = []
    if a.combine:
        for path in a.combine:
            with open(path) as f:
                runs += [json.loads(line) for line in f if line.strip()]
        a.epochs = runs[0]["epochs"] if runs else a.epochs
        a.seeds = ",".join(str(r["seed"]) for r in runs)
    with tempfile.TemporaryDirectory(prefix="airbench94-") as workdir:
        for seed in [] if a.combine else seeds:
            for impl in ("towerflow", "torch"):
                if a.only and impl != a.only:
                    continue
                r = (towerflow_run if impl == "towerflow" else torch_run)(a, seed, workdir)
                r.update(cpu=cpu_model(), epochs=a.epochs, date=datetime.date.today().isoformat())
                runs.append(r)
                print(json.dumps({k: v for k, v in r.items() if k != "curve"}), flush=True)
    with open(out + ".jsonl", "w") as f:
        for r in runs:
            f.write(json.dumps(r) + "\n")
    machine = runs[0]["cpu"] if a.combine and runs else cpu_model()
    md = [f"# airbench94 on {machine}, {datetime.date.today().isoformat()}", "",
          f"{a.epochs} epochs, seeds {a.seeds}; time as airbench times itself (whitening, training steps, "
          "final six-view evaluation). Commands:", ""]
    for r in runs[:2]:
        md.append(f"    {r['command']}")
    md += ["", "| implementation | seed | time (s) | six-view accuracy | plain accuracy | steps |", "|---|---|---|---|---|---|"]
    for r in runs:
        md.append(f"| {r['impl']} | {r['seed']} | {r['time_s']:.1f} | {100 * r['acc_tta']:.2f}% | "
                  f"{100 * r['acc_plain']:.2f}% | {r['steps']} |")
    by = {impl: [r for r in runs if r["impl"] == impl] for impl in ("towerflow", "torch")}
    if by["towerflow"] and by["torch"]:
        tw_t = statistics.mean(r["time_s"] for r in by["towerflow"])
        pt_t = statistics.mean(r["time_s"] for r in by["torch"])
        tw_a = statistics.mean(r["acc_tta"] for r in by["towerflow"])
        pt_a = statistics.mean(r["acc_tta"] for r in by["torch"])
        summary = {"run": "summary", "towerflow_time_s": tw_t, "torch_time_s": pt_t, "speedup": pt_t / tw_t,
                   "towerflow_acc": tw_a, "torch_acc": pt_a, "acc_diff_points": 100 * (tw_a - pt_a)}
        print(json.dumps(summary))
        md += ["", f"Mean time: towerflow {tw_t:.1f} s, PyTorch {pt_t:.1f} s: **{pt_t / tw_t:.2f}x**. Mean six-view "
                   f"accuracy: towerflow {100 * tw_a:.2f}%, PyTorch {100 * pt_a:.2f}% ({100 * (tw_a - pt_a):+.2f} points)."]
        # Time to 94% of the reference's final accuracy: the first point of a run's curve (the
        # plain evaluation after each epoch, then the final six-view one) at or above it.
        target = 0.94 * pt_a
        md += ["", f"Time to 94% of the reference's mean final accuracy ({100 * target:.2f}%), "
                   "at the first evaluation that reaches it:", "",
               "| implementation | seed | minutes | accuracy there |", "|---|---|---|---|"]
        for r in runs:
            points = [(c["time_s"], c["val_acc"]) for c in r["curve"]] + [(r["time_s"], r["acc_tta"])]
            hit = next(((t, acc) for t, acc in points if acc >= target), None)
            md.append(f"| {r['impl']} | {r['seed']} | " +
                      (f"{hit[0] / 60:.1f} | {100 * hit[1]:.2f}% |" if hit else "not reached | |"))
    if plot(runs, out + ".png", machine):
        md += ["", f"![accuracy against time]({os.path.basename(out)}.png)"]
    with open(out + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    print(f"wrote {out}.jsonl and {out}.md", file=sys.stderr)


if __name__ == "__main__":
    main()
