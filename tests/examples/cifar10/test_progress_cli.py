#!/usr/bin/env python3
"""cifar10_train's --progress, as a user sees it on a terminal, in a log file and under mpirun.

    test_progress_cli.py CIFAR10_TRAIN [--mpi] [--mpiexec MPIEXEC]

Cases:
  plain      --progress plain on a terminal: one line per report, no carriage return, no ESC[.
  live       auto on a terminal, no launcher variables: the line is redrawn in place (\\r, ESC[K).
  launcher   auto on a terminal with OMPI_COMM_WORLD_SIZE=1 (what mpirun sets; Open MPI gives rank
             0 a pseudo-terminal even when mpirun's output goes to a file): plain lines. Needs a
             build with MPI (--mpi): without one the program refuses to run under a launcher.
  mpirun     with --mpiexec: `mpirun -n 1 cifar10_train > log`, the reported case: plain lines.
  json       --progress json: every line is a JSON object; --json says the same.
  refused    --progress nonsense, and --json with --progress plain, exit 2 naming the values.
Exit status 0 when every case passes.
"""
import json
import os
import pty
import select
import subprocess
import sys
import tempfile
import termios
import time

TRAIN = sys.argv[1]
HAVE_MPI = "--mpi" in sys.argv
MPIEXEC = sys.argv[sys.argv.index("--mpiexec") + 1] if "--mpiexec" in sys.argv else None
LAUNCHER_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "MPI_LOCALNRANKS", "SLURM_")
# No launcher variables from whatever started this test.
BASE_ENV = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
BASE_ENV["TERM"] = "xterm"
if "ASAN_OPTIONS" in BASE_ENV:  # Open MPI's unloaded components leak unattributably (tests/tower/CMakeLists.txt)
    BASE_ENV["ASAN_OPTIONS"] += ":detect_leaks=0"
# Small and quick: tfcnn on 256 built-in images, 6 steps, a report every step.
STEPS = 6
COMMON = ["--builtin_train_size", "256", "--builtin_test_size", "64", "--batch_size", "32", "--max_steps", str(STEPS),
          "--log_every", "1", "--intra_op_threads", "1", "--loader_threads", "0", "--tensorboard=false"]
failures = []
tmp = tempfile.TemporaryDirectory(prefix="tw_progress_")
runs = 0


def check(ok, what, output=""):
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)
        print("  output was: " + repr(output[-3000:]), flush=True)


def train_dir():
    global runs
    runs += 1
    return os.path.join(tmp.name, f"run{runs}")


def on_terminal(args, env, timeout=240):
    """Runs args with stdout and stderr on a pseudo-terminal; (exit code, everything written)."""
    master, slave = pty.openpty()
    # The terminal driver turns "\n" into "\r\n" by default; switch that off so that every "\r"
    # read here is one the program wrote.
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.OPOST
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if not ready:
            if p.poll() is not None:
                break
            continue
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    try:
        code = p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        p.kill()
        code = p.wait()
    return code, out.decode("utf-8", "replace")


def plain_lines_ok(what, code, out):
    check(code == 0, f"{what}: exit 0 (got {code})", out)
    check("\r" not in out, f"{what}: no carriage return", out)
    check("\x1b[" not in out, f"{what}: no escape code", out)
    steps = [l for l in out.split("\n") if l.startswith("epoch ") and " step " in l]
    check(len(steps) == STEPS, f"{what}: one line per report ({STEPS} reports, {len(steps)} lines)", out)


# plain: a terminal, but plain lines asked for.
code, out = on_terminal([TRAIN, *COMMON, "--train_dir", train_dir(), "--progress", "plain"], BASE_ENV)
plain_lines_ok("--progress plain on a terminal", code, out)

# live: auto on a terminal outside a launcher draws the line as before.
code, out = on_terminal([TRAIN, *COMMON, "--train_dir", train_dir()], BASE_ENV)
check(code == 0, f"auto on a terminal: exit 0 (got {code})", out)
check("\r" in out and "\x1b[K" in out, "auto on a terminal: the live line is redrawn in place (\\r, ESC[K)", out)

# launcher: auto on a terminal that a launcher gave the process.
if HAVE_MPI:
    code, out = on_terminal([TRAIN, *COMMON, "--train_dir", train_dir(), "--progress", "auto"],
                            dict(BASE_ENV, OMPI_COMM_WORLD_SIZE="1"))
    plain_lines_ok("auto on a terminal with OMPI_COMM_WORLD_SIZE=1", code, out)
else:
    print("skipped: auto under launcher variables (this build has no MPI, so cifar10_train refuses to run "
          "under a launcher; configure with -DTOWERFLOW_MPI=ON)", flush=True)

# mpirun: the reported case, mpirun's output in a log file.
if MPIEXEC and HAVE_MPI:
    env = dict(BASE_ENV, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none")
    with open(os.path.join(tmp.name, "mpirun.log"), "w+") as log:
        p = subprocess.run([MPIEXEC, "-n", "1", TRAIN, *COMMON, "--train_dir", train_dir()], env=env,
                           stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, timeout=240)
        log.seek(0)
        plain_lines_ok("mpirun -n 1 cifar10_train > log", p.returncode, log.read())

# json: JSON lines only, by either spelling.
for flags in (["--progress", "json"], ["--json"], ["--json", "--progress", "json"]):
    code, out = on_terminal([TRAIN, *COMMON, "--train_dir", train_dir(), *flags], BASE_ENV)
    lines = [l for l in out.split("\n") if l.strip()]
    try:
        objects = [json.loads(l) for l in lines]
        parsed = True
    except ValueError:
        objects, parsed = [], False
    what = " ".join(flags)
    check(code == 0 and parsed, f"{what}: every line is a JSON object", out)
    check(sum(1 for o in objects if "loss" in o) == STEPS, f"{what}: one training object per report", out)

# refused: a value that is not a form, and two flags that disagree.
p = subprocess.run([TRAIN, *COMMON, "--train_dir", train_dir(), "--progress", "nonsense"], env=BASE_ENV,
                   capture_output=True, text=True, timeout=60)
check(p.returncode == 2 and '--progress "nonsense" is not one of auto, plain, live, json' in p.stderr,
      f"--progress nonsense: exit 2 naming the values (got {p.returncode})", p.stdout + p.stderr)
p = subprocess.run([TRAIN, *COMMON, "--train_dir", train_dir(), "--json", "--progress", "plain"], env=BASE_ENV,
                   capture_output=True, text=True, timeout=60)
check(p.returncode == 2 and "--json and --progress plain disagree" in p.stderr,
      f"--json --progress plain: exit 2 naming both (got {p.returncode})", p.stdout + p.stderr)

tmp.cleanup()
if failures:
    print(f"{len(failures)} failed: " + "; ".join(failures))
    sys.exit(1)
print("all passed")
