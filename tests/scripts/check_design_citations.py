#!/usr/bin/env python3
"""Check that every citation of dsopt's design documents resolves.

The code, tests, benchmarks, bindings and docs cite the design documents in
docs/design/ by file and section or decision identifier, e.g.
"docs/design/zero.md section 11.6", "docs/design/adam.md 2.6",
"compressed-allreduce.md sections 3 and 4", "decisions.md G2, L1-L4, S1".
This script scans src/ include/ cuda/ tests/ bench/ bindings/ examples/
scripts/ docs/ and README.md and fails (exit 1, one line per problem) when

  * a cited <name>.md does not exist (a bare name is looked up in
    docs/design/, a path from the repository root or the citing file's
    folder),
  * a cited section number (section N, sections N and M, section N.M,
    § N, or "<name>.md N.M") is not a heading of that file,
  * a cited decision identifier ("decisions.md G2", "decisions.md L1-L4",
    the older "DECISIONS K1/K2") is not a heading or bold label of
    docs/design/decisions.md,
  * a path under docs/design/ does not exist,
  * a citation still points outside the repository: "shared/spec",
    "spec/<name>.md", "spec <name>.md", "spec section N", "spec N.M", or a
    bare "the spec" / "its spec".

Comment markers at line starts (//, #, *) are ignored, so a citation may
wrap across comment lines. On success it prints "N citations checked".

  python3 tests/scripts/check_design_citations.py [--root DIR] [--skip PATH]...

--skip PATH (repeatable) leaves out a file or a directory, relative to the
root, e.g. --skip README.md. Standard library only.
"""
import argparse
import bisect
import os
import re
import sys

SCAN = ["src", "include", "cuda", "tests", "bench", "bindings", "examples", "scripts", "docs",
        "README.md"]
DESIGN = "docs/design"
TEXT_EXT = {".c", ".h", ".cc", ".cpp", ".hpp", ".cu", ".cuh", ".py", ".pyi", ".rs", ".sh",
            ".txt", ".md", ".toml", ".cmake", ".jl", ".in", ".cfg", ".ini", ".yml", ".yaml"}
SKIP_DIRS = {".git", "__pycache__", "node_modules", "target", ".pytest_cache"}

NUM = r"\d+(?:\.\d+)*"
# a .md file name, optionally with a path and in backticks or quotes
NAME = r"(?P<path>(?<![\w/.-])(?:[\w.-]+/)*[\w-]+\.md)[`'\"]?"
SECTION_RE = re.compile(
    NAME + r",?\s*(?:sections?\s*|§\s*)(?P<nums>" + NUM + r"(?:\s*(?:,|and|&)\s*(?:§\s*)?"
    + NUM + r")*)(?![\w.]*\d)")
NUMBER_RE = re.compile(NAME + r"\s+(?P<nums>\d+\.\d+(?:\.\d+)*)(?![\w.]*\d)(?!\w)")
ID = r"[A-Z]\d+"
IDLIST = (ID + r"(?:\s*[-/–]\s*" + ID + r")?(?:\s*(?:,|and)\s*" + ID + r"(?:\s*[-/–]\s*"
          + ID + r")?)*")
DECISION_RE = re.compile(r"(?:(?P<path>(?<![\w/.-])(?:[\w.-]+/)*decisions\.md)[`'\"]?"
                         r"|\bDECISIONS\b(?!\.md))[:,]?\s*(?P<ids>" + IDLIST + r")?(?!\w)")
DESIGN_PATH_RE = re.compile(r"(?<![\w/.-])(?P<path>docs/design/[\w./-]*[\w-])")
FORBIDDEN = [
    (re.compile(r"shared/spec\b"), "points outside the repository (shared/spec)"),
    (re.compile(r"(?<![\w/.-])spec/[\w.-]+"), "points outside the repository (spec/...)"),
    (re.compile(r"\bspec\s+[\w-]+\.md\b"), "bare 'spec <name>.md' citation"),
    (re.compile(r"\bspec\s+(?:sections?|§)\s*\d"), "'spec section N' names no file"),
    (re.compile(r"\bspec\s+\d+\.\d+"), "'spec N.M' names no file"),
    (re.compile(r"\b(?:[Tt]he|[Ii]ts) spec(?:'s)?\b"), "'the spec' names no file"),
]
COMMENT_LEAD = re.compile(r"^\s*(?:/{2,}[!/]?|#+|\*+(?!\*)|--)?\s?")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   os.pardir, os.pardir),
                    help="repository root (default: two levels above this script)")
    ap.add_argument("--skip", action="append", default=[], metavar="PATH",
                    help="file or directory to leave out, relative to the root (repeatable)")
    return ap.parse_args()


def files_to_scan(root, skips):
    skips = {os.path.normpath(s) for s in skips}
    me = os.path.normpath(os.path.relpath(os.path.abspath(__file__), root))

    def skipped(rel):
        rel = os.path.normpath(rel)
        return rel == me or any(rel == s or rel.startswith(s + os.sep) for s in skips)

    for top in SCAN:
        full = os.path.join(root, top)
        if os.path.isfile(full):
            if not skipped(top):
                yield top
            continue
        for dirpath, dirnames, filenames in os.walk(full):
            rel_dir = os.path.relpath(dirpath, root)
            dirnames[:] = sorted(d for d in dirnames
                                 if d not in SKIP_DIRS and not d.startswith("build")
                                 and not d.endswith(".egg-info")
                                 and not skipped(os.path.join(rel_dir, d)))
            for name in sorted(filenames):
                rel = os.path.join(rel_dir, name)
                ext = os.path.splitext(name)[1]
                if (ext in TEXT_EXT or name == "CMakeLists.txt") and not skipped(rel):
                    yield rel


