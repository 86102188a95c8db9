#!/usr/bin/env python3
"""How much `pip install PACKAGE...` would download, before it does: pip resolves the packages
(--dry-run --report, which reads only their metadata), then each file's size is asked of the index
with an HTTP HEAD. Run with the Python that will install them (scripts/bench.sh --install-peers).

    download_size.py PACKAGE...        prints a summary line, the largest files, and one JSON line

Exit status 0 with the figures; 1 when pip or the index cannot tell (offline, an old pip).
"""
import concurrent.futures
import json
import os
import ssl
import subprocess
import sys
import tempfile
import urllib.request


def resolve(packages):
    """[(name, version, url)] of what pip would install into this Python."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                        "--report", report, *packages], check=True, stdout=subprocess.DEVNULL)
        with open(report) as f:
            items = json.load(f)["install"]
    return [(i["metadata"]["name"], i["metadata"]["version"], i["download_info"]["url"]) for i in items]


def size_of(url, context):
    request = urllib.request.Request(url, method="HEAD")
    with urllib.request.urlopen(request, timeout=30, context=context) as response:
        return int(response.headers["Content-Length"])


def main(packages):
    if not packages:
        print(__doc__.strip())
        return 2
    # The certificate authorities pip is told to trust (PIP_CERT), for networks that inspect TLS.
    context = ssl.create_default_context(cafile=os.environ.get("PIP_CERT") or None)
    try:
        files = resolve(packages)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            sizes = list(pool.map(lambda f: size_of(f[2], context), files))
    except (subprocess.CalledProcessError, OSError, KeyError, ValueError) as e:
        print(f"download_size: could not measure what pip would download for {' '.join(packages)}: {e}",
              file=sys.stderr)
        return 1
    total = sum(sizes)
    rows = sorted(zip(sizes, files), reverse=True)
    print(f"pip install {' '.join(packages)} downloads {total / 1e9:.2f} GB in {len(files)} files; the largest:")
    for size, (name, version, _) in rows[:6]:
        print(f"  {size / 1e6:8.0f} MB  {name} {version}")
    print(json.dumps({"packages": packages, "download_bytes": total, "files": len(files),
                      "largest": [{"name": n, "version": v, "bytes": s} for s, (n, v, _) in rows[:6]]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
