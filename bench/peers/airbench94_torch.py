#!/usr/bin/env python3
"""The "airbench94" CIFAR-10 speed recipe (Keller Jordan, arXiv 2404.00498) in plain PyTorch: a
reference to time and score towerflow against, written from the recipe's published facts.

    airbench94_torch.py --data DIR [--device cpu|cuda[:N]] [--threads N] [--seeds 0,1,2] [--json]

--data: a CIFAR-10 binary folder (data_batch_1..5.bin, test_batch.bin: records of 1 label byte +
3072 pixel bytes, R, G, B planes) or an image-folder root (train/<class>/*.jpg, test/<class>/*.jpg,
decoded with Pillow; files sorted per class, classes in CIFAR-10 order, then shuffled exactly as
cifar10_jpeg_to_bin.py (the data archive's converter) shuffles them, so both forms give the same tensors).
Everything is loaded once as uint8 (load_s, not part of time_s).

Recipe
  Input: pixels/255, mean (0.4914, 0.4822, 0.4465), std (0.2470, 0.2435, 0.2616); float32
    (--half on CUDA: fp16 model, batch norms kept fp32, as the original runs).
  Net: conv2x2(3->24, bias, no padding: the whitening layer) -> GELU -> three ConvGroups of widths
    64, 256, 256, each conv3x3(no bias) -> MaxPool2d(2) -> BN -> GELU -> conv3x3 -> BN -> GELU ->
    MaxPool2d(3) -> flatten -> Linear(256, 10, no bias) -> x 1/9. Convs: PyTorch's default init,
    bias zeroed, dirac_ on the first in_channels filters. BN: eps 1e-12, momentum 0.4 (PyTorch's
    convention), weight frozen at 1, bias trained.
  Whitening: the first 5000 training images (stored order, no augmentation), every 2x2 patch
    (stride 1) flattened (c, h, w); cov = P^T P / n (no mean removed), computed in float32; eigh,
    descending; filters = eigenvectors / sqrt(eigenvalue + 5e-4), weight = cat(filters, -filters),
    frozen. Its bias trains during epochs 0-2 only.
  Training: batch 1024, drop_last, fresh permutation per epoch, 9.9 epochs = ceil(48 * 9.9) = 476
    steps. SGD nesterov, momentum 0.85; kilostep_scale = 1024 * (1 + 1/(1 - 0.85)); lr = 11.5 /
    kilostep_scale, wd = 0.0153 * 1024 / kilostep_scale; BN biases ('norm' in the name): lr 64*lr,
    weight_decay wd/(64*lr); the rest: lr, weight_decay wd/lr. LR factor: 0.2 -> 1.0 linearly over
    the first int(0.23 * steps) steps, then 1.0 -> 0.07 linearly to the end.
    Loss: cross entropy, label smoothing 0.2, summed over the batch.
  Lookahead: an EMA copy of the float state (params and BN running stats); every 5th step
    ema.lerp_(param, 1 - 0.95**5 * (step/steps)**3) and param := ema; after the last step param := ema.
  Augmentation: "alternating flip" (each image flipped with p=0.5 once, before epoch 0; every odd
    epoch all images flipped relative to that) and translate (reflect-pad 2, random 32x32 crop,
    per image per epoch).
  Evaluation: batches of 2000; per-epoch accuracy without TTA (untimed); final with TTA level 2:
    0.5 * mirror(x) + 0.5 * mean over {reflect-pad 1 then crop [0:32,0:32], [2:34,2:34]} of
    mirror(t), where mirror(t) = 0.5 * net(t) + 0.5 * net(flip(t)).

Timing (time_s): wall clock from just before whitening to the end of the final TTA evaluation:
whitening, the lookahead copy, every training step with its augmentation and batching, and the
final evaluation. Not counted: loading, building the net and optimizer, the per-epoch plain
evaluations (the clock pauses around them). On CUDA the device is synchronised before each reading.
"""
import argparse
import json
import math
import os
import platform
import random
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
SHUFFLE_SEED = 20261122  # the order cifar10_jpeg_to_bin.py gives the binary files


