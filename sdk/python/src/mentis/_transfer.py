"""Upload and download between local paths and a sandbox's workspace, shared by both APIs.

As `mentis cp` (cli/src/files.rs) does: a local file goes up as a file (WriteFile, with its permission bits),
a directory as a tar archive (Upload); a remote directory comes down as a tar archive (Download), and so does
one file (Download archives it under its own name, with its mode). A directory lands *in* a destination that
is an existing directory (`dest/<name>`), else *as* the destination, like `cp -r`.

The archive going up is written entry by entry while it is sent, a file `chunk` bytes at a time; the one
coming down is unpacked as it arrives. Unpacking keeps every entry inside the destination: no absolute
names, no "..", nothing written through a symbolic link (a sandbox's files are not to be trusted), and no
set-id bits.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from typing import IO

from .errors import MentisError

_BLOCK = tarfile.BLOCKSIZE


def base_name(path: str) -> str | None:
    """The last component of `path` (trailing slashes ignored); None for "", ".", ".." and "/"."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return None if name in ("", ".", "..") else name


def join_remote(directory: str, name: str) -> str:
    return f"{directory.rstrip('/')}/{name}" if directory.rstrip("/") else name


def local_destination(remote_path: str, local_path: str | os.PathLike[str]) -> str:
    """Where a download of `remote_path` lands: in `local_path` when it is an existing directory (under the
    remote's name), else at `local_path`."""
    local = os.fspath(local_path)
    name = base_name(remote_path)
    if name is not None and os.path.isdir(local):
        return os.path.join(local, name)
    return local


def file_chunks(f: IO[bytes], chunk: int) -> Iterator[bytes]:
    while data := f.read(chunk):
        yield data


def tar_chunks(root: str, chunk: int) -> Iterator[bytes]:
    """The tar archive of directory `root`'s contents (names relative to it, sorted, a directory before what
    it holds; symbolic links and hard links as links), in pieces of about `chunk` bytes, made as they are
    taken."""
    return _rechunk(_tar_pieces(root, chunk), chunk)


def _tar_pieces(root: str, chunk: int) -> Iterator[bytes]:
    # A TarFile only to describe entries: gettarinfo gives modes, owners, link targets and hard links to
    # files archived before.
    describer = tarfile.TarFile(fileobj=io.BytesIO(), mode="w", format=tarfile.PAX_FORMAT)
    for path, name in _walk(root, ""):
        info = describer.gettarinfo(path, name)
        if info is None:  # a socket: nothing to archive
            continue
        yield info.tobuf(describer.format, describer.encoding, describer.errors)
        if info.isreg() and info.size:
            with open(path, "rb") as f:
                left = info.size
                while left:
                    data = f.read(min(chunk, left))
                    if not data:
                        raise OSError(f"{path} shrank while it was being uploaded")
                    left -= len(data)
                    yield data
            yield b"\0" * (-info.size % _BLOCK)
    yield b"\0" * (2 * _BLOCK)  # the end of the archive


def _walk(directory: str, prefix: str) -> Iterator[tuple[str, str]]:
    with os.scandir(directory) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        name = prefix + entry.name
        yield entry.path, name
        if entry.is_dir(follow_symlinks=False):
            yield from _walk(entry.path, name + "/")


def _rechunk(pieces: Iterable[bytes], size: int) -> Iterator[bytes]:
    buf = bytearray()
    for piece in pieces:
        if not buf and len(piece) >= size:
            yield piece
            continue
        buf += piece
        if len(buf) >= size:
            yield bytes(buf)
            buf.clear()
    if buf:
        yield bytes(buf)


