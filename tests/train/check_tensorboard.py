#!/usr/bin/env python3
"""TensorBoard's own reader over towerflow's event files: a crashed and resumed run (written by
test_train's "[tensorboard]" test) must show every tag the run logged, at the steps and values
logged, as one continuous curve. Exits 77 (skipped) when the tensorboard package is missing.

    check_tensorboard.py PATH/TO/test_train
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    from tensorboard.backend.event_processing import event_accumulator as ea
except ImportError as e:
    print(f"SKIPPED: the tensorboard package is not installed ({e}); pip install tensorboard")
    sys.exit(77)


def main():
    test_train = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, TOWERFLOW_TB_DIR=d)
        subprocess.run([test_train, "[tensorboard]"], env=env, check=True, stdout=subprocess.DEVNULL)
        expected = json.load(open(os.path.join(d, "expected.json")))
        acc = ea.EventAccumulator(d, size_guidance={ea.SCALARS: 0})
        acc.Reload()
        scalars = set(acc.Tags()["scalars"])
        for tag in ["train/loss", "train/accuracy", "train/learning_rate", "train/images_per_second",
                    "step_time/total_ms", "step_time/compute_ms", "step_time/reduction_ms",
                    "step_time/optimizer_ms", "step_time/data_wait_ms", "test/loss", "test/accuracy"]:
            assert tag in scalars, f"tag {tag} missing; TensorBoard found {sorted(scalars)}"
        for tag, points in expected.items():
            got = [(e.step, e.value) for e in acc.Scalars(tag)]
            want = [(int(s), float(v)) for s, v in points]
            assert [s for s, _ in got] == [s for s, _ in want], f"{tag}: steps {got} != {want}"
            for (s, g), (_, w) in zip(got, want):
                assert abs(g - w) <= 1e-6 * max(1.0, abs(w)), f"{tag} at step {s}: {g} != {w}"
            print(f"{tag}: {len(got)} points, steps {[s for s, _ in got]}")
    print("TensorBoard reads the resumed run as one continuous run")


if __name__ == "__main__":
    main()
