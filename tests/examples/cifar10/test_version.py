#!/usr/bin/env python3
"""cifar10_train --version and the version in a run's records, against the source tree itself: the
version project() declares in CMakeLists.txt and the commit git reports for the tree (or "unknown"
for a tree without git history, as CI's copy is).
Usage: test_version.py SOURCE_DIR CIFAR10_TRAIN"""
import json
import pathlib
import re
import shutil
import struct
import subprocess
import sys
import tempfile

SOURCE = pathlib.Path(sys.argv[1]).resolve()
TRAIN = sys.argv[2]
failures = []


def check(cond, what, detail=""):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)
        if detail:
            print(detail)


version = re.search(r"project\(towerflow VERSION ([0-9.]+)", (SOURCE / "CMakeLists.txt").read_text()).group(1)
commit = "unknown"
if (SOURCE / ".git").exists() and shutil.which("git"):
    got = subprocess.run(["git", "-C", str(SOURCE), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    if got.returncode == 0:
        commit = got.stdout.strip()

out = subprocess.run([TRAIN, "--version"], capture_output=True, text=True)
check(out.returncode == 0, "--version exits 0", out.stderr)
check(out.stdout.strip() == f"towerflow {version} (commit {commit})", f"--version prints towerflow {version} (commit {commit})",
      out.stdout)

with tempfile.TemporaryDirectory() as tmp:
    run = subprocess.run([TRAIN, "--max_steps", "1", "--batch_size", "16", "--builtin_train_size", "32",
                          "--builtin_test_size", "16", "--eval_every", "0", "--tensorboard=false", "--loader_threads", "0",
                          "--progress", "json", "--train_dir", str(pathlib.Path(tmp) / "run")], capture_output=True, text=True)
    check(run.returncode == 0, "a one-step run", run.stdout[-1500:] + run.stderr[-1500:])
    start = next((json.loads(l) for l in run.stdout.splitlines() if l.startswith("{") and '"event":"start"' in l), {})
    check(start.get("towerflow") == {"version": version, "commit": commit}, "the JSON start event names the version and commit",
          json.dumps(start.get("towerflow")))
    check(start.get("version") == f"{version} (commit {commit})", "the start-up block's version line")
    # The checkpoint's metadata, read from the safetensors header (8-byte length, then JSON).
    state = pathlib.Path(tmp) / "run" / "ckpt-0000000001" / "train_state.safetensors"
    meta = {}
    if state.exists():
        with open(state, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            meta = json.loads(f.read(n)).get("__metadata__", {})
    check(meta.get("towerflow_version") == version and meta.get("towerflow_commit") == commit,
          "the checkpoint records the version and commit", json.dumps(meta)[:500])

print("all checks passed" if not failures else f"FAILED: {len(failures)} check(s)")
sys.exit(1 if failures else 0)
