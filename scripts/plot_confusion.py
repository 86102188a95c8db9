#!/usr/bin/env python3
"""A confusion matrix as a PNG: rows are the true classes, columns the predicted ones, each cell the
share of its row (the count written in it), each row labelled with the class's accuracy. Reads the
JSON cifar10_train writes after each evaluation (TRAIN_DIR/confusion.json) and cifar10_eval writes
with --confusion FILE.

    scripts/plot_confusion.py TRAIN_DIR_OR_FILE -o confusion.png [--size INCHES]

Needs matplotlib (pip install matplotlib).
"""
import argparse
import json
import os
import sys


def read(path):
    file = os.path.join(path, "confusion.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        sys.exit(f"plot_confusion: {file} does not exist; pass a train_dir holding confusion.json, or the file")
    try:
        with open(file) as f:
            doc = json.load(f)
    except json.JSONDecodeError as e:
        sys.exit(f"plot_confusion: {file} is not JSON ({e})")
    m = doc.get("confusion")
    if not isinstance(m, list) or not m or any(not isinstance(r, list) or len(r) != len(m) for r in m):
        sys.exit(f"plot_confusion: {file} holds no square \"confusion\" matrix")
    return file, doc, m


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", help="a train_dir holding confusion.json, or the JSON file")
    p.add_argument("-o", "--output", required=True, help="the PNG to write")
    p.add_argument("--size", type=float, default=0, help="the picture's side in inches (default: from the classes)")
    args = p.parse_args()
    file, doc, m = read(args.source)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        sys.exit(f"plot_confusion: matplotlib is needed ({e}); pip install matplotlib")
    n = len(m)
    names = doc.get("classes") or [str(i) for i in range(n)]
    acc = doc.get("class_acc") or [None] * n
    shares = [[c / max(1, sum(row)) for c in row] for row in m]
    side = args.size or min(24, max(5, 0.6 * n + 2))
    fig, ax = plt.subplots(figsize=(side, side))
    ax.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_xticklabels(names, rotation=90 if n > 10 else 45, ha="right" if n <= 10 else "center")
    ax.set_yticklabels([f"{name} ({100 * a:.1f}%)" if a is not None else f"{name} (no rows)"
                        for name, a in zip(names, acc)])
    ax.set_xlabel("predicted")
    ax.set_ylabel("true (its accuracy)")
    if n <= 20:
        for t in range(n):
            for q in range(n):
                if m[t][q]:
                    ax.text(q, t, str(m[t][q]), ha="center", va="center", fontsize=8,
                            color="white" if shares[t][q] > 0.5 else "black")
    title = f"{doc.get('set', 'test')} top-1 {100 * doc.get('acc', 0):.2f}%"
    if "top5" in doc:
        title += f", top-5 {100 * doc['top5']:.2f}%"
    ax.set_title(f"step {doc.get('step', '?')}, {doc.get('examples', sum(map(sum, m)))} images\n{title}", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.output, dpi=100)
    print(f"plot_confusion: {n}x{n} matrix of {file} drawn to {args.output}")


if __name__ == "__main__":
    main()
