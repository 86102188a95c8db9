#!/usr/bin/env python3
"""Runs every shell command a documentation page shows, on small data, in a scratch directory.

    run_doc_commands.py SOURCE_DIR BUILD_DIR PAGE.md

The commands of the page's ```sh blocks run in order, each with bash, in one scratch directory
where build/ is BUILD_DIR and scripts/, examples/, tests/, docs/ are the source tree's, so a
command reads as the page shows it. A command fails the test when it exits non-zero.

Small data, so that the whole page runs in seconds:
- scripts/get_cifar10.sh downloads a small CIFAR archive made here (TOWERFLOW_CIFAR_URL / _MD5 point
  at it); data/cifar-10-batches-bin, data/cifar-100-binary and /path/to/cifar-10-batches-bin are
  small sets in the official layout (64 images per file);
- cifar10_train and scripts/train_resnet20_cifar10.sh run 3 steps (at most; a command that traces
  keeps its own --max_steps) with a built-in set of 512/128 images; cifar10_eval on 128;
- the benchmarks run two steps or a short time (their length flags are replaced or added);
- the INI files the pages quote (examples/docs/*.ini) are in the scratch directory.

Not run: a command whose comment says "needs: ..." (a GPU, PyTorch, root, the full dataset, ...);
ctest (the suite this test belongs to); scripts/check_embed.sh (CI runs it after the tests); the
"scripts/build.sh && " in front of a command (the build is done: the command after it runs).
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import make_tiny_cifar  # noqa: E402

FENCE = re.compile(r"^(\s*)```sh\s*$")


def split_comment(line):
    """(command, comment) of one shell line; '#' inside quotes is not a comment."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1:].strip()
    return line.rstrip(), ""


