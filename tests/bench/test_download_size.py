#!/usr/bin/env python3
"""bench/peers/download_size.py where the index cannot be reached: exit 1 with a message that names
the packages (scripts/bench.sh then says the size is unknown and what to expect), never a
traceback or a made-up figure. Exit 77 where this Python has no pip."""
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def main():
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        print("TEST SKIPPED: this Python has no pip")
        return 77
    env = dict(os.environ, PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_RETRIES="0", PIP_TIMEOUT="2",
               PIP_NO_CACHE_DIR="1", PIP_FIND_LINKS="")
    p = subprocess.run([sys.executable, str(ROOT / "bench/peers/download_size.py"), "six"],
                       capture_output=True, text=True, env=env, timeout=120)
    ok = (p.returncode == 1 and "could not measure what pip would download for six" in p.stderr
          and "Traceback" not in p.stderr and "downloads" not in p.stdout)
    if not ok:
        print(f"FAILED: exit {p.returncode}\nstdout: {p.stdout}\nstderr: {p.stderr}")
        print("0 passed, 1 failed")
        return 1
    p = subprocess.run([sys.executable, str(ROOT / "bench/peers/download_size.py")], capture_output=True, text=True)
    if p.returncode != 2 or "PACKAGE" not in p.stdout:
        print(f"FAILED: without packages: exit {p.returncode}, {p.stdout}")
        print("1 passed, 1 failed")
        return 1
    print("2 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
