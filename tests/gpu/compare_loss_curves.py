#!/usr/bin/env python3
"""Compares a GPU training run with its CPU twin, with tolerances taken from two CPU runs.

    compare_loss_curves.py GPU_LOG CPU_LOG CPU_LOG_2 [--factor 3] [--floor 0.01] [--json]

Each LOG is a cifar10_train --json log of the same training (same data, order and initial
parameters). CPU_LOG and CPU_LOG_2 differ only in the order of their sums (one CPU tower, and two
with synchronised batch norm: the same arithmetic, split differently), so how far apart they end
up is what rounding alone does to this training once SGD has carried it along. The GPU rounds
differently again (cuDNN's algorithms, other summation orders), so its curve may differ from
CPU_LOG by that much, within a factor:

    mean over logged steps of |gpu - cpu|   <= factor * mean |cpu - cpu_2| + floor
    largest |gpu - cpu| over a window of 5 logged steps (its mean)
                                            <= factor * largest such window of |cpu - cpu_2| + floor
    |test loss gpu - cpu|                   <= factor * |test loss cpu - cpu_2| + 2 * floor

(absolute, in nats; the floor keeps the bound above zero where the two CPU runs agree to the
digits logged). Prints one line per logged step and a verdict (and with --json one JSON line);
exit 0 within the bounds, 1 otherwise or when a log lacks its losses.
"""
import argparse
import json
import sys

WINDOW = 5


def read(path):
    """({step: loss}, final test loss or None) of a cifar10_train --json log."""
    losses, test = {}, None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                o = json.loads(line)
            except ValueError:
                continue
            if "loss" in o and "step" in o:
                losses[o["step"]] = float(o["loss"])
            if o.get("event") == "summary" and "test_loss" in o:
                test = float(o["test_loss"])
    return losses, test


def windows(diffs):
    """The means of every WINDOW consecutive values (all of them, if fewer)."""
    n = min(WINDOW, len(diffs))
    return [sum(diffs[i:i + n]) / n for i in range(len(diffs) - n + 1)]


def compare(gpu, cpu, cpu2, factor, floor):
    g, g_test = gpu
    c, c_test = cpu
    c2, c2_test = cpu2
    steps = sorted(set(g) & set(c) & set(c2))
    if not steps or None in (g_test, c_test, c2_test):
        return None
    d_gpu = [abs(g[s] - c[s]) for s in steps]
    d_cpu = [abs(c2[s] - c[s]) for s in steps]
    r = {
        "steps": len(steps),
        "mean_gpu": sum(d_gpu) / len(d_gpu), "mean_cpu": sum(d_cpu) / len(d_cpu),
        "window_gpu": max(windows(d_gpu)), "window_cpu": max(windows(d_cpu)),
        "test_gpu": abs(g_test - c_test), "test_cpu": abs(c2_test - c_test),
        "factor": factor, "floor": floor,
    }
    r["mean_bound"] = factor * r["mean_cpu"] + floor
    r["window_bound"] = factor * r["window_cpu"] + floor
    r["test_bound"] = factor * r["test_cpu"] + 2 * floor
    r["passed"] = (r["mean_gpu"] <= r["mean_bound"] and r["window_gpu"] <= r["window_bound"]
                   and r["test_gpu"] <= r["test_bound"])
    r["per_step"] = [(s, g[s], c[s], c2[s]) for s in steps]
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gpu_log")
    ap.add_argument("cpu_log")
    ap.add_argument("cpu_log_2")
    ap.add_argument("--factor", type=float, default=3.0)
    ap.add_argument("--floor", type=float, default=0.01)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    logs = [read(p) for p in (a.gpu_log, a.cpu_log, a.cpu_log_2)]
    r = compare(*logs, a.factor, a.floor)
    if r is None:
        print("FAILED: a log lacks its losses or its final test loss: " +
              ", ".join(f"{p}: {len(l[0])} losses, test {l[1]}" for p, l in zip((a.gpu_log, a.cpu_log, a.cpu_log_2), logs)))
        return 1
    for s, g, c, c2 in r.pop("per_step"):
        print(f"step {s:6d}  gpu {g:.5f}  cpu {c:.5f}  cpu_2 {c2:.5f}  |gpu-cpu| {abs(g - c):.5f}  |cpu_2-cpu| {abs(c2 - c):.5f}")
    print(f"{'PASSED' if r['passed'] else 'FAILED'}: {r['steps']} logged steps; mean |gpu-cpu| {r['mean_gpu']:.4f} "
          f"(bound {r['mean_bound']:.4f} from the CPU runs' {r['mean_cpu']:.4f}), worst window "
          f"{r['window_gpu']:.4f} (bound {r['window_bound']:.4f}), test loss |gpu-cpu| {r['test_gpu']:.4f} "
          f"(bound {r['test_bound']:.4f})")
    if a.json:
        print(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in r.items()}))
    return 0 if r["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
