#!/usr/bin/python3
"""PyTorch twin of towerflow_bench_ops: the same rows (ResNet-20 and tfcnn convolutions at batch
128, forward / backward input / backward weight; batch norm + ReLU; max pool; tfcnn's fc1 GEMM),
channels-last, timed the same way (one warm-up call, median of repetitions for at least
--min_time seconds, at least 3 and at most 50).

  /usr/bin/python3 bench/torch_ops_bench.py [--threads N] [--batch B] [--precision fp32|bf16|both]
                                            [--json] [--filter TEXT]

--precision bf16 (or both) runs the convolutions and the GEMM on bfloat16 tensors, as autocast does
(oneDNN's bf16 kernels; outputs in bf16), beside towerflow_bench_ops --precision's rows.
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


CLOCK = [time.perf_counter]


def median_ms(fn, min_time):
    fn()
    times = []
    while (sum(times) < min_time or len(times) < 3) and len(times) < 50:
        t0 = CLOCK[0]()
        fn()
        times.append(CLOCK[0]() - t0)
    return statistics.median(times) * 1e3


def conv_cases(b):
    # (model, layer, n, h, w, c_in, c_out, k, stride, pad)
    return [
        ("resnet20", "conv1 3->16 32x32", b, 32, 32, 3, 16, 3, 1, 1),
        ("resnet20", "16->16 32x32", b, 32, 32, 16, 16, 3, 1, 1),
        ("resnet20", "16->32 s2 32x32", b, 32, 32, 16, 32, 3, 2, 1),
        ("resnet20", "32->32 16x16", b, 16, 16, 32, 32, 3, 1, 1),
        ("resnet20", "32->64 s2 16x16", b, 16, 16, 32, 64, 3, 2, 1),
        ("resnet20", "64->64 8x8", b, 8, 8, 64, 64, 3, 1, 1),
        ("resnet20", "proj 1x1 16->32 s2", b, 32, 32, 16, 32, 1, 2, 0),
        ("resnet20", "proj 1x1 32->64 s2", b, 16, 16, 32, 64, 1, 2, 0),
        ("tfcnn", "conv1 5x5 3->64 32x32", b, 32, 32, 3, 64, 5, 1, 2),
        ("tfcnn", "conv2 5x5 64->64 16x16", b, 16, 16, 64, 64, 5, 1, 2),
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--min_time", type=float, default=0.3)
    ap.add_argument("--filter", default="")
    ap.add_argument("--precision", choices=["fp32", "bf16", "both"], default="fp32")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cpu_clock", action="store_true",
                    help="process CPU time / threads instead of wall time (busy machines; OpenMP "
                         "spin-waiting then counts as work)")
    args = ap.parse_args()
    if args.cpu_clock:
        CLOCK[0] = lambda: time.process_time() / args.threads
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cl = torch.channels_last
    rows = []

    def wanted(model, layer, op):
        return not args.filter or args.filter in f"{model} {layer} {op}"

    dtypes = [d for d, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"))
              if args.precision in (name, "both")]

    def emit(model, layer, op, shape, ms, gflop=0.0, gbytes=0.0, dtype=torch.float32):
        precision = "bf16" if dtype == torch.bfloat16 else "fp32"
        r = dict(bench="ops", framework="pytorch", torch_version=torch.__version__, threads=args.threads,
                 batch=args.batch, clock="cpu" if args.cpu_clock else "wall", model=model, layer=layer, op=op,
                 precision=precision, shape=shape, ms=round(ms, 4),
                 gflop_per_s=round(gflop / (ms / 1e3), 2), gb_per_s=round(gbytes / (ms / 1e3), 2))
        name = op if precision == "fp32" else f"{op}_{precision}"
        print(f"{model:9s} {layer:24s} {name:19s} {ms:9.3f} {r['gflop_per_s']:9.1f} {r['gb_per_s']:8.1f}", flush=True)
        rows.append(r)

    print(f"# torch {torch.__version__} threads={torch.get_num_threads()} batch={args.batch} channels_last "
          f"clock={'cpu/threads' if args.cpu_clock else 'wall'}")
    print(f"{'model':9s} {'layer':24s} {'op':19s} {'ms':>9s} {'GFLOP/s':>9s} {'GB/s':>8s}")
    with torch.no_grad():
        for model, layer, n, h, w, ci, co, k, s, p in conv_cases(args.batch):
            x32 = torch.randn(n, ci, h, w).contiguous(memory_format=cl)
            wt32 = torch.randn(co, ci, k, k).contiguous(memory_format=cl)
            y32 = F.conv2d(x32, wt32, None, s, p)
            dy32 = torch.randn_like(y32).contiguous(memory_format=cl)
            oh, ow = y32.shape[2], y32.shape[3]
            gflop = 2.0 * n * oh * ow * co * ci * k * k / 1e9
            gbytes = (x32.numel() + y32.numel() + wt32.numel()) * 4 / 1e9
            shape = f"n={n} h={h} w={w} c_in={ci} c_out={co} k={k}x{k} stride={s}x{s} pad={p}x{p}"
            for dtype in dtypes:
                x, wt, dy = (t.to(dtype).contiguous(memory_format=cl) for t in (x32, wt32, dy32))

                def bwd(mask):
                    return lambda: torch.ops.aten.convolution_backward(
                        dy, x, wt, None, [s, s], [p, p], [1, 1], False, [0, 0], 1, mask)

                if wanted(model, layer, "conv_fwd"):
                    emit(model, layer, "conv_fwd", shape, median_ms(lambda: F.conv2d(x, wt, None, s, p), args.min_time),
                         gflop, gbytes, dtype)
                if wanted(model, layer, "conv_bwd_input"):
                    emit(model, layer, "conv_bwd_input", shape, median_ms(bwd([True, False, False]), args.min_time),
                         gflop, gbytes, dtype)
                if wanted(model, layer, "conv_bwd_weight"):
                    emit(model, layer, "conv_bwd_weight", shape, median_ms(bwd([False, True, False]), args.min_time),
                         gflop, gbytes, dtype)

        for hw, c in ((32, 16), (16, 32), (8, 64)):
            layer = f"bn {c}ch {hw}x{hw}"
            x = torch.randn(args.batch, c, hw, hw).contiguous(memory_format=cl)
            dy = torch.randn_like(x).contiguous(memory_format=cl)
            g, b = torch.randn(c), torch.randn(c)
            rm, rv = torch.zeros(c), torch.ones(c)
            nbytes = x.numel() * 4 / 1e9
            shape = f"rows={args.batch * hw * hw} c={c}"

            def fwd():
                return F.relu(torch.ops.aten.native_batch_norm(x, g, b, rm, rv, True, 0.1, 1e-5)[0])

            if wanted("resnet20", layer, "bn_relu_fwd"):
                emit("resnet20", layer, "bn_relu_fwd", shape, median_ms(fwd, args.min_time), 0.0, 3 * nbytes)
            if wanted("resnet20", layer, "bn_relu_bwd"):
                out, mean, invstd = torch.ops.aten.native_batch_norm(x, g, b, rm, rv, True, 0.1, 1e-5)
                y = F.relu(out)

                def bwd():
                    gm = torch.ops.aten.threshold_backward(dy, y, 0.0)
                    return torch.ops.aten.native_batch_norm_backward(gm, x, g, rm, rv, mean, invstd, True, 1e-5,
                                                                     [True, True, True])

                emit("resnet20", layer, "bn_relu_bwd", shape, median_ms(bwd, args.min_time), 0.0, 7 * nbytes)

        for hw in (32, 16):
            layer = f"maxpool 3x3 s2 {hw}x{hw}"
            x = torch.randn(args.batch, 64, hw, hw).contiguous(memory_format=cl)
            y, idx = F.max_pool2d(x, 3, 2, 1, return_indices=True)
            dy = torch.randn_like(y).contiguous(memory_format=cl)
            nbytes = (x.numel() + 2 * y.numel()) * 4 / 1e9
            shape = f"n={args.batch} h={hw} w={hw} c=64 k=3x3 stride=2x2 pad=1x1"
            if wanted("tfcnn", layer, "maxpool_fwd"):
                emit("tfcnn", layer, "maxpool_fwd", shape,
                     median_ms(lambda: F.max_pool2d(x, 3, 2, 1, return_indices=True), args.min_time), 0.0, nbytes)
            if wanted("tfcnn", layer, "maxpool_bwd"):
                emit("tfcnn", layer, "maxpool_bwd", shape,
                     median_ms(lambda: torch.ops.aten.max_pool2d_with_indices_backward(
                         dy, x, [3, 3], [2, 2], [1, 1], [1, 1], False, idx), args.min_time), 0.0, nbytes)

        if wanted("tfcnn", "fc1 4096->384", "gemm"):
            for dtype in dtypes:
                a = torch.randn(args.batch, 4096).to(dtype)
                wt = torch.randn(384, 4096).to(dtype)
                emit("tfcnn", "fc1 4096->384", "gemm_nt", f"m={args.batch} n=384 k=4096",
                     median_ms(lambda: torch.mm(a, wt.t()), args.min_time), 2.0 * args.batch * 384 * 4096 / 1e9,
                     0.0, dtype)

    if args.json:
        for r in rows:
            print(json.dumps(r))


if __name__ == "__main__":
    main()
