#!/usr/bin/env python3
"""CPU data-parallel training-throughput benchmark: PyTorch DistributedDataParallel
(gloo backend, 127.0.0.1) with N processes x T intra-op threads.

Same models, data and step as torch_cifar_bench.py (imported from it, not copied):
  * model init torch.manual_seed(seed); DDP broadcasts rank 0's weights at wrap time.
  * one synthetic batch: torch.randn(B,3,32,32) + randint(0,10,(B,)) from a Generator seeded
    with `seed` -- the *global* batch is generated exactly as in torch_cifar_bench.py and then
    split evenly: rank r uses rows [r*B/N, (r+1)*B/N). The same slice is reused every step.
  * step = zero_grad(set_to_none) + forward + cross_entropy (mean over the local batch) +
    backward (DDP averages gradients over ranks, so the update equals the global-batch mean) +
    SGD(lr, momentum 0.9, weight_decay 5e-4).step() + loss.item().
  * BatchNorm (resnet20) uses per-rank batch statistics (plain BatchNorm2d, not SyncBatchNorm);
    DDP's default broadcast_buffers=True re-broadcasts rank 0's BN running stats every forward.

Phases (all ranks together):
  1. --warmup synced DDP steps (untimed; DDP rebuilds its buckets after the first one).
  2. --steps synced DDP steps, each timed with perf_counter on every rank.
  3. parameter checksum gathered from all ranks (must be identical after synced steps).
  4. --nosync-steps steps inside ddp.no_sync() (no gradient all-reduce; each rank applies its own
     local gradient), timed the same way: this is the compute-only baseline for the same split.
     (default = --steps; 0 skips it)

All-reduce timing (default; --no-comm-timing turns it off and uses DDP's built-in C++ hook):
  a DDP comm hook that does exactly what the default hook does (divide bucket by world size,
  async gloo all_reduce) and records, per bucket, the perf_counter time at launch and at future
  completion. Per step it reports
    allreduce_busy_ms   : sum over buckets of (completion - launch)  (may overlap backward compute)
    allreduce_span_ms   : last completion - first launch
    allreduce_exposed_ms: backward() return time - time the last gradient was produced
                          (a tensor hook on the first layer's weight, whose grad is computed last).
                          This is the part of the step spent waiting for the all-reduce after all
                          backward compute finished, plus DDP's copy of the bucket back into .grad.
  and, independently of the hook, sync_minus_nosync_ms = median(synced step) - median(no_sync step).

Rank 0 prints one human-readable line and (with --json) one line "JSON {...}".
img/s = global batch / rank-0 median step time.
"""
import argparse
import contextlib
import json
import os
import platform
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_cifar_bench import MODELS, count_forward_macs  # noqa: E402


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _med(v):
    return statistics.median(v) if v else None


def _r(v, nd=3):
    return None if v is None else round(v, nd)


class CommRecorder:
    """State object for the timing comm hook: (bucket_index, t_launch, t_done, numel) per bucket."""

    def __init__(self, world):
        self.world = world
        self.events = []


def timed_allreduce_hook(state, bucket):
    # Same work as torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook,
    # plus timestamps.
    t0 = time.perf_counter()
    tensor = bucket.buffer()
    idx = bucket.index()
    tensor.div_(state.world)
    fut = dist.all_reduce(tensor, async_op=True).get_future()

    def _done(f):
        state.events.append((idx, t0, time.perf_counter(), tensor.numel()))
        return f.value()[0]

    return fut.then(_done)


