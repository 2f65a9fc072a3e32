"""MentisSandbox's Python client: sandboxes for AI agents, with shell commands, stateful IPython cells,
files and watches of them, terminals, processes, snapshots of workspaces, preview URLs, templates with images
of your own, and egress rules with secrets the sandbox never sees, over the runtime's gRPC API.

    from mentis import Sandbox

    with Sandbox.create() as sb:
        print(sb.run("echo hi").stdout)
        print(sb.run_code("6 * 7").results[0]["text/plain"])

The runtime's address and key come from arguments or `MENTIS_ADDR` / `MENTIS_API_KEY` (see `Settings`).
"""

from ._client import Settings
from .aio import (
    AsyncCommandHandle,
    AsyncFiles,
    AsyncFileWatch,
    AsyncProcesses,
    AsyncSandbox,
    AsyncSecrets,
    AsyncSnapshots,
    AsyncTemplates,
    AsyncTerminal,
    AsyncTerminals,
)
from .egress import EgressDenial, EgressRule, Secrets
from .errors import (
    Aborted,
    AlreadyExists,
    Cancelled,
    ConfigError,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    MentisError,
    NotFound,
    OutOfRange,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from .processes import Processes, ProcessInfo
from .sandbox import (
    CellError,
    CellResult,
    CommandHandle,
    CommandResult,
    FileInfo,
    Files,
    PreviewUrl,
    Sandbox,
    SandboxInfo,
)
from .snapshot import Snapshot, Snapshots
from .template import BuiltImage, Template, Templates
from .terminal import Terminal, TerminalInfo, TerminalLink, Terminals
from .watch import FileEvent, FileWatch

__version__ = "0.1.0"

__all__ = [
    "Aborted",
    "AlreadyExists",
    "AsyncCommandHandle",
    "AsyncFileWatch",
    "AsyncFiles",
    "AsyncProcesses",
    "AsyncSandbox",
    "AsyncSecrets",
    "AsyncSnapshots",
    "AsyncTemplates",
    "AsyncTerminal",
    "AsyncTerminals",
    "BuiltImage",
    "Cancelled",
    "CellError",
    "CellResult",
    "CommandHandle",
    "CommandResult",
    "ConfigError",
    "DeadlineExceeded",
    "EgressDenial",
    "EgressRule",
    "FailedPrecondition",
    "FileEvent",
    "FileInfo",
    "FileWatch",
    "Files",
    "Internal",
    "InvalidArgument",
    "MentisError",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "PreviewUrl",
    "ProcessInfo",
    "Processes",
    "ResourceExhausted",
    "Sandbox",
    "SandboxInfo",
    "Secrets",
    "Settings",
    "Snapshot",
    "Snapshots",
    "Template",
    "Templates",
    "Terminal",
    "TerminalInfo",
    "TerminalLink",
    "Terminals",
    "Unauthenticated",
    "Unavailable",
]
