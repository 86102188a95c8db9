#!/usr/bin/env python3
"""Auto-balanced towers against a real straggler: two processes under mpirun, one per core, with a
busy process competing for the second core, so that rank 1 runs at about half speed.

Each round runs, one after the other (alternating, so that a noisy machine hurts them alike):
  * towerflow --split even
  * towerflow --split weights:W,1 with the best W of a search done in the first round
  * towerflow --split auto
  * PyTorch DistributedDataParallel (gloo, 2 processes x 1 thread, pinned one per core), which
    splits evenly: DDP has no per-rank batch sizes.
All train ResNet-20 (by default) on the same synthetic global batch; img/s is the global batch
over the median step. The figures are the medians over rounds, with ratios auto / even, auto /
best weights and auto / DDP.

Then the straggler appearing mid-run: cifar10_train --split auto under the same mpirun, the busy
process started once the run has logged --midrun-start steps; its metrics.jsonl (rows per tower
and images/s every step) is drawn by scripts/plot_metrics.py --split.

    bench/straggler.py [--build build] [--peer-python build/bench-venv/bin/python] [--rounds 3]

Writes bench/results/straggler-<cpu>-<date>.{jsonl,md,png} and prints JSON lines. Needs 2 or more
CPUs, Open MPI's mpirun and taskset; PyTorch for the peer (skipped, saying so, without it).
"""
import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none", "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def cpu_model():
    """The model name, with the family and model numbers (a VM's name is often only "AMD EPYC")."""
    fields = {}
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        return "unknown CPU"
    return f"{fields.get('model name', 'unknown CPU')} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"


