"""Templates (TemplateService) and images of your own, the synchronous API.

    from mentis import Sandbox, Templates

    with Templates() as templates:
        built = templates.build_image("./tools", "team/tools:1", on_output=print)  # a Dockerfile's folder
        templates.create("tools", image=built.image, env={"MODE": "dev"}, work_dir="app",
                         setup_commands=["mkdir -p app"])
    with Sandbox.create(template="tools") as sb:
        print(sb.run("pwd").stdout)                           # /workspace/app

A template names a sandbox configuration once, in a space: an image (any Linux image with /bin/sh on the
runtime's engine), default limits, env, a working directory and start-up commands run in each new sandbox
(docs/ARCHITECTURE.md, "Templates"). There is no registry: an image is built from a Dockerfile and a local
folder, or imported from a root filesystem tarball, on the runtime's engine (admin keys only).
"""

from __future__ import annotations

import builtins
import os
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any

import grpc
from google.protobuf import field_mask_pb2

from . import _transfer
from ._client import Connection, Settings
from .errors import MentisError, from_rpc_error
from .sandbox import _CHUNK, _send
from .terminal import _time
from .v1 import space_pb2, template_pb2

__all__ = ["BuiltImage", "Template", "Templates"]

# What `update` changes, by keyword: the fields that are update mask paths of their own, and the limits,
# which the runtime changes together (the path `limits`).
_FIELDS = ("description", "image", "env", "work_dir", "setup_commands", "pool_size", "runtime_class")
_LIMITS = ("cpu", "memory_mb", "pids", "nofile", "disk_mb")
_UPDATABLE = (*_FIELDS, *_LIMITS)


@dataclass
class Template:
    """A sandbox configuration of a space. `image` empty is the runtime's default image; a limit of 0 leaves
    it to the space's and the runtime's defaults; `env` is under a sandbox spec's own; `work_dir` is where
    shell commands that name no directory start (relative to `/workspace`, or absolute; empty: `/workspace`);
    `setup_commands` run in order in each new sandbox before it is handed out; `pool_size` sandboxes of it
    are kept ready; `runtime_class` is the isolation its sandboxes run under (such as `runsc`, gVisor), one
    the runtime offers (`MENTIS_RUNTIME_CLASSES`), set by the admin only (empty: the space's)."""

    name: str
    space_id: str = ""
    description: str = ""
    image: str = ""
    cpu: float = 0.0
    memory_mb: int = 0
    pids: int = 0
    nofile: int = 0
    disk_mb: int = 0
    env: dict[str, str] = field(default_factory=dict)
    work_dir: str = ""
    setup_commands: list[str] = field(default_factory=list)
    pool_size: int = 0
    runtime_class: str = ""
    created_at: datetime | None = None
    updated_at: datetime | None = None


@dataclass
class BuiltImage:
    """An image made on the runtime's engine, ready for a template or `Sandbox.create(image=...)` to name:
    `image` its name, `image_id` the engine's id of it (`sha256:...`), `space_id` the space it belongs to
    (only that space's keys may use it, docs/SECURITY.md), `shared` whether the admin shared it with every
    space."""

    image: str
    image_id: str
    space_id: str = ""
    shared: bool = False


def _template(t: template_pb2.Template) -> Template:
    return Template(
        name=t.name,
        space_id=t.space_id,
        description=t.description,
        image=t.image,
        cpu=t.limits.cpu,
        memory_mb=t.limits.memory_mb,
        pids=t.limits.pids,
        nofile=t.limits.nofile,
        disk_mb=t.limits.disk_mb,
        env=dict(t.env),
        work_dir=t.work_dir,
        setup_commands=list(t.setup_commands),
        pool_size=t.pool_size,
        runtime_class=t.runtime_class,
        created_at=_time(t.create_time),
        updated_at=_time(t.update_time),
    )


def _built(b: template_pb2.BuiltImage) -> BuiltImage:
    return BuiltImage(image=b.image, image_id=b.image_id, space_id=b.space_id, shared=b.shared)


