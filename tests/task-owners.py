#!/usr/bin/env python3
"""Fails when production Rust code spawns a task or thread without an owner, or when a module of the runtime
outside its API imports the API (`make lint` runs it).

Detached spawns. The house rule (docs/ARCHITECTURE.md, house rule 4) is that every task has an owner that
cancels and awaits it: a `tokio_util::task::TaskTracker` or a `JoinSet`, whose `.spawn(` is a method call. A
free function that spawns gives the task to nobody, so a shutdown neither stops nor waits for it. Counted as
detached: calls of `tokio::spawn`, `tokio::task::spawn`, `task::spawn`, `spawn_blocking` and `spawn_local`
called as paths (`tokio::task::spawn_blocking(`, `task::spawn_blocking(`), `std::thread::spawn` and
`thread::spawn`, and a bare `spawn(`, `spawn_blocking(` or `spawn_local(` in a file that imports it from
tokio or std::thread, and `.spawn(`/`.spawn_blocking(` on a tokio runtime or handle (a name the file binds
to `Handle::current()`/`Handle::try_current()` or declares `: Runtime`/`: Handle`, or `Handle::current()`
itself). A blocking task awaited where it is spawned (`spawn_blocking(...).await`, also after `?` or a
`.map_err(...)`-style chain that ends in `.await` before the statement ends) is owned by the task that awaits
it: it cannot be cancelled anyway, and nothing outlives the await. Not counted: other method calls (`tasks.spawn(`, `set.spawn(`, `tracker.spawn_blocking(`),
definitions (`fn spawn(`), other paths (`health::spawn(` is the project's own function, checked in its own
file), comments and strings. Production code only: files under a `tests` or `benches` folder, `build.rs`, and
test code are skipped; test code is the item after `#[cfg(test)]` (a `mod tests { ... }` block, a function)
and the file of a `#[cfg(test)] mod NAME;`.

Upward imports. In services/runtime/src the API (`api.rs` and `api/`) depends on the rest, never the other
way: a module outside `api/` naming `crate::api` (a `use`, grouped or not, or a path in the code) turns the
layers round. `server.rs`, `web.rs` and `api.rs` assemble the API and may name it. Test code is skipped as
above.

What exists today is listed in two allowlists, and each entry must match the code exactly: more than listed
fails (a new one is never hidden), and so does fewer (the list shrinks as the code is fixed):
  tests/detached-spawns.allow   PATH FUNCTION COUNT   detached spawns in the named function (the innermost
                                                      `fn` around the call; `-` outside any)
  tests/upward-imports.allow    PATH COUNT            places naming crate::api in that file
Paths are relative to the root; the allowlists are always the repository's, beside this script. `--list`
prints what the code has in those formats (to start a list, never to paper over a new spawn).

Usage: task-owners.py [--root DIR] [--list]   (DIR defaults to the repository; exit 1 on any mismatch)
"""

import argparse
import re
import sys
from collections import Counter
from itertools import dropwhile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SKIP_DIRS = {"target", "node_modules", ".git", ".tools", "tests", "benches"}
RUNTIME_SRC = "services/runtime/src"
API_ASSEMBLERS = {"server.rs", "web.rs", "api.rs"}
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
# What starts a comment, a string or a character literal (a raw string's `r` not inside a name).
LEXEME = re.compile(r"""//|/\*|(?<![\w])b?r#*"|"|'""")
CHAR = re.compile(r"'(\\(x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'])'")
USE = re.compile(r"(?:^|[;{}\s])(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);")
SPAWNS = ("spawn", "spawn_blocking", "spawn_local")
# Paths (whitespace removed, leading `::` dropped) through which a spawn function is detached.
DETACHED_PATHS = {"tokio::", "tokio::task::", "task::", "std::thread::", "thread::"}


