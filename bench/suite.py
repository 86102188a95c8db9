#!/usr/bin/env python3
"""towerflow's benchmark suite: every benchmark in bench/, the machine's limits, and the peers.

Run it through scripts/bench.sh (which builds the benchmarks first), or directly:

    python3 bench/suite.py --build build [--quick] [--rounds 3] [--peer-python build/bench-venv/bin/python]

Writes, under --out (default bench/results):
    <cpu>-<date>.jsonl   one JSON object per figure: "section" says what it is, "command" how to
                         reproduce it, "cpu" on which CPU it was measured
    <cpu>-<date>.md      the report: machine, the comparison with the peers, the machine's limits,
                         training, kernels, all-reduce, allocator, data pipeline
    <cpu>-<date>.kernels.json   Google Benchmark's own JSON of the kernel run
    <cpu>-<date>.log     every command's output

Sections, in the order they run:
    machine    CPU model, cores, ISA extensions, memory, commit, date
    peak       fp32 FMA peak per instruction set on 1 and N threads; bf16 where the CPU has
               AVX512-BF16 (a "skip" row otherwise)                     (towerflow_bench_kernels)
    bandwidth  STREAM copy and triad on 1 and N threads                  (towerflow_bench_kernels)
    kernel     conv / GEMM / batch norm / max pool, forward and backward, at ResNet-20 and tfcnn
               shapes, each with its roofline share (Note [Shares] below)  (towerflow_bench_kernels)
    kernel_bf16  the same convolutions and GEMMs through the bf16 kernels the CPU chooses, each
               beside its fp32 row and over the peak of the instructions it runs (bf16 peak for
               oneDNN's or towerflow's bf16 kernels where measured, else fp32); on a CPU with
               AVX512-BF16 or AMX also through towerflow's own, row by row against oneDNN's (--bf16-also)
                                                                         (towerflow_bench_kernels)
    train      tfcnn and ResNet-20 on 1, 2 and 4 logical CPU devices, every reduction
                                                                         (towerflow_bench_train)
    peer, compare  towerflow against PyTorch (one process, NCHW and channels-last, the better
               counts; DDP over gloo with N processes) and TensorFlow (one process; MirroredStrategy
               over N logical CPUs), alternating, --rounds rounds; median ratio and spread
    bf16       towerflow in fp32 and in bf16, and PyTorch's bf16 autocast (channels-last), one
               process, alternating, --rounds rounds: bf16 against its own fp32 and against PyTorch's
               bf16 (median ratio and spread); on a CPU with AMX or AVX512-BF16 also towerflow's own
               AMX or AVX512-BF16 kernels against oneDNN's (--bf16-also)
                                                                 (towerflow_bench_train --precision)
    trace_kernel  tfcnn and ResNet-20 in one traced process (fp32; bf16 too where the CPU
               multiplies in bf16): each memory-bound kernel of the training step against the time
               its bytes need at STREAM's triad on the same threads      (towerflow_bench_train --trace)
    allreduce, alloc, data   towerflow_bench_allreduce, _alloc, _data
    gpu_*      --gpu: the GPU benchmarks, only when nvidia-smi finds a GPU (training in fp32, bf16
               and fp16; the op benchmark's fp32, bf16 and fp16 rows)

Note [Shares]
A kernel's share is its achieved rate over the roofline at the same thread count: attainable =
min(fp32 peak, intensity x triad bandwidth), intensity = FLOPs / compulsory bytes. A kernel whose
intensity puts it under the bandwidth roof is "memory"-bound and its share is GB/s over triad
bandwidth; otherwise "compute"-bound and GFLOP/s over the fp32 peak of the instruction set the
kernels use. Batch norm and pooling count no FLOPs, so they are memory-bound by definition.
Training is counted as compute-bound: GFLOP/s (3 x forward multiply-adds x 2 per image, the
peers' convention) over the fp32 peak on all the threads the run uses.

Note [Limits measured twice]
Other work on a shared machine only ever lowers a measured limit. The suite measures the limits at
the start (the best of the repetitions) and again at the end, and the higher figure counts; a
share above 100% still means the limit was measured low, and the report says so.
"""
import argparse
import datetime
import json
import math
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPREAD_LIMIT = 0.15  # a comparison whose per-round ratios spread more than this is flagged
BOUND_LIMIT = 1.5  # a memory-bound kernel of the training step slower than this times its bound is flagged
ISA_FLAGS = ["sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
             "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "avx_vnni"]


# ---------------------------------------------------------------------------------------------
# Running commands and recording rows
# ---------------------------------------------------------------------------------------------
class Recorder:
    def __init__(self, out_dir, stem, cpu, isa_extensions=()):
        os.makedirs(out_dir, exist_ok=True)
        self.stem = os.path.join(out_dir, stem)
        self.cpu = cpu
        self.isa_extensions = list(isa_extensions)  # the CPU's, among ISA_FLAGS
        self.rows = []
        self.jsonl = open(self.stem + ".jsonl", "w")
        self.log = open(self.stem + ".log", "w")

    def add(self, section, **fields):
        row = {"section": section, **fields, "cpu": self.cpu}
        self.rows.append(row)
        self.jsonl.write(json.dumps(row) + "\n")
        self.jsonl.flush()
        return row

    def rewrite(self):
        """Writes every row again (the shares may have changed since a row was first written)."""
        self.jsonl.close()
        with open(self.stem + ".jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in self.rows)

    def run(self, cmd, env=None, timeout=900, echo=True):
        """Runs cmd (a list), logs its output, returns (rc, stdout)."""
        text = " ".join(shlex.quote(c) for c in cmd)
        if echo:
            print(f"$ {short_cmd(cmd)}", flush=True)
        self.log.write(f"\n$ {text}\n")
        full_env = dict(os.environ, **(env or {}))
        t0 = time.time()
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=full_env, timeout=timeout, cwd=REPO)
            rc, out = p.returncode, p.stdout
        except subprocess.TimeoutExpired as e:
            rc, out = 124, (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            out += f"\n(timed out after {timeout} s)\n"
        self.log.write(out)
        self.log.write(f"(exit {rc}, {time.time() - t0:.1f} s)\n")
        self.log.flush()
        if rc != 0 and echo:
            print(f"  exit {rc}; last lines:\n" + "\n".join("  " + l for l in out.strip().splitlines()[-5:]),
                  flush=True)
        return rc, out


def regex_escape(name):
    """Escapes what Google Benchmark's regular expressions would read as operators (re.escape
    also escapes spaces and dashes, which POSIX regular expressions do not define)."""
    return re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", name)


def short_cmd(cmd):
    """The command as a user types it from the repository root."""
    return " ".join(shlex.quote(os.path.relpath(c, REPO) if os.path.isabs(c) and c.startswith(REPO) else c)
                    for c in cmd)


def json_lines(out, prefix=""):
    rows = []
    for line in out.splitlines():
        if prefix and line.startswith(prefix):
            line = line[len(prefix):]
        elif prefix or not line.startswith("{"):
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return rows


# ---------------------------------------------------------------------------------------------
# The machine
# ---------------------------------------------------------------------------------------------
def machine_info():
    info = {"cpu_model": platform.processor() or "unknown", "logical_cpus": os.cpu_count()}
    try:
        lscpu = subprocess.run(["lscpu"], stdout=subprocess.PIPE, text=True).stdout
        fields = dict(l.split(":", 1) for l in lscpu.splitlines() if ":" in l)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        info["cpu_model"] = fields.get("Model name", info["cpu_model"])
        info["sockets"] = int(fields.get("Socket(s)", "1"))
        info["cores_per_socket"] = int(fields.get("Core(s) per socket", "0") or 0)
        info["threads_per_core"] = int(fields.get("Thread(s) per core", "1"))
        info["hypervisor"] = fields.get("Hypervisor vendor")
        info["cpu_family_model"] = f"family {fields.get('CPU family', '?')}, model {fields.get('Model', '?')}"
        info["l3"] = fields.get("L3 cache")
        flags = fields.get("Flags", "").split()
    except (OSError, ValueError):
        flags = []
    if not flags and os.path.exists("/proc/cpuinfo"):
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                break
    info["isa_extensions"] = [f for f in ISA_FLAGS if f in flags]
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                info["memory_gib"] = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "diff", "--quiet", "HEAD"]).returncode != 0
        info["commit"] = commit + (" (with local changes)" if dirty else "")
    except OSError:
        info["commit"] = "unknown"
    info["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    info["kernel"] = platform.release()
    return info


def cpu_slug(info):
    """The CPU in a file name: "intel-xeon-2-80ghz-f6m106" (family and model, since a virtual
    machine's model name often leaves out the generation)."""
    s = re.sub(r"\((R|TM)\)|\bCPU\b|Processor|\bwith\b.*$", "", info["cpu_model"], flags=re.I)
    s = re.sub(r"[^A-Za-z0-9]+", "-", s).strip("-").lower() or "cpu"
    fm = re.findall(r"\d+", info.get("cpu_family_model", ""))
    return s + (f"-f{fm[0]}m{fm[1]}" if len(fm) == 2 else "")


# ---------------------------------------------------------------------------------------------
# Kernels, peaks and bandwidth (Google Benchmark)
# ---------------------------------------------------------------------------------------------
def kernel_context(rec, a, limits):
    """Without the kernels part: the instruction sets of towerflow's kernels and of its bf16
    kernels, from Google Benchmark's context of the shortest run it has (a baseline FMA loop for
    10 ms; a run of no benchmark prints no context)."""
    exe = os.path.join(a.bin, "towerflow_bench_kernels")
    if not os.path.exists(exe):
        return
    rc, out = rec.run([exe, "--benchmark_filter=^peak/fp32_fma/baseline/real_time/threads:1$",
                       "--benchmark_min_time=0.01",
                       "--benchmark_format=json"], echo=False)
    try:
        ctx = json.JSONDecoder().raw_decode(out[out.index("{"):])[0].get("context", {}) if rc == 0 else {}
    except ValueError:
        ctx = {}
    limits["isa"] = ctx.get("towerflow_isa", "unknown").split()[0]
    limits["isa_description"] = ctx.get("towerflow_isa", "unknown")
    limits["bf16_kernels"] = ctx.get("towerflow_bf16_kernels", "unknown")


def run_kernels(rec, a, limits, when="start"):
    """Google Benchmark's run: the limits and the kernels (when="start"), or the limits alone
    again (when="end"; Note [Limits measured twice])."""
    exe = os.path.join(a.bin, "towerflow_bench_kernels")
    if not os.path.exists(exe):
        if when == "start":
            rec.add("skip", what="kernels", reason=f"{exe} not built (Google Benchmark missing: apt install libbenchmark-dev)")
        return
    raw = rec.stem + (".kernels.json" if when == "start" else ".limits-end.json")
    base = [exe, f"--threads={a.threads}", f"--batch={a.kernel_batch}", f"--bandwidth_mib={a.bandwidth_mib}",
            f"--benchmark_min_time={a.min_time}"]
    if a.kernel_reps > 1:
        base += [f"--benchmark_repetitions={a.kernel_reps}", "--benchmark_display_aggregates_only=true"]
    if when == "end":
        base += ["--benchmark_filter=^(peak|mem)/"]
    rc, _ = rec.run(base + [f"--benchmark_out={raw}", "--benchmark_out_format=json"])
    if rc != 0 or not os.path.exists(raw):
        rec.add("error", what="kernels", rc=rc)
        return
    doc = json.load(open(raw))
    ctx = doc.get("context", {})
    limits["isa"] = ctx.get("towerflow_isa", "unknown").split()[0]
    limits["isa_description"] = ctx.get("towerflow_isa", "unknown")
    cv, median, best = {}, {}, {}
    for b in doc["benchmarks"]:
        if b.get("error_occurred"):
            continue
        agg, key = b.get("aggregate_name"), b["run_name"]
        if agg == "cv":
            cv[key] = b.get("real_time")
        elif agg == "median" or (agg is None and a.kernel_reps == 1):
            median[key] = b
        if agg is None:  # one repetition: the limit is the best of them
            rate = b.get("flop_per_s") or b.get("byte_per_s") or 0
            if key not in best or rate > (best[key].get("flop_per_s") or best[key].get("byte_per_s") or 0):
                best[key] = b
    cmd_base = short_cmd([exe, f"--threads={a.threads}", f"--batch={a.kernel_batch}"])
    # Limits first: the kernels' shares need them.
    for key, b in best.items():
        name = re.sub(r"/(real_time|threads:\d+)", "", key)
        threads = b.get("threads", 1)
        command = f"{cmd_base} --benchmark_filter='^{regex_escape(name)}(/|$)'"
        if name.startswith("peak/"):
            _, kind, isa = name.split("/")
            g = b["flop_per_s"] / 1e9
            k = (kind, isa, threads)
            limits.setdefault("peak", {})[k] = max(g, limits.get("peak", {}).get(k, 0))
            rec.add("peak", kind=kind, isa=isa, threads=threads, gflop_per_s=g, when=when, cv=cv.get(key),
                    command=command)
        elif name.startswith("mem/"):
            g = b["byte_per_s"] / 1e9
            k = (name[4:], threads)
            limits.setdefault("bw", {})[k] = max(g, limits.get("bw", {}).get(k, 0))
            rec.add("bandwidth", kind=name[4:], threads=threads, gb_per_s=g, when=when, array_mib=a.bandwidth_mib,
                    cv=cv.get(key), command=command)
    if when == "end":
        return
    if not any(k[0] == "bf16_dot" for k in limits.get("peak", {})):
        rec.add("peak", kind="bf16_dot", isa="avx512bf16", threads=a.threads, gflop_per_s=None,
                skipped=ctx.get("bf16_peak", "skipped: this CPU has no AVX512-BF16"))
    limits["bf16_kernels"] = ctx.get("towerflow_bf16_kernels", "unknown")
    for key, b in median.items():
        name = re.sub(r"/(real_time|threads:\d+)", "", key)
        if not name.startswith(("kernel/", "kernel_bf16/")):
            continue
        family, model, op, layer = name.split("/", 3)
        rec.add("kernel" if family == "kernel" else "kernel_bf16", model=model, op=op, layer=layer,
                threads=a.threads, batch=a.kernel_batch, ms=b["real_time"], gflop_per_s=b["flop_per_s"] / 1e9,
                gb_per_s=b["byte_per_s"] / 1e9, cv=cv.get(key), isa=limits["isa"],
                command=f"{cmd_base} --benchmark_filter='^{regex_escape(name)}$'")
    apply_shares(rec, a, limits)


def run_kernels_second(rec, a, limits):
    """The bf16 kernel rows again through the second set of bf16 kernels (second_bf16_kernels),
    so that the report puts each kernel of both sets side by side."""
    second = second_bf16_kernels(a, limits, rec.isa_extensions)
    exe = os.path.join(a.bin, "towerflow_bench_kernels")
    if not second or not os.path.exists(exe):
        return
    raw = rec.stem + ".kernels-bf16-second.json"
    env = {"TOWERFLOW_BF16_KERNELS": second}
    base = [exe, f"--threads={a.threads}", f"--batch={a.kernel_batch}", f"--benchmark_min_time={a.min_time}",
            "--benchmark_filter=^kernel_bf16/"]
    if a.kernel_reps > 1:
        base += [f"--benchmark_repetitions={a.kernel_reps}", "--benchmark_display_aggregates_only=true"]
    rc, _ = rec.run(base + [f"--benchmark_out={raw}", "--benchmark_out_format=json"], env=env)
    if rc != 0 or not os.path.exists(raw):
        rec.add("error", what=f"kernels with TOWERFLOW_BF16_KERNELS={second}", rc=rc)
        return
    cmd_base = f"TOWERFLOW_BF16_KERNELS={second} " + short_cmd([exe, f"--threads={a.threads}", f"--batch={a.kernel_batch}"])
    for b in json.load(open(raw))["benchmarks"]:
        if b.get("error_occurred") or not (b.get("aggregate_name") == "median" or
                                           (b.get("aggregate_name") is None and a.kernel_reps == 1)):
            continue
        name = re.sub(r"/(real_time|threads:\d+)", "", b["run_name"])
        _, model, op, layer = name.split("/", 3)
        rec.add("kernel_bf16_second", kernels=second, model=model, op=op, layer=layer, threads=a.threads,
                batch=a.kernel_batch, ms=b["real_time"], gflop_per_s=b["flop_per_s"] / 1e9,
                command=f"{cmd_base} --benchmark_filter='^{regex_escape(name)}$'")


def apply_shares(rec, a, limits):
    """(Re)computes every share from the limits as they stand (Note [Shares])."""
    peak_all = fp32_peak(limits, a.threads)
    bw = limits.get("bw", {}).get(("triad", a.threads))
    bf16_kind = "bf16_dot"
    bf16_peak = limits.get("peak", {}).get(("bf16_dot", "avx512bf16", a.threads))
    native = limits.get("bf16_kernels", "").startswith(("oneDNN", "towerflow's AVX512-BF16 kernels (vdpbf16ps",
                                                         "towerflow's AMX kernels (tdpbf16ps"))
    amx_peak = limits.get("peak", {}).get(("bf16_amx", "amx", a.threads))
    if amx_peak and any(t in limits.get("bf16_kernels", "") for t in ("AMX tiles", "tdpbf16ps tiles")):
        bf16_kind, bf16_peak = "bf16_amx", amx_peak  # oneDNN's or towerflow's tile kernels
    for r in rec.rows:
        if r["section"] == "kernel":
            r["bound"], r["share_of_bound"] = roofline(r["gflop_per_s"], r["gb_per_s"], peak_all, bw)
        elif r["section"] == "kernel_bf16":
            # Over the peak of the instructions the row runs: AMX's TDPBF16PS for oneDNN on AMX,
            # VDPBF16PS for oneDNN's or towerflow's bf16 kernels, where measured; else the fp32 peak.
            peak = bf16_peak if native and bf16_peak else peak_all
            r["peak"] = bf16_kind if native and bf16_peak else "fp32_fma"
            r["share_of_peak"] = r["gflop_per_s"] / peak if peak and r["gflop_per_s"] > 0 else None
        elif r["section"] == "train" and r.get("threads_total"):
            peak = fp32_peak(limits, r["threads_total"])
            r["share_of_fp32_peak"] = r["gflop_per_s"] / peak if peak else None
        elif r["section"] == "peer":
            r["share_of_fp32_peak"] = (r.get("gflop_per_s") or 0) / peak_all if peak_all else None


def fp32_peak(limits, threads):
    """fp32 peak (GFLOP/s) of the instruction set the kernels use, at this many threads."""
    peaks = limits.get("peak", {})
    isa = limits.get("isa")
    for t in (threads, max([k[2] for k in peaks] or [1])):
        if ("fp32_fma", isa, t) in peaks:
            return peaks[("fp32_fma", isa, t)] * (threads / t)
    return None


def roofline(gflops, gbytes, peak, bw):
    if not bw:
        return None, None
    if gflops <= 0 or not peak:
        return "memory", gbytes / bw
    intensity = gflops / gbytes  # FLOP per byte
    if intensity * bw < peak:
        return "memory", gbytes / bw
    return "compute", gflops / peak


# ---------------------------------------------------------------------------------------------
# Training: towerflow's sweep, and the peers in alternating rounds
# ---------------------------------------------------------------------------------------------
def tw_train_cmd(a, model, devices, reduction, precision="fp32"):
    return [os.path.join(a.bin, "towerflow_bench_train"), "--model", model, "--batch", str(a.batch),
            "--threads", str(max(1, a.threads // devices)), "--devices", str(devices),
            "--reduction", reduction, "--steps", str(a.steps), "--warmup", str(a.warmup), "--json"] + (
        ["--precision", precision] if precision != "fp32" else [])


def run_tw_train(rec, a, limits, model, devices, reduction, precision="fp32", env=None, **extra):
    cmd = tw_train_cmd(a, model, devices, reduction, precision)
    rc, out = rec.run(cmd, env=env)
    rows = json_lines(out)
    if rc != 0 or not rows:
        rec.add("error", what="train", model=model, devices=devices, reduction=reduction, rc=rc,
                command=short_cmd(cmd))
        return None
    r = rows[-1]
    used = min(a.threads, devices * r.get("threads", 1))
    peak = fp32_peak(limits, used)
    r.update(extra)
    r["share_of_fp32_peak"] = r["gflop_per_s"] / peak if peak else None
    r["threads_total"] = used
    prefix = "".join(f"{k}={v} " for k, v in (env or {}).items())
    return rec.add("train", **r, command=prefix + short_cmd(cmd))


def second_bf16_kernels(a, limits, extensions):
    """The bf16 kernels that compare_bf16 also runs, beside the automatic choice, or None: where
    oneDNN's are chosen, towerflow's own AMX kernels on a CPU with AMX-BF16, else its AVX512-BF16
    kernels on a CPU with that instruction (Note [bf16 kernels] in core/cpu/bf16.cc: which is faster
    is measured here), or what --bf16-also names."""
    if a.bf16_also == "none":
        return None
    if a.bf16_also != "auto":
        return a.bf16_also
    native_onednn = limits.get("bf16_kernels", "").startswith("oneDNN")
    if not native_onednn:
        return None
    if "amx_bf16" in extensions:
        return "amx"
    return "avx512bf16" if "avx512_bf16" in extensions else None


def sweep(rec, a, limits):
    for model in a.models:
        for devices in a.device_counts:
            for reduction in (["all_reduce"] if devices == 1 else a.reductions):
                run_tw_train(rec, a, limits, model, devices, reduction)


def have_module(python, module):
    if not python or not shutil.which(python) and not os.path.exists(python):
        return None
    p = subprocess.run([python, "-c", f"import {module}; print({module}.__version__)"], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True)
    return p.stdout.strip() if p.returncode == 0 else None


INSTALL_HINT = {
    "torch": "scripts/bench.sh --install-peers (a virtual environment in build/bench-venv), or pip install torch",
    "tensorflow": "scripts/bench.sh --install-peers (a virtual environment in build/bench-venv), or pip install tensorflow-cpu",
}


def peer_cmd(a, name, model, n):
    """The peer's command line. n: 1 for one process, N for the multi-tower configuration."""
    py, peers = a.peer_python, os.path.join(REPO, "bench", "peers")
    common = ["--model", model, "--batch", str(a.batch), "--steps", str(a.steps), "--warmup",
              str(a.warmup), "--json"]
    if name in ("torch_nchw", "torch_cl"):
        cmd = [py, os.path.join(peers, "torch_cifar_bench.py"), *common, "--threads", str(a.threads)]
        return cmd + (["--channels-last"] if name == "torch_cl" else [])
    if name in ("ddp_nchw", "ddp_cl"):
        cmd = [py, os.path.join(peers, "torch_ddp_bench.py"), *common, "--procs", str(n),
               "--threads", str(max(1, a.threads // n)), "--nosync-steps", "0", "--no-comm-timing"]
        return cmd + (["--channels-last"] if name == "ddp_cl" else [])
    if name in ("tf", "tf_mirrored"):
        return [py, os.path.join(peers, "tf_cifar_bench.py"), *common, "--threads", str(a.threads),
                "--towers", str(n)]
    raise ValueError(name)


PEER_LABEL = {
    "torch_nchw": "PyTorch, NCHW", "torch_cl": "PyTorch, channels-last",
    "ddp_nchw": "PyTorch DDP (gloo), NCHW", "ddp_cl": "PyTorch DDP (gloo), channels-last",
    "tf": "TensorFlow", "tf_mirrored": "TensorFlow MirroredStrategy",
}
PEER_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONWARNINGS": "ignore"}


def compare(rec, a, limits, versions):
    """Per model: one process, then N towers; each round runs towerflow, then every peer."""
    have_torch, have_tf = versions.get("torch"), versions.get("tensorflow")
    for mod, have in (("torch", have_torch), ("tensorflow", have_tf)):
        if not have:
            msg = (f"{mod} is not installed for {a.peer_python}; skipped. Install it with {INSTALL_HINT[mod]}"
                   if not a.no_peers else f"{mod}: peers skipped (--no-peers)")
            print(msg, flush=True)
            rec.add("skip", what=f"peer {mod}", reason=msg)
    if not (have_torch or have_tf):
        return
    n = a.towers
    for model in a.models:
        configs = [("1 process", 1, ["torch_nchw", "torch_cl"] * bool(have_torch) + ["tf"] * bool(have_tf))]
        if n > 1:
            configs.append((f"{n} towers", n, None))
        best_layout = "cl"
        for config, devices, peers in configs:
            if peers is None:  # DDP in the layout that won the one-process comparison
                peers = [f"ddp_{best_layout}"] * bool(have_torch) + ["tf_mirrored"] * bool(have_tf)
            tw_runs, peer_runs = [], {p: [] for p in peers}
            for rnd in range(a.rounds):
                r = run_tw_train(rec, a, limits, model, devices, "all_reduce", round=rnd + 1, comparison=config)
                tw_runs.append(r["img_per_s"] if r else None)
                for p in peers:
                    cmd = peer_cmd(a, p, model, devices)
                    rc, out = rec.run(cmd, env=PEER_ENV, timeout=1200)
                    res = json_lines(out, prefix="JSON ")
                    if rc != 0 or not res:
                        rec.add("error", what=p, model=model, rc=rc, command=short_cmd(cmd))
                        peer_runs[p].append(None)
                        continue
                    j = res[-1]
                    peak = fp32_peak(limits, a.threads)
                    rec.add("peer", peer=p, label=PEER_LABEL[p], model=model, comparison=config, round=rnd + 1,
                            img_per_s=j["img_per_s_median"], ms_per_step=j["step_ms_median"],
                            gflop_per_s=j.get("train_gflop_per_s"),
                            share_of_fp32_peak=j.get("train_gflop_per_s", 0) / peak if peak else None,
                            version=j.get("torch_version") or j.get("tf_version"),
                            loss_first=j.get("loss_first"), loss_last=j.get("loss_last"), command=short_cmd(cmd))
                    peer_runs[p].append(j["img_per_s_median"])
            # PyTorch's two layouts: the better (higher median) counts.
            for family in ("torch", "ddp"):
                nchw, cl = peer_runs.get(f"{family}_nchw"), peer_runs.get(f"{family}_cl")
                if nchw is not None and cl is not None:
                    worse = f"{family}_nchw" if med(cl) >= med(nchw) else f"{family}_cl"
                    if family == "torch":
                        best_layout = "cl" if worse.endswith("nchw") else "nchw"
                    peer_runs[worse + "_other"] = peer_runs.pop(worse)
            for p, runs in peer_runs.items():
                if p.endswith("_other"):
                    continue
                ratios = [t / q for t, q in zip(tw_runs, runs) if t and q]
                if not ratios:
                    continue
                m = statistics.median(ratios)
                spread = (max(ratios) - min(ratios)) / m
                other = peer_runs.get(("torch_nchw" if p == "torch_cl" else "torch_cl") + "_other") \
                    if p.startswith("torch") else None
                rec.add("compare", model=model, comparison=config, devices=devices, peer=p, label=PEER_LABEL[p],
                        version=versions["torch" if p.startswith(("torch", "ddp")) else "tensorflow"],
                        towerflow_img_per_s=med(tw_runs), peer_img_per_s=med(runs),
                        other_layout_img_per_s=med(other) if other else None,
                        ratios=ratios, ratio_median=m, ratio_min=min(ratios), ratio_max=max(ratios),
                        spread=spread, trusted=spread <= SPREAD_LIMIT, rounds=len(ratios),
                        command_towerflow=short_cmd(tw_train_cmd(a, model, devices, "all_reduce")),
                        command_peer=short_cmd(peer_cmd(a, p, model, devices)))


def med(xs):
    xs = [x for x in (xs or []) if x]
    return statistics.median(xs) if xs else None


def ratio_row(num, den):
    """Median, min and max of the per-round ratios num / den (rounds where both ran)."""
    ratios = [x / y for x, y in zip(num, den) if x and y]
    if not ratios:
        return {}
    m = statistics.median(ratios)
    spread = (max(ratios) - min(ratios)) / m
    return dict(ratios=ratios, ratio_median=m, ratio_min=min(ratios), ratio_max=max(ratios), spread=spread,
                trusted=spread <= SPREAD_LIMIT, rounds=len(ratios))


def compare_bf16(rec, a, limits, versions):
    """Per model, one process: each round runs towerflow in fp32, towerflow in bf16, and PyTorch's bf16
    autocast (channels-last). bf16 against towerflow's own fp32 and against PyTorch's bf16. Where a
    second set of bf16 kernels applies (second_bf16_kernels), each round runs it too, after the
    automatic choice, and the row gives its ratio to the automatic choice."""
    have_torch = versions.get("torch")
    second = second_bf16_kernels(a, limits, rec.isa_extensions)
    for model in a.models:
        runs = {"fp32": [], "bf16": [], "torch": [], "second": []}
        for rnd in range(a.rounds):
            for precision in ("fp32", "bf16"):
                r = run_tw_train(rec, a, limits, model, 1, "all_reduce", precision, round=rnd + 1,
                                 comparison="bf16")
                runs[precision].append(r["img_per_s"] if r else None)
            if second:
                r = run_tw_train(rec, a, limits, model, 1, "all_reduce", "bf16",
                                 env={"TOWERFLOW_BF16_KERNELS": second}, round=rnd + 1,
                                 comparison="bf16", bf16_kernels=second)
                runs["second"].append(r["img_per_s"] if r else None)
            if not have_torch:
                continue
            cmd = peer_cmd(a, "torch_cl", model, 1) + ["--bf16"]
            rc, out = rec.run(cmd, env=PEER_ENV, timeout=1200)
            res = json_lines(out, prefix="JSON ")
            if rc != 0 or not res:
                rec.add("error", what="torch_cl --bf16", model=model, rc=rc, command=short_cmd(cmd))
                runs["torch"].append(None)
                continue
            j = res[-1]
            rec.add("peer", peer="torch_cl_bf16", label="PyTorch bf16 autocast, channels-last", model=model,
                    comparison="bf16", round=rnd + 1, img_per_s=j["img_per_s_median"], ms_per_step=j["step_ms_median"],
                    gflop_per_s=j.get("train_gflop_per_s"), version=j.get("torch_version"),
                    loss_first=j.get("loss_first"), loss_last=j.get("loss_last"), command=short_cmd(cmd))
            runs["torch"].append(j["img_per_s_median"])
        row = dict(model=model, bf16_kernels=limits.get("bf16_kernels", "unknown"),
                   fp32_img_per_s=med(runs["fp32"]), bf16_img_per_s=med(runs["bf16"]),
                   torch_bf16_img_per_s=med(runs["torch"]),
                   command_fp32=short_cmd(tw_train_cmd(a, model, 1, "all_reduce")),
                   command=short_cmd(tw_train_cmd(a, model, 1, "all_reduce", "bf16")),
                   command_peer=short_cmd(peer_cmd(a, "torch_cl", model, 1) + ["--bf16"]) if have_torch else None)
        row["vs_fp32"] = ratio_row(runs["bf16"], runs["fp32"])
        row["vs_torch_bf16"] = ratio_row(runs["bf16"], runs["torch"])
        if second:
            row.update(second_kernels=second, second_img_per_s=med(runs["second"]),
                       second_vs_automatic=ratio_row(runs["second"], runs["bf16"]),
                       command_second=f"TOWERFLOW_BF16_KERNELS={second} " + row["command"])
        rec.add("compare_bf16", **row)


def native_bf16(limits):
    """Whether the CPU's bf16 kernels multiply in bf16 (oneDNN's, or towerflow's AMX or AVX512-BF16
    kernels), rather than emulate it on the fp32 kernels."""
    kernels = limits.get("bf16_kernels", "unknown")
    return kernels != "unknown" and not kernels.startswith("emulated")


def trace_bounds(rec, a, limits):
    """Per model, one process on all threads: a traced training run (towerflow_bench_train --trace),
    in fp32 and, where the CPU multiplies in bf16, in bf16. After the trace bench_train measures
    STREAM's triad on the same threads and sets each memory-bound kernel of the timed steps
    (elementwise, ReLU, pooling, batch norm, bias, the optimizer's update, copies) against the time
    its bytes need at that bandwidth (trace::bandwidth_rows); one row per kernel, per step."""
    precisions = ["fp32"] + (["bf16"] if native_bf16(limits) else [])
    with tempfile.TemporaryDirectory(prefix="towerflow-suite-") as tmp:
        for model in a.models:
            for precision in precisions:
                base = tw_train_cmd(a, model, 1, "all_reduce", precision)
                cmd = base + ["--trace", os.path.join(tmp, f"{model}-{precision}.json")]
                shown = short_cmd(base + ["--trace", "trace.json"])
                rc, out = rec.run(cmd)
                rows = json_lines(out)
                if rc != 0 or not rows or not rows[-1].get("memory_bound_kernels"):
                    rec.add("error", what="trace", model=model, precision=precision, rc=rc, command=shown)
                    continue
                r = rows[-1]
                steps = r.get("steps") or a.steps
                for k in r["memory_bound_kernels"]:
                    rec.add("trace_kernel", model=model, precision=precision, kernel=k["kernel"],
                            calls_per_step=k["calls"] / steps, mib_per_call=k["bytes"] / k["calls"] / (1 << 20),
                            ms_per_step=k["ms"] / steps, bound_ms_per_step=k["bound_ms"] / steps,
                            gb_per_s=k["gb_per_s"], over_bound=k["over_bound"], in_cache=k["in_cache"],
                            step_ms=r.get("ms_per_step"), img_per_s=r.get("img_per_s"),
                            bound_gb_per_s=r.get("bandwidth_bound_gb_per_s"), command=shown)


# ---------------------------------------------------------------------------------------------
# All-reduce, allocator, data pipeline
# ---------------------------------------------------------------------------------------------
def straggler(rec, a):
    """bench/straggler.py: even, the best hand-set weights, auto and PyTorch DDP against a real straggler."""
    cmd = [sys.executable, os.path.join(REPO, "bench", "straggler.py"), "--build", a.build, "--peer-python",
           a.peer_python, "--rounds", str(a.rounds)] + (["--steps", "3", "--warmup", "3", "--weights", "2", "--no-midrun"]
                                                         if a.quick else [])
    rc, out = rec.run(cmd, timeout=3600)
    rows = json_lines(out)
    if rc != 0 or not rows:
        rec.add("error", what="straggler", rc=rc, command=short_cmd(cmd))
    for r in rows:
        rec.add("straggler", **r)


def run_simple(rec, a, section, exe_name, args):
    exe = os.path.join(a.bin, exe_name)
    cmd = [exe, *args, "--json"]
    rc, out = rec.run(cmd)
    rows = json_lines(out)
    if rc != 0 or not rows:
        rec.add("error", what=section, rc=rc, command=short_cmd(cmd))
    for r in rows:
        rec.add(section, **r, command=short_cmd(cmd))
    return rows


def others(rec, a, limits):
    for n in sorted({2, a.towers} | ({4} if not a.quick else set())):
        ar = ["--devices", str(n)] + (["--max_bytes", "1048576", "--seconds", "0.02"] if a.quick
                                      else ["--max_bytes", str(64 << 20), "--seconds", "0.3"])
        rows = run_simple(rec, a, "allreduce", "towerflow_bench_allreduce", ar)
        del rows
    run_simple(rec, a, "alloc", "towerflow_bench_alloc", ["--pairs", "20000" if a.quick else "300000"])
    threads = ",".join(str(t) for t in sorted({0, 1, a.threads}))
    run_simple(rec, a, "data", "towerflow_bench_data",
               ["--dataset", "builtin", "--threads", threads, "--images", "512" if a.quick else "20000"])


# ---------------------------------------------------------------------------------------------
# GPU: only from a real GPU
# ---------------------------------------------------------------------------------------------
def gpus():
    if not shutil.which("nvidia-smi"):
        return []
    p = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return [l.strip() for l in p.stdout.splitlines() if l.strip()] if p.returncode == 0 else []


def run_gpu(rec, a):
    found = gpus()
    if not found:
        rec.add("skip", what="gpu", reason="no GPU (nvidia-smi finds none): no GPU figures")
        print("no GPU found: the GPU part measures nothing", flush=True)
        return
    rec.add("gpu_machine", gpus=found)
    ops = os.path.join(a.bin, "towerflow_bench_gpu_ops")
    if os.path.exists(ops):
        run_simple(rec, a, "gpu_kernel", "towerflow_bench_gpu_ops", ["--batch", str(a.kernel_batch)])
    else:
        rec.add("skip", what="gpu kernels", reason="towerflow_bench_gpu_ops not built (a CUDA build makes it)")
    for model in a.models:
        for precision in ("fp32", "bf16", "fp16"):
            cmd = [os.path.join(a.bin, "towerflow_bench_train"), "--model", model, "--batch", str(a.batch),
                   "--devices", "/gpu:0", "--steps", str(a.steps), "--warmup", str(a.warmup), "--json",
                   "--precision", precision]
            rc, out = rec.run(cmd)
            for r in json_lines(out):
                rec.add("gpu_train", **r, gpu=found[0], command=short_cmd(cmd))


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------
def fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def pct(x):
    return "-" if x is None else f"{100 * x:.0f}%"


def table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(out)


def report(rec, a, info, limits, versions, argv, elapsed):
    R = rec.rows
    sec = lambda s: [r for r in R if r["section"] == s]
    cores = info.get("sockets", 1) * info.get("cores_per_socket", 0) or info["logical_cpus"]
    md = [f"# towerflow benchmarks on {info['cpu_model']}", ""]
    md += [f"- CPU: **{info['cpu_model']}** ({info.get('cpu_family_model', '')}), {cores} cores ({info['logical_cpus']} logical CPUs"
           + (f", {info['threads_per_core']} thread{'s' if info['threads_per_core'] > 1 else ''} per core"
              if info.get("threads_per_core") else "")
           + (f", under {info['hypervisor']}" if info.get("hypervisor") else "") + ")"
           + (f", L3 {info['l3']}" if info.get("l3") else ""),
           f"- ISA extensions: {' '.join(info['isa_extensions']) or 'none of interest'}; towerflow's kernels use "
           f"{limits.get('isa_description', 'unknown')}",
           f"- memory: {info.get('memory_gib', '?')} GiB; Linux {info['kernel']}",
           f"- commit {info['commit']}, {info['date']}; suite: `{' '.join(argv)}` ({elapsed / 60:.1f} min)",
           f"- peers: PyTorch {versions.get('torch') or 'not installed'}, TensorFlow "
           f"{versions.get('tensorflow') or 'not installed'} (python: `{short_cmd([a.peer_python])}`)",
           f"- settings: batch {a.batch}, {a.threads} threads in all, {a.steps} timed steps after {a.warmup} "
           f"warm-up (median step), {a.rounds} rounds against each peer", ""]

    if "peers" in a.parts:
        md += ["## towerflow against the peers", "",
               "Same model, global batch, threads and synthetic data; each round runs towerflow, then each peer. "
               "Ratio = towerflow img/s / peer img/s per round; the median over rounds, and the spread "
               f"(max - min) / median. A spread over {SPREAD_LIMIT:.0%} is marked **noisy**: rerun on a quieter "
               "machine before quoting it. PyTorch runs NCHW and channels-last; the better layout counts. "
               "Share = training GFLOP/s (3 x forward multiply-adds x 2 per image) over the machine's fp32 peak.", ""]
        cmp_rows = sec("compare")
        if cmp_rows:
            tw_share = {}
            for r in sec("train"):
                if r.get("comparison"):
                    tw_share.setdefault((r["model"], r["comparison"]), []).append(r.get("share_of_fp32_peak"))
            peer_share = {}
            for r in sec("peer"):
                peer_share.setdefault((r["model"], r["comparison"], r["peer"]), []).append(r.get("share_of_fp32_peak"))
            rows = []
            for r in cmp_rows:
                rows.append([r["model"], r["comparison"], fmt(r["towerflow_img_per_s"]),
                             pct(med(tw_share.get((r["model"], r["comparison"])))),
                             f"{r['label']} ({r['version']})", fmt(r["peer_img_per_s"]),
                             pct(med(peer_share.get((r["model"], r["comparison"], r["peer"])))),
                             f"**{r['ratio_median']:.2f}x**", f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f}"
                             + ("" if r["trusted"] else " **noisy**"), r["rounds"]])
            md += [table(["model", "config", "towerflow img/s", "share", "peer", "peer img/s", "share",
                          "ratio", "spread", "rounds"], rows), ""]
            other = [r for r in cmp_rows if r.get("other_layout_img_per_s")]
            if other:
                md += ["Other PyTorch layout (not counted): " + "; ".join(
                    f"{r['model']} {r['comparison']}: {fmt(r['other_layout_img_per_s'])} img/s" for r in other), ""]
            md += ["Commands (one round):", ""]
            for r in cmp_rows:
                md += [f"- {r['model']}, {r['comparison']}, {r['label']}: `{r['command_towerflow']}` then "
                       f"`{r['command_peer']}`"]
            md += [""]
        for r in sec("skip"):
            if r["what"].startswith("peer"):
                md += [f"- {r['reason']}"]
        md += [""]

    if sec("compare_bf16"):
        md += ["## bf16 training", "",
               "One process, all threads; each round runs towerflow in fp32, then in bf16 (`--precision bf16`), then "
               "PyTorch's bf16 autocast (channels-last). Ratios: towerflow bf16 img/s over towerflow fp32 and over "
               "PyTorch bf16, per round; median and spread. The targets (bf16 at >= 1.7x towerflow's fp32 and "
               ">= 1.5x PyTorch's bf16) apply to CPUs with AVX512-BF16 or AMX; elsewhere bf16 is emulated.", ""]

        def ratio(d):
            if not d:
                return "-"
            return (f"**{d['ratio_median']:.2f}x** ({d['ratio_min']:.2f}-{d['ratio_max']:.2f}"
                    + ("" if d["trusted"] else ", **noisy**") + ")")

        rows = [[r["model"], fmt(r["fp32_img_per_s"]), fmt(r["bf16_img_per_s"]), fmt(r["torch_bf16_img_per_s"]),
                 ratio(r["vs_fp32"]), ratio(r["vs_torch_bf16"])] for r in sec("compare_bf16")]
        md += [table(["model", "fp32 img/s", "bf16 img/s", "PyTorch bf16 img/s", "bf16 / fp32", "bf16 / PyTorch bf16"],
                     rows), ""]
        md += [f"bf16 kernels: {sec('compare_bf16')[0]['bf16_kernels']}", ""]
        seconds = [r for r in sec("compare_bf16") if r.get("second_kernels")]
        if seconds:
            md += [f"The same bf16 training with `TOWERFLOW_BF16_KERNELS={seconds[0]['second_kernels']}`, run in "
                   "each round after the automatic choice: its img/s over the automatic choice's.", ""]
            md += [table(["model", "bf16 kernels", "img/s", "over the automatic choice"],
                         [[r["model"], r["second_kernels"], fmt(r["second_img_per_s"]), ratio(r["second_vs_automatic"])]
                          for r in seconds]), ""]
        md += ["Commands (one round):", ""]
        for r in sec("compare_bf16"):
            md += [f"- {r['model']}: `{r['command_fp32']}`, `{r['command']}`"
                   + (f", `{r['command_second']}`" if r.get("command_second") else "")
                   + (f", `{r['command_peer']}`" if r.get("command_peer") else "")]
        md += [""]

    if sec("trace_kernel"):
        md += ["## Memory-bound kernels in a training step against their bound", "",
               "One process on all threads, the timed steps traced (`--trace`). Each memory-bound kernel (elementwise, "
               "ReLU, pooling, batch norm, bias, the optimizer's update, copies) against the time its bytes need at "
               "STREAM's triad bandwidth, measured on the same threads right after the trace (`x bound`: 1 is at the "
               "bound; bytes: each operand read or written once per pass, as `args.bytes` in the trace). Kernels "
               "that move under 1 MiB a call run from the caches, where a call's cost rather than its bytes sets the "
               f"time: listed, not judged. Beyond {BOUND_LIMIT}x is in **bold**.", ""]
        groups = {}
        for r in sec("trace_kernel"):
            groups.setdefault((r["model"], r["precision"]), []).append(r)
        for (model, precision), rows in groups.items():
            first = rows[0]
            beyond = lambda r: not r["in_cache"] and r["over_bound"] > BOUND_LIMIT
            far = [r for r in rows if beyond(r)]
            total = sum(r["ms_per_step"] for r in rows)
            step = first.get("step_ms")
            md += [f"**{model}, {precision}** ({fmt(first.get('img_per_s'))} img/s traced; triad "
                   f"{fmt(first.get('bound_gb_per_s'))} GB/s; these kernels {fmt(total, '.2f')} ms of a "
                   f"{fmt(step, '.1f')} ms step): "
                   + (f"none beyond {BOUND_LIMIT}x" if not far else
                      f"{len(far)} beyond {BOUND_LIMIT}x, {fmt(sum(r['ms_per_step'] for r in far), '.2f')} ms a step"),
                   "", f"`{first['command']}`", ""]
            body = [[r["kernel"] + (" (in cache)" if r["in_cache"] else ""), fmt(r["calls_per_step"], ".1f"),
                     fmt(r["ms_per_step"], ".3f"), fmt(r["mib_per_call"], ".2f"), fmt(r["gb_per_s"]),
                     (f"**{r['over_bound']:.2f}x**" if beyond(r) else f"{r['over_bound']:.2f}x")] for r in rows]
            md += [table(["kernel", "calls/step", "ms/step", "MiB/call", "GB/s", "x bound"], body), ""]

    if sec("peak") or sec("bandwidth"):
        md += ["## The machine's limits", "",
               "An FMA loop per instruction set the CPU can run (each compiled for its own set, chosen by what the "
               "CPU reports), on one thread and on all; STREAM copy and triad (reads + writes, no write-allocate) "
               f"over {a.bandwidth_mib} MiB arrays; measured at the start and at the end of the run (Note "
               "[Limits measured twice] in bench/suite.py), the best of the repetitions.", ""]
        rows = []
        for r in sec("peak"):
            if r.get("gflop_per_s") is None:
                rows.append([f"{r['kind']} ({r['isa']})", "-", "-", r.get("skipped", "skipped"), ""])
            else:
                rows.append([f"{r['kind']} ({r['isa']})", r["threads"], r.get("when", ""),
                             f"{r['gflop_per_s']:.1f} GFLOP/s", f"`{r['command']}`"])
        for r in sec("bandwidth"):
            rows.append([f"memory {r['kind']}", r["threads"], r.get("when", ""), f"{r['gb_per_s']:.1f} GB/s",
                         f"`{r['command']}`"])
        md += [table(["figure", "threads", "measured", "value", "command"], rows), ""]
        used = fp32_peak(limits, a.threads)
        bw = limits.get("bw", {}).get(("triad", a.threads))
        md += [f"Shares below divide by the higher of the two measurements: fp32 peak {fmt(used)} GFLOP/s "
               f"({limits.get('isa', '?')}, {a.threads} threads), triad {fmt(bw)} GB/s. A share above 100% means "
               "the limit was measured low (the machine was busier then than during the figure).", ""]

    if sec("train"):
        md += ["## Training (towerflow)", "",
               "Each reduction on 1, 2 and 4 logical CPU devices (threads split evenly; with more devices than cores "
               "the devices share cores). Median step over the timed steps; share of the fp32 peak on the threads "
               "used.", ""]
        rows = [[r["model"], r["devices"], r["threads"], r["reduction"], fmt(r["img_per_s"]), fmt(r["ms_per_step"], ".2f"),
                 fmt(r["gflop_per_s"]), pct(r.get("share_of_fp32_peak")), f"{100 * r['reduction_share']:.1f}%", r["check"],
                 f"`{r['command']}`"] for r in sec("train") if not r.get("comparison")]
        md += [table(["model", "devices", "threads/device", "reduction", "img/s", "ms/step", "GFLOP/s", "share of peak",
                      "reduction not hidden", "check", "command"], rows), ""]

    if sec("kernel"):
        md += ["## Kernels", "",
               f"Batch {a.kernel_batch}, {a.threads} threads, kernels built for {limits.get('isa', '?')}; wall-clock "
               "median (Google Benchmark). Share: of the roofline bound (compute: fp32 peak; memory: triad bandwidth; "
               "Note [Shares] in bench/suite.py). cv: coefficient of variation over repetitions.", ""]
        rows = [[r["model"], r["op"], r["layer"], fmt(r["ms"], ".3f"), fmt(r["gflop_per_s"]), fmt(r["gb_per_s"]),
                 r["bound"] or "-", pct(r["share_of_bound"]), pct(r.get("cv")), f"`{r['command']}`"] for r in sec("kernel")]
        md += [table(["model", "op", "layer", "ms", "GFLOP/s", "GB/s", "bound", "share", "cv", "command"], rows), ""]

    if sec("kernel_bf16"):
        fp32 = {(r["model"], r["op"], r["layer"]): r for r in sec("kernel")}
        md += ["## bf16 kernels", "",
               f"The convolutions and GEMMs above through the bf16 kernels ({limits.get('bf16_kernels', '?')}). "
               "Share: of the peak of the instructions they run (the bf16 peak for oneDNN's bf16 kernels where it "
               "was measured, else the fp32 peak). vs fp32: the fp32 row's time over this one's.", ""]
        rows = []
        for r in sec("kernel_bf16"):
            f = fp32.get((r["model"], r["op"], r["layer"]))
            rows.append([r["model"], r["op"], r["layer"], fmt(r["ms"], ".3f"), fmt(r["gflop_per_s"]),
                         f"{r.get('peak', '-')}: {pct(r.get('share_of_peak'))}",
                         f"{f['ms'] / r['ms']:.2f}x" if f and r["ms"] else "-", f"`{r['command']}`"])
        md += [table(["model", "op", "layer", "ms", "GFLOP/s", "share of peak", "vs fp32", "command"], rows), ""]
        seconds = sec("kernel_bf16_second")
        if seconds:
            auto = {(r["model"], r["op"], r["layer"]): r for r in sec("kernel_bf16")}
            kernels = seconds[0]["kernels"]
            md += [f"The same rows with `TOWERFLOW_BF16_KERNELS={kernels}`, beside the automatic choice's: "
                   "which kernels won, row by row (speed = the automatic choice's time over this one's).", ""]
            rows, speeds = [], []
            for r in seconds:
                f = auto.get((r["model"], r["op"], r["layer"]))
                speed = f["ms"] / r["ms"] if f and r["ms"] else None
                if speed:
                    speeds.append(speed)
                rows.append([r["model"], r["op"], r["layer"], fmt(f["ms"], ".3f") if f else "-", fmt(r["ms"], ".3f"),
                             f"{speed:.2f}x" if speed else "-", f"`{r['command']}`"])
            md += [table(["model", "op", "layer", "automatic ms", f"{kernels} ms", "speed", "command"], rows), ""]
            if speeds:
                geo = math.exp(sum(math.log(x) for x in speeds) / len(speeds))
                md += [f"Geometric mean: {kernels} at {geo:.2f}x the automatic choice's speed over {len(speeds)} rows.", ""]

    if sec("allreduce"):
        md += ["## All-reduce (local, shared memory)", "",
               "busbw as nccl-tests defines it; bound: the memcpy traffic the same threads can move.", ""]
        rows = [[r.get("devices"), r.get("bytes"), fmt(r.get("time_us"), ".1f"), fmt(r.get("algbw_gbps"), ".2f"),
                 fmt(r.get("busbw_gbps"), ".2f"), pct(r["pct_of_bound"] / 100 if r.get("pct_of_bound") is not None else None),
                 f"`{r['command']}`"] for r in sec("allreduce")]
        md += [table(["devices", "bytes", "time us", "algbw GB/s", "busbw GB/s", "share of bound", "command"], rows), ""]

    if sec("alloc"):
        md += ["## Allocator", ""]
        keys = [k for k in (sec("alloc")[0] if sec("alloc") else {}) if k not in ("section", "cpu", "command")]
        md += [table(keys + ["command"], [[fmt(r.get(k), ".3g") if isinstance(r.get(k), float) else r.get(k) for k in keys]
                                          + [f"`{r['command']}`"] for r in sec("alloc")]), ""]
    if sec("data"):
        md += ["## Data pipeline (builtin synthetic set, CIFAR augmentation)", ""]
        keys = [k for k in (sec("data")[0] if sec("data") else {}) if k not in ("section", "cpu", "command")]
        md += [table(keys + ["command"], [[fmt(r.get(k), ".3g") if isinstance(r.get(k), float) else r.get(k) for k in keys]
                                          + [f"`{r['command']}`"] for r in sec("data")]), ""]
    if a.gpu:
        md += ["## GPU", ""]
        g = sec("gpu_machine")
        if not g:
            md += ["No GPU on this machine: no GPU figures.", ""]
        else:
            md += [f"GPUs: {', '.join(g[0]['gpus'])}", ""]
            rows = [[r.get("model"), r.get("precision", "fp32"), r.get("devices"), fmt(r.get("img_per_s")),
                     fmt(r.get("ms_per_step"), ".2f"), r.get("timing"), f"`{r['command']}`"] for r in sec("gpu_train")]
            md += [table(["model", "precision", "devices", "img/s", "ms/step", "timing", "command"], rows), ""]
            rows = [[r.get("op"), r.get("shape"), fmt(r.get("median_ms"), ".3f"),
                     fmt(r.get("gflops")), fmt(r.get("gbps")), f"`{r['command']}`"] for r in sec("gpu_kernel")]
            md += [table(["op", "shape", "ms", "GFLOP/s", "GB/s", "command"], rows), ""]
    summary = [r for r in sec("straggler") if r.get("run") == "summary"]
    if summary:
        r = summary[-1]
        md += ["## Auto-balanced towers against a straggler (bench/straggler.py)", "",
               "Two processes, one per core, a spinning process sharing rank 1's core; median img/s over rounds.", "",
               table(["even", f"best hand-set ({r['best_weights']})", "auto", "PyTorch DDP", "auto / best", "auto / even",
                      "auto / DDP"],
                     [[fmt(r["even"]), fmt(r["best_hand_set"]), fmt(r["auto"]), fmt(r.get("ddp")),
                       fmt(r["auto_over_best"], ".2f"), fmt(r["auto_over_even"], ".2f"), fmt(r.get("auto_over_ddp"), ".2f")]]),
               ""]
    errors = sec("error")
    if errors:
        md += ["## Failures", ""] + [f"- {r['what']}: exit {r.get('rc')} `{r.get('command', '')}`" for r in errors] + [""]
    md += [f"Every figure is also in `{os.path.basename(rec.stem)}.jsonl` (one JSON object per line, with its "
           f"command and CPU); each command's output is in `{os.path.basename(rec.stem)}.log`.", ""]
    with open(rec.stem + ".md", "w") as f:
        f.write("\n".join(md))
    return md


# ---------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(REPO, "build"), help="the CMake build directory")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results"), help="where the report goes")
    ap.add_argument("--name", help="file name stem (default: <cpu>-<date>, or <cpu>-quick)")
    ap.add_argument("--quick", action="store_true", help="a smoke run on tiny settings (about a minute)")
    ap.add_argument("--peer-python", default=sys.executable, help="the Python that has torch / tensorflow")
    ap.add_argument("--no-peers", action="store_true", help="skip PyTorch and TensorFlow")
    ap.add_argument("--only", default="kernels,train,peers,bf16,trace,others",
                    help="comma-separated parts: kernels, train, peers, bf16, trace, others (the limits come with "
                         "kernels); "
                         "straggler (auto-balanced towers against a real straggler, bench/straggler.py: about 8 "
                         "minutes, 2 or more CPUs) only when named")
    ap.add_argument("--bf16-also", default="auto",
                    help="bf16 kernels the bf16 part also trains with (TOWERFLOW_BF16_KERNELS), beside the automatic "
                         "choice: auto (where oneDNN's are chosen: amx where the CPU has AMX-BF16, else "
                         "avx512bf16 where it has AVX512-BF16), none, or a name")
    ap.add_argument("--gpu", action="store_true", help="also the GPU part (when nvidia-smi finds a GPU)")
    ap.add_argument("--gpu-only", action="store_true", help="only the GPU part")
    ap.add_argument("--models", default="tfcnn,resnet20")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads in all (default: every CPU)")
    ap.add_argument("--towers", type=int, help="devices / processes of the multi-tower comparison "
                                               "(default: the threads, at least 2)")
    ap.add_argument("--batch", type=int, help="global batch of the training runs (default 128; quick 8)")
    ap.add_argument("--steps", type=int, help="timed steps per training run (default 12; quick 2)")
    ap.add_argument("--warmup", type=int, help="warm-up steps (default 2; quick 1)")
    ap.add_argument("--rounds", type=int, help="rounds against each peer (default 3; quick 1)")
    ap.add_argument("--devices", default=None, help="device counts of the sweep (default 1,2,4; quick 1,2)")
    ap.add_argument("--reductions", default="all_reduce,bucketed,parameter_device")
    ap.add_argument("--kernel-batch", type=int, help="batch of the kernel benchmarks (default 128; quick 2)")
    ap.add_argument("--kernel-reps", type=int, help="Google Benchmark repetitions (default 3; quick 1)")
    ap.add_argument("--min-time", type=float, help="Google Benchmark min time per repetition, s (default 0.2)")
    ap.add_argument("--bandwidth-mib", type=int, help="MiB per STREAM array (default 256; quick 8)")
    a = ap.parse_args()
    q = a.quick
    a.batch = a.batch or (8 if q else 128)
    a.steps = a.steps or (2 if q else 12)
    a.warmup = a.warmup if a.warmup is not None else (1 if q else 2)
    a.rounds = a.rounds or (1 if q else 3)
    a.towers = a.towers or max(2, a.threads)
    a.device_counts = [int(x) for x in (a.devices or ("1,2" if q else "1,2,4")).split(",")]
    a.reductions = a.reductions.split(",")
    a.kernel_batch = a.kernel_batch or (2 if q else 128)
    a.kernel_reps = a.kernel_reps or (1 if q else 3)
    a.min_time = a.min_time or (0.001 if q else 0.2)
    a.bandwidth_mib = a.bandwidth_mib or (8 if q else 256)
    a.models = a.models.split(",")
    a.bin = os.path.join(os.path.abspath(a.build), "bin")
    parts = set(a.only.split(","))
    if a.gpu_only:
        parts, a.gpu = set(), True
    a.parts = parts
    if not os.path.exists(os.path.join(a.bin, "towerflow_bench_train")):
        sys.exit(f"error: {a.bin}/towerflow_bench_train not found; build first (scripts/bench.sh builds) "
                 f"or pass --build DIR")

    t0 = time.time()
    info = machine_info()
    stem = a.name or f"{cpu_slug(info)}-" + ("quick" if q else datetime.date.today().isoformat())
    rec = Recorder(a.out, stem, info["cpu_model"], info["isa_extensions"])
    rec.add("machine", **info)
    print(f"# towerflow benchmarks on {info['cpu_model']} ({info['logical_cpus']} CPUs), commit {info['commit']}",
          flush=True)
    versions = {}
    if not a.no_peers and parts & {"peers", "bf16"}:
        versions = {m: have_module(a.peer_python, m) for m in ("torch", "tensorflow")}
    limits = {}
    if "kernels" in parts:
        run_kernels(rec, a, limits)
        run_kernels_second(rec, a, limits)
    else:
        kernel_context(rec, a, limits)
    if "train" in parts:
        sweep(rec, a, limits)
    if "peers" in parts:
        compare(rec, a, limits, versions)
    if "bf16" in parts:
        compare_bf16(rec, a, limits, versions)
    if "trace" in parts:
        trace_bounds(rec, a, limits)
    if "others" in parts:
        others(rec, a, limits)
    if "straggler" in parts:
        straggler(rec, a)
    if "kernels" in parts and (set(parts) - {"kernels"}):
        run_kernels(rec, a, limits, when="end")
        apply_shares(rec, a, limits)
    rec.rewrite()
    if a.gpu:
        run_gpu(rec, a)
    md = report(rec, a, info, limits, versions, ["scripts/bench.sh"] + sys.argv[1:], time.time() - t0)
    # The headline on the terminal: the comparison, or the training sweep without peers.
    cut = [i for i, l in enumerate(md) if l.startswith("## ")]
    print("\n".join(md[:cut[1] if sec_count(rec, "compare") and len(cut) > 1 else (cut[0] if cut else len(md))]))
    print(f"report: {rec.stem}.md\nfigures: {rec.stem}.jsonl", flush=True)
    return 1 if sec_count(rec, "error") else 0


def sec_count(rec, s):
    return sum(1 for r in rec.rows if r["section"] == s)


if __name__ == "__main__":
    sys.exit(main())