class ChunkReader(io.RawIOBase):
    """A readable file over an iterator of byte chunks (a Download stream)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        super().__init__()
        self._chunks = chunks
        self._left = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._left:
            try:
                self._left = memoryview(next(self._chunks))
            except StopIteration:
                return 0
        n = min(len(buffer), len(self._left))
        buffer[:n] = self._left[:n]
        self._left = self._left[n:]
        return n


def unpack(archive: IO[bytes], target: str, chunk: int) -> None:
    """Unpacks the tar stream `archive` into directory `target` (created when missing), read as it comes."""
    os.makedirs(target, exist_ok=True)
    directories: list[tuple[str, int, float]] = []
    try:
        with tarfile.open(fileobj=archive, mode="r|") as tar:
            for member in tar:
                parts = _parts(member.name)
                if not parts:
                    continue  # the directory itself
                dest = _inside(target, parts, member.name)
                mode = member.mode & 0o777
                if member.isdir():
                    try:
                        is_dir = stat.S_ISDIR(os.lstat(dest).st_mode)
                    except FileNotFoundError:
                        is_dir = None
                    if is_dir is False:
                        os.unlink(dest)  # a file or a link where the archive has a directory
                    if not is_dir:
                        os.mkdir(dest, 0o700)
                    directories.append((dest, mode, member.mtime))
                elif member.isreg():
                    _clear(dest)
                    fd = os.open(
                        dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
                    )
                    with os.fdopen(fd, "wb") as out:
                        data = tar.extractfile(member)
                        assert data is not None
                        shutil.copyfileobj(data, out, chunk)
                        os.fchmod(out.fileno(), mode)
                    os.utime(dest, (member.mtime, member.mtime))
                elif member.issym():
                    _clear(dest)
                    os.symlink(member.linkname, dest)
                elif member.islnk():
                    source = _inside(target, _parts(member.linkname), member.linkname, make=False)
                    _clear(dest)
                    os.link(source, dest, follow_symlinks=False)
                # Devices and fifos are never made here.
    except tarfile.TarError as e:
        raise MentisError(f"the archive from the sandbox cannot be read: {e}") from None
    # Directory modes last, deepest first, so a read-only directory could still be filled.
    for path, mode, mtime in reversed(directories):
        os.chmod(path, mode)
        os.utime(path, (mtime, mtime))


def unpack_one(archive: IO[bytes], dest: str, chunk: int) -> None:
    """Unpacks a one-entry archive (a Download of one file) to `dest`, through a temporary folder beside it,
    so `dest` is replaced only by a complete file."""
    parent = os.path.dirname(os.path.abspath(dest))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".mentis-download-", dir=parent)
    try:
        unpack(archive, staging, chunk)
        entries = os.listdir(staging)
        if len(entries) != 1:
            raise MentisError(f"the download held {len(entries)} entries where one file was expected")
        os.replace(os.path.join(staging, entries[0]), dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _parts(name: str) -> list[str]:
    """An archive name's components; MentisError when it leaves the destination."""
    if name.startswith("/"):
        raise MentisError(f"archive entry {name!r} has an absolute name")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise MentisError(f'archive entry {name!r} leaves the destination ("..")')
    return parts


def _inside(target: str, parts: list[str], shown: str, *, make: bool = True) -> str:
    """The path of `parts` under `target`, making missing parent directories (when `make`); MentisError when a
    parent on the way is a symbolic link or not a directory."""
    if not parts:
        raise MentisError(f"archive link {shown!r} names the destination itself")
    here = target
    for part in parts[:-1]:
        here = os.path.join(here, part)
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            if not make:
                raise MentisError(
                    f"archive link {shown!r} points to nothing earlier in the archive"
                ) from None
            os.mkdir(here, 0o755)
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise MentisError(f"archive entry {shown!r} goes through {here!r}, which is not a directory")
    return os.path.join(here, parts[-1])


def _clear(dest: str) -> None:
    """Makes room for a file or link at `dest`: an existing file or link is removed (never followed)."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.lstat(dest).st_mode):
            raise IsADirectoryError(f"{dest} is a directory; the archive has a file there")
        os.unlink(dest)


def remote_file_destination(local: str, remote_path: str, remote_is_dir: bool) -> str:
    """Where an upload of local file `local` lands: in `remote_path` when it is "" (the workspace), ends with
    "/" or is an existing directory (under the local name), else at `remote_path`."""
    if not remote_path or remote_path.endswith("/") or remote_is_dir:
        return join_remote(remote_path, os.path.basename(local))
    return remote_path


def remote_dir_destination(local: str, remote_path: str, remote_is_dir: bool) -> str:
    """Where an upload of local directory `local` lands: in `remote_path` when it is an existing directory
    (under the local name; "" is the workspace), else at `remote_path`."""
    name = base_name(local)
    if remote_is_dir and name is not None:
        return join_remote(remote_path, name)
    return remote_path.rstrip("/")