def _message(name: str, space_id: str | None, fields: dict[str, Any]) -> template_pb2.Template:
    """The Template message of `name` with `fields` (keywords of `create`; None is the empty value)."""
    v = {k: fields.get(k) for k in _UPDATABLE}
    return template_pb2.Template(
        space_id=space_id or "",
        name=name,
        description=v["description"] or "",
        image=v["image"] or "",
        limits=space_pb2.SandboxLimits(
            cpu=v["cpu"] or 0.0,
            memory_mb=v["memory_mb"] or 0,
            pids=v["pids"] or 0,
            nofile=v["nofile"] or 0,
            disk_mb=v["disk_mb"] or 0,
        ),
        env=v["env"] or {},
        work_dir=v["work_dir"] or "",
        setup_commands=builtins.list(v["setup_commands"] or ()),
        pool_size=v["pool_size"] or 0,
        runtime_class=v["runtime_class"] or "",
    )


def _create_request(
    name: str, space_id: str | None, fields: dict[str, Any]
) -> template_pb2.CreateTemplateRequest:
    return template_pb2.CreateTemplateRequest(template=_message(name, space_id, fields))


def _list_request(space_id: str | None, page_size: int) -> template_pb2.ListTemplatesRequest:
    return template_pb2.ListTemplatesRequest(space_id=space_id or "", page_size=page_size)


def _check_update(fields: dict[str, Any]) -> bool:
    """Refuses what `update` cannot change (TypeError) and an update of nothing (ValueError); True when the
    template's current limits are needed, to keep those of the five not given."""
    unknown = sorted(set(fields) - set(_UPDATABLE))
    if unknown:
        raise TypeError(f"update() cannot change {', '.join(unknown)}; it changes {', '.join(_UPDATABLE)}")
    if not fields:
        raise ValueError(f"update() needs at least one field to change: {', '.join(_UPDATABLE)}")
    given = [k for k in _LIMITS if k in fields]
    return bool(given) and len(given) < len(_LIMITS)


def _update_request(
    name: str, space_id: str | None, fields: dict[str, Any], current: Template | None
) -> template_pb2.UpdateTemplateRequest:
    """UpdateTemplate's request: the fields given, and a mask naming them only. The limits go together (the
    mask's `limits`), those not given at the values of `current`."""
    if current is not None:
        fields = {**{k: getattr(current, k) for k in _LIMITS}, **fields}
    paths = [k for k in _FIELDS if k in fields]
    if any(k in fields for k in _LIMITS):
        paths.append("limits")
    return template_pb2.UpdateTemplateRequest(
        template=_message(name, space_id, fields), update_mask=field_mask_pb2.FieldMask(paths=paths)
    )


def _build_header(
    tag: str,
    dockerfile: str,
    build_args: dict[str, str] | None,
    no_cache: bool,
    space_id: str | None,
    egress: bool,
) -> template_pb2.BuildImageHeader:
    return template_pb2.BuildImageHeader(
        image=tag,
        dockerfile=dockerfile,
        build_args=build_args or {},
        no_cache=no_cache,
        space_id=space_id or "",
        egress=egress,
    )


def _context_chunks(context: str | os.PathLike[str]) -> Iterator[bytes]:
    """The folder `context` as a tar archive (every file in it, links as links), about a MiB a chunk, made
    as it is sent. A missing folder is FileNotFoundError, a file NotADirectoryError, here, not mid-call."""
    local = os.fspath(context)
    if not stat.S_ISDIR(os.stat(local).st_mode):
        raise NotADirectoryError(f"{local} is not a folder: the build context is a folder with a Dockerfile")
    return _transfer.tar_chunks(local, _CHUNK)


def _rootfs_chunks(
    rootfs: str | os.PathLike[str] | bytes | IO[bytes],
) -> tuple[Iterator[bytes], Callable[[], None]]:
    """The root filesystem in chunks, and what closes the file opened for it."""
    if isinstance(rootfs, (bytes, bytearray, memoryview)):
        data = memoryview(rootfs).cast("B")
        return (bytes(data[i : i + _CHUNK]) for i in range(0, len(data), _CHUNK)), lambda: None
    if hasattr(rootfs, "read"):
        return _transfer.file_chunks(rootfs, _CHUNK), lambda: None  # type: ignore[arg-type]
    local = os.fspath(rootfs)  # type: ignore[arg-type]
    if stat.S_ISDIR(os.stat(local).st_mode):
        raise IsADirectoryError(f"{local} is a folder: import_image takes a root filesystem as a tar file")
    f = open(local, "rb")  # noqa: SIM115 (closed by the caller, once sent)
    return _transfer.file_chunks(f, _CHUNK), f.close