# ---------------------------------------------------------------------------- data
def read_bin(path):
    with open(path, "rb") as fh:
        raw = bytearray(fh.read())
    if len(raw) % 3073:
        sys.exit(f"{path}: {len(raw)} bytes is not a whole number of 3073-byte CIFAR-10 records")
    rec = torch.frombuffer(raw, dtype=torch.uint8).view(-1, 3073) if raw else torch.empty((0, 3073), dtype=torch.uint8)
    return rec[:, 1:].reshape(-1, 3, 32, 32).clone(), rec[:, 0].long()


def read_folder(split_dir, rng):
    try:
        from PIL import Image
    except ImportError:
        sys.exit(f"--data {os.path.dirname(split_dir)} is an image folder, which needs Pillow "
                 "(pip install pillow); or convert it with cifar10_jpeg_to_bin.py and pass the binary folder")
    names = list(CLASSES) if all(os.path.isdir(os.path.join(split_dir, c)) for c in CLASSES) else \
        sorted(d for d in os.listdir(split_dir) if os.path.isdir(os.path.join(split_dir, d)))
    recs = []
    for label, name in enumerate(names):
        folder = os.path.join(split_dir, name)
        for f in sorted(os.listdir(folder)):
            with Image.open(os.path.join(folder, f)) as im:
                im = im.convert("RGB")
            if im.size != (32, 32):
                sys.exit(f"{os.path.join(folder, f)}: {im.size[0]}x{im.size[1]}, not 32x32")
            recs.append((label, im.tobytes()))
    rng.shuffle(recs)
    pixels = torch.frombuffer(bytearray(b"".join(r[1] for r in recs)), dtype=torch.uint8)
    return pixels.view(-1, 32, 32, 3).permute(0, 3, 1, 2).contiguous(), torch.tensor([r[0] for r in recs])


def load_data(root):
    if os.path.isfile(os.path.join(root, "data_batch_1.bin")):
        parts = [read_bin(os.path.join(root, f"data_batch_{i}.bin")) for i in range(1, 6)]
        train = (torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]))
        return train, read_bin(os.path.join(root, "test_batch.bin"))
    if os.path.isdir(os.path.join(root, "train")) and os.path.isdir(os.path.join(root, "test")):
        rng = random.Random(SHUFFLE_SEED)
        return read_folder(os.path.join(root, "train"), rng), read_folder(os.path.join(root, "test"), rng)
    sys.exit(f"--data {root}: neither a CIFAR-10 binary folder (data_batch_1.bin) "
             "nor an image folder (train/, test/)")


class Normalise:
    def __init__(self, device, dtype):
        std = torch.tensor(STD, device=device).view(1, 3, 1, 1)
        self.scale, self.shift = 1 / (255 * std), -torch.tensor(MEAN, device=device).view(1, 3, 1, 1) / std
        self.dtype, self.channels_last = dtype, device.type == "cuda"

    def __call__(self, x_u8, plain=False):
        """uint8 [N, 3, 32, 32] -> normalised, in the model's dtype and layout (plain: float32, NCHW)."""
        x = x_u8.float() * self.scale + self.shift
        if plain:
            return x
        x = x.to(self.dtype)
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x


def crop(padded, offsets, size=32):
    """padded[b, :, dy:dy+size, dx:dx+size] for each image b, with (dy, dx) = offsets[b]."""
    ar = torch.arange(size, device=padded.device)
    rows, cols = offsets[:, 0:1] + ar, offsets[:, 1:2] + ar
    b = torch.arange(padded.shape[0], device=padded.device).view(-1, 1, 1, 1)
    c = torch.arange(padded.shape[1], device=padded.device).view(1, -1, 1, 1)
    return padded[b, c, rows[:, None, :, None], cols[:, None, None, :]]


# ---------------------------------------------------------------------------- net
def make_conv(cin, cout, kernel, padding, bias):
    conv = nn.Conv2d(cin, cout, kernel, padding=padding, bias=bias)  # PyTorch's default init
    with torch.no_grad():
        if conv.bias is not None:
            conv.bias.zero_()
        nn.init.dirac_(conv.weight[:cin])
    return conv


