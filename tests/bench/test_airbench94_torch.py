#!/usr/bin/env python3
"""bench/peers/airbench94_torch.py end to end on a tiny random CIFAR-10 binary folder (1280 train
and 600 test images, of which --limit-train 1024 and --limit-test 512 are used): 2 epochs of batch
256 make ceil(4 * 2) = 8 steps, and the JSON lines (stdout and --jsonl) hold the expected keys,
finite times and accuracies in [0, 1]; then the ablation switches (--flip random --tta 1
--no-lookahead) for half an epoch; and, where the interpreter has Pillow, an image-folder copy
of the same images loads as the same images and labels.

    test_airbench94_torch.py AIRBENCH94_TORCH_PY [FALLBACK_PYTHON]

PyTorch comes from the interpreter TOWERFLOW_TORCH_PYTHON names, else the one running this, else
FALLBACK_PYTHON (the build's bench-venv, where scripts/bench.sh --install-peers puts it); without
it anywhere the test reports itself skipped (77)."""
import json
import math
import os
import random
import subprocess
import sys
import tempfile

EPOCH_KEYS = {"kind", "seed", "epoch", "step", "time_s", "train_loss", "train_acc", "val_acc"}
RUN_KEYS = {"kind", "seed", "device", "threads", "torch", "cpu", "epochs", "steps", "time_s", "whiten_s",
            "tta_eval_s", "acc_tta", "acc_plain", "flip", "tta", "lookahead", "load_s"}
SUMMARY_KEYS = {"kind", "runs", "acc_tta_mean", "acc_tta_std", "time_s_mean", "time_s_std"}


def torch_python(fallback):
    candidates = [os.environ.get("TOWERFLOW_TORCH_PYTHON"), sys.executable, fallback]
    for python in [c for c in candidates if c and os.path.exists(c)]:
        if subprocess.run([python, "-c", "import torch"], capture_output=True).returncode == 0:
            return python
    print(f"TEST SKIPPED: none of {[c for c in candidates if c]} has torch (pip install torch, or set "
          "TOWERFLOW_TORCH_PYTHON to an interpreter that has it; scripts/bench.sh --install-peers)")
    sys.exit(77)


def write_bin(path, records):
    with open(path, "wb") as fh:
        fh.write(b"".join(bytes([label]) + pixels for label, pixels in records))


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}")
        sys.exit(1)


def finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


def run(python, script, data, jsonl, extra):
    cmd = [python, script, "--data", data, "--limit-train", "1024", "--limit-test", "512", "--batch", "256",
           "--seeds", "0", "--json", "--jsonl", jsonl] + extra
    print("+", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    sys.stderr.write(proc.stderr)
    check(proc.returncode == 0, f"exit status {proc.returncode}")
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    check(lines, "no JSON lines on stdout")
    return lines


def check_lines(lines, epochs, steps, flip, tta, lookahead):
    kinds = [r["kind"] for r in lines]
    check(kinds == ["epoch"] * epochs + ["run", "summary"], f"kinds {kinds}")
    for r in lines[:epochs]:
        check(EPOCH_KEYS <= set(r), f"epoch line lacks {EPOCH_KEYS - set(r)}")
        check(finite(r["time_s"]) and r["time_s"] > 0, f"epoch time_s {r['time_s']}")
        check(finite(r["train_loss"]), f"train_loss {r['train_loss']}")
        check(0 <= r["train_acc"] <= 1 and 0 <= r["val_acc"] <= 1, f"epoch accuracies {r}")
    check([r["step"] for r in lines[:epochs]][-1] == steps, f"last epoch's step is not {steps}")
    run_line, summary = lines[-2], lines[-1]
    check(RUN_KEYS <= set(run_line), f"run line lacks {RUN_KEYS - set(run_line)}")
    check(SUMMARY_KEYS <= set(summary), f"summary line lacks {SUMMARY_KEYS - set(summary)}")
    check(run_line["steps"] == steps, f"steps {run_line['steps']}, expected {steps}")
    for key in ("time_s", "whiten_s", "tta_eval_s", "load_s"):
        check(finite(run_line[key]) and run_line[key] >= 0, f"{key} {run_line[key]}")
    check(run_line["whiten_s"] + run_line["tta_eval_s"] <= run_line["time_s"], "whiten_s + tta_eval_s > time_s")
    check(run_line["time_s"] >= lines[epochs - 1]["time_s"], "run time_s < the last epoch's")
    check(0 <= run_line["acc_tta"] <= 1 and 0 <= run_line["acc_plain"] <= 1, f"accuracies {run_line}")
    check(run_line["acc_plain"] == lines[epochs - 1]["val_acc"], "acc_plain is not the last epoch's val_acc")
    check((run_line["flip"], run_line["tta"], run_line["lookahead"]) == (flip, tta, lookahead),
          f"flip/tta/lookahead {run_line['flip']}, {run_line['tta']}, {run_line['lookahead']}")
    check(summary["runs"] == 1 and summary["acc_tta_mean"] == run_line["acc_tta"], f"summary {summary}")


def main():
    script = sys.argv[1]
    python = torch_python(sys.argv[2] if len(sys.argv) > 2 else None)
    rng = random.Random(7)
    train = [(rng.randrange(10), rng.randbytes(3072)) for _ in range(1280)]
    test = [(rng.randrange(10), rng.randbytes(3072)) for _ in range(600)]
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "cifar-10-batches-bin")
        os.makedirs(data)
        for i in range(5):
            write_bin(os.path.join(data, f"data_batch_{i + 1}.bin"), train[i * 256:(i + 1) * 256])
        write_bin(os.path.join(data, "test_batch.bin"), test)

        jsonl = os.path.join(tmp, "runs.jsonl")
        lines = run(python, script, data, jsonl, ["--epochs", "2"])
        check_lines(lines, 2, 8, "alternating", 2, True)
        with open(jsonl) as fh:
            check([json.loads(line) for line in fh] == lines, "--jsonl differs from stdout")

        lines = run(python, script, data, os.path.join(tmp, "ablation.jsonl"),
                    ["--epochs", "0.5", "--flip", "random", "--tta", "1", "--no-lookahead"])
        check_lines(lines, 1, 2, "random", 1, False)

        if subprocess.run([python, "-c", "import PIL"], capture_output=True).returncode != 0:
            print(f"note: {python} lacks Pillow; the image-folder form of --data was not tried")
        else:
            # The same images as PNG folders (lossless): the folder form loads them, in its own order.
            check(subprocess.run([python, "-c", f"""
import os, sys, torch
sys.path.insert(0, os.path.dirname({script!r}))
from PIL import Image
import airbench94_torch as ab
(bx, by), (tx, ty) = ab.load_data({data!r})
root = {os.path.join(tmp, "folders")!r}
for split, xs, ys in (("train", bx, by), ("test", tx, ty)):
    for i, (x, y) in enumerate(zip(xs, ys)):
        d = os.path.join(root, split, ab.CLASSES[int(y)])
        os.makedirs(d, exist_ok=True)
        Image.fromarray(x.permute(1, 2, 0).numpy()).save(os.path.join(d, "%04d.png" % i))
(fx, fy), (gx, gy) = ab.load_data(root)
def key(xs, ys):
    return sorted(bytes([int(y)]) + x.numpy().tobytes() for x, y in zip(xs, ys))
assert key(fx, fy) == key(bx, by) and key(gx, gy) == key(tx, ty)
"""]).returncode == 0, "the image-folder form does not load the same images and labels")
            print("image-folder form: same images and labels")
    print("airbench94_torch: all checks passed")


if __name__ == "__main__":
    main()
