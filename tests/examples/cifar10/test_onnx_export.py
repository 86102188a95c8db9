#!/usr/bin/env python3
"""towerflow_export --onnx against ONNX Runtime: for tfcnn and resnet20 trained at another input
size and normalisation, the exported model's logits on real image files equal cifar10_predict's
(the same weights, preprocessing and evaluation-mode forward); the model carries the
preprocessing in its metadata; bad exports are refused naming the cause.

    test_onnx_export.py CIFAR10_TRAIN CIFAR10_PREDICT TOWERFLOW_EXPORT

Needs onnxruntime, numpy and Pillow (scripts/install_deps.sh puts them in .venv); without them
the test reports itself skipped (77)."""
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import onnxruntime as ort
    from PIL import Image
except ImportError as e:
    print(f"TEST SKIPPED: {e.name} is missing (pip install onnxruntime numpy pillow, or run scripts/install_deps.sh)")
    sys.exit(77)

failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAILED: ") + what)
    failures += 0 if ok else 1


def main():
    train, predict, export = sys.argv[1:4]
    with tempfile.TemporaryDirectory() as tmp:
        images = os.path.join(tmp, "images")
        os.makedirs(images)
        rng = np.random.default_rng(5)
        for i in range(8):
            y, x = np.mgrid[0:40, 0:40]
            img = np.stack([127 + 120 * np.sin(x / (3 + i) + c) * np.cos(y / (4 + c)) for c in range(3)], -1)
            Image.fromarray(np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8)).save(
                os.path.join(images, f"img{i}.png"))
        for model in ["tfcnn", "resnet20"]:
            run = os.path.join(tmp, model)
            subprocess.run([train, "--model", model, "--max_steps", "6", "--builtin_train_size", "256",
                            "--builtin_test_size", "64", "--batch_size", "32", "--image_size", "40",
                            "--mean", "imagenet", "--std", "0.3,0.3,0.3", "--train_dir", run, "--progress", "plain"],
                           check=True, capture_output=True)
            path = os.path.join(tmp, model + ".onnx")
            res = subprocess.run([export, "--checkpoint", run, "--onnx", path], capture_output=True, text=True)
            check(res.returncode == 0, f"{model}: towerflow_export exits 0 ({res.stderr.strip()})")
            if res.returncode != 0:
                continue
            session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            meta = session.get_modelmeta().custom_metadata_map
            check(meta.get("image_size") == "40x40" and meta.get("mean") == "0.485,0.456,0.406",
                  f"{model}: the model's metadata holds the preprocessing ({meta.get('image_size')}, {meta.get('mean')})")
            files = sorted(os.path.join(images, f) for f in os.listdir(images))
            mean = np.array([float(v) for v in meta["mean"].split(",")], np.float32)
            std = np.array([float(v) for v in meta["std"].split(",")], np.float32)
            batch = np.stack([((np.asarray(Image.open(f).convert("RGB"), np.float32) / 255 - mean) / std)
                              .transpose(2, 0, 1) for f in files]).astype(np.float32)
            ours = session.run(["logits"], {"input": batch})[0]
            out = subprocess.run([predict, "--checkpoint", run, "--json", images], capture_output=True, text=True,
                                 check=True)
            theirs = {os.path.normpath(j["path"]): j["logits"]
                      for j in map(json.loads, out.stdout.splitlines()) if "path" in j}
            ref = np.array([theirs[os.path.normpath(f)] for f in files], np.float32)
            worst = float(np.abs(ours - ref).max())
            scale = max(1.0, float(np.abs(ref).max()))
            check(ours.shape == (8, 10) and worst <= 1e-4 * scale,
                  f"{model}: ONNX Runtime's logits are within {worst:.3g} of cifar10_predict's (bound {1e-4 * scale:.3g})")
            check(bool((ours.argmax(1) == ref.argmax(1)).all()), f"{model}: the same top-1 class for every image")
        # Refusals: weights of another model, a model towerflow does not export.
        bad = subprocess.run([export, "--checkpoint", os.path.join(tmp, "tfcnn"), "--model", "resnet20",
                              "--onnx", os.path.join(tmp, "x.onnx")], capture_output=True, text=True)
        check(bad.returncode == 2 and "conv1.weight" in bad.stderr and not os.path.exists(os.path.join(tmp, "x.onnx")),
              f"weights of another model: exit 2 naming the tensor ({bad.stderr.strip()[:160]})")
        bad = subprocess.run([export, "--checkpoint", os.path.join(tmp, "tfcnn"), "--model", "vgg16",
                              "--onnx", os.path.join(tmp, "x.onnx")], capture_output=True, text=True)
        check(bad.returncode == 2 and "has no ONNX export" in bad.stderr, f"unknown model: exit 2 ({bad.stderr.strip()[:120]})")
    print(f"{failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
