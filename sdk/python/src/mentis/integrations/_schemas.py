"""The tools' arguments as pydantic models, the schema both LangChain and CrewAI give the model (pydantic
comes with either framework)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from ._common import ARGUMENTS, LIST_FILES, READ_FILE, RUN_PYTHON, RUN_SHELL, WRITE_FILE


class RunShellArgs(BaseModel):
    command: str = Field(description=ARGUMENTS["command"])
    timeout: float | None = Field(default=None, description=ARGUMENTS["timeout"])


class RunPythonArgs(BaseModel):
    code: str = Field(description=ARGUMENTS["code"])


class ReadFileArgs(BaseModel):
    path: str = Field(description=ARGUMENTS["path"])


class WriteFileArgs(BaseModel):
    path: str = Field(description=ARGUMENTS["path"])
    content: str = Field(description=ARGUMENTS["content"])


class ListFilesArgs(BaseModel):
    path: str = Field(default="", description=ARGUMENTS["folder"])


SCHEMAS: dict[str, type[BaseModel]] = {
    RUN_SHELL.name: RunShellArgs,
    RUN_PYTHON.name: RunPythonArgs,
    READ_FILE.name: ReadFileArgs,
    WRITE_FILE.name: WriteFileArgs,
    LIST_FILES.name: ListFilesArgs,
}