class Busy:
    """A process spinning on one core: the competing load that makes a straggler."""

    def __init__(self, core):
        self.core = core
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(["taskset", "-c", str(self.core), sys.executable, "-c", "while True: pass"])

    def stop(self):
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def run(cmd, env=None, timeout=900):
    full_env = dict(os.environ, **MPI_ENV, **(env or {}))
    p = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout)
    if p.returncode != 0:
        sys.exit(f"straggler: {' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p.stdout


def json_rows(out, prefix=""):
    rows = []
    for line in out.splitlines():
        line = line.strip()
        if line.startswith(prefix) and line[len(prefix):].lstrip().startswith("{"):
            try:
                rows.append(json.loads(line[len(prefix):]))
            except json.JSONDecodeError:
                pass
    return rows


def towerflow(a, split):
    cmd = ["mpirun", "-np", "2", "--bind-to", "core", "--map-by", "core",
           os.path.join(a.bin, "towerflow_bench_train"), "--model", a.model, "--batch", str(a.batch), "--threads", "1",
           "--devices", "1", "--split", split, "--split_remainder", "spread", "--steps", str(a.steps), "--warmup", str(a.warmup), "--json"]
    r = json_rows(run(cmd))[-1]
    return {"run": f"towerflow {split}", "img_per_s": r["img_per_s"], "last_split": r.get("last_split"),
            "command": " ".join(cmd[:7] + [os.path.relpath(cmd[7], REPO)] + cmd[8:])}


def ddp(a):
    cmd = [a.peer_python, os.path.join(REPO, "bench", "peers", "torch_ddp_bench.py"), "--model", a.model,
           "--batch", str(a.batch), "--procs", "2", "--threads", "1", "--pin", "--steps", str(a.steps),
           "--warmup", str(a.warmup), "--nosync-steps", "0", "--json"]
    r = json_rows(run(cmd), "JSON")[-1]
    return {"run": "pytorch ddp", "img_per_s": r["img_per_s_median"],
            "command": " ".join([os.path.relpath(cmd[1], REPO)] + cmd[2:])}


def have_torch(python):
    return subprocess.run([python, "-c", "import torch"], capture_output=True).returncode == 0


def midrun(a, out_dir, stem):
    """cifar10_train --split auto; the busy process starts after --midrun-start logged steps."""
    train_dir = tempfile.mkdtemp(prefix="towerflow-straggler-")
    cmd = ["mpirun", "-np", "2", "--bind-to", "core", "--map-by", "core", os.path.join(a.bin, "cifar10_train"),
           "--devices", "/cpu:0", "--split", "auto", "--batch_size", str(a.batch), "--max_steps", str(a.midrun_steps), "--log_every", "1",
           "--intra_op_threads", "1", "--eval_every", "0", "--train_dir", train_dir, "--progress", "json"]
    env = dict(os.environ, **MPI_ENV)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    busy = Busy(1)
    started_at = None
    for line in proc.stdout:
        m = re.match(r'\s*\{"step":(\d+)', line)
        if m and started_at is None and int(m.group(1)) >= a.midrun_start:
            busy.start()
            started_at = int(m.group(1))
    proc.wait()
    busy.stop()
    if proc.returncode != 0:
        sys.exit(f"straggler: {' '.join(cmd)} exited {proc.returncode}")
    png = os.path.join(out_dir, stem + "-midrun.png")
    subprocess.run([a.plot_python, os.path.join(REPO, "scripts", "plot_metrics.py"), os.path.join(train_dir, "metrics.jsonl"),
                    "--split", "-o", png,
                    "--mark", str(started_at)], check=True)
    metrics = os.path.join(out_dir, stem + "-midrun.metrics.jsonl")
    shutil.copyfile(os.path.join(train_dir, "metrics.jsonl"), metrics)
    shutil.rmtree(train_dir)
    rows = [json.loads(l) for l in open(metrics) if '"split"' in l]
    return {"run": "midrun", "straggler_from_step": started_at, "plot": os.path.relpath(png, REPO),
            "splits": [r["split"] for r in rows], "img_per_s": [r["img_per_s"] for r in rows],
            "command": " ".join(cmd[:7] + [os.path.relpath(cmd[7], REPO)] + cmd[8:])}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results"))
    ap.add_argument("--peer-python", default=None, help="the Python with torch (default: BUILD/bench-venv's, else python3)")
    ap.add_argument("--plot-python", default=None, help="the Python with matplotlib (default: .venv's, else python3)")
    ap.add_argument("--model", default="resnet20")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=15, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=6, help="untimed steps first (auto measures from the second)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--weights", default="1.5,2,2.5,3", help="the W of weights:W,1 searched in the first round")
    ap.add_argument("--midrun-steps", type=int, default=60)
    ap.add_argument("--midrun-start", type=int, default=20, help="the busy process starts after this step")
    ap.add_argument("--no-midrun", action="store_true")
    a = ap.parse_args()
    if (os.cpu_count() or 1) < 2:
        sys.exit("straggler: needs 2 or more CPUs (one per rank)")
    a.bin = os.path.join(os.path.abspath(a.build), "bin")
    venv = os.path.join(a.build, "bench-venv", "bin", "python")
    a.peer_python = a.peer_python or (venv if os.path.exists(venv) else sys.executable)
    dot_venv = os.path.join(REPO, ".venv", "bin", "python3")
    a.plot_python = a.plot_python or (dot_venv if os.path.exists(dot_venv) else sys.executable)
    cpu = cpu_model()
    stem = "straggler-" + re.sub(r"[^a-z0-9]+", "-", cpu.lower()).strip("-") + "-" + datetime.date.today().isoformat()
    stem = stem.replace("-family-", "-f").replace("-model-", "m")
    os.makedirs(a.out, exist_ok=True)
    rows = []

    def emit(r):
        r["cpu"] = cpu
        rows.append(r)
        print(json.dumps(r), flush=True)

    torch_ok = have_torch(a.peer_python)
    if not torch_ok:
        print(f"# PyTorch not found by {a.peer_python}: the DDP peer is skipped", flush=True)
    busy = Busy(1)
    busy.start()
    try:
        best = None
        for rnd in range(a.rounds):
            if rnd == 0:  # the hand-set weights: search once
                tried = [dict(towerflow(a, f"weights:{w},1"), round=0, search=True) for w in a.weights.split(",")]
                for t in tried:
                    emit(t)
                best = max(tried, key=lambda t: t["img_per_s"])["run"].split(" ", 1)[1]
            for split in ("even", best, "auto"):
                emit(dict(towerflow(a, split), round=rnd))
            if torch_ok:
                emit(dict(ddp(a), round=rnd))
    finally:
        busy.stop()

    def median(name):
        xs = [r["img_per_s"] for r in rows if r["run"] == name and not r.get("search")]
        return statistics.median(xs) if xs else None

    even, hand, auto, torch_ddp = (median("towerflow even"), median(f"towerflow {best}"), median("towerflow auto"),
                                   median("pytorch ddp"))
    summary = {"run": "summary", "best_weights": best, "even": even, "best_hand_set": hand, "auto": auto,
               "ddp": torch_ddp, "auto_over_best": auto / hand, "auto_over_even": auto / even,
               "auto_over_ddp": auto / torch_ddp if torch_ddp else None}
    emit(summary)
    mid = None if a.no_midrun else midrun(a, a.out, stem)
    if mid:
        emit(mid)

    with open(os.path.join(a.out, stem + ".jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    md = [f"# Auto-balanced towers against a straggler, on {cpu}", "",
          f"- {datetime.date.today().isoformat()}; `bench/straggler.py {' '.join(sys.argv[1:])}`",
          f"- {a.model}, global batch {a.batch}, 2 processes under `mpirun --bind-to core`, 1 thread each; "
          "a spinning process shares core 1 with rank 1 all along",
          f"- {a.rounds} rounds, alternating; median img/s over rounds ({a.steps} timed steps after {a.warmup})", "",
          "| split | img/s | auto / this |", "|---|---|---|"]
    for name, v in (("even", even), (f"best hand-set ({best})", hand), ("auto", auto), ("PyTorch DDP (even)", torch_ddp)):
        md.append(f"| {name} | {v:.1f} | {auto / v:.2f} |" if v else f"| {name} | not run | |")
    if mid:
        md += ["", f"Straggler from step {mid['straggler_from_step']} of {a.midrun_steps} (cifar10_train --split auto): "
               f"![rows per tower and step time]({os.path.basename(mid['plot'])})",
               "", "rows of tower 1 per step: " + " ".join(str(s[1]) for s in mid["splits"])]
    with open(os.path.join(a.out, stem + ".md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print(f"report: {os.path.relpath(os.path.join(a.out, stem + '.md'), REPO)}", flush=True)


if __name__ == "__main__":
    main()
