#!/usr/bin/env python3
"""scripts/get_cifar10.sh against a local HTTP server (with byte ranges) and file:// URLs serving
small archives made here: a good archive, CIFAR-100, a bad checksum, an unreachable address, a
download resumed from a partial file, and a second run that finds the data in place.
Usage: test_get_cifar10.py SOURCE_DIR"""
import hashlib
import shutil
import http.server
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "docs"))
import make_tiny_cifar  # noqa: E402

SOURCE = pathlib.Path(sys.argv[1]).resolve()
SCRIPT = SOURCE / "scripts" / "get_cifar10.sh"
failures = []


def check(cond, what, detail=""):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)
        if detail:
            print(detail)


class Server(http.server.ThreadingHTTPServer):
    requests = []  # (path, Range header)


class Handler(http.server.BaseHTTPRequestHandler):
    """Serves the files of the current archive folder, honouring "Range: bytes=N-" as curl sends it."""
    root = None

    def do_GET(self):
        rng = self.headers.get("Range")
        self.server.requests.append((self.path, rng))
        f = Handler.root / self.path.lstrip("/")
        if not f.is_file():
            self.send_error(404)
            return
        data = f.read_bytes()
        start = 0
        if rng and rng.startswith("bytes="):
            start = int(rng[len("bytes="):].split("-")[0])
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        self.wfile.write(data[start:])

    def log_message(self, *args):
        pass


def run(args, cwd, env=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("TOWERFLOW_CIFAR")}
    e.update(env or {})
    return subprocess.run(["bash", str(SCRIPT)] + args, cwd=cwd, env=e, capture_output=True, text=True, timeout=120)


def same_tree(a, b):
    names = sorted(p.name for p in a.iterdir())
    return names == sorted(p.name for p in b.iterdir()) and all(
        (a / n).read_bytes() == (b / n).read_bytes() for n in names)


def main():
    if not (shutil.which("curl") or shutil.which("wget")):
        print("TEST SKIPPED: neither curl nor wget is installed")
        return 77
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="get_cifar10_"))
    served = tmp / "served"
    served.mkdir()
    src10 = make_tiny_cifar.make(tmp / "src", n=40)
    md5_10 = make_tiny_cifar.archive(src10, served / "cifar-10-binary.tar.gz")
    src100 = make_tiny_cifar.make(tmp / "src", cifar100=True, n=40)
    md5_100 = make_tiny_cifar.archive(src100, served / "cifar-100-binary.tar.gz")
    Handler.root = served
    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    work = tmp / "work"
    work.mkdir()

    # A good archive over HTTP, the checksum overridden by the environment.
    r = run(["data"], work, {"TOWERFLOW_CIFAR_URL": f"{base}/cifar-10-binary.tar.gz", "TOWERFLOW_CIFAR_MD5": md5_10})
    out = work / "data" / "cifar-10-batches-bin"
    check(r.returncode == 0, "a good archive: exit 0", r.stderr)
    check(r.stdout.strip() == "data/cifar-10-batches-bin", "it prints the --data_dir to use", r.stdout)
    check("--data_dir data/cifar-10-batches-bin" in r.stderr, "it says which --data_dir to pass", r.stderr)
    check(out.is_dir() and same_tree(out, src10), "the unpacked files are the archive's")
    check(not (work / "data" / "cifar-10-binary.tar.gz.part").exists(), "no partial file is left")

    # Run again: nothing is downloaded.
    n = len(server.requests)
    r = run(["data"], work, {"TOWERFLOW_CIFAR_URL": f"{base}/cifar-10-binary.tar.gz", "TOWERFLOW_CIFAR_MD5": md5_10})
    check(r.returncode == 0 and len(server.requests) == n and "already holds" in r.stderr,
          "a second run finds the data and downloads nothing", r.stderr)

    # CIFAR-100 from a file:// URL, with the flags instead of the environment.
    r = run(["--cifar100", "--url", f"file://{served}/cifar-100-binary.tar.gz", "--md5", md5_100, "d100"], work)
    check(r.returncode == 0 and r.stdout.strip() == "d100/cifar-100-binary", "--cifar100 --url file://...: exit 0",
          r.stdout + r.stderr)
    check(same_tree(work / "d100" / "cifar-100-binary", src100), "CIFAR-100 unpacked as archived")

    # A bad checksum: the official sum against another archive.
    r = run(["bad"], work, {"TOWERFLOW_CIFAR_URL": f"{base}/cifar-10-binary.tar.gz"})
    check(r.returncode == 1, "a bad checksum: exit 1", r.stderr)
    for needle in ("bad/cifar-10-binary.tar.gz", "c32a1d4ab5d03f1284b67883e8d87530", md5_10, "rm bad/cifar-10-binary.tar.gz"):
        check(needle in r.stderr, f"the checksum error names {needle}", r.stderr)
    check(not (work / "bad" / "cifar-10-batches-bin").exists(), "nothing is unpacked from a bad archive")

    # An unreachable address (a port nobody listens on), as when offline.
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = s.getsockname()[1]
    s.close()
    r = run(["off"], work, {"TOWERFLOW_CIFAR_URL": f"http://127.0.0.1:{dead}/cifar-10-binary.tar.gz"})
    check(r.returncode == 1, "an unreachable URL: exit 1", r.stderr)
    check("could not download" in r.stderr and "offline" in r.stderr and f"127.0.0.1:{dead}" in r.stderr
          and "--url file://" in r.stderr, "the error says offline or wrong address, and the fix", r.stderr)
    r = run(["missing"], work, {"TOWERFLOW_CIFAR_URL": f"{base}/nothing.tar.gz"})
    check(r.returncode == 1 and "could not download" in r.stderr, "an HTTP 404 is an error, not a file", r.stderr)

    # Resume: a partial download continues from where it stopped (curl -C -).
    whole = (served / "cifar-10-binary.tar.gz").read_bytes()
    half = len(whole) // 2
    (work / "resume").mkdir()
    (work / "resume" / "cifar-10-binary.tar.gz.part").write_bytes(whole[:half])
    n = len(server.requests)
    r = run(["resume"], work, {"TOWERFLOW_CIFAR_URL": f"{base}/cifar-10-binary.tar.gz", "TOWERFLOW_CIFAR_MD5": md5_10})
    check(r.returncode == 0, "a partial download: exit 0", r.stderr)
    ranges = [rng for _, rng in server.requests[n:]]
    check(ranges == [f"bytes={half}-"], f"only the missing bytes were asked for (Range: bytes={half}-)", str(ranges))
    check(same_tree(work / "resume" / "cifar-10-batches-bin", src10), "the resumed archive unpacks whole")
    check(hashlib.md5((work / "resume" / "cifar-10-binary.tar.gz").read_bytes()).hexdigest() == md5_10,
          "the resumed archive is byte for byte the served one")

    server.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