def make_norm(channels):
    norm = nn.BatchNorm2d(channels, eps=1e-12, momentum=0.4)
    norm.weight.requires_grad_(False)
    return norm


class ConvGroup(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv1, self.pool, self.norm1 = make_conv(cin, cout, 3, 1, False), nn.MaxPool2d(2), make_norm(cout)
        self.conv2, self.norm2, self.activ = make_conv(cout, cout, 3, 1, False), make_norm(cout), nn.GELU()

    def forward(self, x):
        x = self.activ(self.norm1(self.pool(self.conv1(x))))
        return self.activ(self.norm2(self.conv2(x)))


class Mul(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return x * self.scale


def make_net():
    net = nn.Sequential(make_conv(3, 24, 2, 0, True), nn.GELU(), ConvGroup(24, 64), ConvGroup(64, 256),
                        ConvGroup(256, 256), nn.MaxPool2d(3), nn.Flatten(), nn.Linear(256, 10, bias=False),
                        Mul(1 / 9))
    net[0].weight.requires_grad_(False)
    return net


@torch.no_grad()
def init_whitening(conv, images, eps=5e-4):
    """images: normalised float32 [N, 3, 32, 32]."""
    c, (h, w) = images.shape[1], conv.weight.shape[2:]
    patches = images.unfold(2, h, 1).unfold(3, w, 1).permute(0, 2, 3, 1, 4, 5).reshape(-1, c * h * w)
    cov = patches.T @ patches / patches.shape[0]
    evals, evecs = torch.linalg.eigh(cov)  # ascending
    evals, filters = evals.flip(0), evecs.T.flip(0).reshape(-1, c, h, w)
    filters = filters / torch.sqrt(evals + eps).view(-1, 1, 1, 1)
    conv.weight.copy_(torch.cat([filters, -filters]))


class Lookahead:
    def __init__(self, net):
        self.ema = {k: v.detach().clone() for k, v in net.state_dict().items() if v.is_floating_point()}

    @torch.no_grad()
    def update(self, net, decay):
        state = net.state_dict()
        for k, ema in self.ema.items():
            ema.lerp_(state[k], 1 - decay)
            state[k].copy_(ema)


def lr_factor(step, total):
    warmup = int(0.23 * total)
    if step < warmup:
        f = step / warmup
        return 0.2 * (1 - f) + 1.0 * f
    f = (step - warmup) / (total - warmup) if total > warmup else 1.0
    return 1.0 * (1 - f) + 0.07 * f


@torch.no_grad()
def evaluate(net, images, labels, norm, tta):
    def mirror(x):
        return 0.5 * net(x) + 0.5 * net(x.flip(-1))

    net.eval()
    correct = 0
    for i in range(0, len(images), 2000):
        x = norm(images[i:i + 2000])
        if tta == 0:
            logits = net(x)
        elif tta == 1:
            logits = mirror(x)
        else:
            padded = F.pad(x, (1,) * 4, mode="reflect")
            shifted = 0.5 * mirror(padded[:, :, 0:32, 0:32]) + 0.5 * mirror(padded[:, :, 2:34, 2:34])
            logits = 0.5 * mirror(x) + 0.5 * shifted
        correct += (logits.argmax(1) == labels[i:i + 2000]).sum().item()
    net.train()
    return correct / len(images)


class Clock:
    """Wall clock that can pause; synchronises the GPU before each reading."""

    def __init__(self, device):
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.total, self.since = 0.0, None

    def start(self):
        self.sync()
        self.since = time.perf_counter()

    def stop(self):
        self.sync()
        self.total += time.perf_counter() - self.since
        self.since = None
        return self.total


# ---------------------------------------------------------------------------- one run
def run(args, data, seed, device, emit):
    (train_x, train_y), (test_x, test_y) = data
    n, batch = len(train_x), args.batch
    steps_per_epoch = n // batch
    total = math.ceil(steps_per_epoch * args.epochs)
    dtype = torch.float16 if args.half else torch.float32
    norm = Normalise(device, dtype)

    torch.manual_seed(seed)
    net = make_net().to(device)
    if device.type == "cuda":
        net = net.to(memory_format=torch.channels_last)
    if args.half:
        net = net.half()
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.float()
    kilostep_scale = 1024 * (1 + 1 / (1 - 0.85))
    lr, wd = 11.5 / kilostep_scale, 0.0153 * 1024 / kilostep_scale
    lr_biases = 64 * lr
    params = [(k, p) for k, p in net.named_parameters() if p.requires_grad]
    optimizer = torch.optim.SGD([
        dict(params=[p for k, p in params if "norm" in k], lr=lr_biases, weight_decay=wd / lr_biases),
        dict(params=[p for k, p in params if "norm" not in k], lr=lr, weight_decay=wd / lr)],
        momentum=0.85, nesterov=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, total))
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.2, reduction="none")

    clock = Clock(device)
    clock.start()
    init_whitening(net[0], norm(train_x[:5000], plain=True))
    whiten_s = clock.stop()
    clock.start()
    lookahead = None if args.no_lookahead else Lookahead(net)
    stored_flip = torch.rand(n, device=device) < 0.5
    step, val_acc = 0, None
    for epoch in range(math.ceil(args.epochs)):
        net[0].bias.requires_grad_(epoch < 3)
        perm = torch.randperm(n, device=device)
        if args.flip == "alternating":
            flips = stored_flip ^ (epoch % 2 == 1)
        elif args.flip == "random":
            flips = torch.rand(n, device=device) < 0.5
        else:
            flips = None
        offsets = torch.randint(0, 5, (n, 2), device=device)
        for i in range(steps_per_epoch):
            idx = perm[i * batch:(i + 1) * batch]
            x, y = norm(train_x[idx]), train_y[idx]
            if flips is not None:
                x = torch.where(flips[idx].view(-1, 1, 1, 1), x.flip(-1), x)
            x = crop(F.pad(x, (2,) * 4, mode="reflect"), offsets[idx])
            outputs = net(x)
            loss = loss_fn(outputs, y).sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            if lookahead is not None:
                if step % 5 == 0:
                    lookahead.update(net, 0.95 ** 5 * (step / total) ** 3)
                if step == total:
                    lookahead.update(net, 1.0)
            if step == total:
                break
        elapsed = clock.stop()  # the per-epoch evaluation is not timed
        train_loss = loss.item() / len(y)
        train_acc = (outputs.detach().argmax(1) == y).float().mean().item()
        val_acc = evaluate(net, test_x, test_y, norm, 0)
        emit(dict(kind="epoch", seed=seed, epoch=epoch + 1, step=step, time_s=round(elapsed, 4),
                  train_loss=round(train_loss, 6), train_acc=train_acc, val_acc=val_acc),
             f"seed {seed} epoch {epoch + 1:2d} step {step:4d}/{total} train_loss {train_loss:.4f} "
             f"train_acc {train_acc:.4f} val_acc {val_acc:.4f} time {elapsed:.2f}s")
        clock.start()
    tta_start = clock.stop()
    clock.start()
    acc_tta = evaluate(net, test_x, test_y, norm, args.tta)
    time_s = clock.stop()
    return dict(steps=step, time_s=time_s, whiten_s=whiten_s, tta_eval_s=time_s - tta_start,
                acc_tta=acc_tta, acc_plain=val_acc)


