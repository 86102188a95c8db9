#!/usr/bin/env python3
"""The recipe of scripts/train_resnet20_cifar10.sh in PyTorch, on the same CIFAR-10 binary files:
an independent reference for the accuracy cifar10_train reaches.

    /usr/bin/python3 scripts/torch_resnet20_cifar10.py DATA_DIR [--epochs 40] [--out DIR]

Same model (ResNet-20 with projection shortcuts and torchvision names, He-normal fan-out
convolutions), same augmentation (4-pixel zero-padded random crop, horizontal flip, CIFAR-10
mean/std, then a --cutout square set to 0 with its centre anywhere in the image, clipped at the
edges, as data/augment.h; 12 as the shell script, 0 for none), SGD with momentum 0.9 and weight decay 5e-4 on every parameter, lr 0.1 with one linear
warm-up epoch multiplying a cosine over the whole run (optim/schedule.cc's warmup_schedule over
cosine_schedule), global batch 128 normalised in halves of 64 as the two towers do (--ghost 2).
Writes one JSON line per evaluation to stdout and to OUT/metrics.jsonl; OUT/last.pt is written
after every epoch (temporary file, then rename) and --resume continues from it."""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "cifar10"))
from check_torch_load import CifarResNet  # noqa: E402  (the checkpoint-compatible PyTorch model)

MEAN = np.array([0.4914, 0.4822, 0.4465], np.float32).reshape(1, 3, 1, 1)
STD = np.array([0.2470, 0.2435, 0.2616], np.float32).reshape(1, 3, 1, 1)


def resnet20():
    model = CifarResNet(20)
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return model


def load(data_dir, names):
    raw = np.concatenate([np.fromfile(os.path.join(data_dir, n), np.uint8).reshape(-1, 3073) for n in names])
    return raw[:, 1:].reshape(-1, 3, 32, 32), raw[:, 0].astype(np.int64)


def normalise(x_uint8):
    return torch.from_numpy((x_uint8.astype(np.float32) / 255 - MEAN) / STD)


def augment(padded, idx, rng):
    """4-pixel zero-padded random crop and horizontal flip of the images idx."""
    n = len(idx)
    dy, dx = rng.integers(0, 9, n), rng.integers(0, 9, n)
    rows = dy[:, None] + np.arange(32)[None, :]                    # n x 32
    cols = dx[:, None] + np.arange(32)[None, :]
    flip = rng.random(n) < 0.5
    cols = np.where(flip[:, None], cols[:, ::-1], cols)
    out = padded[idx[:, None, None, None], np.arange(3)[None, :, None, None],
                 rows[:, None, :, None], cols[:, None, None, :]]
    return out


def cutout(x, size, rng):
    """Sets a size x size square of each image of x (n, c, h, w) to 0 after normalisation: centre
    uniform over the image, clipped at its edges (data/augment.cc's cutout)."""
    n, _, h, w = x.shape
    cy, cx = rng.integers(0, h, n), rng.integers(0, w, n)
    y0, x0 = cy - size // 2, cx - size // 2
    ys, xs = np.arange(h)[None, :], np.arange(w)[None, :]
    rows = (ys >= y0[:, None]) & (ys < y0[:, None] + size)            # n x h
    cols = (xs >= x0[:, None]) & (xs < x0[:, None] + size)            # n x w
    keep = ~(rows[:, :, None] & cols[:, None, :])                     # n x h x w
    return x * torch.from_numpy(keep[:, None].astype(np.float32))


def evaluate(model, x, y):
    model.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, len(y), 500):
            out = model(x[i:i + 500])
            loss += F.cross_entropy(out, y[i:i + 500], reduction="sum").item()
            correct += (out.argmax(1) == y[i:i + 500]).sum().item()
    model.train()
    return loss / len(y), correct / len(y)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data_dir")
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--ghost", type=int, default=2, help="batch-norm groups per batch (the towers)")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--weight_decay", type=float, default=5e-4)
    ap.add_argument("--cutout", type=int, default=12, help="cutout side in pixels (0: none)")
    ap.add_argument("--label_smoothing", type=float, default=0.0)
    ap.add_argument("--eval_every", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="torch_resnet20")
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)

    x_train, y_train = load(args.data_dir, [f"data_batch_{i}.bin" for i in range(1, 6)])
    x_test, y_test = load(args.data_dir, ["test_batch.bin"])
    padded = np.pad(x_train, ((0, 0), (0, 0), (4, 4), (4, 4)))
    x_test, y_test = normalise(x_test), torch.from_numpy(y_test)
    steps_per_epoch = len(y_train) // args.batch
    total = steps_per_epoch * args.epochs

    model = resnet20()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=args.weight_decay)

    def lr_at(step):
        cos = args.lr * (1 + math.cos(math.pi * step / total)) / 2
        return cos * step / steps_per_epoch if step < steps_per_epoch else cos

    start_epoch = 0
    ckpt = os.path.join(args.out, "last.pt")
    if args.resume and os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start_epoch = state["epoch"]
    metrics = open(os.path.join(args.out, "metrics.jsonl"), "a")
    t0 = time.time()
    for epoch in range(start_epoch, args.epochs):
        rng = np.random.default_rng([args.seed, epoch])
        order = rng.permutation(len(y_train))
        seen, correct, loss_sum = 0, 0, 0.0
        for s in range(steps_per_epoch):
            step = epoch * steps_per_epoch + s
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            idx = order[s * args.batch:(s + 1) * args.batch]
            xb = normalise(augment(padded, idx, rng))
            if args.cutout > 0:
                xb = cutout(xb, args.cutout, rng)
            yb = torch.from_numpy(y_train[idx])
            opt.zero_grad(set_to_none=True)
            outs = [model(part) for part in xb.chunk(args.ghost)]
            out = torch.cat(outs)
            loss = F.cross_entropy(out, yb, label_smoothing=args.label_smoothing)
            loss.backward()
            opt.step()
            seen += len(idx)
            correct += (out.argmax(1) == yb).sum().item()
            loss_sum += loss.item() * len(idx)
        line = {"epoch": epoch + 1, "step": (epoch + 1) * steps_per_epoch, "loss": round(loss_sum / seen, 5),
                "acc": round(correct / seen, 5), "lr": lr_at((epoch + 1) * steps_per_epoch - 1),
                "wall_s": round(time.time() - t0, 1)}
        if (epoch + 1) % args.eval_every == 0 or epoch + 1 == args.epochs:
            test_loss, test_acc = evaluate(model, x_test, y_test)
            line.update(test_loss=round(test_loss, 5), test_acc=round(test_acc, 5))
        print(json.dumps(line), flush=True)
        metrics.write(json.dumps(line) + "\n")
        metrics.flush()
        tmp = ckpt + ".tmp"
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch + 1}, tmp)
        os.replace(tmp, ckpt)


if __name__ == "__main__":
    main()
