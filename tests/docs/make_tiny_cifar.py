#!/usr/bin/env python3
"""Small CIFAR-10 / CIFAR-100 binary sets in the official layout, for tests.

    make_tiny_cifar.py OUT [--cifar100] [--records N] [--archive FILE.tar.gz]

Writes OUT/cifar-10-batches-bin/{data_batch_1..5,test_batch}.bin and batches.meta.txt (N records
per file, default 64; random pixels, labels cycling through the classes), or
OUT/cifar-100-binary/{train,test}.bin and the label-name files; with --archive, also a .tar.gz of
that folder as the official archive holds it, and prints its MD5.
"""
import argparse
import hashlib
import pathlib
import random
import tarfile

CLASSES10 = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def records(n, label_bytes, seed):
    rng = random.Random(seed)
    out = bytearray()
    for i in range(n):
        if label_bytes == 1:
            out += bytes([i % 10])
        else:
            out += bytes([i % 20, i % 100])  # coarse, fine
        out += bytes(rng.getrandbits(8) for _ in range(3072))
    return bytes(out)


def make(out, cifar100=False, n=64):
    out = pathlib.Path(out)
    if cifar100:
        d = out / "cifar-100-binary"
        d.mkdir(parents=True, exist_ok=True)
        (d / "train.bin").write_bytes(records(5 * n, 2, 1))
        (d / "test.bin").write_bytes(records(n, 2, 2))
        (d / "fine_label_names.txt").write_text("".join(f"fine{i}\n" for i in range(100)))
        (d / "coarse_label_names.txt").write_text("".join(f"coarse{i}\n" for i in range(20)))
    else:
        d = out / "cifar-10-batches-bin"
        d.mkdir(parents=True, exist_ok=True)
        for b in range(1, 6):
            (d / f"data_batch_{b}.bin").write_bytes(records(n, 1, b))
        (d / "test_batch.bin").write_bytes(records(n, 1, 6))
        (d / "batches.meta.txt").write_text("\n".join(CLASSES10) + "\n\n")
    return d


def archive(folder, path):
    with tarfile.open(path, "w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    return hashlib.md5(pathlib.Path(path).read_bytes()).hexdigest()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--cifar100", action="store_true")
    p.add_argument("--records", type=int, default=64)
    p.add_argument("--archive")
    a = p.parse_args()
    folder = make(a.out, a.cifar100, a.records)
    if a.archive:
        print(archive(folder, a.archive))
    else:
        print(folder)
