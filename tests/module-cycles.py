#!/usr/bin/env python3
"""Fails when the files of a crate import each other in a cycle (`make lint` runs it on every crate).

A file is a module: `lib.rs`/`main.rs` is the crate root, `foo.rs` is `foo`, `foo/bar.rs` is `foo::bar`.
File A depends on file B when A names an item of B: `use crate::b::X`, `super::X`, `child::X`, or such a path
inline. A name that a module only re-exports (`pub use other::X`) is followed to where it is defined, so a
facade that re-exports its children does not count as a dependency of whoever uses the facade. `mod child;`
declares, it does not depend. Test modules (`#[cfg(test)] mod tests { ... }` at the end of a file) are
skipped: a unit test may look at its parent.

Usage: module-cycles.py CRATE_SRC_DIR [...]   (prints each cycle; exit 1 when there is one)
"""

import re
import sys
from pathlib import Path

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def module_of(src: Path, file: Path) -> tuple:
    rel = file.relative_to(src).with_suffix("")
    parts = rel.parts
    if parts in (("lib",), ("main",)):
        return ()
    if parts[-1] == "mod":
        parts = parts[:-1]
    return tuple(parts)


def strip(text: str) -> str:
    """Source without comments, strings, and the trailing `#[cfg(test)] mod tests { ... }`."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'r#*"(?:.|\n)*?"#*', '""', text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    text = re.sub(r"'(?:\\.|[^'\\])'", "' '", text)
    m = re.search(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text)
    if m:
        text = text[: m.start()]
    return text


def use_trees(text: str):
    """Yields (is_pub, [path, ...]) for every `use` item, its groups expanded."""
    for m in re.finditer(r"(?:^|[;{}\s])(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", text):
        is_pub = bool(m.group(1))
        yield is_pub, list(expand(re.sub(r"\s+", "", m.group(2))))


def expand(tree: str):
    """`a::{b::C,d}` -> `a::b::C`, `a::d` (aliases dropped)."""
    tree = re.sub(r"\bas\w+", "", tree.replace(" as ", "as"))
    brace = tree.find("{")
    if brace < 0:
        yield tree
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
                    yield prefix + p if p != "self" else prefix.rstrip(":")


def main(dirs) -> int:
    found_cycle = False
    for d in dirs:
        src = Path(d)
        files = {module_of(src, f): f for f in sorted(src.rglob("*.rs"))}
        modules = set(files)
        texts = {m: strip(f.read_text()) for m, f in files.items()}

        def absolute(mod: tuple, path: list):
            """A path as written in `mod` -> an absolute path, or None when it is outside the crate."""
            if not path:
                return None
            head = path[0]
            if head == "crate":
                return list(path[1:])
            if head in ("self", "super"):
                base = list(mod)
                while path and path[0] in ("self", "super"):
                    if path[0] == "super":
                        base = base[:-1]
                    path = path[1:]
                return base + list(path)
            if tuple(mod) + (head,) in modules:
                return list(mod) + list(path)
            return None

        # Re-exports: (module, name) -> absolute path it stands for.
        reexports = {}
        for mod, text in texts.items():
            for is_pub, paths in use_trees(text):
                if not is_pub:
                    continue
                for p in paths:
                    a = absolute(mod, p.split("::"))
                    if a and a[-1] != "*":
                        reexports[(mod, a[-1])] = a

        def defining_module(path: list, seen=0):
            """The file that defines what `path` (absolute) names."""
            best = ()
            for i in range(len(path), -1, -1):
                if tuple(path[:i]) in modules:
                    best = tuple(path[:i])
                    break
            rest = path[len(best) :]
            if rest and (best, rest[0]) in reexports and seen < 20:
                target = reexports[(best, rest[0])] + rest[1:]
                if target != path:
                    return defining_module(target, seen + 1)
            return best

        edges = {m: set() for m in modules}
        for mod, text in texts.items():
            paths = []
            for _, ps in use_trees(text):
                paths += [p.split("::") for p in ps]
            body = re.sub(r"(?:pub(?:\([^)]*\))?\s+)?use\s+[^;]+;", "", text)
            for m in re.finditer(rf"\b((?:{IDENT}::)+{IDENT})", body):
                paths.append(m.group(1).split("::"))
            for p in paths:
                a = absolute(mod, p)
                if a is None:
                    continue
                target = defining_module([x for x in a if x != "*"])
                if target != mod:
                    edges[mod].add(target)

        # Strongly connected components (Tarjan).
        index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

        def visit(v):
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on.add(v)
            for w in edges[v]:
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    sccs.append(comp)

        sys.setrecursionlimit(10000)
        for v in sorted(modules):
            if v not in index:
                visit(v)
        for comp in sccs:
            found_cycle = True
            names = sorted("::".join(c) or "<root>" for c in comp)
            print(f"{src}: import cycle among {len(comp)} files: {', '.join(names)}")
            for v in sorted(comp):
                inside = sorted("::".join(w) or "<root>" for w in edges[v] if w in comp)
                print(f"    {'::'.join(v) or '<root>'} -> {', '.join(inside)}")
    return 1 if found_cycle else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
