#!/usr/bin/env python3
"""cifar10_train under mpirun, as a user runs it: one training over every process.

    test_mpi_cli.py MPIEXEC CIFAR10_TRAIN [CASE ...]

Cases (all by default):
  same       2 processes x 1 device end with the same parameters as 1 process x 2 devices; the
             checkpoints and metrics.jsonl are written once (by rank 0) and the output is one
             start-up block.
  resume     a run of 2 processes stopped at step 6 and resumed under mpirun -np 2, or by one
             process with 2 devices, ends as the uninterrupted run; one resumed on 3 processes
             (the batch spread over 3 towers) goes on from step 6.
  mismatch   ranks started with different flags stop, each naming the difference.
  failure    a rank that fails at start-up is named, with its error, by the other rank.
  kill       a rank killed with SIGKILL mid-run ends the job within the bound, non-zero.
  sigterm    SIGTERM to every rank: each says where rank 0 wrote the checkpoint (not an empty path).
  chaos      a run killed at random moments (SIGKILL to a random rank, SIGTERM to mpirun) and
             resumed each time on another number of processes and devices until its last step:
             every checkpoint stays intact, and the final model is the uninterrupted run's within
             the tolerance of summation order. Seeded (TOWERFLOW_CHAOS_SEED, printed), so a
             failure reproduces.
Exit status 0 when every case passes; 77 (skipped) when MPIEXEC cannot start 2 processes.
"""
import json
import os
import pathlib
import random
import signal
import struct
import subprocess
import sys
import tempfile
import time

MPIEXEC, TRAIN = sys.argv[1], sys.argv[2]
CASES = sys.argv[3:] or ["same", "resume", "mismatch", "failure", "kill", "sigterm", "chaos"]
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_btl_vader_single_copy_mechanism="none")
if "ASAN_OPTIONS" in ENV:  # Open MPI's unloaded components leak unattributably (tests/tower/CMakeLists.txt)
    ENV["ASAN_OPTIONS"] += ":detect_leaks=0"
# Small and quick: tfcnn (no batch statistics) on 640 built-in images, 1 thread per device.
COMMON = ["--builtin_train_size", "640", "--builtin_test_size", "128", "--batch_size", "32",
          "--log_every", "2", "--intra_op_threads", "1", "--loader_threads", "0", "--tensorboard=false"]
failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)


