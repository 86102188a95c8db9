#!/usr/bin/env python3
"""compare_loss_curves.py: a GPU curve within the bound the two CPU runs give passes, one beyond
it fails, a log without its losses fails with a message naming it. Exit 0 when all hold."""
import json
import os
import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent


def write(path, losses, test):
    with open(path, "w") as f:
        f.write("not JSON: the start-up block\n")
        for i, loss in enumerate(losses):
            f.write(json.dumps({"step": 10 * (i + 1), "loss": loss, "acc": 0.5}) + "\n")
        if test is not None:
            f.write(json.dumps({"event": "summary", "test_loss": test}) + "\n")


def run(*logs):
    p = subprocess.run([sys.executable, str(HERE / "compare_loss_curves.py"), "--json", *logs],
                       capture_output=True, text=True)
    return p.returncode, p.stdout


def main():
    cpu = [2.3, 1.9, 1.6, 1.2, 0.9, 0.8, 0.6, 0.5, 0.5, 0.5]
    cpu2 = [v + d for v, d in zip(cpu, [0.004, 0.017, 0.05, 0.02, 0.007, 0.05, 0.01, 0.009, 0.017, 0.005])]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        a, b, g = (os.path.join(tmp, n) for n in ("cpu.log", "cpu2.log", "gpu.log"))
        write(a, cpu, 0.438)
        write(b, cpu2, 0.435)
        # Twice the CPU runs' spread, the other way: within 3x + floor.
        write(g, [v - 2 * (w - v) for v, w in zip(cpu, cpu2)], 0.444)
        rc, out = run(g, a, b)
        verdict = json.loads(out.strip().splitlines()[-1])
        if rc != 0 or not verdict["passed"]:
            failures.append(f"a GPU curve twice the CPU spread away failed: {out}")
        if abs(verdict["mean_cpu"] - 0.0189) > 1e-4 or abs(verdict["mean_bound"] - (3 * 0.0189 + 0.01)) > 1e-3:
            failures.append(f"the bound is not 3 x the CPU runs' mean difference + 0.01: {verdict}")
        # Five times the spread: beyond the bound.
        write(g, [v + 5 * (w - v) for v, w in zip(cpu, cpu2)], 0.44)
        rc, out = run(g, a, b)
        if rc != 1 or "FAILED" not in out:
            failures.append(f"a GPU curve five times the CPU spread away passed: {out}")
        # Close curves but a test loss far off.
        write(g, cpu, 0.60)
        rc, out = run(g, a, b)
        if rc != 1:
            failures.append(f"a test loss 0.16 away passed: {out}")
        # A log without its final test loss.
        write(g, cpu, None)
        rc, out = run(g, a, b)
        if rc != 1 or "lacks" not in out or "gpu.log" not in out:
            failures.append(f"a log without its test loss was not named: {out}")
    for f in failures:
        print("FAILED:", f)
    print(f"{4 - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
