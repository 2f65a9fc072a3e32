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
"""

import json
import subprocess
import sys

# For each crate, the workspace crates it may depend on (normal dependencies).
ALLOWED = {
    "mentis-proto": set(),
    "mentis-model": set(),
    "mentis-telemetry": set(),
    "mentis-core": {"mentis-model"},
    "mentis-backend-docker": {"mentis-core", "mentis-telemetry"},
    "mentis-store": {"mentis-core"},
    "mentis-app": {
        "mentis-proto",
        "mentis-core",
        "mentis-store",
        "mentis-backend-docker",
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
    for line in failed:
        print(f"crate-graph: {line}", file=sys.stderr)
    if failed:
        return 1
    print(f"crate-graph: the {len(packages)} workspace crates depend only on the crates their layers may use")
    return 0


if __name__ == "__main__":
    sys.exit(main())
