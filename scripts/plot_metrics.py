#!/usr/bin/env python3
"""Loss and accuracy curves of one or several runs, from their metrics.jsonl, as one PNG: training
loss and accuracy (thin lines, every record) and test loss and accuracy (markers, every
evaluation) against the epoch. Reads cifar10_train's train_dir/metrics.jsonl and the PyTorch
reference's (scripts/torch_resnet20_cifar10.py --out DIR), so the two can be drawn together.

    scripts/plot_metrics.py TRAIN_DIR [TRAIN_DIR ...] -o curves.png [--labels towerflow,pytorch]

A TRAIN_DIR may also be the metrics.jsonl file itself. Needs matplotlib (pip install matplotlib).
"""
import argparse
import json
import os
import sys


def read_run(path):
    file = os.path.join(path, "metrics.jsonl") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        sys.exit(f"plot_metrics: {file} does not exist; pass a train_dir holding metrics.jsonl, or the file")
    train, test = [], []
    with open(file) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"plot_metrics: {file}:{n}: not a JSON object ({e})")
            if "epoch" not in rec:
                continue
            if rec.get("loss") is not None or rec.get("acc") is not None:
                train.append((rec["epoch"], rec.get("loss"), rec.get("acc")))
            if rec.get("test_acc") is not None:
                test.append((rec["epoch"], rec.get("test_loss"), rec["test_acc"]))
    if not train and not test:
        sys.exit(f"plot_metrics: {file} holds no training or evaluation records")
    return train, test


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="train_dirs (or metrics.jsonl files)")
    p.add_argument("-o", "--output", default="curves.png", help="the PNG to write (default curves.png)")
    p.add_argument("--labels", help="comma-separated names for the runs (default: the directories' names)")
    p.add_argument("--title", default="", help="a title above both panels")
    p.add_argument("--width", type=float, default=10, help="inches, at 100 pixels an inch (default 10)")
    p.add_argument("--height", type=float, default=4, help="inches (default 4)")
    args = p.parse_args()
    labels = args.labels.split(",") if args.labels else [os.path.basename(os.path.normpath(r)) for r in args.runs]
    if len(labels) != len(args.runs):
        sys.exit(f"plot_metrics: {len(labels)} labels for {len(args.runs)} runs; give one label per run")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        sys.exit(f"plot_metrics: matplotlib is needed ({e}); pip install matplotlib")

    runs = [read_run(r) for r in args.runs]
    has_loss = any(t[1] is not None for train, test in runs for t in train + test)
    if has_loss:
        fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(args.width, args.height), dpi=100)
    else:  # accuracy alone (e.g. curves transcribed from a table)
        fig, ax_acc = plt.subplots(1, 1, figsize=(args.width, args.height), dpi=100)
        ax_loss = None
    for i, ((train, test), label) in enumerate(zip(runs, labels)):
        color = f"C{i}"
        if train:
            loss = [(t[0], t[1]) for t in train if t[1] is not None]
            if loss and ax_loss:
                ax_loss.plot([t[0] for t in loss], [t[1] for t in loss], color=color, lw=0.8, alpha=0.6,
                             label=f"{label} train")
            acc = [(t[0], t[2]) for t in train if t[2] is not None]
            ax_acc.plot([a[0] for a in acc], [100 * a[1] for a in acc], color=color, lw=0.8, alpha=0.6,
                        label=f"{label} train")
        if test:
            losses = [(t[0], t[1]) for t in test if t[1] is not None]
            if losses and ax_loss:
                ax_loss.plot([t[0] for t in losses], [t[1] for t in losses], color=color, marker="o", ms=3, lw=1.5,
                             label=f"{label} test")
            ax_acc.plot([t[0] for t in test], [100 * t[2] for t in test], color=color, marker="o", ms=3, lw=1.5,
                        label=f"{label} test")
    if ax_loss:
        ax_loss.set_xlabel("epoch")
        ax_loss.set_ylabel("loss")
    ax_acc.set_xlabel("epoch")
    ax_acc.set_ylabel("top-1 accuracy (%)")
    for ax in (a for a in (ax_loss, ax_acc) if a):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.output, dpi=100)
    print(f"plot_metrics: wrote {args.output} ({int(args.width * 100)}x{int(args.height * 100)} pixels)")


if __name__ == "__main__":
    main()
