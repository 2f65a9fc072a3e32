"""The sandbox's tools for LangChain and LangGraph (`pip install 'mentis-sandbox[langchain]'`).

    from mentis import Sandbox
    from mentis.integrations.langchain import sandbox_tools
    from langgraph.prebuilt import ToolNode

    sb = Sandbox.create()
    tools = sandbox_tools(sb)               # run_shell, run_python, read_file, write_file, list_files
    model = chat_model.bind_tools(tools)    # any chat model that calls tools
    node = ToolNode(tools)                  # or any agent that takes LangChain tools

Each tool returns text for the model (see `mentis.integrations`). A call the runtime refuses raises
`ToolException`, which the tool turns into its answer (`handle_tool_error=True`): the model reads the error
in a ToolMessage with status "error", and the loop goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

try:
    from langchain_core.tools import BaseTool, StructuredTool, ToolException
except ImportError as e:  # pragma: no cover - what a user without the extra sees
    raise ImportError(
        "mentis.integrations.langchain needs langchain-core: pip install 'mentis-sandbox[langchain]'"
    ) from e

from ..aio import AsyncSandbox
from ..errors import MentisError
from ..sandbox import Sandbox
from . import _common
from ._schemas import SCHEMAS

__all__ = ["sandbox_tools"]


def sandbox_tools(sandbox: Sandbox | AsyncSandbox, *, limit: int = _common.DEFAULT_LIMIT) -> list[BaseTool]:
    """The tools `run_shell`, `run_python`, `read_file`, `write_file` and `list_files` on `sandbox`, as
    LangChain tools. With a `Sandbox` they run in both `invoke` and `ainvoke` (the latter in a thread);
    with an `AsyncSandbox` they are coroutines, for `ainvoke` and async graphs. `limit` is the most
    characters of one answer given to the model (the middle of a longer one is cut, with a note;
    0: no limit)."""
    if not isinstance(sandbox, (Sandbox, AsyncSandbox)):
        raise TypeError(f"sandbox_tools takes a mentis Sandbox or AsyncSandbox, not {type(sandbox).__name__}")
    asynchronous = isinstance(sandbox, AsyncSandbox)
    tools: list[BaseTool] = []
    for spec, call, acall in _common.TOOLS:
        tools.append(
            StructuredTool.from_function(
                func=None if asynchronous else _sync(call, sandbox, limit),
                coroutine=_async(acall, sandbox, limit) if asynchronous else None,
                name=spec.name,
                description=spec.description,
                args_schema=SCHEMAS[spec.name],
                handle_tool_error=True,
            )
        )
    return tools


def _sync(call: Callable[..., str], sandbox: Sandbox, limit: int) -> Callable[..., str]:
    def tool(**args: Any) -> str:
        try:
            return call(sandbox, **args, limit=limit)
        except MentisError as e:
            raise ToolException(_common.error_text(e)) from e

    return tool


def _async(call: Callable[..., Any], sandbox: AsyncSandbox, limit: int) -> Callable[..., Any]:
    async def tool(**args: Any) -> str:
        try:
            return await call(sandbox, **args, limit=limit)
        except MentisError as e:
            raise ToolException(_common.error_text(e)) from e

    return tool
