"""Watching a directory of a sandbox's workspace (FileService.WatchFiles; the synchronous API).

    with sb.files.watch("src", recursive=True) as watch:    # every change under src from now on
        sb.run("echo 'print(1)' > src/app.py")
        for event in watch:                                 # FileEvents, as they happen
            print(event.type, event.path)                   # created src/app.py, modified src/app.py
            if event.type == "modified":
                break

A watch lives in the sandbox, apart from the stream that reads it (docs/FILES.md, "Watch a folder"): a stream
that drops is opened again with the watch's id after the last event received, so each event arrives once and
none is skipped. `close()` (the end of a `with` block) ends this reader; the watch itself stays in the sandbox
for 5 minutes, keeping its newest 4096 events, and `sb.files.attach_watch(watch.watch_id,
after_seq=watch.last_seq)` reads on from there, in this process or another.
"""

from __future__ import annotations

import builtins
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import grpc

from .errors import InvalidArgument, MentisError, from_rpc_error
from .terminal import _RESUMABLE, _RESUME_FOR, _time
from .v1 import file_pb2

if TYPE_CHECKING:
    from ._client import Connection

__all__ = ["FileEvent", "FileWatch"]

# FileEventType's values by the names FileEvent.type gives them.
_TYPES = {
    value: name.removeprefix("FILE_EVENT_TYPE_").lower()
    for name, value in file_pb2.FileEventType.items()
    if value != file_pb2.FILE_EVENT_TYPE_UNSPECIFIED
}


@dataclass
class FileEvent:
    """One change under a watched directory, or a mark where events were lost.

    `type` is `"created"` (made, or moved in, or replaced whole), `"modified"` (written to: a burst of writes
    to one file is one event at once and one more 50 ms later, so the last write is always reported),
    `"removed"` (deleted, or moved away; a move is `removed` at the old path and `created` at the new one),
    `"overflow"` (events were lost in the sandbox's kernel, or the directory at `path` could not be followed;
    `path` is empty for the whole watch) or `"gap"` (this reader fell behind what the watch keeps, its newest
    4096 events: the `missed` events up to `seq` are gone). After an `overflow` or a `gap`, list the directory
    to catch up. `path` is relative to /workspace, as `FileInfo.path`; `seq` numbers the watch's events from
    1; `time` is when the change was seen."""

    seq: int
    type: str
    path: str
    is_dir: bool = False
    time: datetime | None = None
    missed: int = 0


def _file_event(e: file_pb2.FileEvent) -> FileEvent:
    return FileEvent(
        seq=e.seq, type=_TYPES.get(e.type, "unknown"), path=e.path, is_dir=e.is_dir, time=_time(e.time)
    )


def _watch_request(sandbox_id: str, path: str, recursive: bool) -> file_pb2.WatchFilesRequest:
    return file_pb2.WatchFilesRequest(sandbox_id=sandbox_id, path=path, recursive=recursive)


def _attach_watch_request(sandbox_id: str, watch_id: Any, after_seq: Any) -> file_pb2.WatchFilesRequest:
    """WatchFiles' request that reads watch `watch_id` again; an empty id (which would start a new watch of
    the workspace) or a seq that is no int of 0 or more is InvalidArgument here."""
    if not isinstance(watch_id, str) or not watch_id:
        raise InvalidArgument(f"watch_id must name a watch, not {watch_id!r}", field="watch_id")
    if not isinstance(after_seq, int) or isinstance(after_seq, bool) or after_seq < 0:
        raise InvalidArgument(f"after_seq must be an int of 0 or more, not {after_seq!r}", field="after_seq")
    return file_pb2.WatchFilesRequest(sandbox_id=sandbox_id, watch_id=watch_id, after_seq=after_seq)


class _Events:
    """A watch's events and how its reading ended, shared by the thread (or task) that reads its stream and
    the caller. Events go to the callback when there is one, else into a buffer that `read` empties."""

    def __init__(self, on_event: Callable[[FileEvent], None] | None, after_seq: int) -> None:
        self.on_event = on_event
        self.buffer: list[FileEvent] = []
        self.last_seq = after_seq
        self.failure: BaseException | None = None
        self.closed = False  # the caller closed it
        self.done = False  # the reading ended (closed, the watch ended, or a failure)

    def feed(self, response: file_pb2.WatchFilesResponse) -> FileEvent | None:
        """Takes one message of the stream; the event new to this reader, if it is one (a started, a
        keepalive, or an event a resumed stream repeats, is None). A gap becomes an event of type "gap"
        whose seq is the last one lost, so that a stream opened again after it does not report it again."""
        kind = response.WhichOneof("kind")
        if kind == "event":
            if response.event.seq <= self.last_seq:
                return None
            event = _file_event(response.event)
        elif kind == "gap":
            lost = response.gap.first_available_seq - 1
            if lost <= self.last_seq:
                return None
            missed = lost - max(response.gap.after_seq, self.last_seq)
            event = FileEvent(seq=lost, type="gap", path="", missed=missed)
        else:
            return None
        self.last_seq = event.seq
        if self.on_event is None:
            self.buffer.append(event)
        return event

    def take(self) -> builtins.list[FileEvent]:
        events, self.buffer = self.buffer, []
        return events

    def check_readable(self) -> None:
        if self.on_event is not None:
            raise MentisError("this watch's events go to its on_event callback; there is nothing to read")

    def end(self, failure: BaseException | None = None) -> None:
        if not self.done:
            self.failure, self.done = failure, True


