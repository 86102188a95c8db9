#!/usr/bin/env python3
"""Checks that a cifar10_train checkpoint loads into the equivalent PyTorch module:
safetensors.torch.load_file + load_state_dict(strict=True), and that the optimizer state in
train_state.safetensors is keyed by the same parameter names with the same shapes. With --images,
it classifies real images in PyTorch, preprocessed exactly as towerflow does (below), and with
--compare it checks PyTorch's logits against cifar10_predict --json's for the same files.

    pip install torch safetensors pillow numpy
    python3 examples/cifar10/check_torch_load.py train_dir            # its latest checkpoint
    python3 examples/cifar10/check_torch_load.py train_dir/ckpt-0000000312 --model resnet20
    cifar10_predict --checkpoint train_dir --json imgs/ > tf.jsonl
    python3 examples/cifar10/check_torch_load.py train_dir --images imgs/ --compare tf.jsonl

The model defaults to the one recorded in the checkpoint's metadata.

The preprocessing a towerflow model expects (the checkpoint's metadata: image_size "HxW", mean and
std "R,G,B"): decode to 8-bit RGB; resize to HxW, bilinear with half-pixel centres and no
antialiasing, rounded to the nearest integer, halves up (torch.nn.functional.interpolate(
mode="bilinear", align_corners=False, antialias=False) on the uint8 values as floats, then
floor(x + 0.5); towerflow follows that kernel's float arithmetic, and an occasional pixel may still
round the other way, which moves logits by about 1e-3 of their size: hence --tolerance; no resize
when the size is already HxW, and then the logits agree to float rounding); then (x / 255 - mean) / std per channel; NCHW for PyTorch (towerflow holds NHWC
and flattens in PyTorch's order)."""
import argparse
import json
import os
import sys

import torch
from torch import nn


class TfCnn(nn.Module):
    """The TensorFlow CIFAR-10 tutorial network without LRN (towerflow's tfcnn)."""

    def __init__(self, num_classes=10, h=32, w=32):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 5, padding=2)
        self.conv2 = nn.Conv2d(64, 64, 5, padding=2)
        self.pool = nn.MaxPool2d(3, 2, padding=1)
        pooled = lambda n: ((n + 1) // 2 + 1) // 2  # two poolings of kernel 3, stride 2, padding 1
        self.fc1 = nn.Linear(pooled(h) * pooled(w) * 64, 384)
        self.fc2 = nn.Linear(384, 192)
        self.fc3 = nn.Linear(192, num_classes)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (self.downsample(x) if self.downsample is not None else x))


class CifarResNet(nn.Module):
    """He et al. 2016 CIFAR ResNet-(6n+2) with projection shortcuts, torchvision names."""

    def __init__(self, depth, num_classes=10):
        super().__init__()
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        cin = 16
        for i, (cout, stride) in enumerate([(16, 1), (32, 2), (64, 2)]):
            blocks = []
            for b in range(n):
                blocks.append(BasicBlock(cin, cout, stride if b == 0 else 1))
                cin = cout
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def build(name, num_classes, h=32, w=32):
    if name == "tfcnn":
        return TfCnn(num_classes, h, w)
    if name.startswith("resnet"):
        return CifarResNet(int(name[len("resnet"):]), num_classes)
    sys.exit(f"unknown model {name!r}")


def resolve(path):
    if os.path.isfile(path):
        return path, None
    if os.path.isfile(os.path.join(path, "model.safetensors")):
        return os.path.join(path, "model.safetensors"), os.path.join(path, "train_state.safetensors")
    ckpts = sorted(d for d in os.listdir(path) if d.startswith("ckpt-") and ".tmp-" not in d)
    if not ckpts:
        sys.exit(f"no checkpoint in {path}")
    return resolve(os.path.join(path, ckpts[-1]))


def image_files(inputs):
    out = []
    for p in inputs:
        if os.path.isdir(p):
            found = [os.path.join(d, f) for d, _, fs in os.walk(p) for f in fs
                     if f.lower().endswith((".jpg", ".jpeg", ".png"))]
            out += sorted(found)
        else:
            out.append(p)
    return out