def joined_text(text):
    """The file's lines without leading comment markers, joined by spaces, and
    the offset in that string where each line starts."""
    parts, starts, pos = [], [], 0
    for line in text.split("\n"):
        body = COMMENT_LEAD.sub("", line, count=1).rstrip()
        starts.append(pos)
        parts.append(body)
        pos += len(body) + 1
    return " ".join(parts), starts


class Targets:
    """Headings and bold labels of the cited files, read once each."""

    def __init__(self, root):
        self.root = root
        self.cache = {}

    def resolve(self, path, citing):
        """A bare name is in docs/design/; a path is from the repository root
        or, as a Markdown link is, from the citing file's folder."""
        if "/" not in path:
            return DESIGN + "/" + path
        local = os.path.normpath(os.path.join(os.path.dirname(citing), path))
        if not os.path.isfile(os.path.join(self.root, path)) and \
                os.path.isfile(os.path.join(self.root, local)):
            return local
        return path

    def labels(self, rel):
        if rel not in self.cache:
            full = os.path.join(self.root, rel)
            if not os.path.isfile(full):
                self.cache[rel] = None
            else:
                with open(full, encoding="utf-8") as f:
                    text = f.read()
                heads = [m.group(1) for m in re.finditer(r"(?m)^#{1,6}\s+(.*)$", text)]
                bold = [m.group(1) for m in re.finditer(r"\*\*([^*\n]+)\*\*", text)]
                self.cache[rel] = (heads, bold)
        return self.cache[rel]

    def has_section(self, rel, num):
        heads, _ = self.labels(rel)
        pat = re.compile(r"^(?:§\s*)?" + re.escape(num) + r"(?!\d)(?!\.\d)")
        return any(pat.match(h) for h in heads)

    def has_id(self, rel, ident):
        heads, bold = self.labels(rel)
        pat = re.compile(re.escape(ident) + r"(?![\w])")
        return any(pat.match(h) for h in heads + bold)


def expand_ids(ids):
    out = []
    for part in re.split(r"\s*(?:,|and)\s*", ids.strip()):
        m = re.fullmatch(r"([A-Z])(\d+)\s*([-/–])\s*([A-Z])(\d+)", part)
        if m:
            a, b = int(m.group(2)), int(m.group(5))
            if m.group(3) != "/" and m.group(1) == m.group(4) and a <= b:
                out += [m.group(1) + str(i) for i in range(a, b + 1)]
            else:
                out += [m.group(1) + m.group(2), m.group(4) + m.group(5)]
        elif part:
            out.append(part)
    return out


def main():
    args = parse_args()
    root = os.path.normpath(args.root)
    targets = Targets(root)
    problems, checked = [], 0

    for rel in files_to_scan(root, args.skip):
        try:
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        joined, starts = joined_text(text)

        def fail(offset, what, snippet):
            line = bisect.bisect_right(starts, offset)
            problems.append((rel, line, "%s:%d: %s: %s" % (rel, line, what,
                                                           " ".join(snippet.split()))))

        def check_file(offset, path, snippet):
            target = targets.resolve(path, rel)
            if targets.labels(target) is None:
                fail(offset, "no such file %s" % target, snippet)
                return None
            return target

        seen = set()  # where the cited paths start: each is checked once
        for regex in (SECTION_RE, NUMBER_RE):
            for m in regex.finditer(joined):
                if m.start() in seen:
                    continue
                seen.add(m.start())
                checked += 1
                target = check_file(m.start(), m.group("path"), m.group(0))
                if target is None:
                    continue
                for num in re.findall(NUM, m.group("nums")):
                    if not targets.has_section(target, num):
                        fail(m.start(), "%s has no section %s" % (target, num), m.group(0))
        for m in DECISION_RE.finditer(joined):
            seen.add(m.start())
            checked += 1
            target = check_file(m.start(), m.group("path") or "decisions.md", m.group(0))
            if target is None or not m.group("ids"):
                continue
            for ident in expand_ids(m.group("ids")):
                if not targets.has_id(target, ident):
                    fail(m.start(), "%s has no decision %s" % (target, ident), m.group(0))
        for m in DESIGN_PATH_RE.finditer(joined):
            path = m.group("path").rstrip(".")
            if m.start() in seen:
                continue
            checked += 1
            if not os.path.exists(os.path.join(root, path)):
                fail(m.start(), "no such file %s" % path, path)
        for regex, what in FORBIDDEN:
            for m in regex.finditer(joined):
                lo = max(0, m.start() - 30)
                fail(m.start(), what, joined[lo:m.end() + 30])

    if problems:
        for _, _, p in sorted(problems, key=lambda x: (x[0], x[1])):
            print(p)
        print("%d problem(s) in %d citations" % (len(problems), checked), file=sys.stderr)
        return 1
    print("%d citations checked" % checked)
    return 0


if __name__ == "__main__":
    sys.exit(main())
