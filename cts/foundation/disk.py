"""Writes that leave a file whole or absent, and a full disk as one clear error.

A full disk (or a spent quota, a read-only file system, a directory one may not write) is not
one key's failure: every later write would fail too. `storage_errors` turns the OSError into
`StorageFull`, naming the file, which stops the run (exit 1); what was written whole is kept,
and running the same command again once there is space (or write access) resumes. Neither
helper below leaves a complete-looking partial file behind: `write_whole` renames a finished
temporary over the file, and `append_line` cuts off a line it could not finish.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

#: What a write fails with when the disk, not the data, is the problem.
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
#: A read-only file system, or a directory the user may not write (EPERM: e.g. an immutable file).
_NOT_WRITABLE = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
#: The storage itself failing: a disk's I/O error, an NFS server's stale handle.
_FAILING = frozenset({errno.EIO, errno.ESTALE})
#: A path that cannot hold the file: a part of it is a file (ENOTDIR), or a file stands where
#: a directory must be made (EEXIST from mkdir), or a name too long for the file system.
_BAD_PATH = frozenset({errno.ENOTDIR, errno.EEXIST, errno.ENAMETOOLONG})
STORAGE_ERRNOS = _NO_SPACE | _NOT_WRITABLE | _FAILING | _BAD_PATH


class StorageFull(OSError):
    """A write that failed for want of space, of a place it may write, of a storage that works
    (an I/O error, a stale NFS handle) or of a path that can hold a file: every later write
    would fail too, so the run stops once, at the first, naming the file."""

    def __str__(self) -> str:
        remedy = (
            "make it writable (or choose another --output-dir or cache path)"
            if self.errno in _NOT_WRITABLE
            else "check the file system, or its server (or choose another --output-dir or "
            "cache path)"
            if self.errno in _FAILING
            else "choose a path whose folders are folders (or another --output-dir or cache path)"
            if self.errno in _BAD_PATH
            else "free some space"
        )
        return (
            f"{self.filename}: {self.strerror}; stopped, keeping what was finished: {remedy}, "
            "then run the same command again (a run resumes where it stopped)"
        )


def storage_full(path: Path | str, code: int = errno.ENOSPC) -> StorageFull:
    return StorageFull(code, os.strerror(code), str(path))


@contextmanager
def storage_errors(path: Path | str) -> Iterator[None]:
    """Raise an OSError of a full disk, a quota, a read-only file system, a failing storage or
    a path that cannot hold a file met in the block as StorageFull naming `path` (the file
    being written, not its temporary); others pass."""
    try:
        yield
    except StorageFull:
        raise
    except OSError as e:
        if e.errno not in STORAGE_ERRNOS:
            raise
        raise storage_full(path, e.errno) from e


class NotAFile(ValueError):
    """A path to write whole that exists and is not a regular file: a device (/dev/null), a
    FIFO, a socket, a directory. Renaming a temporary over it would replace it (as root,
    /dev/null itself would become a regular file), so it is refused, naming what it is."""

    def __init__(self, path: Path | str, kind: str) -> None:
        super().__init__(
            f"{path}: not a regular file ({kind}); a file written here replaces what the path "
            "names, so name a regular file (or a path that does not exist yet)"
        )


_KINDS = (
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def refuse_special(path: Path | str) -> None:
    """NotAFile unless `path` is absent or a regular file (a symbolic link counts as what it
    points to; a dangling one as absent). Every writer that renames over a file calls it."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # absent (or unreadable: the write itself then says why)
    if not stat.S_ISREG(mode):
        kind = next((k for test, k in _KINDS if test(mode)), "another kind of file")
        raise NotAFile(path, kind)


def write_whole(path: Path, data: str | bytes, *, durable: bool = True) -> None:
    """Write `path` whole or not at all: a temporary beside it is written, fsync'd and renamed
    over it, and removed when anything fails (the old file, if any, stays as it was). A path
    that is not a regular file is refused (NotAFile) before anything is written.

    `durable=False` skips the fsync: the file is still whole or absent for every reader and
    after the process is killed (the page cache outlives it), but a power loss or kernel crash
    may leave it absent or empty. Only for files whose readers tolerate that."""
    refuse_special(path)
    raw = data.encode() if isinstance(data, str) else data
    # Unique per process and thread: shards of one run write the same config.yaml at once.
    partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.partial")
    with storage_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with partial.open("wb") as f:
                f.write(raw)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
            partial.replace(path)
        except BaseException:
            with suppress(OSError):
                partial.unlink()
            raise


def append_line(path: Path, line: bytes) -> None:
    """Append one line to a file this process alone writes, fsync'd. A failed append is cut
    off again, so that the next line cannot complete its torn start into a corrupt line."""
    with storage_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            end = os.lseek(fd, 0, os.SEEK_END)
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except BaseException:
                # Shrinking needs no space; should it fail anyway, the torn line is still cut
                # by this file's next writer on resume.
                with suppress(OSError):
                    os.ftruncate(fd, end)
                raise
        finally:
            os.close(fd)