# ---------------------------------------------------------------------------- main
def cpu_name():
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="CIFAR-10 binary folder or image-folder root")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    ap.add_argument("--threads", type=int, default=cores, help="torch.set_num_threads (default: all cores)")
    ap.add_argument("--seeds", default="0", help="comma-separated; one run each")
    ap.add_argument("--epochs", type=float, default=9.9)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--flip", choices=["alternating", "random", "none"], default="alternating")
    ap.add_argument("--tta", type=int, choices=[0, 1, 2], default=2)
    ap.add_argument("--no-lookahead", action="store_true")
    ap.add_argument("--half", action="store_true", help="CUDA only: fp16 model, batch norms fp32")
    ap.add_argument("--limit-train", type=int, default=None, help="use the first N training images")
    ap.add_argument("--limit-test", type=int, default=None, help="use the first N test images")
    ap.add_argument("--json", action="store_true", help="JSON lines on stdout (progress goes to stderr)")
    ap.add_argument("--jsonl", default=None, help="append the JSON lines to this file")
    ap.add_argument("--warmup-run", action=argparse.BooleanOptionalAction, default=None,
                    help="one untimed throwaway run first (default: on for CUDA, off for the CPU)")
    args = ap.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit(f"--device {args.device}: this PyTorch sees no CUDA device")
        torch.backends.cudnn.benchmark = True
    elif args.half:
        sys.exit("--half is for --device cuda; the CPU runs float32")
    if args.epochs <= 0 or args.batch <= 0:
        sys.exit(f"--epochs {args.epochs} --batch {args.batch}: both must be positive")
    torch.set_num_threads(args.threads)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]

    def emit(record, progress=None):
        if progress:
            print(progress, file=sys.stderr if args.json else sys.stdout, flush=True)
        line = json.dumps(record)
        if args.json:
            print(line, flush=True)
        if args.jsonl:
            with open(args.jsonl, "a") as fh:
                fh.write(line + "\n")

    t0 = time.perf_counter()
    (train_x, train_y), (test_x, test_y) = load_data(args.data)
    train_x, train_y = train_x[:args.limit_train], train_y[:args.limit_train]
    test_x, test_y = test_x[:args.limit_test], test_y[:args.limit_test]
    data = tuple((x.to(device), y.to(device)) for x, y in ((train_x, train_y), (test_x, test_y)))
    load_s = time.perf_counter() - t0
    if len(train_x) < args.batch or len(test_x) == 0:
        sys.exit(f"{len(train_x)} training and {len(test_x)} test images: need at least one batch "
                 f"({args.batch}) of training images and one test image")

    if args.warmup_run if args.warmup_run is not None else device.type == "cuda":
        run(args, data, seeds[0], device, lambda record, progress=None: None)
    common = dict(device=str(device), threads=torch.get_num_threads(), torch=torch.__version__,
                  cpu=cpu_name(), epochs=args.epochs, flip=args.flip, tta=args.tta, lookahead=not args.no_lookahead,
                  load_s=round(load_s, 4))
    results = []
    for seed in seeds:
        r = run(args, data, seed, device, emit)
        results.append(r)
        emit(dict(kind="run", seed=seed, device=common["device"], threads=common["threads"],
                  torch=common["torch"], cpu=common["cpu"], epochs=args.epochs, steps=r["steps"],
                  time_s=round(r["time_s"], 4), whiten_s=round(r["whiten_s"], 4),
                  tta_eval_s=round(r["tta_eval_s"], 4), acc_tta=r["acc_tta"], acc_plain=r["acc_plain"],
                  flip=args.flip, tta=args.tta, lookahead=common["lookahead"], load_s=common["load_s"]),
             f"seed {seed}: acc_tta {r['acc_tta']:.4f} acc_plain {r['acc_plain']:.4f} "
             f"time {r['time_s']:.2f}s (whiten {r['whiten_s']:.2f}s, tta eval {r['tta_eval_s']:.2f}s)")

    def spread(key):
        values = [r[key] for r in results]
        return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0

    (acc_mean, acc_std), (time_mean, time_std) = spread("acc_tta"), spread("time_s")
    emit(dict(kind="summary", runs=len(results), seeds=seeds, acc_tta_mean=acc_mean, acc_tta_std=acc_std,
              time_s_mean=round(time_mean, 4), time_s_std=round(time_std, 4), **common),
         f"{len(results)} runs: acc_tta {acc_mean:.4f} +- {acc_std:.4f}, time {time_mean:.2f} +- {time_std:.2f}s")


if __name__ == "__main__":
    main()
