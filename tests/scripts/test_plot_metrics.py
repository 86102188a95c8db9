#!/usr/bin/env python3
"""scripts/plot_metrics.py draws a cifar10_train run and a PyTorch-reference-format run into one
PNG of the requested size, and refuses a directory without metrics. Exits 77 (skipped) without
matplotlib.

    test_plot_metrics.py SOURCE_DIR
"""
import os
import struct
import subprocess
import sys
import tempfile

try:
    import matplotlib  # noqa: F401
except ImportError as e:
    print(f"SKIPPED: matplotlib is not installed ({e}); pip install matplotlib")
    sys.exit(77)


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert head[12:16] == b"IHDR", f"{path}: no IHDR chunk first"
    return struct.unpack(">II", head[16:24])


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
