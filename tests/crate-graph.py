#!/usr/bin/env python3
"""Fails when a workspace crate depends on a workspace crate its layer may not use (`make lint` runs it).

The layers of the control plane are crates (docs/ARCHITECTURE.md, "Crates and what each may depend on"), so
the compiler holds most lines by itself: the application (mentis-app) does not depend on the API
(mentis-runtime), and Cargo refuses a cycle; the API cannot name the store, the backends or the executor
client because they are not among its dependencies, or are private to mentis-app. What the compiler cannot
see is a dependency added to a Cargo.toml: this check reads each crate's normal dependencies (not dev- or
build-dependencies: a test may look below its layer) among the workspace's crates, from `cargo metadata`, and
fails on any that the table below does not allow. A new crate must be added to the table; the table is the
one in ARCHITECTURE.md.

Schemas by role, the same way: each proto schema belongs to the crates of its role, and production code (test
modules and tests/ folders aside) of any other crate that names it fails. The public API (`mentis_proto::api`)
is the API's, the CLI's, MCP's and the tests'; the executor wire (`mentis_proto::executor`) is the executor's and
the application's executor client's; the journal's record (`mentis_proto::journal`) is the application's.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

# For each crate, the workspace crates it may depend on (normal dependencies).
ALLOWED = {
    "mentis-proto": set(),
    "mentis-model": set(),
    "mentis-telemetry": set(),
    "mentis-core": {"mentis-model"},
    "mentis-backend-docker": {"mentis-core", "mentis-telemetry"},
    "mentis-backend-kubernetes": {"mentis-core", "mentis-telemetry"},
    "mentis-store": {"mentis-core"},
    # The egress gateway: policies and the seams it asks through, below the application that runs it.
    "mentis-gateway": {"mentis-core"},
    "mentis-app": {
        "mentis-proto",
        "mentis-core",
        "mentis-store",
        "mentis-gateway",
        "mentis-backend-docker",
        "mentis-backend-kubernetes",
        "mentis-telemetry",
        "mentis-mcp",
    },
    # The API: the application and the public protos; never the store or a backend.
    "mentis-runtime": {"mentis-app", "mentis-proto", "mentis-core", "mentis-telemetry", "mentis-mcp"},
    "mentis-executor": {"mentis-model", "mentis-proto", "mentis-telemetry"},
    "mentis-mcp": {"mentis-proto"},
    "mentis-cli": {"mentis-proto", "mentis-mcp"},
    "mentis-e2e": {"mentis-app", "mentis-proto", "mentis-runtime", "mentis-telemetry"},
}


# For each schema, the source folders whose production code may name it.
SCHEMAS = {
    "api": {"services/runtime/src", "cli/src", "mcp/src"},
    "executor": {"executor/src", "services/app/src"},
    "journal": {"services/app/src"},
}
# Every production source folder that depends on mentis-proto.
SOURCES = ["executor/src", "services/app/src", "services/runtime/src", "cli/src", "mcp/src"]
NAMED = re.compile(r"mentis_proto::(api|executor|journal)\b|mentis_proto::\{([^}]*)\}")


def production(text: str) -> str:
    """The text before a file's test module (`#[cfg(test)]` then `mod`), comments blanked."""
    cut = re.search(r"#\[cfg\(test\)\]\s*mod\s", text)
    text = text[: cut.start()] if cut else text
    return re.sub(r"//[^\n]*", "", text)


def schemas_named(text: str):
    for m in NAMED.finditer(production(text)):
        if m.group(1):
            yield m.group(1)
        else:
            yield from (n for n in ("api", "executor", "journal") if re.search(rf"\b{n}\b", m.group(2)))


def schema_failures(root: Path) -> list:
    failed = []
    for src in SOURCES:
        for path in sorted((root / src).rglob("*.rs")):
            for schema in sorted(set(schemas_named(path.read_text()))):
                if src not in SCHEMAS[schema]:
                    failed.append(f"{path.relative_to(root)} names mentis_proto::{schema}, not its role's schema")
    return failed


def main() -> int:
    out = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    packages = json.loads(out)["packages"]
    names = {p["name"] for p in packages}
    failed = []
    for p in sorted(packages, key=lambda p: p["name"]):
        name = p["name"]
        if name not in ALLOWED:
            failed.append(f"{name}: not in tests/crate-graph.py's table: say what it may depend on")
            continue
        for dep in sorted(d["name"] for d in p["dependencies"] if d["name"] in names and d["kind"] is None):
            if dep not in ALLOWED[name]:
                failed.append(f"{name} depends on {dep}, which its layer may not use")
    failed += schema_failures(Path(__file__).resolve().parent.parent)
    for line in failed:
        print(f"crate-graph: {line}", file=sys.stderr)
    if failed:
        return 1
    print(f"crate-graph: the {len(packages)} workspace crates depend only on the crates their layers may use, "
          "and name only the protos of their roles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
