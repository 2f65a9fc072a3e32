#!/usr/bin/env python3
"""Fails when docs/ARCHITECTURE.md names a file or a test that does not exist (`make lint` runs it).

The architecture document says which test proves each promise and which file holds each part. A test renamed,
moved to another crate or deleted would leave the document naming nothing, and nobody would notice; this check
makes that a lint failure. What it reads (fenced code blocks are skipped):

Files. A backticked word is a repository path when it has no space and none of `<>:=#?@$`, does not start with
`/` (a path inside a container), its first part is not capitalised (`MENTIS_DATA_DIR/...`, `ExecutorService/Run`),
and it contains a `/` or ends in a source file's extension (.rs .py .sh .mjs .js .html .toml .yaml .json
.proto .md .packages .Dockerfile). It exists when it is a path from the repository's root, or the tail of a
path git tracks (`api/images.rs` for services/runtime/src/api/images.rs, `config/` for a folder), or a path
git ignores (made by `make tools` or a build: `.tools/venv`, `web/node_modules`, `target/bench.json`). The few
names in EXAMPLES are not paths of the repository (the house rules' `foo.rs`).

Tests. A tier word outside backticks gives its tier to the backticked names after it, until another tier
word, the end of the sentence, a `;` followed by a word (not by a name), or the end of the table cell, list
item or paragraph. Inside a parenthesis, names with `::` keep the tier outside it and single words do not,
so in  e2e `a::b` (by `dd`; `a::c`)  a::b and a::c are checked and dd is not. The words, from the Test tiers
table:
  e2e                          tests/e2e/ (crate root main.rs)
  rc, runtime component        services/runtime/tests/component/ (main.rs)
  exec, executor component     executor/tests/component/ (crate root executor/tests/component.rs)
  gw, gateway component        services/gateway/tests/gateway.rs
  component (alone)            either of the two component tiers
  unit, Unit, executor unit    `#[cfg(test)]` modules beside the code: any workspace crate's source folder,
                               the path optionally led by the crate's short name (`core::image`)
A table column whose header is a tier word and "test" ("component test") gives its cells that tier. Only
names that look like Rust paths are checked (`a::b::c`, `a::*`, `bad_input`). `a::b::c` exists when, under
the tier's folder, the longest leading part names a module file (a.rs or a/mod.rs, then a/b.rs ...), each
part after it is an inline `mod` of that file, and the last part is a `fn` in that file (or a `mod`, or `*`).
Bare names right after a .rs file, alone or in a list separated by commas (`observations.rs` `a`, `b`), are
`fn`s in that file. Names outside a tier (`Manager::create`, `sandboxes::pump`) are code, not tests, and are
not checked.

Usage: arch-docs-check.py [ARCHITECTURE.md]   (default docs/ARCHITECTURE.md; prints each missing name with its
line; exit 1 when one is missing)
"""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TIERS = {
    "e2e": [("tests/e2e", "main.rs")],
    "rc": [("services/runtime/tests/component", "main.rs")],
    "exec": [("executor/tests/component", "../component.rs")],
    "gw": [("services/gateway/tests", "gateway.rs")],
}
TIERS["component"] = TIERS["rc"] + TIERS["exec"]

EXTENSIONS = (".rs", ".py", ".sh", ".mjs", ".js", ".html", ".toml", ".yaml", ".json", ".proto", ".md",
              ".packages", ".Dockerfile")
# Backticked words that look like paths of the repository but are not.
EXAMPLES = {
    "foo.rs": "the house rules' example of a module file",
    "foo/": "the house rules' example of a module folder",
    "mod.rs": "the house rules' name for what the project does not use",
    "disks/": "a folder of MENTIS_DATA_DIR",
}
RUST_PATH = re.compile(r"^[a-z_][a-z0-9_]*(::([a-z_][a-z0-9_]*|\*))*$")
HAS_LETTER = re.compile(r"[a-z]")
TIER_WORDS = {"e2e", "rc", "exec", "gw", "unit", "Unit", "component"}


def tracked() -> list:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def ignored(path: str) -> bool:
    return subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0