def commands(text):
    """(line number, command, comment) for every command of every ```sh block."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        i += 1
        if not m:
            continue
        cmd, comments, start = "", [], None
        while i < len(lines) and lines[i].strip() != "```":
            code, comment = split_comment(lines[i].strip())
            if comment:
                comments.append(comment)
            if code:
                if start is None:
                    start = i + 1
                cont = code.endswith("\\")
                cmd += (" " if cmd else "") + code.rstrip("\\").strip()
                if not cont:
                    out.append((start, cmd, " ".join(comments)))
                    cmd, comments, start = "", [], None
            elif not cmd:
                comments = []
            i += 1
        i += 1
    return out


def set_flag(cmd, flag, value, only_if_absent=False):
    pattern = re.compile(r"(\s" + re.escape(flag) + r")(?:[= ](\S+))")
    if pattern.search(cmd):
        return cmd if only_if_absent else pattern.sub(lambda m: f"{m.group(1)} {value}", cmd)
    return f"{cmd} {flag} {value}"


def small(cmd):
    cmd = cmd.replace("/path/to/cifar-10-batches-bin", "data/cifar-10-batches-bin")
    # The program, after a launcher (mpirun -np 2 build/bin/cifar10_train ...).
    words = [w for w in cmd.split() if "=" not in w]
    known = ("cifar10_train", "train_resnet20_cifar10.sh", "cifar10_eval", "towerflow_bench_train",
             "towerflow_bench_allreduce", "towerflow_bench_alloc", "towerflow_bench_data", "towerflow_bench_kernels",
             "towerflow_bench_ops", "bench.sh")
    name = next((os.path.basename(w) for w in words if os.path.basename(w) in known),
                os.path.basename(words[0]) if words else "")
    if name in ("cifar10_train", "train_resnet20_cifar10.sh"):
        # 3 steps: more than an epoch of the small set (2 steps), so a warm-up epoch fits.
        given = re.search(r"\s--max_steps[= ](\d+)", cmd)
        if not given or (int(given.group(1)) > 3 and "--trace_steps" not in cmd):
            cmd = set_flag(cmd, "--max_steps", "3")
        cmd = set_flag(cmd, "--builtin_train_size", "512")
        cmd = set_flag(cmd, "--builtin_test_size", "128")
    elif name == "cifar10_eval":
        cmd = set_flag(cmd, "--builtin_test_size", "128")
    elif name == "towerflow_bench_train":
        cmd = set_flag(cmd, "--steps", "2")  # its check wants the loss to move
        cmd = set_flag(cmd, "--warmup", "0")
    elif name == "towerflow_bench_allreduce":
        cmd = set_flag(cmd, "--max_bytes", "1048576")
        cmd = set_flag(cmd, "--seconds", "0.02")
    elif name == "towerflow_bench_alloc":
        cmd = set_flag(cmd, "--pairs", "10000")
    elif name == "towerflow_bench_data":
        cmd = set_flag(cmd, "--images", "512")
    elif name == "towerflow_bench_kernels":
        cmd = f"{cmd} --benchmark_min_time=0.01"
    elif name == "towerflow_bench_ops":
        cmd = set_flag(cmd, "--batch", "8")
        cmd = set_flag(cmd, "--min_time", "0.01")
    elif name == "bench.sh":
        # The suite's smoke run, on the build there is, its report in the scratch directory (not
        # over the reports in bench/results/).
        if "--install-peers" in cmd:
            return cmd  # not reached: such a command says what it needs
        cmd = f"{cmd} --quick --no-peers --no-build --out bench-out"
    return cmd


def main():
    source, build, page = pathlib.Path(sys.argv[1]).resolve(), pathlib.Path(sys.argv[2]).resolve(), sys.argv[3]
    text = (source / page).read_text()
    found = commands(text)
    work = pathlib.Path(tempfile.mkdtemp(prefix="doc_commands_"))
    for name in ("scripts", "examples", "tests", "docs", "bench"):
        (work / name).symlink_to(source / name)
    (work / "build").symlink_to(build)
    for ini in (source / "examples" / "docs").glob("*.ini"):
        shutil.copy(ini, work / ini.name)
    archives = work.parent / (work.name + "_archives")
    archives.mkdir()
    env = dict(os.environ)
    # Commands under mpirun run as CI does: as root, with more ranks than cores, and without
    # cross-memory attach (containers forbid it). Open MPI's own variables; others ignore them.
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_btl_vader_single_copy_mechanism="none")
    sums = {}
    for kind in ("cifar10", "cifar100"):
        folder = make_tiny_cifar.make(archives / kind, cifar100=kind == "cifar100")
        tgz = archives / f"{kind}.tar.gz"
        sums[kind] = (f"file://{tgz}", make_tiny_cifar.archive(folder, tgz))
    if "get_cifar10.sh" not in text:
        make_tiny_cifar.make(work / "data")
        make_tiny_cifar.make(work / "data", cifar100=True)

    ran, skipped, failed = 0, [], []
    for line, cmd, comment in found:
        where = f"{page}:{line}"
        need = re.search(r"needs:\s*(.+?)(?:;|\.\s|\.$|$)", comment)
        if need:
            skipped.append(f"{where}: not run (needs {need.group(1).strip()}): {cmd}")
            continue
        cmd = re.sub(r"^scripts/build\.sh &&\s*", "", cmd)
        if re.match(r"^ctest\b", cmd):
            skipped.append(f"{where}: not run (the test suite this test belongs to): {cmd}")
            continue
        if cmd.startswith("scripts/check_embed.sh"):
            skipped.append(f"{where}: not run (CI runs it after the tests, .ci/run): {cmd}")
            continue
        run = small(cmd)
        url, md5 = sums["cifar100" if "--cifar100" in cmd else "cifar10"]
        env.update(TOWERFLOW_CIFAR_URL=url, TOWERFLOW_CIFAR_MD5=md5)
        t0 = time.time()
        run_env = dict(env)
        if "ASAN_OPTIONS" in run_env and re.match(r"^(mpirun|mpiexec)\b", run):
            # Open MPI's unloaded components leak unattributably (tests/tower/CMakeLists.txt).
            run_env["ASAN_OPTIONS"] += ":detect_leaks=0"
        r = subprocess.run(["bash", "-c", run], cwd=work, env=run_env, capture_output=True, text=True, timeout=300)
        ran += 1
        status = "ok  " if r.returncode == 0 else "FAIL"
        print(f"{status} {where} ({time.time() - t0:.1f} s, exit {r.returncode}): {run}")
        if r.returncode != 0:
            failed.append(where)
            print((r.stdout + r.stderr)[-3000:])
    for s in skipped:
        print(s)
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(archives, ignore_errors=True)
    print(f"{page}: {ran} commands run, {len(failed)} failed, {len(skipped)} not run")
    if failed:
        return 1
    if ran == 0:
        print(f"TEST SKIPPED: every command of {page} needs what this machine lacks" if skipped
              else f"{page} shows no shell command")
        return 77 if skipped else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