def blank(text: str) -> str:
    """The source with comments, strings and character literals replaced by spaces (newlines kept, so
    offsets and line numbers stay those of the file). Lifetimes are left alone."""
    out = list(text)
    i, n = 0, len(text)

    def wipe(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while (m := LEXEME.search(text, i)) is not None:
        i, tok = m.start(), m.group(0)
        if tok == "//":
            j = text.find("\n", i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
        elif tok == "/*":
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            wipe(i, j)
            i = j
        elif tok.endswith('"') and tok != '"':  # a raw string: r"...", r#"..."#, br"..."
            hashes = tok.strip('br"')
            end = text.find('"' + hashes, m.end())
            end = n if end < 0 else end + 1 + len(hashes)
            wipe(i, end)
            i = end
        elif tok == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            wipe(i, j + 1)
            i = j + 1
        else:
            c = CHAR.match(text, i)
            if c:
                wipe(i, c.end())
                i = c.end()
            else:
                i += 1  # a lifetime
    return "".join(out)


def matching_paren(text: str, open_at: int) -> int:
    depth = 0
    for k in range(open_at, len(text)):
        if text[k] == "(":
            depth += 1
        elif text[k] == ")":
            depth -= 1
            if depth == 0:
                return k
    return len(text) - 1


def awaited_at_once(text: str, call_open: int) -> bool:
    """Whether the call whose `(` is at `call_open` is awaited as it is made: `.await` right after it."""
    after = text[matching_paren(text, call_open) + 1 :]
    return re.match(r"\s*\.\s*await\b", after) is not None


def matching_brace(text: str, open_at: int) -> int:
    depth = 0
    for k in range(open_at, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return k
    return len(text) - 1


def drop_test_code(text: str):
    """The text (already blanked) with every `#[cfg(test)]` item wiped, and the names of test modules
    declared as files (`#[cfg(test)] mod tests;`)."""
    test_files = []
    out = text
    for m in re.finditer(r"#\[cfg\(test\)\]", text):
        rest = m.end()
        # Further attributes of the same item.
        while a := re.compile(r"\s*#!?\[[^\]]*\]").match(out, rest):
            rest = a.end()
        decl = re.compile(rf"\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+({IDENT})\s*;").match(out, rest)
        if decl:
            test_files.append(decl.group(1))
            end = decl.end()
        else:
            brace, semi = out.find("{", rest), out.find(";", rest)
            if brace < 0 or (0 <= semi < brace):
                end = semi + 1 if semi >= 0 else len(out)
            else:
                end = matching_brace(out, brace) + 1
        out = out[: m.start()] + re.sub(r"[^\n]", " ", out[m.start() : end]) + out[end:]
    return out, test_files


def enclosing_functions(text: str):
    """The body of every named `fn`, as (offset of its `{`, offset of its `}`, name)."""
    spans, stack, pending, depth = [], [], None, 0
    for m in re.finditer(rf"\bfn\s+({IDENT})|[{{}};]", text):
        tok = m.group(0)
        if m.group(1):
            pending = m.group(1)
        elif tok == ";":
            if pending is not None and not inside_brackets(text, m.start()):
                pending = None
        elif tok == "{":
            depth += 1
            if pending is not None:
                stack.append((pending, depth, m.start()))
                pending = None
        else:
            if stack and stack[-1][1] == depth:
                name, _, start = stack.pop()
                spans.append((start, m.start(), name))
            depth -= 1
    return spans


def inside_brackets(text: str, at: int) -> bool:
    """Whether `at` is inside brackets opened after the last `fn` (a `;` in `[u8; 4]` does not end a
    signature)."""
    start = text.rfind("fn ", 0, at)
    seg = text[start:at]
    return seg.count("[") > seg.count("]") or seg.count("(") > seg.count(")")


def function_at(spans, offset: int) -> str:
    """The name of the innermost `fn` whose body holds `offset`, or `-`."""
    best = None
    for start, end, name in spans:
        if start <= offset <= end and (best is None or start > best[0]):
            best = (start, name)
    return best[1] if best else "-"


def use_paths(text: str):
    """Every path a `use` item names, groups expanded (`a::{b, c::d}` -> `a::b`, `a::c::d`)."""
    for m in USE.finditer(text):
        yield from expand(re.sub(r"\s+", "", re.sub(r"\s+as\s+\w+", "", m.group(1))))


def expand(tree: str):
    brace = tree.find("{")
    if brace < 0:
        yield tree.lstrip(":")
        return
    prefix, inner = tree[:brace], tree[brace + 1 : tree.rfind("}")]
    depth, start = 0, 0
    for i, c in enumerate(inner + ","):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "," and depth == 0:
            part = inner[start:i]
            start = i + 1
            if part:
                for p in expand(part):
                    yield (prefix + p if p != "self" else prefix.rstrip(":")).lstrip(":")


def production_files(root: Path):
    """The .rs files of production code under root, as (path relative to root, blanked text without tests)."""
    files = {}
    for path in sorted(root.rglob("*.rs")):
        rel = path.relative_to(root)
        if SKIP_DIRS & set(rel.parts[:-1]) or rel.name == "build.rs":
            continue
        files[rel] = path
    excluded = set()
    texts = {}
    for rel, path in files.items():
        text, test_mods = drop_test_code(blank(path.read_text()))
        texts[rel] = text
        base = rel.parent if rel.stem in ("lib", "main", "mod") else rel.parent / rel.stem
        for name in test_mods:
            excluded |= {base / f"{name}.rs", base / name / "mod.rs"}
    for rel in sorted(texts):
        if rel not in excluded and not any(p in excluded for p in rel.parents):
            yield rel, texts[rel]


def detached_spawns(text: str):
    """(offset, call) of every detached spawn in a blanked text."""
    imported = set()
    for p in use_paths(text):
        head, _, name = p.rpartition("::")
        if name in SPAWNS and head in ("tokio", "tokio::task", "std::thread"):
            imported.add(name)
    call = re.compile(rf"(?<![\w.:])((?:{IDENT}\s*::\s*)*)({'|'.join(SPAWNS)})\s*(?:::\s*<[^>]*>\s*)?\(")
    for m in call.finditer(text):
        before = text[: m.start()].rstrip()
        if before.endswith(("fn", ".")):  # a definition, or a method split before its name
            continue
        path = re.sub(r"\s+", "", m.group(1))
        if m.group(2) == "spawn_blocking" and awaited_at_once(text, m.end() - 1):
            continue
        if path.removeprefix("::") in DETACHED_PATHS or (not path and m.group(2) in imported):
            yield m.start(), path + m.group(2)
    # A tokio runtime or its handle spawns onto the runtime, owned by nobody.
    runtimes = set(re.findall(rf"\b({IDENT})\s*:\s*&?\s*(?:mut\s+)?(?:tokio\s*::\s*runtime\s*::\s*)?"
                              r"(?:Runtime|Handle)\b", text))
    runtimes |= set(re.findall(rf"\b({IDENT})\s*\)?\s*=\s*(?:::)?(?:tokio\s*::\s*runtime\s*::\s*)?"
                               r"Handle\s*::\s*(?:try_)?current\s*\(", text))
    receiver = "|".join([re.escape(r) for r in sorted(runtimes)] + [r"Handle\s*::\s*current\s*\(\s*\)"])
    method = re.compile(rf"(?<![\w.:])({receiver})\s*\.\s*({'|'.join(SPAWNS)})\s*(?:::\s*<[^>]*>\s*)?\(")
    for m in method.finditer(text):
        yield m.start(), re.sub(r"\s+", "", m.group(1)) + "." + m.group(2)


def upward_imports(text: str, module: list):
    """The offset of every `use` path and every path in the code that names crate::api, also as
    `super::...::api` from `module` (its path in the crate) or, in the crate root, `self::api`/`api`."""

    def names_api(parts: list) -> bool:
        if parts[:1] == ["crate"]:
            return parts[1:2] == ["api"]
        supers = len(parts) - len(list(dropwhile(lambda p: p == "super", parts)))
        if supers:
            return supers == len(module) and parts[supers : supers + 1] == ["api"]
        return not module and parts[: 2 if parts[:1] == ["self"] else 1][-1:] == ["api"]

    for m in USE.finditer(text):
        for p in expand(re.sub(r"\s+", "", re.sub(r"\s+as\s+\w+", "", m.group(1)))):
            if names_api(p.split("::")):
                yield m.start(1)
    code = USE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    for m in re.finditer(r"(?<![\w:])((?:crate|super|self)(?:\s*::\s*(?:super|api))+)\b", code):
        if names_api(re.sub(r"\s+", "", m.group(1)).split("::")):
            yield m.start()


def read_allow(path: Path, fields: int):
    entries = Counter()
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != fields or not parts[-1].isdigit():
            sys.exit(f"{path}:{n}: expected {fields} fields, the last a count: {line!r}")
        entries[tuple(parts[:-1])] = int(parts[-1])
    return entries


def compare(found: Counter, allowed: Counter, where: dict, allow_file: Path, what: str, fix: str) -> list:
    problems = []
    for key in sorted(set(found) | set(allowed)):
        have, may = found.get(key, 0), allowed.get(key, 0)
        name = " ".join(key)
        if have > may:
            lines = ", ".join(str(n) for n in where.get(key, []))
            problems.append(f"{name}: {have} {what}, {may} allowed (line {lines}): {fix}")
        elif have < may:
            problems.append(f"{name}: {have} {what}, {may} allowed: lower its line in {allow_file.name}")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=REPO)
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    root = args.root.resolve()

    spawns, spawn_lines = Counter(), {}
    imports, import_lines = Counter(), {}
    for rel, text in production_files(root):
        spans = enclosing_functions(text)
        for offset, _ in detached_spawns(text):
            key = (rel.as_posix(), function_at(spans, offset))
            spawns[key] += 1
            spawn_lines.setdefault(key, []).append(text.count("\n", 0, offset) + 1)
        parts = rel.as_posix()
        if parts.startswith(RUNTIME_SRC + "/"):
            inner = parts[len(RUNTIME_SRC) + 1 :]
            if not inner.startswith("api/") and inner not in API_ASSEMBLERS:
                module = list(Path(inner).with_suffix("").parts)
                module = [] if module in (["lib"], ["main"]) else module[:-1] if module[-1] == "mod" else module
                for offset in upward_imports(text, module):
                    imports[(parts,)] += 1
                    import_lines.setdefault((parts,), []).append(text.count("\n", 0, offset) + 1)

    if args.list:
        print("# detached spawns: PATH FUNCTION COUNT")
        for key, n in sorted(spawns.items()):
            print(f"{' '.join(key)} {n}    # line {', '.join(map(str, spawn_lines[key]))}")
        print("# upward imports: PATH COUNT")
        for key, n in sorted(imports.items()):
            print(f"{' '.join(key)} {n}    # line {', '.join(map(str, import_lines[key]))}")
        return 0

    spawn_allow = REPO / "tests" / "detached-spawns.allow"
    import_allow = REPO / "tests" / "upward-imports.allow"
    problems = compare(spawns, read_allow(spawn_allow, 3), spawn_lines, spawn_allow, "detached spawn(s)",
                       "spawn it on an owner (a TaskTracker or a JoinSet)")
    problems += compare(imports, read_allow(import_allow, 2), import_lines, import_allow, "upward import(s)",
                        "move what it needs out of api/ (or pass it in)")
    for p in problems:
        print(f"{root}: {p}")
    if problems:
        print("task-owners: every task needs an owner (a TaskTracker or a JoinSet), and only the API names "
              "crate::api (tests/task-owners.py says why)")
        return 1
    print(f"task-owners: {sum(spawns.values())} detached spawns and {sum(imports.values())} upward imports, "
          "as the allowlists say")
    return 0


if __name__ == "__main__":
    sys.exit(main())
