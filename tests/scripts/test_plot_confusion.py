#!/usr/bin/env python3
"""scripts/plot_confusion.py draws a confusion.json (as cifar10_train writes it) into a PNG of the
requested size, and refuses a file without a square matrix. Exits 77 (skipped) without matplotlib.

    test_plot_confusion.py SOURCE_DIR
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
    script = os.path.join(sys.argv[1], "scripts", "plot_confusion.py")
    with tempfile.TemporaryDirectory() as d:
        doc = {"step": 390, "examples": 30, "set": "test", "acc": 0.6, "top5": 1.0, "classes": ["cat", "dog", "frog"],
               "confusion": [[8, 2, 0], [3, 6, 1], [0, 6, 4]], "class_acc": [0.8, 0.6, 0.4]}
        with open(os.path.join(d, "confusion.json"), "w") as f:
            json.dump(doc, f)
        out = os.path.join(d, "m.png")
        subprocess.run([sys.executable, script, d, "-o", out, "--size", "4"], check=True)
        assert png_size(out) == (400, 400), f"size {png_size(out)}, expected (400, 400)"
        assert os.path.getsize(out) > 5000, "an almost empty picture"
        with open(os.path.join(d, "bad.json"), "w") as f:
            json.dump({"confusion": [[1, 2], [3]]}, f)
        bad = subprocess.run([sys.executable, script, os.path.join(d, "bad.json"), "-o", out],
                             capture_output=True, text=True)
        assert bad.returncode != 0 and "no square" in bad.stderr, bad.stderr
    print("1 passed, 0 failed")


main()
