#!/usr/bin/env python3
"""The installed headers (TW_PUBLIC_HEADERS in cmake/TowerflowInstall.cmake) are exactly the
umbrella headers and every project header they include, directly or not: a public header that
includes a private one would not compile once installed, and a header outside the closure is an
internal one that must not become API by being installed. The private headers (the backend
interface) are included from core/ and the tests only: the other areas reach devices through
core/tensor/device_ops.h.

    check_public_headers.py SOURCE_DIR
"""
import os
import re
import sys

UMBRELLAS = ["core/core.h", "core/collectives/collectives.h", "tower/tower.h", "optim/optim.h",
             "data/data.h", "models/models.h", "io/io.h", "train/train.h"]
PRIVATE = ["core/tensor/backend_impl.h", "core/tensor/cpu_backend.h"]


def closure(root):
    seen, stack = set(), list(UMBRELLAS)
    while stack:
        header = stack.pop()
        if header in seen:
            continue
        seen.add(header)
        with open(os.path.join(root, header), encoding="utf-8") as f:
            for line in f:
                m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if m and os.path.exists(os.path.join(root, m.group(1))):
                    stack.append(m.group(1))
    return seen


def listed(root):
    with open(os.path.join(root, "cmake/TowerflowInstall.cmake"), encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"set\(TW_PUBLIC_HEADERS\s+([^)]*)\)", text)
    if not m:
        sys.exit("check_public_headers: no set(TW_PUBLIC_HEADERS ...) in cmake/TowerflowInstall.cmake")
    return set(m.group(1).split())


def outside_core(root):
    """(file, private header) for every source outside core/ and tests/ that includes one."""
    found = []
    for area in sorted(os.listdir(root)):
        if area in ("core", "tests") or area.startswith((".", "build")) or not os.path.isdir(os.path.join(root, area)):
            continue
        for folder, _, files in os.walk(os.path.join(root, area)):
            for name in files:
                if not name.endswith((".h", ".cc", ".cu")):
                    continue
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for line in f:
                        m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                        if m and m.group(1) in PRIVATE:
                            found.append((os.path.relpath(path, root), m.group(1)))
    return found


def main():
    root = sys.argv[1]
    want, have = closure(root), listed(root)
    problems = [f"{h}: included by a public header but not installed; add it to TW_PUBLIC_HEADERS"
                for h in sorted(want - have)]
    problems += [f"{h}: installed but no umbrella header includes it; remove it from TW_PUBLIC_HEADERS "
                 f"or include it from its area's umbrella header" for h in sorted(have - want)]
    problems += [f"{h}: a private header is public" for h in PRIVATE if h in have or h in want]
    problems += [f"{f}: includes the private {h}; use core/tensor/device_ops.h" for f, h in outside_core(root)]
    for p in problems:
        print(p)
    print(f"check_public_headers: {len(have)} public headers, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
