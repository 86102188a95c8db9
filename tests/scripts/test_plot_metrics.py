#!/usr/bin/env python3
"""scripts/plot_metrics.py draws a cifar10_train run and a PyTorch-reference-format run into one
PNG of the requested size, and refuses a directory without metrics. Exits 77 (skipped) without
matplotlib.

    test_plot_metrics.py SOURCE_DIR
"""
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
    print("plot_metrics.py: an 800x300 PNG of two runs; a directory without metrics refused")


if __name__ == "__main__":
    main()
