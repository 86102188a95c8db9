#!/usr/bin/env python3
"""Compares two cifar10_train --json logs (GPU towers against CPU towers) of the same run.

    compare_loss_curves.py GPU_LOG CPU_LOG [--mean_tol 0.05] [--max_tol 0.15] [--test_tol 0.10]

The training loss of the logged steps must agree within mean_tol on average and max_tol at every
logged step (absolute, in nats); the final test loss within test_tol. The two runs start from the
same parameters and data order; float rounding differs between cuDNN and the CPU kernels, and
SGD carries those differences along, so the curves agree statistically, not bit for bit.
Prints one line per logged step and a verdict; exit 0 when within tolerance, 1 otherwise.
"""
import argparse
import json
import sys


def read(path):
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gpu_log")
    ap.add_argument("cpu_log")
    ap.add_argument("--mean_tol", type=float, default=0.05)
    ap.add_argument("--max_tol", type=float, default=0.15)
    ap.add_argument("--test_tol", type=float, default=0.10)
    a = ap.parse_args()
    g, g_test = read(a.gpu_log)
    c, c_test = read(a.cpu_log)
    steps = sorted(set(g) & set(c))
    if not steps or g_test is None or c_test is None:
        print(f"FAILED: missing data (GPU {len(g)} losses, test {g_test}; CPU {len(c)}, test {c_test})")
        return 1
    diffs = []
    for s in steps:
        d = abs(g[s] - c[s])
        diffs.append(d)
        print(f"step {s:6d}  gpu {g[s]:.5f}  cpu {c[s]:.5f}  |diff| {d:.5f}")
    mean = sum(diffs) / len(diffs)
    worst = max(diffs)
    test_diff = abs(g_test - c_test)
    ok = mean <= a.mean_tol and worst <= a.max_tol and test_diff <= a.test_tol
    print(f"{'PASSED' if ok else 'FAILED'}: {len(steps)} logged steps, mean |diff| {mean:.4f} "
          f"(tol {a.mean_tol}), max {worst:.4f} (tol {a.max_tol}); test loss gpu {g_test:.4f} "
          f"cpu {c_test:.4f} |diff| {test_diff:.4f} (tol {a.test_tol})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
