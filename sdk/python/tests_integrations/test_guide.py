"""docs/SDK.md's agent-framework examples (its `python frameworks` blocks, which the core tests leave out:
they need the frameworks), run exactly as a reader would paste them, against the test runtime."""

from __future__ import annotations

import pathlib
import re


def test_the_guides_framework_examples_run_as_written(env, capsys):
    guide = pathlib.Path(__file__).resolve().parents[3] / "docs" / "SDK.md"
    blocks = re.findall(r"```python frameworks\n(.*?)```", guide.read_text(), re.S)
    assert len(blocks) == 2, "docs/SDK.md should have a LangGraph and a CrewAI example"
    langgraph, crewai = blocks
    exec(compile(langgraph, "docs/SDK.md", "exec"), {})
    assert capsys.readouterr().out.splitlines() == [
        "exit code: 0",
        "--- stdout ---",
        "42",
        'error error: PATH_NOT_FOUND: "missing.txt" does not exist',
    ]
    exec(compile(crewai, "docs/SDK.md", "exec"), {})
    assert capsys.readouterr().out.splitlines() == [
        "exit code: 0",
        "--- stdout ---",
        "42",
        'error: PATH_NOT_FOUND: "missing.txt" does not exist',
    ]
