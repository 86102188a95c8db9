#!/usr/bin/env python3
"""Training-throughput benchmark for small CIFAR-10-style CNNs in PyTorch, on the CPU or a GPU.

Synthetic data (random float32 NCHW [B,3,32,32], random int64 labels in [0,10),
fixed seed; one batch generated up front and reused every step).
Each step = zero_grad + forward + cross-entropy + backward + SGD(momentum 0.9,
weight_decay 5e-4) step.

Models
  tfcnn    : conv5x5(3->64,p2)+ReLU, maxpool3x3 s2 p1, conv5x5(64->64,p2)+ReLU,
             maxpool3x3 s2 p1, flatten(64*8*8=4096), fc 4096->384 ReLU,
             fc 384->192 ReLU, fc 192->10.  (No LRN.)
  resnet20 : He et al. 2016 CIFAR ResNet-20: conv3x3(3->16)+BN+ReLU, 3 stages x 3
             BasicBlocks (16/32/64 ch, stride 1/2/2), downsampling shortcut =
             1x1 conv (stride 2, no bias) + BN projection ("option B" style,
             only where shape changes; identity elsewhere), global avg pool, fc 64->10.

FLOPs: forward multiply-accumulates (MACs) of every Conv2d / Linear are counted
analytically from layer shapes (Cout*Hout*Wout*Cin/groups*kh*kw for conv,
in*out for fc; bias adds, BN, ReLU, pooling, loss are NOT counted).
FLOPs = 2*MACs. Training FLOPs per image are approximated as 3x forward FLOPs.

--bf16: forward + loss run under torch.autocast("cpu", dtype=torch.bfloat16) (CPU autocast:
conv/linear/matmul in bf16, ops on autocast's fp32 list in fp32); parameters, gradients and
the SGD update stay fp32 (fp32 master weights); backward runs outside the autocast region,
as autocast recommends. Without --bf16 the step is exactly the fp32 step (no autocast context).

--device cuda[:N]: the model and the batch on that GPU, as PyTorch users run it there: with
--channels-last, and --bf16 or --fp16 as torch.autocast("cuda", ...) (fp16 with a GradScaler, the
dynamic loss scaling towerflow's fp16 also uses). Steps are timed to the loss's .item(), which
waits for the GPU.
"""
import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


