#!/usr/bin/env python3
"""Checks that comments and documentation point at things that exist.

    check_notes_and_paths.py SOURCE_DIR     the check; exit 1 when it finds a problem
    check_notes_and_paths.py --self-test    runs the check on small made-up trees

Two rules; each problem is printed on its own line as FILE:LINE: what is wrong; the fix.

1. Every cited Note has a definition. A citation is the word Note followed by a title in square
   brackets, anywhere in a source, script or documentation file (a title may run on over the next
   comment line). A definition is a line that starts at column 0 with the comment marker of its
   file (// in C++ and CUDA, # in Python, shell and CMake) followed by the Note and its title, and
   that starts a comment block: either the line holds nothing else and the next line continues the
   comment (the heading form, the usual one), or the title is followed by a colon and the text,
   and the line before is not a comment line with text. In Python a line that holds only the Note
   and its title, at column 0 between a blank line and a line of text, is a definition too (a
   Note in a docstring). An indented line is a citation, however it is written. A title is
   defined once.

2. No path names a machine. In docs/**.md, README.md, bench/** (but bench/results/, the records
   of runs), scripts/** and .ci/**: an absolute path is allowed only under a prefix of ALLOWED
   below (system places every user's machine has, and placeholders); a relative path that starts
   with ../ may not leave the repository (a Markdown link's target is resolved from its page's
   folder, any other path from the repository root, where the project's commands run). URLs are
   not paths; nor are device names (/cpu:0, /gpu:1, /job:worker/...: a name, a colon, a word),
   nor a string that continues another ("kernel/" + "/fc1"). A path starts at the start of a
   line or after a space, an opening bracket or quote, = : , < > | ! or ;.

This file is not searched for Notes: its own examples would read as citations.
"""
import bisect
import difflib
import os
import re
import subprocess
import sys
import tempfile

# Folders no rule looks in: git's, the build trees, the tests' Python environment and other
# ignored outputs (.gitignore), and the datasets unpacked under data/.
SKIP_DIRS = re.compile(r"^(\.git|\.venv|\.whl|\.rehearsal|build.*|install.*|train_dir.*|__pycache__|"
                       r"cifar-10-batches-bin|cifar-100-binary)$")
C_LIKE = {".cc", ".h", ".cu", ".cuh", ".cpp", ".hpp", ".c"}
HASH_COMMENTS = {".py", ".sh", ".cmake", ".txt", ".ini", ".supp", ""}  # "": scripts such as .ci/run
NOTE_FILES = C_LIKE | HASH_COMMENTS | {".md"}

# Absolute paths allowed in docs, bench sources and scripts: (prefix, the only file it is allowed
# in or None for any, why). A path is allowed when it is the prefix or lies under it.
ALLOWED = [
    ("/usr", None, "the system's programs, headers and libraries (/usr/bin/python3, /usr/local/cuda)"),
    ("/bin", None, "the system's programs (#!/bin/sh)"),
    ("/sbin", None, "the system's programs"),
    ("/lib", None, "the system's libraries"),
    ("/lib64", None, "the system's libraries"),
    ("/etc", None, "the system's configuration (/etc/os-release, /etc/resolv.conf)"),
    ("/opt", None, "where vendors install software (/opt/intel)"),
    ("/dev", None, "devices (/dev/null, /dev/shm)"),
    ("/proc", None, "the kernel's view of processes (/proc/cpuinfo)"),
    ("/sys", None, "the kernel's view of devices"),
    ("/tmp", None, "scratch space every Unix system has; a path under it is made by the command "
                   "that names it"),
    ("/var/tmp", None, "scratch space every Unix system has (mktemp -d under ${TMPDIR:-/var/tmp})"),
    ("/var/cache/towerflow", None, "the cache scripts/bare_root.sh keeps its Debian root in"),
    ("/var/cache/apt", None, "apt's own cache, on every Debian system"),
    ("/path/to", None, "a placeholder the reader replaces (/path/to/cifar-10-batches-bin)"),
    ("/src", "scripts/bare_root.sh", "inside the root file system the script makes, where it copies the tree"),
    ("/root", "scripts/bare_root.sh", "HOME inside the root file system the script makes"),
]
# Relative paths out of the repository that are allowed: (prefix, why).
ALLOWED_OUTSIDE = [
    ("../shared/data", "the development machines' data folder (a JPEG CIFAR-10 and its converter), "
                       "which docs/data.md introduces as such; the commands that read it say "
                       "'needs: the project's data folder' or 'needs: the full dataset', so no test runs them"),
]
DEVICE_NAMES = {"cpu", "gpu", "job", "device", "replica", "task"}

CITATION = re.compile(r"\bNote \[([^\[\]]{1,160}?)\]")
URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://\S*")
# A path starts after one of these (or at the start of a line); a quote only when it opens.
BOUNDARY = set(" \t([{=:,'\"`<>|!;")
QUOTES = set("'\"`")
PATH_CHARS = re.compile(r"[\w.~+@%*$/-]+")


