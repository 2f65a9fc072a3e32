"""mentis.integrations.langchain: LangGraph agent loops on real sandboxes. No model service: a scripted chat
model (langchain_core's GenericFakeChatModel) emits the tool calls; everything else is real, from LangGraph's
ToolNode to the sandbox's shell, kernel and files."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import Field

from mentis import AsyncSandbox, Sandbox
from mentis.integrations.langchain import sandbox_tools

NAMES = ["run_shell", "run_python", "read_file", "write_file", "list_files"]


class ScriptedModel(GenericFakeChatModel):
    """Answers with the next scripted message. Binding tools records their schemas as a provider would get
    them (OpenAI's function format), then returns the model itself."""

    bound: list[dict[str, Any]] = Field(default_factory=list)

    def bind_tools(self, tools, **kwargs):
        self.bound = [convert_to_openai_tool(t) for t in tools]
        return self


def _call(name: str, call_id: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


def _turn(*calls: dict[str, Any]) -> AIMessage:
    """A model's turn that asks for these tool calls."""
    return AIMessage("", tool_calls=list(calls))


def _graph(model: ScriptedModel, tools):
    """The ReAct loop: the model answers; while it asks for tools, ToolNode runs them and it goes on."""
    bound = model.bind_tools(tools)

    def agent(state: MessagesState):
        return {"messages": [bound.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


def _tool_messages(messages) -> dict[str, ToolMessage]:
    return {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}


@pytest.fixture(scope="module")
def sb(runtime):
    with Sandbox.create(addr=runtime.addr, api_key=runtime.key) as sandbox:
        yield sandbox


def test_a_langgraph_agent_loop_runs_its_tool_calls_in_the_sandbox(sb):
    final = "42 is in answer.txt; doubled, 84; the plan is written."
    model = ScriptedModel(
        messages=iter(
            [
                _turn(_call("run_shell", "c1", command="echo $((6*7)) > answer.txt; cat answer.txt")),
                _turn(_call("run_python", "c2", code="n = int(open('answer.txt').read())\nn * 2")),
                _turn(_call("write_file", "c3", path="notes/plan.md", content="# Plan\nstep one\n")),
                _turn(
                    _call("read_file", "c4", path="notes/plan.md"), _call("list_files", "c5", path="notes")
                ),
                _turn(_call("read_file", "c6", path="notes/missing.md")),
                _turn(_call("run_shell", "c7", command="ls notes/missing.md")),
                AIMessage(final),
            ]
        )
    )
    tools = sandbox_tools(sb)
    question = HumanMessage("What is 6 times 7, doubled? Keep a plan.")
    out = _graph(model, tools).invoke({"messages": [question]})

    # The model was offered the five tools, with their arguments' schemas.
    assert [t["function"]["name"] for t in model.bound] == NAMES
    shell = model.bound[0]["function"]["parameters"]
    assert shell["required"] == ["command"]
    assert set(shell["properties"]) == {"command", "timeout"}

    results = _tool_messages(out["messages"])
    assert set(results) == {"c1", "c2", "c3", "c4", "c5", "c6", "c7"}
    assert results["c1"].content == "exit code: 0\n--- stdout ---\n42"
    # The kernel sees the file the shell wrote: one sandbox, one workspace.
    assert results["c2"].content == "status: ok\n--- result ---\n84"
    assert results["c3"].content == "wrote 16 bytes to notes/plan.md"
    assert results["c4"].content == "# Plan\nstep one\n"
    assert results["c5"].content == "notes/plan.md (16 bytes)"
    # A refused call is a tool error the model reads, and the loop goes on.
    assert results["c6"].status == "error"
    assert results["c6"].content == 'error: PATH_NOT_FOUND: "notes/missing.md" does not exist'
    # A failing command is an answer with its exit code, not an error.
    assert results["c7"].status == "success"
    assert results["c7"].content.startswith(
        "exit code: 2\n--- stderr ---\nls: cannot access 'notes/missing.md"
    )
    assert all(results[c].status == "success" for c in ("c1", "c2", "c3", "c4", "c5"))
    assert out["messages"][-1].content == final
    assert [type(m).__name__ for m in out["messages"]].count("AIMessage") == 7

    # And the sandbox holds what the agent did.
    assert sb.files.read_text("notes/plan.md") == "# Plan\nstep one\n"
    assert sb.run("cat answer.txt").stdout == "42\n"


def test_an_async_graph_runs_the_async_sandboxes_tools_concurrently(runtime):
    async def main():
        async with AsyncSandbox.create(addr=runtime.addr, api_key=runtime.key) as sb:
            model = ScriptedModel(
                messages=iter(
                    [
                        # Both in one turn: ToolNode runs them at once, each on the sandbox.
                        _turn(
                            _call("run_shell", "a1", command="sleep 1; echo first"),
                            _call("run_python", "a2", code="import time; time.sleep(1); print('second')"),
                        ),
                        _turn(_call("read_file", "a3", path="nowhere.txt")),
                        _turn(_call("write_file", "a4", path="x.txt", content="ok")),
                        AIMessage("done"),
                    ]
                )
            )
            tools = sandbox_tools(sb)
            out = await _graph(model, tools).ainvoke({"messages": [HumanMessage("go")]})
            return out, await sb.files.read_text("x.txt")

    out, written = asyncio.run(main())
    results = _tool_messages(out["messages"])
    assert results["a1"].content == "exit code: 0\n--- stdout ---\nfirst"
    assert results["a2"].content == "status: ok\n--- output ---\nsecond"
    assert (results["a3"].status, results["a3"].content) == (
        "error",
        'error: PATH_NOT_FOUND: "nowhere.txt" does not exist',
    )
    assert results["a4"].content == "wrote 2 bytes to x.txt"
    assert written == "ok"
    assert out["messages"][-1].content == "done"


def test_an_async_sandboxes_tools_are_coroutines_only(runtime):
    async def main():
        async with AsyncSandbox.create(addr=runtime.addr, api_key=runtime.key) as sb:
            (shell, *_) = sandbox_tools(sb)
            answer = await shell.ainvoke({"command": "echo async"})
            with pytest.raises(NotImplementedError):
                shell.invoke({"command": "echo sync"})
            return answer

    assert asyncio.run(main()) == "exit code: 0\n--- stdout ---\nasync"


def test_a_sync_sandboxes_tools_also_run_from_ainvoke(sb):
    tools = {t.name: t for t in sandbox_tools(sb)}
    assert asyncio.run(tools["run_shell"].ainvoke({"command": "echo threaded"})) == (
        "exit code: 0\n--- stdout ---\nthreaded"
    )


def test_what_the_model_reads(sb):
    tools = {t.name: t for t in sandbox_tools(sb, limit=1000)}
    shell, python, read = tools["run_shell"], tools["run_python"], tools["read_file"]

    # Exit code, stdout and stderr; a timed-out command says so.
    both = shell.invoke({"command": "echo out; echo err >&2; exit 3"})
    assert both == "exit code: 3\n--- stdout ---\nout\n--- stderr ---\nerr"
    assert shell.invoke({"command": "true"}) == "exit code: 0\n(no output)"
    slow = shell.invoke({"command": "echo started; sleep 30", "timeout": 1})
    assert slow.startswith("exit code: -1 (timed_out: "), slow
    assert slow.endswith("\n--- stdout ---\nstarted")

    # Long output: head and tail kept, the cut said, within the limit (plus the note).
    printing = {"command": "printf HEAD; head -c 50000 /dev/zero | tr '\\0' x; printf TAIL"}
    long = shell.invoke(printing)
    whole = "exit code: 0\n--- stdout ---\nHEAD" + "x" * 50000 + "TAIL"
    assert long.startswith("exit code: 0\n--- stdout ---\nHEAD")
    assert long.endswith("xxTAIL")
    note = (
        f"\n[... {len(whole) - 1000:,} characters cut from the middle: the output had {len(whole):,} "
        "characters, 1,000 are shown ...]\n"
    )
    assert long == whole[:500] + note + whole[-500:]
    unlimited = sandbox_tools(sb, limit=0)[0]
    assert unlimited.invoke(printing) == whole

    # A cell: printed text, results (an image named by its type and size), the error and its traceback
    # without terminal colours.
    cell = python.invoke(
        {"code": "import matplotlib.pyplot as plt\nprint('plotting')\nplt.plot([1, 2]); plt.show()\n6 * 7"}
    )
    assert re.fullmatch(
        r"status: ok\n--- output ---\nplotting\n--- result ---\n<Figure size \d+x\d+ with 1 Axes>\n"
        r"\[image/png, [\d,]+ bytes: not shown\]\n42",
        cell,
    ), cell
    failed = python.invoke({"code": "def f():\n    return 1 / 0\nf()"})
    assert failed.startswith("status: error\n--- error ---\nZeroDivisionError: division by zero\n"), failed
    assert "----> 3 f()" in failed and "\x1b[" not in failed
    assert failed.endswith("ZeroDivisionError: division by zero")

    # Files: text as is, a long one cut, a binary one named.
    sb.files.write("big.txt", "z" * 3000)
    big = read.invoke({"path": "big.txt"})
    assert big.count("z") == 1000 and big.startswith("z" * 500) and big.endswith("z" * 500)
    assert "2,000 characters cut from the middle" in big
    sb.files.write("blob.bin", bytes(range(256)))
    assert read.invoke({"path": "blob.bin"}) == (
        "blob.bin is not UTF-8 text (256 bytes): inspect it with run_python or run_shell."
    )
    sb.files.write("empty.txt", "")
    assert read.invoke({"path": "empty.txt"}) == "empty.txt is empty."
    sb.run("mkdir -p tree/sub && echo hi > tree/sub/f && ln -s sub/f tree/link")
    assert tools["list_files"].invoke({"path": "tree"}) == "tree/link -> sub/f\ntree/sub/"
    sb.run("mkdir -p hollow")
    assert tools["list_files"].invoke({"path": "hollow"}) == "hollow is empty."


def test_a_sandbox_gone_is_a_tool_error_not_a_crash(runtime):
    sb = Sandbox.create(addr=runtime.addr, api_key=runtime.key)
    tools = {t.name: t for t in sandbox_tools(sb)}
    sb.delete()
    try:
        message = tools["run_shell"].invoke(_call("run_shell", "g1", command="echo hi"))
    finally:
        sb.close()
    assert isinstance(message, ToolMessage)
    assert message.status == "error"
    assert message.content == (
        f"error: SANDBOX_ENDED: sandbox {sb.id} is TERMINATED; an action needs it RUNNING"
    ), message.content


def test_only_sandboxes_make_tools():
    with pytest.raises(TypeError, match="mentis Sandbox or AsyncSandbox"):
        sandbox_tools("sandbox-id")