# ----------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------
class TFCNN(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 5, padding=2)
        self.pool1 = nn.MaxPool2d(3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(64, 64, 5, padding=2)
        self.pool2 = nn.MaxPool2d(3, stride=2, padding=1)
        self.fc1 = nn.Linear(64 * 8 * 8, 384)
        self.fc2 = nn.Linear(384, 192)
        self.fc3 = nn.Linear(192, num_classes)

    def forward(self, x):
        x = self.pool1(F.relu(self.conv1(x)))
        x = self.pool2(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                nn.BatchNorm2d(cout))
        else:
            self.shortcut = nn.Identity()

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet20(nn.Module):
    def __init__(self, num_classes=10, n=3):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        layers, cin = [], 16
        for cout, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(n):
                layers.append(BasicBlock(cin, cout, stride if i == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layers(x)
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


MODELS = {"tfcnn": TFCNN, "resnet20": ResNet20}


# ----------------------------------------------------------------------------
# Analytic MAC counting (from layer shapes, via a single shape-probing forward)
# ----------------------------------------------------------------------------
def count_forward_macs(model, hw=32):
    rows = []

    def conv_hook(m, inp, out):
        _, cout, ho, wo = out.shape
        kh, kw = m.kernel_size
        macs = cout * ho * wo * (m.in_channels // m.groups) * kh * kw
        rows.append((m._bench_name, "conv", f"{m.in_channels}->{cout} k{kh}x{kw} s{m.stride[0]} out{ho}x{wo}", macs))

    def fc_hook(m, inp, out):
        macs = m.in_features * m.out_features
        rows.append((m._bench_name, "fc", f"{m.in_features}->{m.out_features}", macs))

    hooks = []
    for name, m in model.named_modules():
        m._bench_name = name
        if isinstance(m, nn.Conv2d):
            hooks.append(m.register_forward_hook(conv_hook))
        elif isinstance(m, nn.Linear):
            hooks.append(m.register_forward_hook(fc_hook))
    was_training = model.training
    model.eval()
    with torch.no_grad():
        model(torch.zeros(1, 3, hw, hw))
    model.train(was_training)
    for h in hooks:
        h.remove()
    return rows


def describe(model_name, lr):
    """One image through the model in training mode, its loss and backward, as the step runs them:
    multiply-adds counted by torch.utils.flop_counter (2 FLOPs each), every parameter and buffer."""
    from torch.utils.flop_counter import FlopCounterMode
    torch.manual_seed(0)
    model = MODELS[model_name]()
    model.train()
    x = torch.full((1, 3, 32, 32), 0.5)
    y = torch.tensor([1])
    with FlopCounterMode(display=False) as fwd:
        out = model(x)
    loss = F.cross_entropy(out, y)
    with FlopCounterMode(display=False) as bwd:
        loss.backward()
    layers = [dict(scope=name, op=kind, shape=desc, macs=macs) for name, kind, desc, macs in count_forward_macs(model)]
    return dict(
        framework="pytorch", torch_version=torch.__version__, model=model_name,
        params=sum(p.numel() for p in model.parameters()),
        parameters=[dict(name=n, shape=list(p.shape), trainable=p.requires_grad) for n, p in model.named_parameters()],
        buffers=[dict(name=n, shape=list(b.shape)) for n, b in model.named_buffers() if b.dim() > 0],
        fwd_macs_per_img=fwd.get_total_flops() // 2, bwd_macs_per_img=bwd.get_total_flops() // 2,
        layers=layers, loss="F.cross_entropy, mean over the batch",
        optimizer=f"torch.optim.SGD(lr={lr}, momentum=0.9, weight_decay=5e-4) on every parameter")


# ----------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), default="tfcnn")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads(N)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed warmup steps")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--channels-last", action="store_true",
                    help="(optional extra) use torch.channels_last memory format for model and input")
    ap.add_argument("--bf16", action="store_true",
                    help="wrap forward+loss in torch.autocast(device, dtype=torch.bfloat16); fp32 master weights")
    ap.add_argument("--fp16", action="store_true",
                    help="torch.autocast(device, dtype=torch.float16) with a GradScaler (GPU only)")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    ap.add_argument("--layers", action="store_true", help="print per-layer MAC table")
    ap.add_argument("--json", action="store_true", help="print one JSON result line at the end")
    ap.add_argument("--describe", action="store_true",
                    help="print what one training step computes as one line 'DESCRIBE {json}' and exit "
                         "(bench/peers/check_equivalence.py)")
    args = ap.parse_args()
    if args.describe:
        print("DESCRIBE " + json.dumps(describe(args.model, args.lr)))
        return 0
    device = torch.device(args.device)
    if args.bf16 and args.fp16:
        ap.error("--bf16 and --fp16 exclude each other")
    if args.fp16 and device.type != "cuda":
        ap.error("--fp16 runs on a GPU only (--device cuda)")
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: this PyTorch sees no CUDA device")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    model = MODELS[args.model]()
    rows = count_forward_macs(model)
    fwd_macs = sum(r[3] for r in rows)
    fwd_flops = 2 * fwd_macs
    nparams = sum(p.numel() for p in model.parameters())

    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.batch, 3, 32, 32, generator=g, dtype=torch.float32)
    y = torch.randint(0, 10, (args.batch,), generator=g, dtype=torch.int64)
    model, x, y = model.to(device), x.to(device), y.to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    scaler = torch.amp.GradScaler("cuda") if args.fp16 else None

    def amp_ctx():
        if args.bf16 or args.fp16:
            return torch.autocast(device.type, dtype=torch.bfloat16 if args.bf16 else torch.float16)
        return contextlib.nullcontext()

    def step():
        opt.zero_grad(set_to_none=True)
        with amp_ctx():
            out = model(x)
            loss = F.cross_entropy(out, y)
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss.item()

    print(f"# torch {torch.__version__} | python {platform.python_version()} | "
          f"threads={torch.get_num_threads()} interop={torch.get_num_interop_threads()} | "
          f"model={args.model} batch={args.batch} params={nparams} channels_last={args.channels_last} "
          f"bf16_autocast={args.bf16}")
    print(f"# env OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')} "
          f"ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY')} "
          f"LD_LIBRARY_PATH={os.environ.get('LD_LIBRARY_PATH')}")
    blas = sorted({l.split()[-1] for l in open("/proc/self/maps") if "blas" in l or "lapack" in l})
    print(f"# blas libs mapped: {blas}")
    print(f"# forward MACs/img = {fwd_macs:,}  -> forward FLOPs/img = {fwd_flops:,} "
          f"({fwd_flops/1e6:.2f} MFLOP); train ~3x = {3*fwd_flops/1e6:.2f} MFLOP/img")
    if args.layers:
        for name, kind, desc, macs in rows:
            print(f"#   {name:28s} {kind:4s} {desc:32s} {macs:>12,} MACs")

    losses = []
    t_warm0 = time.perf_counter()
    for _ in range(args.warmup):
        losses.append(step())
    t_warm = time.perf_counter() - t_warm0

    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - t0)

    med = statistics.median(times)
    mean = statistics.fmean(times)
    ips_med = args.batch / med
    ips_mean = args.batch / mean
    train_gflops = ips_med * 3 * fwd_flops / 1e9
    res = dict(
        framework="pytorch", torch_version=torch.__version__, model=args.model, batch=args.batch,
        threads=torch.get_num_threads(), channels_last=args.channels_last, bf16=args.bf16, fp16=args.fp16,
        device=str(device), gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        warmup=args.warmup, steps=args.steps, warmup_total_s=round(t_warm, 4),
        step_ms_median=round(med * 1e3, 3), step_ms_mean=round(mean * 1e3, 3),
        step_ms_min=round(min(times) * 1e3, 3), step_ms_max=round(max(times) * 1e3, 3),
        step_ms_stdev=round(statistics.pstdev(times) * 1e3, 3),
        img_per_s_median=round(ips_med, 2), img_per_s_mean=round(ips_mean, 2),
        fwd_macs_per_img=fwd_macs, fwd_mflop_per_img=round(fwd_flops / 1e6, 3),
        train_gflop_per_s=round(train_gflops, 2), params=nparams,
        loss_first=round(losses[0], 4), loss_last=round(losses[-1], 4),
        ld_library_path=os.environ.get("LD_LIBRARY_PATH"),
        aten_cpu_capability=os.environ.get("ATEN_CPU_CAPABILITY"),
    )
    print(f"{args.model:9s} batch={args.batch} threads={res['threads']}: "
          f"{ips_med:8.1f} img/s (median; mean {ips_mean:.1f})  "
          f"{med*1e3:8.2f} ms/step median [min {min(times)*1e3:.2f}, max {max(times)*1e3:.2f}, "
          f"sd {statistics.pstdev(times)*1e3:.2f}]  fwd {fwd_flops/1e6:.2f} MFLOP/img  "
          f"train ~{train_gflops:.2f} GFLOP/s  loss {losses[0]:.3f}->{losses[-1]:.3f}")
    if args.json:
        print("JSON " + json.dumps(res))


if __name__ == "__main__":
    sys.exit(main())
