"""The sandbox's tools for CrewAI (`pip install 'mentis-sandbox[crewai]'`).

    from crewai import Agent
    from mentis import Sandbox
    from mentis.integrations.crewai import sandbox_tools

    sb = Sandbox.create()
    agent = Agent(role=..., goal=..., backstory=..., tools=sandbox_tools(sb))

Each tool returns text for the model (see `mentis.integrations`). A call the runtime refuses returns a
`crewai.tools.ToolFailure`, CrewAI's way for a tool to say it failed: the agent reads its message, and the
failure is recorded by the agent's `tool_failure_policy`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

try:
    from crewai.tools import BaseTool, ToolFailure
except ImportError as e:  # pragma: no cover - what a user without the extra sees
    raise ImportError("mentis.integrations.crewai needs crewai: pip install 'mentis-sandbox[crewai]'") from e

from pydantic import PrivateAttr

from ..errors import MentisError
from ..sandbox import Sandbox
from . import _common
from ._schemas import SCHEMAS

__all__ = ["SandboxTool", "sandbox_tools"]


class SandboxTool(BaseTool):
    """One tool on a sandbox (made by `sandbox_tools`). `limit` is the most characters of one answer given
    to the model (0: no limit)."""

    limit: int = _common.DEFAULT_LIMIT
    _sandbox: Sandbox = PrivateAttr()
    _call: Callable[..., str] = PrivateAttr()

    def __init__(self, sandbox: Sandbox, call: Callable[..., str], **fields: Any) -> None:
        super().__init__(**fields)
        self._sandbox = sandbox
        self._call = call

    def _run(self, **args: Any) -> str | ToolFailure:
        try:
            return self._call(self._sandbox, **args, limit=self.limit)
        except MentisError as e:
            return ToolFailure(
                message=_common.error_text(e),
                code=e.reason or e.code,
                retryable=e.retry_after is not None,
            )

    async def _arun(self, **args: Any) -> str | ToolFailure:
        return await asyncio.to_thread(self._run, **args)


def sandbox_tools(sandbox: Sandbox, *, limit: int = _common.DEFAULT_LIMIT) -> list[BaseTool]:
    """The tools `run_shell`, `run_python`, `read_file`, `write_file` and `list_files` on `sandbox`, as
    CrewAI tools (`run` and `arun`; the latter runs the call in a thread). `limit` is the most characters
    of one answer given to the model (the middle of a longer one is cut, with a note; 0: no limit)."""
    if not isinstance(sandbox, Sandbox):
        raise TypeError(f"sandbox_tools takes a mentis Sandbox, not {type(sandbox).__name__}")
    return [
        SandboxTool(
            sandbox,
            call,
            name=spec.name,
            description=spec.description,
            args_schema=SCHEMAS[spec.name],
            limit=limit,
        )
        for spec, call, _ in _common.TOOLS
    ]
