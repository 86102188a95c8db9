#!/usr/bin/env python3
"""PyTorch classifies real images as cifar10_predict does: a run at another input size and
normalisation (--image_size 40 --mean imagenet --std 0.3,0.3,0.3), then the same images (PNGs of
other sizes, so both resize) through cifar10_predict --json and through the PyTorch module that
check_torch_load.py builds, preprocessed as its docstring says; the logits must agree.

    test_predict_torch.py CIFAR10_TRAIN CIFAR10_PREDICT CHECK_TORCH_LOAD_PY

PyTorch, safetensors, Pillow and numpy come from the interpreter running this, or the one
TOWERFLOW_TORCH_PYTHON names; without them the test reports itself skipped (77)."""
import json
import os
import subprocess
import sys
import tempfile


def main():
    train, predict, check = sys.argv[1:4]
    python = os.environ.get("TOWERFLOW_TORCH_PYTHON", sys.executable)
    probe = subprocess.run([python, "-c", "import torch, safetensors, PIL, numpy"], capture_output=True)
    if probe.returncode != 0:
        print(f"TEST SKIPPED: {python} lacks torch, safetensors, pillow or numpy "
              "(pip install them, or set TOWERFLOW_TORCH_PYTHON to an interpreter that has them)")
        sys.exit(77)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        images = os.path.join(tmp, "images")
        os.makedirs(images)
        # Real photographs are not in the tree: smooth coloured patterns of several sizes.
        subprocess.run([python, "-c", f"""
import numpy as np
from PIL import Image
rng = np.random.default_rng(3)
for i, (h, w) in enumerate([(32, 32), (40, 40), (37, 45), (64, 48), (20, 28), (50, 50)]):
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([127 + 120 * np.sin(x / (3 + i) + c) * np.cos(y / (4 + c)) for c in range(3)], -1)
    img = np.clip(img + rng.normal(0, 10, img.shape), 0, 255).astype(np.uint8)
    Image.fromarray(img).save(r"{images}/img%d.png" % i)
"""], check=True)
        for model in ["tfcnn", "resnet20"]:
            run = os.path.join(tmp, model)
            subprocess.run([train, "--model", model, "--max_steps", "6", "--builtin_train_size", "256",
                            "--builtin_test_size", "64", "--batch_size", "32", "--image_size", "40",
                            "--mean", "imagenet", "--std", "0.3,0.3,0.3", "--train_dir", run,
                            "--progress", "plain"], check=True, capture_output=True)
            out = subprocess.run([predict, "--checkpoint", run, "--json", images], capture_output=True, text=True)
            if out.returncode != 0:
                print(f"FAILED: {model}: cifar10_predict exited {out.returncode}: {out.stderr}{out.stdout}")
                failures += 1
                continue
            jsonl = os.path.join(tmp, model + ".jsonl")
            with open(jsonl, "w") as f:
                f.write(out.stdout)
            paths = [json.loads(l).get("path") for l in out.stdout.splitlines() if '"path"' in l]
            if len(paths) != 6:
                print(f"FAILED: {model}: cifar10_predict printed {len(paths)} predictions, expected 6")
                failures += 1
            res = subprocess.run([python, check, run, "--images", images, "--compare", jsonl],
                                 capture_output=True, text=True)
            print(res.stdout.strip())
            if res.returncode != 0:
                print(f"FAILED: {model}: {res.stderr.strip()}")
                failures += 1
    print(f"{2 - failures} passed, {failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
