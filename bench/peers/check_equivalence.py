#!/usr/bin/env python3
"""Do the peers run the network and step towerflow runs? For each model, each side describes one
training step on one image (--describe): towerflow_bench_train counts the multiply-adds its CPU
backend runs (MacCounter), the PyTorch peer counts with torch.utils.flop_counter, the TensorFlow
peer from the ops of its traced step that the step's outputs need. Compared:

  parameters   every trainable tensor's shape (PyTorch's layouts: OIHW kernels, [out, in] dense
               weights; TensorFlow's converted), and their count
  buffers      the batch-norm running statistics each keeps
  forward      multiply-adds per image of every convolution and matrix product, layer by layer
  backward     multiply-adds per image of the gradients: what is differentiated (no side computes
               the input image's gradient)
  loss, optimizer  printed for the reader

A peer that computes less is not a faster peer: any difference fails (exit 1). A peer whose
framework is not installed is reported as skipped.

  python3 bench/peers/check_equivalence.py [--models tfcnn,resnet20] [--towerflow BIN] [--python PY] [--json]
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run_describe(cmd):
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except FileNotFoundError as e:
        return None, str(e)
    for line in out.stdout.splitlines():
        line = line.strip()
        if line.startswith("DESCRIBE "):
            return json.loads(line[len("DESCRIBE "):]), None
        if line.startswith("{") and '"framework"' in line:
            return json.loads(line), None
    tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
    return None, f"exit {out.returncode}: {tail[0]}"


def facts(d):
    """The comparable facts of one description."""
    forward = sorted(r["macs"] for r in d["layers"] if r.get("pass", "forward") == "forward")
    return {
        "parameters": d["params"],
        "trainable shapes": sorted(tuple(p["shape"]) for p in d["parameters"] if p["trainable"]),
        "frozen parameters": sum(1 for p in d["parameters"] if not p["trainable"]),
        "buffer shapes": sorted(tuple(b["shape"]) for b in d["buffers"]),
        "forward MACs/img": d["fwd_macs_per_img"],
        "forward products (MACs each)": forward,
        "backward MACs/img": d["bwd_macs_per_img"],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tfcnn,resnet20")
    ap.add_argument("--towerflow", default="build/bin/towerflow_bench_train")
    ap.add_argument("--python", default=None,
                    help="the Python with the peers (default: build/bench-venv/bin/python if it exists, else this one)")
    ap.add_argument("--json", action="store_true", help="one JSON line per model")
    ap.add_argument("--skip-code", type=int, default=0,
                    help="exit with this code where no peer could describe its step (77 for CTest's skip)")
    args = ap.parse_args()
    py = args.python or ("build/bench-venv/bin/python" if os.path.exists("build/bench-venv/bin/python") else sys.executable)
    failed = False
    peers_described = 0
    for model in args.models.split(","):
        sides = {
            "towerflow": [args.towerflow, "--model", model, "--describe"],
            "pytorch": [py, os.path.join(HERE, "torch_cifar_bench.py"), "--model", model, "--describe"],
            "tensorflow": [py, os.path.join(HERE, "tf_cifar_bench.py"), "--model", model, "--describe"],
        }
        described, skipped = {}, {}
        for name, cmd in sides.items():
            d, why = run_describe(cmd)
            if d is None:
                skipped[name] = why
            else:
                described[name] = d
        if "towerflow" not in described:
            print(f"{model}: towerflow could not describe its step ({skipped['towerflow']})", file=sys.stderr)
            return 2
        ref = facts(described["towerflow"])
        result = {"model": model, "towerflow": {k: v for k, v in ref.items() if not isinstance(v, list)},
                  "peers": {}, "skipped": skipped}
        print(f"{model}: towerflow {ref['parameters']:,} parameters, forward {ref['forward MACs/img']:,} "
              f"MACs/img, backward {ref['backward MACs/img']:,}")
        print(f"  loss       towerflow: {described['towerflow']['loss']}")
        print(f"  optimizer  towerflow: {described['towerflow']['optimizer']}")
        for name, d in described.items():
            if name == "towerflow":
                continue
            peers_described += 1
            got = facts(d)
            diffs = [k for k in ref if got[k] != ref[k]]
            result["peers"][name] = {"same": not diffs, "differs_in": diffs}
            verdict = "the same network and step" if not diffs else "DIFFERS in " + ", ".join(diffs)
            print(f"  {name:10s} {verdict}")
            for k in diffs:
                print(f"    {k}: towerflow {ref[k]}, {name} {got[k]}")
            print(f"    loss: {d['loss']}; optimizer: {d['optimizer']}")
            failed = failed or bool(diffs)
        for name, why in skipped.items():
            print(f"  {name:10s} skipped: {why}")
        if args.json:
            print(json.dumps(result))
    if failed:
        return 1
    if peers_described == 0 and args.skip_code:
        print("no peer is installed here: nothing was compared (scripts/bench.sh --install-peers installs them)")
        return args.skip_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