def worker(rank, args, port):
    torch.set_num_threads(args.threads)
    if args.pin:
        ncpu = os.cpu_count()
        cores = {(rank * args.threads + i) % ncpu for i in range(args.threads)}
        os.sched_setaffinity(0, cores)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=args.procs)
    world = dist.get_world_size()

    torch.manual_seed(args.seed)
    model = MODELS[args.model]()
    fwd_macs = sum(r[3] for r in count_forward_macs(model))
    fwd_flops = 2 * fwd_macs
    nparams = sum(p.numel() for p in model.parameters())

    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.batch, 3, 32, 32, generator=g, dtype=torch.float32)
    y = torch.randint(0, 10, (args.batch,), generator=g, dtype=torch.int64)
    per = args.batch // world
    x = x[rank * per:(rank + 1) * per].contiguous()
    y = y[rank * per:(rank + 1) * per].contiguous()
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    model.train()

    ddp = DDP(model, broadcast_buffers=not args.no_broadcast_buffers,
              bucket_cap_mb=args.bucket_cap_mb)
    rec = CommRecorder(world)
    if not args.no_comm_timing:
        ddp.register_comm_hook(state=rec, hook=timed_allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)

    # The first parameter (conv1.weight in both models) gets its gradient last in backward.
    marks = {"last_grad": None}
    first_param = next(model.parameters())

    def _mark(grad):
        marks["last_grad"] = time.perf_counter()

    first_param.register_hook(_mark)

    def step(sync):
        rec.events.clear()
        marks["last_grad"] = None
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with (contextlib.nullcontext() if sync else ddp.no_sync()):
            out = ddp(x)
            loss = F.cross_entropy(out, y)
            tb0 = time.perf_counter()
            loss.backward()
            tb1 = time.perf_counter()
        opt.step()
        lv = loss.item()
        t1 = time.perf_counter()
        r = dict(step=t1 - t0, fwd=tb0 - t0, bwd=tb1 - tb0, loss=lv)
        if sync and rec.events:
            ev = list(rec.events)
            r["busy"] = sum(e[2] - e[1] for e in ev)
            r["span"] = max(e[2] for e in ev) - min(e[1] for e in ev)
            r["nbuckets"] = len(ev)
            r["bucket_numel"] = [e[3] for e in sorted(ev)]
            if marks["last_grad"] is not None:
                r["exposed"] = max(0.0, tb1 - marks["last_grad"])
                # how long after the last gradient was produced the final all-reduce completed
                r["last_done_after_last_grad"] = max(e[2] for e in ev) - marks["last_grad"]
        return r

    if rank == 0:
        print(f"# torch {torch.__version__} | python {platform.python_version()} | gloo DDP "
              f"procs={world} threads/proc={torch.get_num_threads()} "
              f"interop={torch.get_num_interop_threads()} | model={args.model} "
              f"global batch={args.batch} (per rank {per}) params={nparams} "
              f"channels_last={args.channels_last} pin={args.pin}", flush=True)
        print(f"# env OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')} "
              f"LD_LIBRARY_PATH={os.environ.get('LD_LIBRARY_PATH')} "
              f"GLOO_SOCKET_IFNAME={os.environ.get('GLOO_SOCKET_IFNAME')}", flush=True)
        blas = sorted({l.split()[-1] for l in open("/proc/self/maps") if "blas" in l or "lapack" in l})
        print(f"# blas libs mapped (rank 0): {blas}", flush=True)

    losses = []
    dist.barrier()
    tw0 = time.perf_counter()
    for _ in range(args.warmup):
        losses.append(step(True)["loss"])
    t_warm = time.perf_counter() - tw0

    dist.barrier()
    sync_recs = [step(True) for _ in range(args.steps)]
    losses += [r["loss"] for r in sync_recs]

    # parameters must be identical on all ranks after synced steps
    with torch.no_grad():
        csum = float(sum(p.double().sum() for p in model.parameters()))
    all_csum = [None] * world
    dist.all_gather_object(all_csum, csum)

    nosync_recs = []
    if args.nosync_steps > 0:
        dist.barrier()
        for _ in range(min(2, args.nosync_steps)):  # untimed: settle after the phase switch
            step(False)
        nosync_recs = [step(False) for _ in range(args.nosync_steps)]
    dist.barrier()

    def summ(recs, key):
        return _med([r[key] for r in recs if key in r])

    local = dict(
        rank=rank,
        step_times=[r["step"] for r in sync_recs],
        step_med=summ(sync_recs, "step"), fwd_med=summ(sync_recs, "fwd"), bwd_med=summ(sync_recs, "bwd"),
        busy_med=summ(sync_recs, "busy"), span_med=summ(sync_recs, "span"),
        exposed_med=summ(sync_recs, "exposed"),
        last_done_med=summ(sync_recs, "last_done_after_last_grad"),
        nbuckets=sync_recs[-1].get("nbuckets") if sync_recs else None,
        bucket_numel=sync_recs[-1].get("bucket_numel") if sync_recs else None,
        nosync_med=summ(nosync_recs, "step"), nosync_fwd_med=summ(nosync_recs, "fwd"),
        nosync_bwd_med=summ(nosync_recs, "bwd"),
        loss_first=losses[0] if losses else None, loss_last=losses[-1] if losses else None,
    )
    gathered = [None] * world
    dist.all_gather_object(gathered, local)

    if rank == 0:
        times = local["step_times"]
        med = statistics.median(times)
        mean = statistics.fmean(times)
        ips = args.batch / med
        # per-step slowest rank (ranks are coupled by the all-reduce, so this is ~ rank 0's)
        per_step_max = [max(gr["step_times"][i] for gr in gathered) for i in range(len(times))]
        ns = local["nosync_med"]
        ex = local["exposed_med"]
        res = dict(
            framework="pytorch", mode="ddp", backend="gloo", torch_version=torch.__version__,
            model=args.model, batch=args.batch, batch_per_rank=per, procs=world,
            threads=torch.get_num_threads(), channels_last=args.channels_last, pin=args.pin,
            broadcast_buffers=not args.no_broadcast_buffers, bucket_cap_mb=args.bucket_cap_mb,
            comm_timing_hook=not args.no_comm_timing,
            warmup=args.warmup, steps=args.steps, nosync_steps=args.nosync_steps,
            warmup_total_s=round(t_warm, 4),
            step_ms_median=round(med * 1e3, 3), step_ms_mean=round(mean * 1e3, 3),
            step_ms_min=round(min(times) * 1e3, 3), step_ms_max=round(max(times) * 1e3, 3),
            step_ms_stdev=round(statistics.pstdev(times) * 1e3, 3),
            img_per_s_median=round(ips, 2), img_per_s_mean=round(args.batch / mean, 2),
            step_ms_median_slowest_rank=round(statistics.median(per_step_max) * 1e3, 3),
            per_rank_step_ms_median=[_r(gr["step_med"] * 1e3) for gr in gathered],
            fwd_ms_median=_r(local["fwd_med"] * 1e3), bwd_ms_median=_r(local["bwd_med"] * 1e3),
            allreduce_buckets=local["nbuckets"], allreduce_bucket_numel=local["bucket_numel"],
            allreduce_busy_ms_median=_r(local["busy_med"] and local["busy_med"] * 1e3),
            allreduce_span_ms_median=_r(local["span_med"] and local["span_med"] * 1e3),
            allreduce_exposed_ms_median=_r(ex and ex * 1e3),
            allreduce_exposed_share=_r(ex / med if ex is not None else None, 4),
            per_rank_allreduce_exposed_ms_median=[_r(gr["exposed_med"] and gr["exposed_med"] * 1e3)
                                                  for gr in gathered],
            last_allreduce_done_after_last_grad_ms_median=_r(local["last_done_med"] and
                                                            local["last_done_med"] * 1e3),
            nosync_step_ms_median=_r(ns and ns * 1e3),
            nosync_img_per_s_median=_r(ns and args.batch / ns, 2),
            nosync_fwd_ms_median=_r(local["nosync_fwd_med"] and local["nosync_fwd_med"] * 1e3),
            nosync_bwd_ms_median=_r(local["nosync_bwd_med"] and local["nosync_bwd_med"] * 1e3),
            per_rank_nosync_step_ms_median=[_r(gr["nosync_med"] and gr["nosync_med"] * 1e3)
                                            for gr in gathered],
            sync_minus_nosync_ms=_r(ns and (med - ns) * 1e3),
            sync_minus_nosync_share=_r(ns and (med - ns) / med, 4),
            params_in_sync=len(set(all_csum)) == 1, param_checksums=all_csum,
            fwd_macs_per_img=fwd_macs, fwd_mflop_per_img=round(fwd_flops / 1e6, 3),
            train_gflop_per_s=round(ips * 3 * fwd_flops / 1e9, 2), params=nparams,
            loss_first=_r(local["loss_first"], 4), loss_last=_r(local["loss_last"], 4),
            ld_library_path=os.environ.get("LD_LIBRARY_PATH"),
            aten_cpu_capability=os.environ.get("ATEN_CPU_CAPABILITY"),
        )
        exs = "n/a" if ex is None else f"{ex*1e3:.2f} ms ({100*ex/med:.1f}% of step)"
        nss = "n/a" if ns is None else f"{ns*1e3:.2f} ms ({args.batch/ns:.1f} img/s)"
        print(f"{args.model:9s} DDP {world}x{torch.get_num_threads()} batch={args.batch}: "
              f"{ips:8.1f} img/s (median)  {med*1e3:8.2f} ms/step median "
              f"[min {min(times)*1e3:.2f}, max {max(times)*1e3:.2f}]  fwd {local['fwd_med']*1e3:.2f} "
              f"bwd {local['bwd_med']*1e3:.2f} ms | allreduce exposed {exs}, busy "
              f"{res['allreduce_busy_ms_median']} ms in {local['nbuckets']} buckets | no_sync step {nss} | "
              f"params in sync: {res['params_in_sync']}  loss {losses[0]:.3f}->{losses[-1]:.3f}",
              flush=True)
        if args.json:
            print("JSON " + json.dumps(res), flush=True)

    dist.barrier()
    # Leave without running destructors. With torch 1.13 + a Python comm hook, normal teardown can
    # deadlock: ~Reducer -> ~ProcessGroupGloo joins the gloo worker threads while holding the GIL,
    # and a worker is blocked acquiring the GIL to free a tensor whose PyObject the hook created
    # (seen once here: a rank spun forever after printing its result). All ranks have passed the
    # barrier above, so no collective is in flight; results are already printed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), default="tfcnn")
    ap.add_argument("--batch", type=int, default=128, help="GLOBAL batch, split evenly across ranks")
    ap.add_argument("--procs", type=int, default=2, help="number of DDP processes (ranks)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per process")
    ap.add_argument("--steps", type=int, default=20, help="timed synced steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed synced warmup steps")
    ap.add_argument("--nosync-steps", type=int, default=None,
                    help="timed steps under ddp.no_sync() (default: = --steps; 0 = skip)")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--channels-last", action="store_true",
                    help="torch.channels_last memory format for model and input")
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP bucket_cap_mb (default 25)")
    ap.add_argument("--no-broadcast-buffers", action="store_true",
                    help="DDP(broadcast_buffers=False) (default True, as in DDP)")
    ap.add_argument("--no-comm-timing", action="store_true",
                    help="do not register the timing comm hook (DDP's built-in allreduce)")
    ap.add_argument("--pin", action="store_true",
                    help="pin rank r to cores [r*T, (r+1)*T) mod ncpu with sched_setaffinity")
    ap.add_argument("--json", action="store_true", help="rank 0 prints one JSON result line")
    args = ap.parse_args()
    if args.nosync_steps is None:
        args.nosync_steps = args.steps
    if args.batch % args.procs:
        ap.error(f"--batch {args.batch} is not divisible by --procs {args.procs}")
    if not dist.is_available() or not dist.is_gloo_available():
        print("torch.distributed gloo backend is not available in this torch build", file=sys.stderr)
        return 2
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    port = _free_port()
    mp.spawn(worker, args=(args, port), nprocs=args.procs, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