def unit_roots() -> dict:
    """Short crate name -> its source folder, for every workspace member (mentis-e2e's root is tests/)."""
    members = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["members"]
    roots = {}
    for m in members:
        src = ROOT / m / "src"
        if not src.is_dir():
            src = ROOT / m
        roots[Path(m).name.replace("-", "_")] = src
    return roots


class Checker:
    def __init__(self):
        self.files = tracked()
        self.dirs = set()
        for f in self.files:
            parts = f.split("/")
            for i in range(1, len(parts)):
                self.dirs.add("/".join(parts[:i]))
        self.units = unit_roots()
        self.texts = {}
        self.counts = {"files": 0, "tests": 0}

    # --- files --------------------------------------------------------------------------------------------
    @staticmethod
    def is_path(word: str) -> bool:
        if word in EXAMPLES or re.search(r"[\s<>:=#?@$]", word) or word.startswith("/"):
            return False
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+(/[A-Za-z0-9_.+-]+)*/?", word):
            return False
        if word[0].isupper():
            return False
        return "/" in word or word.endswith(EXTENSIONS)

    def find_path(self, word: str) -> list:
        """Tracked files (or folders) the word names: the path itself, or paths it is the tail of."""
        p = word.rstrip("/")
        if p in self.files or p in self.dirs:
            return [p]
        tail = "/" + p
        found = [f for f in self.files if f.endswith(tail)]
        found += [d for d in self.dirs if d.endswith(tail)]
        return found

    def path_exists(self, word: str) -> bool:
        p = word.rstrip("/")
        return bool(self.find_path(word)) or (ROOT / p).exists() or ignored(p)

    # --- tests --------------------------------------------------------------------------------------------
    def text(self, path: Path) -> str:
        if path not in self.texts:
            self.texts[path] = path.read_text()
        return self.texts[path]

    def resolve(self, folder: Path, root_file: Path, parts: list) -> bool:
        """Whether `parts` (a module path, its last part a fn, an inline mod or `*`) exists in a crate."""
        best, rest = root_file, parts
        for i in range(len(parts), 0, -1):
            mods = parts[:i]
            if "*" in mods:
                continue
            for candidate in (folder.joinpath(*mods).with_suffix(".rs"), folder.joinpath(*mods, "mod.rs")):
                if candidate.is_file():
                    best, rest = candidate, parts[i:]
                    break
            else:
                continue
            break
        if not best.is_file():
            return False
        text = self.text(best)
        if not rest:
            return True
        for m in rest[:-1]:
            if m != "*" and not re.search(rf"\bmod\s+{m}\s*\{{", text):
                return False
        last = rest[-1]
        return last == "*" or bool(re.search(rf"\b(fn\s+{last}\s*[(<]|mod\s+{last}\s*[{{;])", text))

    def test_exists(self, tier: str, name: str) -> bool:
        parts = name.split("::")
        if tier == "unit":
            roots = list(self.units.items())
            for crate, src in roots:
                root_file = src / "lib.rs" if (src / "lib.rs").is_file() else src / "main.rs"
                if self.resolve(src, root_file, parts):
                    return True
                if len(parts) > 1 and parts[0] in (crate, f"mentis_{crate}"):
                    if self.resolve(src, root_file, parts[1:]):
                        return True
            return False
        for folder, root in TIERS[tier]:
            folder = ROOT / folder
            if self.resolve(folder, (folder / root).resolve(), parts):
                return True
        return False

    def fn_in_files(self, files: list, name: str) -> bool:
        for f in files:
            path = ROOT / f
            if path.is_file() and re.search(rf"\bfn\s+{name}\s*[(<]", self.text(path)):
                return True
        return False


def tier_of(words: list):
    """The tier a run of words ends on, or None."""
    w = words[-1]
    prev = words[-2] if len(words) > 1 else ""
    if w == "component":
        return {"runtime": "rc", "executor": "exec"}.get(prev, "component")
    if w in ("unit", "Unit"):
        return "unit"
    if w in ("e2e", "rc", "exec"):
        return w
    return None


TOKEN = re.compile(r"`[^`]*`|\(|\)|[A-Za-z0-9_'-]+|\.(?=\s+[A-Z(`]|\s*$)|[^\s]")