def run(args, np=None, timeout=240):
    cmd = ([MPIEXEC, "-n", str(np)] if np else []) + args
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def tensors(path):
    """name -> raw bytes of every tensor of a safetensors file."""
    data = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    return {k: body[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in header.items() if k != "__metadata__"}


def max_diff(a, b):
    """Largest absolute difference between two checkpoints' float32 tensors."""
    ta, tb = tensors(a), tensors(b)
    assert ta.keys() == tb.keys(), (sorted(ta), sorted(tb))
    worst = 0.0
    for k in ta:
        xa = struct.unpack(f"<{len(ta[k]) // 4}f", ta[k])
        xb = struct.unpack(f"<{len(tb[k]) // 4}f", tb[k])
        worst = max(worst, max((abs(x - y) for x, y in zip(xa, xb)), default=0.0))
    return worst


def final_model(train_dir):
    ckpts = sorted(pathlib.Path(train_dir).glob("ckpt-*"))
    return ckpts[-1] / "model.safetensors"


tmp = pathlib.Path(tempfile.mkdtemp(prefix="tw_mpi_cli_"))

# Can this machine start 2 MPI processes at all?
code, out = run(["true"], np=2, timeout=60)
if code != 0:
    print(f"TEST SKIPPED: {MPIEXEC} -n 2 true failed here:\n{out}")
    sys.exit(77)

if "same" in CASES:
    code, out = run([TRAIN, "--devices", "/cpu:0", "--train_dir", str(tmp / "np2"), "--max_steps", "8"] + COMMON, np=2)
    check(code == 0, f"mpirun -np 2 cifar10_train exits 0 ({code})")
    check(out.count("towerflow cifar10_train") == 1, "one start-up block, from rank 0")
    check("2 processes" in out and "2 towers (1 per process)" in out, "the start-up block names the processes")
    lines = (tmp / "np2" / "metrics.jsonl").read_text().splitlines()
    check(len([l for l in lines if "test_loss" in l]) == 1, "metrics.jsonl holds one evaluation, not one per rank")
    check(sorted(p.name for p in (tmp / "np2").glob("ckpt-*")) == ["ckpt-0000000008"], "one final checkpoint")
    code, out1 = run([TRAIN, "--devices", "/cpu:0,/cpu:1", "--train_dir", str(tmp / "one"), "--max_steps", "8"] + COMMON)
    check(code == 0, "1 process x 2 devices exits 0")
    d = max_diff(final_model(tmp / "np2"), final_model(tmp / "one"))
    check(d < 1e-6, f"2 processes x 1 device = 1 process x 2 devices (max difference {d:.3g})")

if "resume" in CASES:
    import shutil
    # The run that is not interrupted, checkpointing at step 6 on the way; the interrupted ones
    # are copies of it without the step-12 checkpoint (as if stopped after step 6).
    full = tmp / "full"
    code, _ = run([TRAIN, "--devices", "/cpu:0", "--train_dir", str(full), "--max_steps", "12", "--save_every", "6"]
                  + COMMON, np=2)
    check(code == 0 and (full / "ckpt-0000000006").exists(), "the uninterrupted run, with a checkpoint at step 6")
    for name in ("part", "part_single", "part_three"):
        shutil.copytree(full, tmp / name)
        shutil.rmtree(tmp / name / "ckpt-0000000012")
    resume = ["--max_steps", "12", "--save_every", "6", "--resume"] + COMMON
    code, out = run([TRAIN, "--devices", "/cpu:0", "--train_dir", str(tmp / "part")] + resume, np=2)
    check(code == 0 and "ckpt-0000000006" in out, "resumed under mpirun -np 2 from step 6")
    d = max_diff(final_model(tmp / "part"), final_model(full))
    check(d == 0.0, f"resumed on 2 processes = uninterrupted, bit for bit (max difference {d:.3g})")
    code, out = run([TRAIN, "--devices", "/cpu:0,/cpu:1", "--train_dir", str(tmp / "part_single")] + resume)
    check(code == 0 and "ckpt-0000000006" in out, "the 2-process checkpoint resumed by 1 process with 2 devices")
    d = max_diff(final_model(tmp / "part_single"), final_model(full))
    check(d < 1e-6, f"resumed on 1 process x 2 devices = uninterrupted (max difference {d:.3g})")
    code, out = run([TRAIN, "--devices", "/cpu:0", "--train_dir", str(tmp / "part_three"), "--split_remainder", "spread"]
                    + resume, np=3)
    check(code == 0 and "ckpt-0000000006" in out and "3 towers" in out,
          f"the 2-process checkpoint resumed on 3 processes ({code})")
    check((tmp / "part_three" / "ckpt-0000000012").exists(), "the 3-process run went on to step 12")
    d = max_diff(final_model(tmp / "part_three"), final_model(full))
    # The same samples in the same global batches, split 11/11/10 instead of 16/16: only the
    # order of summation differs.
    check(d < 1e-4, f"resumed on 3 processes: close to the uninterrupted run (max difference {d:.3g})")

if "mismatch" in CASES:
    base = [TRAIN, "--devices", "/cpu:0", "--train_dir", str(tmp / "mismatch"), "--max_steps", "4"] + COMMON
    cmd = [MPIEXEC, "-n", "1"] + base + ["--seed", "1", ":", "-n", "1"] + base + ["--seed", "2"]
    t0 = time.time()
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    check(p.returncode != 0, "ranks with different --seed: the job fails")
    check(out.count("the ranks disagree on the options") == 2, "both ranks report the difference")
    check('"seed":1' in out.replace(" ", "") and '"seed":2' in out.replace(" ", ""), "the message shows both values")
    check(time.time() - t0 < 60, "at once, not after a timeout")

if "failure" in CASES:
    base = [TRAIN, "--devices", "/cpu:0", "--train_dir", str(tmp / "failure"), "--max_steps", "4"] + COMMON
    # Rank 1 alone has an impossible setting in its environment.
    cmd = [MPIEXEC, "-n", "1"] + base + [":", "-n", "1", "env", "TOWERFLOW_CPU_ISA=bogus"] + base
    t0 = time.time()
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    check(p.returncode != 0, "a rank that fails: the job fails")
    check("rank 0: rank 1 failed:" in out and "TOWERFLOW_CPU_ISA" in out,
          "rank 0 names rank 1 and its error:\n" + "\n".join(l for l in out.splitlines() if "rank" in l)[:2000])
    check(time.time() - t0 < 60, f"within the bound ({time.time() - t0:.1f} s)")

if "kill" in CASES:
    cmd = [MPIEXEC, "-n", "2", TRAIN, "--devices", "/cpu:0", "--train_dir", str(tmp / "kill"), "--max_steps",
           "100000", "--json"] + COMMON
    log = open(tmp / "kill.log", "w+")
    p = subprocess.Popen(cmd, env=ENV, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while time.time() < deadline and '"step"' not in (tmp / "kill.log").read_text():
        time.sleep(0.2)
    ranks = subprocess.run(["pgrep", "-P", str(p.pid), "-f", "cifar10_train"], capture_output=True, text=True).stdout.split()
    check(len(ranks) == 2, f"two ranks running ({ranks})")
    t0 = time.time()
    os.kill(int(ranks[-1]), signal.SIGKILL)
    try:
        p.wait(timeout=90)
    except subprocess.TimeoutExpired:
        p.kill()
    elapsed = time.time() - t0
    out = (tmp / "kill.log").read_text()
    check(p.returncode not in (0, None), f"the job ends non-zero ({p.returncode})")
    check(elapsed < 60, f"within 60 s of the kill ({elapsed:.1f} s)")
    check("signal 9" in out or "rank" in out.lower(), "the launcher or a rank says which rank died:\n" + out[-1500:])

if "sigterm" in CASES:
    # As a scheduler ends a job: SIGTERM to every rank. Rank 0 alone writes the checkpoint; every
    # rank's "stopped by" line names it. --tag-output prefixes each line with [job,rank]. Rank 1
    # (no checkpoint to write) finishes first; mpirun may then end rank 0 before its line is out,
    # so rank 0's line is checked only when it is there.
    cmd = [MPIEXEC, "--tag-output", "-n", "2", TRAIN, "--devices", "/cpu:0", "--train_dir", str(tmp / "sigterm"), "--max_steps",
           "100000", "--json"] + COMMON
    log = open(tmp / "sigterm.log", "w+")
    p = subprocess.Popen(cmd, env=ENV, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while time.time() < deadline and '"step"' not in (tmp / "sigterm.log").read_text():
        time.sleep(0.2)
    ranks = subprocess.run(["pgrep", "-P", str(p.pid), "-f", "cifar10_train"], capture_output=True, text=True).stdout.split()
    check(len(ranks) == 2, f"two ranks running ({ranks})")
    for r in ranks:
        os.kill(int(r), signal.SIGTERM)
    try:
        p.wait(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
    out = (tmp / "sigterm.log").read_text()
    ckpts = sorted((tmp / "sigterm").glob("ckpt-*"))
    check(len(ckpts) == 1, f"one checkpoint, rank 0's ({[c.name for c in ckpts]})")
    # A rank whose own SIGTERM arrives after the other rank's stop request reached it says it was
    # stopped by another rank; either way it names the checkpoint.
    stopped = [l for l in out.splitlines() if "stopped by SIGTERM" in l or "stopped by another rank" in l]
    check(any(",1]<" in l.split(":", 1)[0] for l in stopped) and ckpts and
          all(str(ckpts[-1]) + ";" in l for l in stopped),
          "rank 1 (and rank 0, if it got that far) names the checkpoint rank 0 wrote:\n" + "\n".join(stopped) +
          "\n" + out[-1500:])

if "chaos" in CASES:
    seed = int(os.environ.get("TOWERFLOW_CHAOS_SEED") or random.SystemRandom().randrange(1 << 30))
    rng = random.Random(seed)
    print(f"chaos: seed {seed} (TOWERFLOW_CHAOS_SEED={seed} repeats this case)", flush=True)
    CKPT = str(pathlib.Path(TRAIN).parent / "towerflow_ckpt")
    steps = 24
    base = ["--max_steps", str(steps), "--save_every", "2", "--json"] + COMMON
    code, _ = run([TRAIN, "--devices", "/cpu:0", "--train_dir", str(tmp / "calm")] + base, np=2)
    check(code == 0, "the uninterrupted run (2 processes x 1 device)")
    # Each attempt on another shape of the same global batch: processes x devices.
    shapes = [(2, ["--devices", "/cpu:0"]), (1, ["--devices", "/cpu:0,/cpu:1"]),
              (3, ["--devices", "/cpu:0", "--split_remainder", "spread"])]
    chaos, shape, attempts, intact = tmp / "chaos", rng.randrange(3), [], True
    t_start = time.time()
    for attempt in range(8):
        shape = (shape + rng.randrange(1, 3)) % 3  # never the previous shape
        np_, devices = shapes[shape]
        resume = ["--resume"] if attempt > 0 else []
        final = attempt == 7  # the last attempt runs to the end
        log = open(tmp / f"chaos{attempt}.log", "w+")
        cmd = [MPIEXEC, "-n", str(np_), TRAIN, "--train_dir", str(chaos)] + devices + resume + base
        p = subprocess.Popen(cmd, env=ENV, stdout=log, stderr=subprocess.STDOUT)
        before = {c.name for c in chaos.glob("ckpt-*")}
        how = "none"
        if not final:
            # Once this attempt has begun a checkpoint of its own (its temporary directory counts, so
            # a kill may land while it is being written), at a random moment after that.
            deadline = time.time() + 60
            while time.time() < deadline and p.poll() is None and not ({c.name for c in chaos.glob("ckpt-*")} - before):
                time.sleep(0.05)
            time.sleep(rng.uniform(0, 0.4))
            if p.poll() is None:
                ranks = subprocess.run(["pgrep", "-P", str(p.pid), "-f", "cifar10_train"], capture_output=True,
                                       text=True).stdout.split()
                if rng.random() < 0.5 and ranks:
                    how = "SIGKILL to a rank"
                    os.kill(int(rng.choice(ranks)), signal.SIGKILL)
                else:
                    how = "SIGTERM to mpirun"
                    p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            check(False, f"chaos attempt {attempt} ended within 120 s of {how}")
        newest = max((c.name for c in chaos.glob("ckpt-" + "[0-9]" * 10)), default="none")
        attempts.append(f"{np_} process(es) {' '.join(devices[1:])}: {how}, exit {p.returncode}, newest {newest}")
        code, out = run([CKPT, "verify", str(chaos)], timeout=60)
        if code != 0:
            intact = False
            check(False, f"every checkpoint intact after attempt {attempt} ({how}):\n{out[-1500:]}")
        if (chaos / f"ckpt-{steps:010d}").exists() and p.returncode == 0:
            break
    print("chaos attempts:\n  " + "\n  ".join(attempts), flush=True)
    check(intact, "no checkpoint was ever unreadable")
    check((chaos / f"ckpt-{steps:010d}").exists(), f"the run reached step {steps} (seed {seed})")
    if (chaos / f"ckpt-{steps:010d}").exists():
        d = max_diff(final_model(chaos), final_model(tmp / "calm"))
        # The same samples in the same global batches, split over 2, 3 or 2 towers in turn: only
        # the order of summation differs.
        check(d < 1e-4, f"the interrupted run = the uninterrupted one (max difference {d:.3g}, seed {seed})")
    check(time.time() - t_start < 180, f"chaos within its bound ({time.time() - t_start:.1f} s)")

print(f"{len(failures)} failure(s)" if failures else "all cases passed")
sys.exit(1 if failures else 0)
