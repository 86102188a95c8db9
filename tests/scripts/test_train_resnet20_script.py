#!/usr/bin/env python3
"""scripts/train_resnet20_cifar10.sh started from another directory: its DATA_DIR and TRAIN_DIR
are the caller's relative paths, and a second start resumes the checkpoint it left there.
Usage: test_train_resnet20_script.py SOURCE_DIR BUILD_DIR"""
import os
import pathlib
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "docs"))
import make_tiny_cifar  # noqa: E402

SOURCE = pathlib.Path(sys.argv[1]).resolve()
BUILD = pathlib.Path(sys.argv[2]).resolve()
failures = []


def check(cond, what, detail=""):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)
        if detail:
            print(detail)


with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    repo, caller = tmp / "repo", tmp / "caller"
    repo.mkdir()
    caller.mkdir()
    (repo / "scripts").symlink_to(SOURCE / "scripts")
    (repo / "build").symlink_to(BUILD)
    make_tiny_cifar.make(caller / "data")  # caller/data/cifar-10-batches-bin, 64 images a file
    quick = ["--batch_size", "32", "--warmup_epochs", "0", "--eval_every", "0", "--save_every", "0",
             "--log_every", "1", "--tensorboard=false", "--loader_threads", "0", "--progress", "plain"]

    def start(steps):
        return subprocess.run(["../repo/scripts/train_resnet20_cifar10.sh", "data/cifar-10-batches-bin", "run",
                               *quick, "--max_steps", str(steps)],
                              cwd=caller, env={**os.environ, "EPOCHS": "1"}, capture_output=True, text=True)

    first = start(1)
    check(first.returncode == 0, "the script trains from relative paths given in another directory",
          first.stdout[-2000:] + first.stderr[-2000:])
    check((caller / "run" / "ckpt-0000000001").is_dir(), "the checkpoint is in the caller's run/, not the repository's")
    check(not (repo / "run").exists(), "nothing was written under the repository")
    second = start(2)
    check(second.returncode == 0 and (caller / "run" / "ckpt-0000000002").is_dir(),
          "started again, it resumes the caller's run/", second.stdout[-2000:] + second.stderr[-2000:])
    check("ckpt-0000000001 (step 1)" in second.stdout, "the second start says it resumed from step 1",
          second.stdout[-2000:])

print(f"{'FAILED' if failures else 'passed'}: {len(failures)} of the checks failed" if failures else "all checks passed")
sys.exit(1 if failures else 0)