class _BuildOutput:
    """A build's responses: the output to the callback, the image at the end."""

    def __init__(self, on_output: Callable[[str], None] | None) -> None:
        self._on_output = on_output
        self.image: BuiltImage | None = None

    def feed(self, r: template_pb2.BuildImageResponse) -> None:
        kind = r.WhichOneof("kind")
        if kind == "output":
            if self._on_output is not None:
                self._on_output(r.output)
        elif kind == "image":
            self.image = _built(r.image)

    def result(self) -> BuiltImage:
        if self.image is None:
            raise MentisError("the build's stream ended without an image")
        return self.image


class Templates:
    """The templates of the runtime's spaces (`create`, `get`, `list`, `update`, `delete`), and the images
    they name (`build_image`, `import_image`). Opens a connection of its own (the same `addr`, `api_key` and
    `tls` rules as `Sandbox.create`); used as a context manager it is closed at the end of the block.
    `space_id` None is the space `default`; a key scoped to spaces manages its spaces' templates only
    (PermissionDenied otherwise), and images are built and imported with an admin key only."""

    def __init__(self, *, addr: str | None = None, api_key: str | None = None, tls: bool | None = None):
        self._conn = Connection(Settings.resolve(addr, api_key, tls=tls))

    def _call(self, method_name: str, request: Any):
        try:
            return getattr(self._conn.templates, method_name)(request)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def create(
        self,
        name: str,
        *,
        space_id: str | None = None,
        image: str = "",
        description: str = "",
        env: dict[str, str] | None = None,
        cpu: float = 0,
        memory_mb: int = 0,
        pids: int = 0,
        nofile: int = 0,
        disk_mb: int = 0,
        work_dir: str = "",
        setup_commands: builtins.list[str] | None = None,
        pool_size: int = 0,
        runtime_class: str = "",
    ) -> Template:
        """Creates template `name` (1-63 lowercase letters, digits or '-') and returns it. 0 / empty leaves a
        setting to the space's and the runtime's defaults. AlreadyExists when the space has one of that name,
        NotFound when the space is unknown, InvalidArgument (with its `field`) for a value the runtime
        refuses."""
        fields = dict(
            image=image,
            description=description,
            env=env,
            cpu=cpu,
            memory_mb=memory_mb,
            pids=pids,
            nofile=nofile,
            disk_mb=disk_mb,
            work_dir=work_dir,
            setup_commands=setup_commands,
            pool_size=pool_size,
            runtime_class=runtime_class,
        )
        return _template(self._call("CreateTemplate", _create_request(name, space_id, fields)).template)

    def get(self, name: str, space_id: str | None = None) -> Template:
        """One template; NotFound when the space has none of that name."""
        request = template_pb2.GetTemplateRequest(space_id=space_id or "", name=name)
        return _template(self._call("GetTemplate", request).template)

    def list(self, space_id: str | None = None, *, page_size: int = 0) -> builtins.list[Template]:
        """The space's templates in name order, every page followed. `page_size` is how many each call
        fetches (0: the runtime's default, 100; at most 1000)."""
        request = _list_request(space_id, page_size)
        found: builtins.list[Template] = []
        while True:
            r = self._call("ListTemplates", request)
            found.extend(_template(t) for t in r.templates)
            if not r.next_page_token:
                return found
            request.page_token = r.next_page_token

    def update(self, name: str, *, space_id: str | None = None, **fields: Any) -> Template:
        """Changes the fields given, by the keywords of `create` (None: the empty value), and only those (the
        update mask names them), and returns the template: `update("tools", image="team/tools:2")`. The
        runtime changes the limits together, so when some of `cpu`, `memory_mb`, `pids`, `nofile` and
        `disk_mb` are given the template is read first and the others are sent as they were. Sandboxes made
        before keep what they got; its pool is made again. NotFound when there is no such template,
        TypeError for a keyword that is no field of `create`, ValueError when none is given."""
        current = self.get(name, space_id) if _check_update(fields) else None
        request = _update_request(name, space_id, fields, current)
        return _template(self._call("UpdateTemplate", request).template)

    def delete(self, name: str, space_id: str | None = None) -> None:
        """Deletes a template; sandboxes made from it keep running. NotFound when there is none."""
        self._call("DeleteTemplate", template_pb2.DeleteTemplateRequest(space_id=space_id or "", name=name))

    def build_image(
        self,
        context: str | os.PathLike[str],
        tag: str,
        *,
        dockerfile: str = "Dockerfile",
        build_args: dict[str, str] | None = None,
        no_cache: bool = False,
        on_output: Callable[[str], None] | None = None,
        space_id: str | None = None,
        egress: bool = False,
    ) -> BuiltImage:
        """Builds image `tag` (for example `"team/tools:1"`) on the runtime's engine from the folder
        `context`, sent as a tar archive as it is read (every file of it: a `.dockerignore` is not applied),
        with the Dockerfile at `dockerfile` in it; `build_args` are ARG values. The engine's output is passed
        to `on_output` as it comes. Every FROM must name an image the engine has (there is no registry to
        pull from): FailedPrecondition before the build otherwise, and for a step that fails, after its
        output. The image belongs to `space_id` (None: `default`): that space's keys may use it, others
        not until `share_image`. RUN steps have no network unless `egress` (and the runtime allows it,
        MENTIS_BUILD_EGRESS=allow; FailedPrecondition otherwise). Admin keys only (PermissionDenied)."""
        chunks = _context_chunks(context)
        header = _build_header(tag, dockerfile, build_args, no_cache, space_id, egress)
        local: builtins.list[BaseException] = []
        ready = threading.Event()
        calls: builtins.list[Any] = []

        def requests() -> Iterator[template_pb2.BuildImageRequest]:
            yield template_pb2.BuildImageRequest(header=header)
            try:
                for chunk in chunks:
                    yield template_pb2.BuildImageRequest(context=chunk)
            except Exception as e:  # a local file that cannot be read: nothing half sent is built
                local.append(e)
                ready.wait()
                calls[0].cancel()

        responses = self._conn.templates.BuildImage(requests())
        calls.append(responses)
        ready.set()
        output = _BuildOutput(on_output)
        try:
            for r in responses:
                output.feed(r)
        except grpc.RpcError as e:
            if local:
                raise local[0] from None
            raise from_rpc_error(e) from None
        finally:
            responses.cancel()  # nothing once it ended; the call's end when the callback raised
        return output.result()

    def import_image(
        self,
        rootfs: str | os.PathLike[str] | bytes | IO[bytes],
        tag: str,
        *,
        changes: builtins.list[str] | None = None,
        space_id: str | None = None,
    ) -> BuiltImage:
        """Makes image `tag` on the runtime's engine from a root filesystem as a tar archive (plain or gzip),
        as `docker import` does: `rootfs` is the archive's path, its bytes, or a binary file open for reading.
        `changes` are Dockerfile instructions applied to it (`"ENV PATH=/usr/bin:/bin"`, `"WORKDIR /srv"`;
        CMD, ENTRYPOINT, ENV, EXPOSE, LABEL, ONBUILD, USER, VOLUME, WORKDIR). The image belongs to
        `space_id` (None: `default`), as with `build_image`. Admin keys only."""
        chunks, close = _rootfs_chunks(rootfs)
        header = template_pb2.ImportImageHeader(image=tag, changes=changes or [], space_id=space_id or "")
        try:
            r = _send(
                self._conn.templates.ImportImage,
                template_pb2.ImportImageRequest(header=header),
                chunks,
                lambda data: template_pb2.ImportImageRequest(data=data),
            )
        finally:
            close()
        return _built(r.image)

    def share_image(self, tag: str, shared: bool = True) -> BuiltImage:
        """Lets every space's keys use image `tag` (one built or imported for a space), or, with
        `shared=False`, only its own space's again. NotFound for an image the runtime has no record of.
        Admin keys only."""
        r = self._call("ShareImage", template_pb2.ShareImageRequest(image=tag, shared=shared))
        return _built(r.image)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Templates:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
