#!/usr/bin/env python3
"""The documentation's code blocks are quoted from files that are compiled and run.

A fenced block in README.md or docs/*.md preceded by

    <!-- snippet: examples/docs/towers.cc#loop -->

holds the lines between `// [docs:loop]` and `// [end]` of that file (`#` comments for CMake and
INI files), without their common indentation; with no `#NAME`, the whole file. Every C++ block
must be such a quote, so every C++ line a page shows is compiled (tests/docs/CMakeLists.txt) and
run on small data.

    scripts/doc_snippets.py --check [ROOT]   # exit 1 listing each block that differs or is not a quote
    scripts/doc_snippets.py --write [ROOT]   # rewrite the blocks from their files
"""
import pathlib
import re
import sys
import textwrap

MARKER = re.compile(r"^<!-- snippet: (\S+?)(?:#(\S+))? -->\s*$")
FENCE = re.compile(r"^(\s*)(```+)(\S*)\s*$")
CPP = {"cpp", "c++", "cc", "cxx"}


def pages(root):
    return [root / "README.md"] + sorted((root / "docs").rglob("*.md"))


def region(root, path, name):
    f = root / path
    if not f.is_file():
        raise ValueError(f"{path} does not exist")
    lines = f.read_text().splitlines()
    if name is None:
        return "\n".join(lines)
    begin = re.compile(r"^\s*(//|#) \[docs:" + re.escape(name) + r"\]\s*$")
    end = re.compile(r"^\s*(//|#) \[end\]\s*$")
    starts = [i for i, line in enumerate(lines) if begin.match(line)]
    if len(starts) != 1:
        raise ValueError(f"{path} has {len(starts)} regions [docs:{name}] (expected 1)")
    for j in range(starts[0] + 1, len(lines)):
        if end.match(lines[j]):
            return textwrap.dedent("\n".join(lines[starts[0] + 1:j]))
    raise ValueError(f"{path}: region [docs:{name}] has no [end]")


def blocks(text):
    """(marker or None, language, first body line, end line) for every fenced block."""
    lines = text.splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not (lines[j].strip() == m.group(2)):
            j += 1
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        marker = MARKER.match(lines[k]) if k >= 0 else None
        out.append((marker, m.group(3).lower(), i + 1, j))
        i = j + 1
    return lines, out


def run(root, write):
    problems, quoted = [], 0
    for page in pages(root):
        lines, found = blocks(page.read_text())
        changed = False
        for marker, lang, begin, end in reversed(found):
            where = f"{page.relative_to(root)}:{begin}"
            if marker is None:
                if lang in CPP:
                    problems.append(f"{where}: a C++ block that is not quoted from a compiled file; "
                                    "move it into examples/docs/ and add <!-- snippet: FILE#NAME --> before it")
                continue
            try:
                want = region(root, marker.group(1), marker.group(2))
            except ValueError as e:
                problems.append(f"{where}: {e}")
                continue
            quoted += 1
            have = "\n".join(lines[begin:end])
            if have != want:
                if write:
                    lines[begin:end] = want.splitlines()
                    changed = True
                else:
                    problems.append(f"{where}: differs from {marker.group(1)}"
                                    + (f"#{marker.group(2)}" if marker.group(2) else "")
                                    + " (scripts/doc_snippets.py --write copies it in)")
        if changed:
            page.write_text("\n".join(lines) + "\n")
            print(f"rewrote {page.relative_to(root)}")
    for p in problems:
        print(p)
    print(f"{quoted} quoted blocks, {len(problems)} problems")
    if quoted == 0:
        print("no quoted block found: is ROOT the source tree?")
        return 1
    return 1 if problems and not write else 0


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    flags = [a for a in sys.argv[1:] if a.startswith("--")]
    if flags not in (["--check"], ["--write"]):
        print(__doc__)
        sys.exit(2)
    root = pathlib.Path(args[0] if args else pathlib.Path(__file__).resolve().parent.parent)
    sys.exit(run(root, flags == ["--write"]))