def check_chunk(checker: Checker, chunk: str, starts: list, tier, problems: list):
    """Checks one table cell, list item or paragraph; `starts` holds (offset in chunk, line) for each of its
    lines, `tier` is the one its column gives it."""
    stack = [{"tier": tier, "file": None, "words": [], "outer": None, "semi": False}]
    for m in TOKEN.finditer(chunk):
        tok = m.group(0)
        state = stack[-1]
        line = next(n for offset, n in reversed(starts) if offset <= m.start())
        if tok == "(":
            outer = state["tier"] or state["outer"]
            stack.append({"tier": None, "file": None, "words": [], "outer": outer, "semi": False})
            continue
        if tok == ")":
            if len(stack) > 1:
                stack.pop()
            stack[-1]["file"] = None
            continue
        if tok == ".":
            state.update(tier=None, file=None, words=[])
            continue
        if tok == ";":
            state.update(file=None, semi=True)
            continue
        if tok == ",":
            continue
        if state["semi"]:
            state["semi"] = False
            if not tok.startswith("`"):
                state.update(tier=None, words=[])
        if not tok.startswith("`"):
            state["file"] = None
            if re.fullmatch(r"[A-Za-z0-9_-]+", tok):
                state["words"].append(tok)
                t = tier_of(state["words"])
                if t:
                    state["tier"] = t
            continue
        word = tok[1:-1]
        prev_file, state["file"] = state["file"], None
        if checker.is_path(word):
            checker.counts["files"] += 1
            if not checker.path_exists(word):
                problems.append((line, f"`{word}`: no such file or folder"))
                state["file"] = []
            elif word.endswith(".rs"):
                state["file"] = checker.find_path(word)
            continue
        if not RUST_PATH.match(word) or not HAS_LETTER.search(word) or word in TIER_WORDS:
            continue
        if prev_file is not None and "::" not in word:
            state["file"] = prev_file
            if prev_file:
                checker.counts["tests"] += 1
                if not checker.fn_in_files(prev_file, word):
                    problems.append((line, f"`{word}`: no fn of that name in {', '.join(prev_file)}"))
            continue
        tier = state["tier"] or (state["outer"] if "::" in word else None)
        if tier:
            checker.counts["tests"] += 1
            if not checker.test_exists(tier, word):
                problems.append((line, f"{tier} `{word}`: no such test or module"))


def chunks(text: str):
    """Yields (text, [(offset, line)], tier) for each table cell, list item and paragraph, code blocks left
    out."""
    lines = text.split("\n")
    fenced = False
    para, starts = [], []
    header = None

    def flush():
        nonlocal para, starts
        if para:
            yield " ".join(para), starts, None
        para, starts = [], []

    for n, raw in enumerate(lines, 1):
        if raw.startswith("```"):
            fenced = not fenced
            yield from flush()
            continue
        if fenced:
            continue
        s = raw.strip()
        if s.startswith("|"):
            yield from flush()
            cells = [c.strip() for c in s.strip("|").split("|")]
            if all(re.fullmatch(r":?-+:?", c) for c in cells):
                continue
            if header is None:
                header = [tier_of(c.split()[:-1]) if c.endswith(" test") and len(c.split()) > 1 else None
                          for c in cells]
                for c in cells:
                    yield c, [(0, n)], None
                continue
            for i, c in enumerate(cells):
                yield c, [(0, n)], header[i] if i < len(header) else None
            continue
        header = None
        if not s or s.startswith("#") or re.match(r"([-*]|\d+\.)\s", s):
            yield from flush()
            if not s or s.startswith("#"):
                continue
        starts.append((sum(len(p) + 1 for p in para), n))
        para.append(s)
    yield from flush()


def main(argv) -> int:
    doc = Path(argv[0]) if argv else ROOT / "docs" / "ARCHITECTURE.md"
    checker = Checker()
    problems = []
    for chunk, starts, tier in chunks(doc.read_text()):
        check_chunk(checker, chunk, starts, tier, problems)
    for line, what in problems:
        print(f"{doc}:{line}: {what}")
    if problems:
        print(f"{len(problems)} name(s) in {doc} point at nothing: fix the name, or the text")
        return 1
    print(f"{doc}: the {checker.counts['files']} file names and {checker.counts['tests']} test names exist")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
