"""What the framework tools share, with no framework imported: their names and descriptions, the calls they
make on a sandbox (sync and async) and the text each call gives the model."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from ..aio import AsyncSandbox
    from ..errors import MentisError
    from ..sandbox import CellResult, CommandResult, FileInfo, Sandbox

DEFAULT_LIMIT = 20_000
"""The most characters of a tool's text given to the model (head and tail kept, the middle cut)."""


class ToolSpec(NamedTuple):
    name: str
    description: str


RUN_SHELL = ToolSpec(
    "run_shell",
    "Run a bash command in the sandbox, a Linux machine of your own, and get its exit code, stdout and "
    "stderr. It starts in the workspace folder, where files stay between calls. A command that fails is "
    "no error: read its exit code.",
)
RUN_PYTHON = ToolSpec(
    "run_python",
    "Run Python code as a cell of the sandbox's IPython kernel: variables and imports stay from one call to "
    "the next. Returns what the code printed, the value of its last expression (images are named by type), "
    "and the exception with its traceback if it raised one.",
)
READ_FILE = ToolSpec(
    "read_file",
    "Read a text file of the sandbox (a relative path is from the workspace folder).",
)
WRITE_FILE = ToolSpec(
    "write_file",
    "Write text to a file of the sandbox, replacing what it held; missing parent folders are made (a "
    "relative path is from the workspace folder).",
)
LIST_FILES = ToolSpec(
    "list_files",
    "List a folder of the sandbox (the workspace folder when no path is given): one entry a line, folders "
    "ending with '/', files with their size.",
)

# The descriptions of the tools' arguments, for the frameworks' argument schemas.
ARGUMENTS = {
    "command": "The bash command line to run.",
    "timeout": "Seconds the command may run before it is stopped (omitted: the runtime's default).",
    "code": "The Python code to run.",
    "path": "The file's path.",
    "folder": "The folder's path (empty: the workspace folder).",
    "content": "The text to write.",
}

# --- the calls, synchronous and asynchronous


def run_shell(sb: Sandbox, command: str, timeout: float | None = None, *, limit: int) -> str:
    return command_text(sb.run(command, timeout=timeout), limit)


def run_python(sb: Sandbox, code: str, *, limit: int) -> str:
    return cell_text(sb.run_code(code), limit)


def read_file(sb: Sandbox, path: str, *, limit: int) -> str:
    return file_text(path, sb.files.read(path), limit)


def write_file(sb: Sandbox, path: str, content: str, *, limit: int) -> str:
    sb.files.write(path, content)
    return written_text(path, content)


def list_files(sb: Sandbox, path: str = "", *, limit: int) -> str:
    return listing_text(path, sb.files.list(path), limit)


async def arun_shell(sb: AsyncSandbox, command: str, timeout: float | None = None, *, limit: int) -> str:
    return command_text(await sb.run(command, timeout=timeout), limit)


async def arun_python(sb: AsyncSandbox, code: str, *, limit: int) -> str:
    return cell_text(await sb.run_code(code), limit)


async def aread_file(sb: AsyncSandbox, path: str, *, limit: int) -> str:
    return file_text(path, await sb.files.read(path), limit)


async def awrite_file(sb: AsyncSandbox, path: str, content: str, *, limit: int) -> str:
    await sb.files.write(path, content)
    return written_text(path, content)


async def alist_files(sb: AsyncSandbox, path: str = "", *, limit: int) -> str:
    return listing_text(path, await sb.files.list(path), limit)


# The tools in the order the frameworks list them: spec, sync call, async call.
TOOLS = (
    (RUN_SHELL, run_shell, arun_shell),
    (RUN_PYTHON, run_python, arun_python),
    (READ_FILE, read_file, aread_file),
    (WRITE_FILE, write_file, awrite_file),
    (LIST_FILES, list_files, alist_files),
)

# --- the text the model gets

# Terminal colours and cursor moves (IPython colours its tracebacks).
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def clip(text: str, limit: int) -> str:
    """`text` when it has at most `limit` characters, else its head and tail with a note of what was cut."""
    if limit <= 0 or len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    cut = len(text) - limit
    note = (
        f"\n[... {cut:,} characters cut from the middle: the output had {len(text):,} characters, "
        f"{limit:,} are shown ...]\n"
    )
    return text[:head] + note + text[len(text) - tail :]


def _section(title: str, body: str) -> str:
    return f"--- {title} ---\n{body.rstrip(chr(10))}"


def command_text(r: CommandResult, limit: int) -> str:
    """A command's end for the model: exit code (and why when it did not just exit), stdout, stderr."""
    head = f"exit code: {r.exit_code}"
    if r.reason != "exited":
        head += f" ({r.reason}{': ' + r.message if r.message else ''})"
    parts = [head]
    if r.stdout:
        parts.append(_section("stdout", r.stdout))
    if r.stderr:
        parts.append(_section("stderr", r.stderr))
    if len(parts) == 1:
        parts.append("(no output)")
    return clip("\n".join(parts), limit)


def _result_text(bundle: dict) -> str:
    """One rich result: its text/plain, and the other MIME types named (images with their size)."""
    lines = []
    if "text/plain" in bundle:
        lines.append(str(bundle["text/plain"]))
    for mime, value in bundle.items():
        if mime == "text/plain":
            continue
        size = f", {len(value):,} bytes" if isinstance(value, bytes) else ""
        lines.append(f"[{mime}{size}: not shown]")
    return "\n".join(lines)


def cell_text(c: CellResult, limit: int) -> str:
    """A cell's end for the model: its status, printed text, results and error with traceback."""
    head = f"status: {c.status}"
    if c.reason:
        head += f" ({c.reason})"
    parts = [head]
    if c.text:
        parts.append(_section("output", c.text))
    if c.results:
        parts.append(_section("result", "\n".join(_result_text(b) for b in c.results)))
    if c.error is not None:
        error = f"{c.error.name}: {c.error.value}"
        if c.error.traceback:
            error += "\n" + _ANSI.sub("", "\n".join(c.error.traceback))
        parts.append(_section("error", error))
    if len(parts) == 1:
        parts.append("(no output)")
    return clip("\n".join(parts), limit)


def file_text(path: str, data: bytes, limit: int) -> str:
    """A file's content for the model (a file that is not UTF-8 text is named, not shown)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return f"{path} is not UTF-8 text ({len(data):,} bytes): inspect it with run_python or run_shell."
    return clip(text, limit) if text else f"{path} is empty."


def written_text(path: str, content: str) -> str:
    return f"wrote {len(content.encode('utf-8')):,} bytes to {path}"


def listing_text(path: str, files: list[FileInfo], limit: int) -> str:
    """A folder's entries for the model, one a line."""
    if not files:
        return f"{path or 'the workspace folder'} is empty."
    lines = []
    for f in sorted(files, key=lambda f: f.path):
        if f.is_dir:
            lines.append(f"{f.path}/")
        elif f.symlink_target:
            lines.append(f"{f.path} -> {f.symlink_target}")
        else:
            lines.append(f"{f.path} ({f.size:,} bytes)")
    return clip("\n".join(lines), limit)


def error_text(e: MentisError) -> str:
    """A refused call for the model: the runtime's reason and message."""
    return f"error: {e}"
