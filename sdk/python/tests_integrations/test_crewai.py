"""mentis.integrations.crewai: each tool through CrewAI's tool interface (BaseTool.run and arun, and the
structured tool CrewAI's agents call with the model's JSON arguments) on a real sandbox, and a CrewAI agent
run with them. No model service: the agent's LLM is scripted; everything else is real."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from crewai import Agent, Crew, Task
from crewai.llms.base_llm import BaseLLM
from crewai.tools import BaseTool, ToolFailure
from pydantic import Field

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


class ScriptedLLM(BaseLLM):
    """Answers with the next scripted reply (CrewAI's text protocol: Thought, Action, Action Input, then Final
    Answer) and keeps the messages it was sent."""

    replies: list[str]
    sent: list[Any] = Field(default_factory=list)

    def call(self, messages, tools=None, callbacks=None, available_functions=None, **kwargs):
        # A copy: the agent goes on appending to the list it passed.
        self.sent.append([dict(m) for m in messages])
        return self.replies.pop(0)

    def supports_function_calling(self) -> bool:
        return False

    def get_context_window_size(self) -> int:
        return 100_000


def test_a_crewai_agent_runs_its_actions_in_the_sandbox(sb):
    llm = ScriptedLLM(
        model="scripted",
        replies=[
            'Thought: compute\nAction: run_shell\nAction Input: {"command": "echo $((6*7)) | tee six.txt"}',
            'Thought: check the notes\nAction: read_file\nAction Input: {"path": "crew/none.md"}',
            "Thought: I now know the final answer\nFinal Answer: 42",
        ],
    )
    agent = Agent(
        role="Analyst",
        goal="Answer with numbers computed in the sandbox",
        backstory="Runs everything in a sandbox.",
        tools=sandbox_tools(sb),
        llm=llm,
        max_iter=5,
    )
    task = Task(description="What is 6 times 7?", expected_output="A number", agent=agent)
    out = Crew(agents=[agent], tasks=[task]).kickoff()

    assert out.raw == "42"
    assert llm.replies == []
    # What the model was shown after each action: the sandbox's answer, then the refused call's text.
    observations = [sent[-2]["content"].split("\nObservation: ", 1)[1] for sent in llm.sent[1:]]
    assert observations == [
        "exit code: 0\n--- stdout ---\n42",
        'error: PATH_NOT_FOUND: "crew/none.md" does not exist (code: PATH_NOT_FOUND)',
    ]
    # The refused call is on the task's record as a tool failure; the command ran in the sandbox.
    (failure,) = out.tasks_output[0].tool_failures
    assert (failure.tool_name, failure.failure.code) == ("read_file", "PATH_NOT_FOUND")
    assert sb.files.read_text("six.txt") == "42\n"