def preprocess(files, h, w, meta):
    """The batch towerflow would feed the model, NCHW (see the module's docstring)."""
    import numpy as np
    from PIL import Image

    mean = torch.tensor([float(v) for v in meta.get("mean", "0.4914,0.4822,0.4465").split(",")]).view(3, 1, 1)
    std = torch.tensor([float(v) for v in meta.get("std", "0.247,0.2435,0.2616").split(",")]).view(3, 1, 1)
    images = []
    for f in files:
        x = torch.from_numpy(np.asarray(Image.open(f).convert("RGB"), dtype=np.uint8).copy()).permute(2, 0, 1)
        x = x.float()
        if tuple(x.shape[1:]) != (h, w):
            x = torch.nn.functional.interpolate(x[None], size=(h, w), mode="bilinear", align_corners=False,
                                                antialias=False)[0].add(0.5).floor().clamp(0, 255)
        images.append((x / 255 - mean) / std)
    return torch.stack(images)


def main():
    from safetensors import safe_open  # here, so the model classes import without safetensors
    from safetensors.torch import load_file

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--model")
    ap.add_argument("--images", nargs="+", help="image files or folders to classify in PyTorch")
    ap.add_argument("--compare", help="cifar10_predict --json output for the same images")
    ap.add_argument("--tolerance", type=float, default=2e-3,
                    help="largest logit difference, relative to the largest logit (at least 1)")
    args = ap.parse_args()
    model_file, state_file = resolve(args.checkpoint)
    meta = {}
    if state_file and os.path.exists(state_file):
        with safe_open(state_file, "pt") as f:
            meta = f.metadata() or {}
    name = args.model or meta.get("model", "tfcnn")
    state = load_file(model_file)
    num_classes = int(meta.get("num_classes", 10))
    h, w = (int(v) for v in meta.get("image_size", "32x32").split("x"))
    model = build(name, num_classes, h, w)
    model.load_state_dict(state, strict=True)  # raises on any missing, extra or misshapen tensor
    print(f"{model_file}: {len(state)} tensors load into PyTorch {name} "
          f"({sum(p.numel() for p in model.parameters())} parameters) with strict=True")
    if state_file and os.path.exists(state_file):
        opt = load_file(state_file)
        params = dict(model.named_parameters())
        for key, value in opt.items():
            param = key.rsplit(".", 1)[0]
            if param not in params:
                sys.exit(f"optimizer state {key!r} names no parameter of the model")
            if tuple(value.shape) != tuple(params[param].shape):
                sys.exit(f"optimizer state {key!r} has shape {tuple(value.shape)}, "
                         f"the parameter {tuple(params[param].shape)}")
        options = json.loads(meta.get("options", "{}"))
        print(f"{state_file}: {len(opt)} optimizer tensors ({meta.get('optimizer')}) keyed by parameter name; "
              f"step {meta.get('step')}, epoch {meta.get('epoch')}, step_in_epoch {meta.get('step_in_epoch')}, "
              f"{len(options)} options recorded")
    if not args.images:
        # One forward pass, to show the loaded module runs.
        with torch.no_grad():
            model.eval()
            out = model(torch.zeros(2, 3, h, w))
        assert out.shape == (2, num_classes)
        print("ok")
        return
    files = image_files(args.images)
    batch = preprocess(files, h, w, meta)
    with torch.no_grad():
        model.eval()
        logits = model(batch)
    names = json.loads(meta.get("class_names", "null")) or [str(c) for c in range(num_classes)]
    for f, row in zip(files, logits):
        print(f"{f}  {names[int(row.argmax())]}")
    if args.compare:
        theirs = {}
        with open(args.compare) as fh:
            for line in fh:
                j = json.loads(line)
                if "path" in j:
                    theirs[os.path.normpath(j["path"])] = j["logits"]
        worst = 0.0
        for f, row in zip(files, logits):
            key = os.path.normpath(f)
            if key not in theirs:
                sys.exit(f"{f}: not in {args.compare}")
            diff = float((row - torch.tensor(theirs[key])).abs().max())
            print(f"{f}: largest logit difference {diff:.3g}")
            worst = max(worst, diff)
        scale = float(logits.abs().max())
        print(f"{len(files)} images: PyTorch's logits are within {worst:.3g} of towerflow's "
              f"(largest logit {scale:.3g})")
        if worst > args.tolerance * max(1.0, scale):
            sys.exit(f"the logits differ by {worst:.3g}, more than {args.tolerance} x {max(1.0, scale):.3g}")
    print("ok")


if __name__ == "__main__":
    main()
