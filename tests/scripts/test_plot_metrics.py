#!/usr/bin/env python3
"""scripts/plot_metrics.py draws a cifar10_train run and a PyTorch-reference-format run into one
PNG of the requested size, and refuses a directory without metrics; with --split it draws an auto
split's rows per tower and step time, and refuses a run without a split. Exits 77 (skipped)
without matplotlib.

    test_plot_metrics.py SOURCE_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plot_test_util import png_size, require_matplotlib  # noqa: E402

require_matplotlib()


def main():
    src = sys.argv[1]
    script = os.path.join(src, "scripts", "plot_metrics.py")
    fixtures = os.path.join(src, "tests", "fixtures", "plot")
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "curves.png")
        subprocess.run([sys.executable, script, os.path.join(fixtures, "towerflow_run"),
                        os.path.join(fixtures, "torch_run", "metrics.jsonl"), "-o", out,
                        "--labels", "towerflow,pytorch", "--width", "8", "--height", "3"], check=True)
        assert png_size(out) == (800, 300), f"size {png_size(out)}, expected (800, 300)"
        assert os.path.getsize(out) > 10000, "an almost empty picture"
        bad = subprocess.run([sys.executable, script, d, "-o", os.path.join(d, "x.png")],
                             capture_output=True, text=True)
        assert bad.returncode != 0 and "metrics.jsonl does not exist" in bad.stderr, bad.stderr
        assert not os.path.exists(os.path.join(d, "x.png"))
        # An auto split's records: tower 1 loses rows once a straggler appears at step 5.
        run = os.path.join(d, "metrics.jsonl")
        with open(run, "w") as f:
            for step in range(1, 11):
                split = [64, 64] if step < 7 else [85, 43]
                f.write(json.dumps({"step": step, "epoch": step / 10, "loss": 2.0, "acc": 0.1, "lr": 0.1,
                                    "img_per_s": 300.0 if step < 5 else 250.0, "split": split}) + "\n")
        out = os.path.join(d, "split.png")
        subprocess.run([sys.executable, script, run, "--split", "--mark", "5", "-o", out], check=True)
        assert png_size(out) == (1000, 400), f"size {png_size(out)}, expected (1000, 400)"
        none = subprocess.run([sys.executable, script, os.path.join(fixtures, "towerflow_run"), "--split",
                               "-o", os.path.join(d, "y.png")], capture_output=True, text=True)
        assert none.returncode != 0 and "holds no records with a split" in none.stderr, none.stderr
    print("plot_metrics.py: an 800x300 PNG of two runs; a directory without metrics refused; "
          "an auto split's rows and step time; a run without a split refused")


if __name__ == "__main__":
    main()
