"""mentis.integrations.crewai: each tool through CrewAI's tool interface (BaseTool.run and arun, and the
structured tool CrewAI's agents call with the model's JSON arguments) on a real sandbox."""

from __future__ import annotations

import asyncio

import pytest
from crewai.tools import BaseTool, ToolFailure

from mentis import Sandbox
from mentis.integrations.crewai import sandbox_tools


@pytest.fixture(scope="module")
def sb(runtime):
    with Sandbox.create(addr=runtime.addr, api_key=runtime.key) as sandbox:
        yield sandbox


@pytest.fixture(scope="module")
def tools(sb) -> dict[str, BaseTool]:
    return {t.name: t for t in sandbox_tools(sb)}


def test_the_five_tools_with_their_arguments(tools):
    assert list(tools) == ["run_shell", "run_python", "read_file", "write_file", "list_files"]
    assert all(isinstance(t, BaseTool) for t in tools.values())
    shell = tools["run_shell"].args_schema.model_json_schema()
    assert shell["required"] == ["command"]
    assert set(shell["properties"]) == {"command", "timeout"}
    # What CrewAI shows the model about the tool.
    assert "exit code" in tools["run_shell"].description


def test_run_shell(tools):
    assert tools["run_shell"].run(command="echo $((6*7))") == "exit code: 0\n--- stdout ---\n42"
    # A failing command is an answer with its exit code, not a failure.
    failed = tools["run_shell"].run(command="echo no >&2; exit 3")
    assert failed == "exit code: 3\n--- stderr ---\nno"
    slow = tools["run_shell"].run(command="sleep 30", timeout=1)
    assert slow.startswith("exit code: -1 (timed_out: ")


def test_run_python_keeps_the_kernels_state(tools):
    assert tools["run_python"].run(code="x = 6 * 7\nprint('set')") == "status: ok\n--- output ---\nset"
    assert tools["run_python"].run(code="x") == "status: ok\n--- result ---\n42"
    failed = tools["run_python"].run(code="undefined_name")
    assert failed.startswith("status: error\n--- error ---\nNameError: name 'undefined_name' is not defined")


def test_files_round_trip(sb, tools):
    assert tools["write_file"].run(path="crew/notes.md", content="café\n") == "wrote 6 bytes to crew/notes.md"
    assert tools["read_file"].run(path="crew/notes.md") == "café\n"
    assert tools["list_files"].run(path="crew") == "crew/notes.md (6 bytes)"
    assert sb.files.read_text("crew/notes.md") == "café\n"


def test_a_refused_call_is_a_crewai_tool_failure(tools):
    failure = tools["read_file"].run(path="crew/missing.md")
    assert isinstance(failure, ToolFailure)
    assert failure.message == 'error: PATH_NOT_FOUND: "crew/missing.md" does not exist'
    assert (failure.code, failure.retryable) == ("PATH_NOT_FOUND", False)
    # The text the agent reads.
    assert tools["read_file"].format_output_for_agent(failure) == (
        'error: PATH_NOT_FOUND: "crew/missing.md" does not exist (code: PATH_NOT_FOUND)'
    )


def test_the_structured_tool_agents_call_with_json_arguments(tools):
    structured = tools["run_shell"].to_structured_tool()
    assert structured.invoke('{"command": "echo $((6*7))"}') == "exit code: 0\n--- stdout ---\n42"
    python = tools["run_python"].to_structured_tool()
    assert asyncio.run(python.ainvoke({"code": "6 * 7"})) == "status: ok\n--- result ---\n42"


def test_arun(tools):
    assert asyncio.run(tools["run_shell"].arun(command="echo async")) == "exit code: 0\n--- stdout ---\nasync"
    failure = asyncio.run(tools["list_files"].arun(path="no/such/folder"))
    assert isinstance(failure, ToolFailure) and failure.code == "PATH_NOT_FOUND"


def test_only_sync_sandboxes_make_tools():
    with pytest.raises(TypeError, match="mentis Sandbox"):
        sandbox_tools("sandbox-id")