def rel(path, root):
    return os.path.relpath(path, root).replace(os.sep, "/")


def walk(root):
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not SKIP_DIRS.match(x))
        for f in sorted(files):
            yield os.path.join(d, f)


def read_lines(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return None


def comment_marker(path):
    ext = os.path.splitext(path)[1]
    if ext in C_LIKE:
        return "//"
    if ext in HASH_COMMENTS:
        return "#"
    return None


def definition_title(lines, i, marker, is_py):
    """The title of the Note defined at line i, or None."""
    line = lines[i]
    prev = lines[i - 1] if i > 0 else ""
    nxt = lines[i + 1] if i + 1 < len(lines) else ""
    if marker:
        m = re.match(re.escape(marker) + r" ?Note \[([^\[\]]+)\](.*)$", line)
        if m:
            rest = m.group(2).strip()
            if rest == "" and re.match(re.escape(marker) + r"\s*\S", nxt):
                return m.group(1)
            if rest.startswith(":") and not re.match(re.escape(marker) + r"\s*\S", prev):
                return m.group(1)
    if is_py:
        m = re.match(r"Note \[([^\[\]]+)\]\s*$", line)
        if m and prev.strip() == "" and nxt.strip() != "":
            return m.group(1)
    return None


def strip_comment(line):
    """The text of a line without its indentation and leading comment marker, for joining the
    lines a citation may run over."""
    return re.sub(r"^\s*(//+|#+|\*+|>)?\s*", "", line)


def norm(title):
    return " ".join(title.split())


def check_notes(root, self_path):
    defined, cited, twice = {}, [], []
    for path in walk(root):
        ext = os.path.splitext(path)[1]
        if ext not in NOTE_FILES or os.path.abspath(path) == self_path:
            continue
        lines = read_lines(path)
        if lines is None or (ext == "" and not (lines and lines[0].startswith("#!"))):
            continue  # a file without an extension is searched when it is a script
        r = rel(path, root)
        marker, is_py = comment_marker(path), ext == ".py"
        def_lines = set()
        for i in range(len(lines)):
            if "Note [" not in lines[i]:
                continue
            t = definition_title(lines, i, marker, is_py)
            if t is not None:
                if norm(t) in defined:
                    twice.append(f"{r}:{i + 1}: Note [{norm(t)}] is defined twice (also at "
                                 f"{defined[norm(t)]}); give one of them another title, or make "
                                 f"this one a citation")
                defined.setdefault(norm(t), f"{r}:{i + 1}")
                def_lines.add(i)
        # Citations, over the lines joined so that a title may continue on the next line.
        text, starts = [], []
        pos = 0
        for line in lines:
            s = strip_comment(line)
            starts.append(pos)
            text.append(s)
            pos += len(s) + 1
        joined = "\n".join(text).replace("\n", " ")
        for m in CITATION.finditer(joined):
            line_no = bisect.bisect_right(starts, m.start()) - 1
            if line_no in def_lines:
                continue
            cited.append((r, line_no + 1, norm(m.group(1))))
    problems = twice
    titles = sorted(defined)
    for r, line_no, title in cited:
        if title in defined:
            continue
        close = difflib.get_close_matches(title, titles, n=1, cutoff=0.6)
        fix = (f"did you mean Note [{close[0]}] ({defined[close[0]]})?" if close else
               "cite an existing Note's exact title, write the Note where its reasoning lives, "
               "or drop the citation")
        problems.append(f"{r}:{line_no}: Note [{title}] is cited but defined nowhere (a definition is "
                        f"a column-0 '// Note [...]' or '# Note [...]' line that starts a comment block); {fix}")
    return problems


def path_scope(root):
    for path in walk(root):
        r = rel(path, root)
        if (r == "README.md" or (r.startswith("docs/") and r.endswith(".md"))
                or (r.startswith("bench/") and not r.startswith("bench/results/"))
                or r.startswith("scripts/") or r.startswith(".ci/")):
            yield path, r


def allowed_absolute(p, r):
    for prefix, only_in, _ in ALLOWED:
        if (p == prefix or p.startswith(prefix + "/")) and only_in in (None, r):
            return True
    return False


def check_paths(root):
    problems = []
    for path, r in path_scope(root):
        lines = read_lines(path)
        if lines is None or "\0" in "".join(lines[:50]):
            continue
        for i, line in enumerate(lines):
            line = URL.sub(lambda m: " " * len(m.group(0)), line)
            for m in PATH_CHARS.finditer(line):
                tok, at = m.group(0), m.start()
                before = line[at - 1] if at > 0 else " "
                if before in QUOTES:  # an opening quote, unless it continues a string ("a" + "/b")
                    before = line[:at - 1].rstrip()[-1:] or " "
                    if before == "+":
                        continue
                if before not in BOUNDARY:
                    continue
                if tok.startswith("/") and len(tok) > 1 and tok[1] not in "/*":
                    first = re.match(r"/([\w.~+@%-]*)", tok).group(1)
                    if first.lower() in DEVICE_NAMES or first.strip(".") == "":
                        continue
                    if re.match(r"/[A-Za-z_]+:\w", line[at:]):
                        continue  # a device name: /cpu:0, /gpu:1, /x:0 in a table
                    p = tok.rstrip(".:")
                    if allowed_absolute(p, r):
                        continue
                    problems.append(f"{r}:{i + 1}: absolute path {p} names a machine; write it relative "
                                    f"to the repository (or its build folder), as a placeholder "
                                    f"(/path/to/...), or add a system prefix to ALLOWED in {SELF_REL} "
                                    f"with the reason")
                elif tok.startswith("../"):
                    p = tok.rstrip(".:")
                    link = line[:at].endswith("](")
                    base = os.path.dirname(path) if link and r.endswith(".md") else root
                    target = os.path.normpath(os.path.join(base, p))
                    if os.path.commonpath([os.path.abspath(root), os.path.abspath(target)]) == os.path.abspath(root):
                        continue
                    if any(p == a or p.startswith(a + "/") for a, _ in ALLOWED_OUTSIDE):
                        continue
                    problems.append(f"{r}:{i + 1}: relative path {p} leaves the repository (resolved from "
                                    f"{'the page' if base != root else 'the repository root'}); name the "
                                    f"file inside the repository (the peer scripts are bench/peers/)")
    return problems


SELF_REL = "tests/docs/check_notes_and_paths.py"


def check(root):
    root = os.path.abspath(root)
    problems = check_notes(root, os.path.abspath(__file__)) + check_paths(root)
    for p in problems:
        print(p)
    if problems:
        print(f"check_notes_and_paths: {len(problems)} problem(s); see {SELF_REL} for the rules")
        return 1
    print("check_notes_and_paths: every cited Note is defined, and no path names a machine")
    return 0


def self_test():
    """The check fails on a tree with one undefined citation and one machine path, naming both,
    and passes on a clean tree (so it cannot pass everything)."""
    n = "Note"  # spelled apart, so that this file holds no citation
    clean = {
        "core/a.cc": f"// {n} [Why one lock]\n// Because.\n\nint f();  // ({n} [Why\n// one lock])\n",
        "core/b.cc": f"// {n} [Colon form]: text\n// more.\nint g();\n",
        "bench/run.py": f'"""Doc.\n\n{n} [Shares]\nText.\n"""\n# see {n} [Shares], {n} [Colon form]\n',
        "docs/x.md": (f"Read {n} [Why one lock] in `core/a.cc`.\n\n```sh\n/usr/bin/python3 bench/run.py "
                      "--out /tmp/x --devices /gpu:0,/cpu:0   # https://example.com/a/b\n```\n"
                      "[up](../README.md)\n"),
        "scripts/s.sh": '#!/bin/sh\ntmp=$(mktemp -d "${TMPDIR:-/var/tmp}/tw.XXXXXX")\ncp x "$tmp"/out\n',
        "README.md": "See [docs](docs/x.md).\n",
    }
    bad = dict(clean)
    bad["core/c.cc"] = f"int h();  // see {n} [Missing title]\n"
    bad["docs/y.md"] = "Run `python3 /home/someone/peers/bench.py`.\n"
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for name, files in (("clean", clean), ("bad", bad)):
            root = os.path.join(tmp, name)
            for f, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(root, f)), exist_ok=True)
                with open(os.path.join(root, f), "w") as fh:
                    fh.write(text)
            out = subprocess.run([sys.executable, os.path.abspath(__file__), root],
                                 capture_output=True, text=True)
            print(f"--- {name} tree: exit {out.returncode}\n{out.stdout}{out.stderr}", end="")
            if name == "clean" and out.returncode != 0:
                print("SELF-TEST FAILED: the clean tree should pass")
                ok = False
            if name == "bad":
                want = ["core/c.cc:1: Note [Missing title] is cited but defined nowhere",
                        "docs/y.md:1: absolute path /home/someone/peers/bench.py names a machine"]
                if out.returncode != 1:
                    print("SELF-TEST FAILED: the bad tree should fail with exit 1")
                    ok = False
                for w in want:
                    if w not in out.stdout:
                        print(f"SELF-TEST FAILED: expected a line with: {w}")
                        ok = False
                if len(out.stdout.splitlines()) != len(want) + 1:
                    print("SELF-TEST FAILED: expected exactly the two problems and the summary line")
                    ok = False
    print("self-test passed" if ok else "self-test failed")
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(check(sys.argv[1]))