class FileWatch:
    """A watch of a directory of the sandbox, made by `sb.files.watch(...)` or `sb.files.attach_watch(...)`.

    Its events come as `FileEvent`s, in order, each once: iterate over it (until it is closed or the watch
    ends), `read` what arrived, or pass `on_event` (then it is called from the watch's thread, and nothing is
    kept to read). A thread of the watch reads its stream from the sandbox and opens it again after a drop
    (within a minute), from the last event received. `watch_id` names the watch in the sandbox and `last_seq`
    is the seq of the last event received: `sb.files.attach_watch(watch_id, after_seq=last_seq)` reads on from
    there after `close()`, for 5 minutes. Used in a `with` block, it is closed at the end.
    """

    def __init__(
        self,
        conn: Connection,
        sandbox_id: str,
        request: file_pb2.WatchFilesRequest,
        on_event: Callable[[FileEvent], None] | None = None,
    ) -> None:
        self._conn = conn
        self._sandbox_id = sandbox_id
        self._events = _Events(on_event, request.after_seq)
        self._cond = threading.Condition()
        self._call: Any = None
        self.watch_id: str = self._open(request).watch_id
        self._thread = threading.Thread(
            target=self._read_stream, name=f"mentis-watch-{self.watch_id}", daemon=True
        )
        self._thread.start()

    # --- the stream

    def _open(self, request: file_pb2.WatchFilesRequest) -> file_pb2.WatchFilesResponse.Started:
        """Opens a stream and returns its `started` (once it came the watch exists: every change from then on
        is reported); typed errors."""
        call = self._conn.files.WatchFiles(request)
        try:
            for response in call:
                if response.HasField("started"):
                    break
            else:
                raise MentisError("the watch's stream ended before it started")
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        except BaseException:
            call.cancel()
            raise
        with self._cond:
            self._call = call
            closed = self._events.closed
        if closed:  # closed while it opened again
            call.cancel()
        return response.started

    def _read_stream(self) -> None:
        """The reading thread: events into the buffer or the callback until the watch is closed, ends in the
        sandbox, or fails; a stream that drops is opened again after the last event received."""
        deadline: float | None = None
        while True:
            generation = self._conn.generation
            failure: MentisError
            try:
                for response in self._call:
                    if self._events.closed:  # nothing reaches the callback after `close`
                        break
                    with self._cond:
                        event = self._events.feed(response)
                        self._cond.notify_all()
                    if event is not None:
                        deadline = None
                        if self._events.on_event is not None:
                            self._events.on_event(event)
                # Closed, or the runtime ended the stream: the watch ended (its sandbox's executor stopped).
                self._end()
                return
            except grpc.RpcError as e:
                if self._events.closed:
                    self._end()
                    return
                if e.code() not in _RESUMABLE:
                    self._end(from_rpc_error(e))
                    return
                failure = from_rpc_error(e)
                self._conn.reconnect(generation)
            except Exception as e:  # the callback's error: the watch's failure
                self._call.cancel()
                self._end(e)
                return
            # Open it again, after the last event received, within the deadline.
            while True:
                now = time.monotonic()
                deadline = deadline or now + _RESUME_FOR
                if self._events.closed:
                    self._end()
                    return
                if now > deadline:
                    self._end(failure)
                    return
                time.sleep(0.05)
                request = _attach_watch_request(self._sandbox_id, self.watch_id, self._events.last_seq)
                try:
                    self._open(request)
                except MentisError as e:
                    if e.code not in ("UNAVAILABLE", "CANCELLED"):
                        self._end(e)
                        return
                    failure = e
                    continue
                deadline = None
                break

    def _end(self, failure: BaseException | None = None) -> None:
        with self._cond:
            self._events.end(failure)
            self._cond.notify_all()

    # --- what it is

    @property
    def last_seq(self) -> int:
        """The seq of the last event received (0: none yet); `attach_watch` goes on after it."""
        return self._events.last_seq

    def __repr__(self) -> str:
        return f"FileWatch({self.watch_id!r}, last_seq={self.last_seq!r})"

    # --- its events

    def read(self, timeout: float | None = None) -> builtins.list[FileEvent]:
        """The events that arrived since the last read, waiting up to `timeout` seconds (None: no limit) for
        one. [] when the time passed with none, or once the watch is closed (or ended) and all was read; the
        error that ended it (a stream that could not be opened again) is raised then."""
        with self._cond:
            self._events.check_readable()
            self._cond.wait_for(lambda: self._events.buffer or self._events.done, timeout)
            if self._events.buffer:
                return self._events.take()
            if self._events.failure is not None:
                raise self._events.failure
            return []

    def __iter__(self) -> Iterator[FileEvent]:
        """The events one by one as they come, until the watch is closed (from another thread) or ends in the
        sandbox. Leaving the loop early loses nothing: the next loop goes on from there."""
        while True:
            with self._cond:
                self._events.check_readable()
                self._cond.wait_for(lambda: self._events.buffer or self._events.done)
                if not self._events.buffer:
                    if self._events.failure is not None:
                        raise self._events.failure
                    return
                event = self._events.buffer.pop(0)
            yield event

    def wait(self, timeout: float | None = None) -> None:
        """Waits until the reading ends: `close()` from another thread (or from `on_event`), or the watch
        ending in the sandbox (its executor stopped). The error that ended it is raised here: `on_event`'s, or
        a stream that could not be opened again. TimeoutError when it still runs after `timeout` seconds."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._events.done, timeout):
                raise TimeoutError(f"watch {self.watch_id} still runs after {timeout} s")
            if self._events.failure is not None:
                raise self._events.failure

    # --- the end

    def close(self) -> None:
        """Ends this reader: its stream is cancelled and its thread ended (joined, unless this is called from
        `on_event`). Events not yet read stay readable. The watch stays in the sandbox for 5 minutes, for
        `attach_watch`. Closing twice is no error."""
        with self._cond:
            self._events.closed = True
            call = self._call
        call.cancel()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def __enter__(self) -> FileWatch:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
