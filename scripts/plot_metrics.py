#!/usr/bin/env python3
"""Loss and accuracy curves of one or several runs, from their metrics.jsonl, as one PNG: training
loss and accuracy (thin lines, every record) and test loss and accuracy (markers, every
evaluation) against the epoch. Reads cifar10_train's train_dir/metrics.jsonl and the PyTorch
reference's (scripts/torch_resnet20_cifar10.py --out DIR), so the two can be drawn together.

    scripts/plot_metrics.py TRAIN_DIR [TRAIN_DIR ...] -o curves.png [--labels towerflow,pytorch]

With --split, a run of an auto split (cifar10_train --split auto): the rows of every tower and the
step time (the global batch over the record's images/s) against the step, from the records'
"split"; --mark STEP draws a line at a step (where a straggler appeared, say).

    scripts/plot_metrics.py TRAIN_DIR --split -o split.png [--mark 20]

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


def read_split(path):
    """(step, rows per tower, step seconds) of every record with a split."""
    file = os.path.join(path, "metrics.jsonl") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        sys.exit(f"plot_metrics: {file} does not exist; pass a train_dir holding metrics.jsonl, or the file")
    out = []
    with open(file) as f:
        for line in f:
            rec = json.loads(line) if line.strip() else {}
            if rec.get("split") and rec.get("img_per_s"):
                out.append((rec["step"], rec["split"], sum(rec["split"]) / rec["img_per_s"]))
    if not out:
        sys.exit(f"plot_metrics: {file} holds no records with a split; run with --split auto")
    return out


def save(fig, args):
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.output, dpi=100)
    print(f"plot_metrics: wrote {args.output} ({int(args.width * 100)}x{int(args.height * 100)} pixels)")


def plot_split(args, plt):
    fig, (ax_rows, ax_time) = plt.subplots(1, 2, figsize=(args.width, args.height), dpi=100)
    for run in args.runs:
        records = read_split(run)
        steps = [r[0] for r in records]
        for t in range(len(records[0][1])):
            ax_rows.plot(steps, [r[1][t] for r in records], lw=1.2, label=f"tower {t}")
        ax_time.plot(steps, [1e3 * r[2] for r in records], lw=1.2, color="k")
    for ax in (ax_rows, ax_time):
        if args.mark is not None:
            ax.axvline(args.mark, color="r", ls="--", lw=0.8, label="straggler appears")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    ax_rows.set_ylabel("rows of the global batch")
    ax_time.set_ylabel("step time (ms)")
    ax_rows.legend(fontsize=8)
    save(fig, args)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="train_dirs (or metrics.jsonl files)")
    p.add_argument("-o", "--output", default="curves.png", help="the PNG to write (default curves.png)")
    p.add_argument("--labels", help="comma-separated names for the runs (default: the directories' names)")
    p.add_argument("--title", default="", help="a title above both panels")
    p.add_argument("--width", type=float, default=10, help="inches, at 100 pixels an inch (default 10)")
    p.add_argument("--height", type=float, default=4, help="inches (default 4)")
    p.add_argument("--split", action="store_true", help="rows per tower and step time against the step (an auto split)")
    p.add_argument("--mark", type=int, help="with --split: a vertical line at this step")
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
    if args.split:
        plot_split(args, plt)
        return

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
    save(fig, args)


if __name__ == "__main__":
    main()
