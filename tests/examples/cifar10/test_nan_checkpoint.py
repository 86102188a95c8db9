#!/usr/bin/env python3
"""A checkpoint whose weights are NaN: cifar10_eval and cifar10_train's evaluation fail, naming the loss.

Before, every NaN row counted as correct (nothing compares greater than NaN), so cifar10_eval
printed `test_loss nan  test_acc 100.00%` and exited 0. Now top-k counts no row whose logits are
not all finite, and a non-finite test loss ends both programs with NumericalError's status (3)
and a message naming the loss, the causes and the fix.

usage: test_nan_checkpoint.py CIFAR10_TRAIN CIFAR10_EVAL
"""
import json
import pathlib
import struct
import subprocess
import sys
import tempfile

TINY = ["--model", "tfcnn", "--builtin_train_size", "64", "--builtin_test_size", "32", "--batch_size", "32",
        "--loader_threads", "0", "--devices", "/cpu:0,/cpu:1"]


def run(cmd, cwd):
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    print(f"$ {' '.join(cmd)}\n{p.stdout}(exit status {p.returncode})\n")
    return p


def poison(path):
    """Overwrites every F32 tensor of a safetensors file with NaN, as a diverged run would have left it.

    The file's checksum keys (towerflow.crc32c.*) are dropped: it reads as one from another writer,
    which the loader accepts unchecked, so what is tested is the evaluation, not the checksums."""
    data = path.read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_len])
    body = bytearray(data[8 + header_len:])
    nan = struct.pack("<f", float("nan"))
    count = 0
    for name, t in header.items():
        if name == "__metadata__" or t["dtype"] != "F32":
            continue
        begin, end = t["data_offsets"]
        body[begin:end] = nan * ((end - begin) // 4)
        count += 1
    assert count > 0, f"{path} holds no F32 tensor"
    meta = header.get("__metadata__", {})
    for key in [k for k in meta if k.startswith("towerflow.crc32c.")]:
        del meta[key]
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writers pad it
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(body))


def expect(p, what, *needles):
    ok = p.returncode == 3 and all(n in p.stdout for n in needles) and "100.00%" not in p.stdout
    if not ok:
        print(f"FAIL: {what}: expected exit status 3 and {needles} in the output, no 100.00%")
    return ok


def main():
    train_bin, eval_bin = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        p = run([train_bin, *TINY, "--max_steps", "1", "--train_dir", "run"], tmp)
        if p.returncode != 0:
            print("FAIL: the 1-step training run that makes the checkpoint failed")
            return 1
        checkpoints = sorted(pathlib.Path(tmp, "run").glob("ckpt-*"))
        poison(checkpoints[-1] / "model.safetensors")
        ok = expect(run([eval_bin, "--checkpoint", "run", "--loader_threads", "0"], tmp), "cifar10_eval",
                    "test_acc 0.00%", "the test loss of", "is nan", "contain NaN/Inf", "--lr")
        # The resumed run has no step left: fit() evaluates the loaded (NaN) model and stops.
        ok &= expect(run([train_bin, *TINY, "--max_steps", "1", "--train_dir", "run", "--resume"], tmp),
                     "cifar10_train --resume", "the test loss is nan at step 1", "contain NaN/Inf",
                     "lower the learning rate")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
