#!/usr/bin/env python3
"""Prints the accuracy curve of a cifar10_train run from its train_dir/metrics.jsonl as a markdown
table: for every evaluation, the epoch, step, test accuracy and loss, and the training loss,
accuracy and images/s averaged over the training records since the previous evaluation.

    scripts/metrics_curve.py train_dir/metrics.jsonl
"""
import json
import sys


def main(path):
    rows, train = [], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not a JSON object ({e}); is this a cifar10_train metrics.jsonl?")
            if "test_acc" in rec:
                mean = lambda k: sum(r[k] for r in train) / len(train) if train else float("nan")
                rows.append((rec["epoch"], rec["step"], rec["test_acc"], rec["test_loss"],
                             mean("loss"), mean("acc"), mean("img_per_s")))
                train = []
            elif "loss" in rec:
                train.append(rec)
    if not rows:
        sys.exit(f"{path}: no evaluation records yet")
    print("| epoch | step | test acc | test loss | train loss | train acc | img/s |")
    print("|---|---|---|---|---|---|---|")
    for e, s, ta, tl, l, a, ips in rows:
        print(f"| {e:g} | {s} | {100 * ta:.2f}% | {tl:.3f} | {l:.3f} | {100 * a:.1f}% | {ips:.0f} |")
    best = max(rows, key=lambda r: r[2])
    print(f"\nbest test accuracy {100 * best[2]:.2f}% at epoch {best[0]:g}; last {100 * rows[-1][2]:.2f}%")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
