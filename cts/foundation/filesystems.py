"""Which file system a path is on, for what does not work on a network one: SQLite's WAL mode
needs every process that opens the database on one host (its shared-memory index), so a cache
shared by Slurm tasks on several nodes over NFS, Lustre or GPFS must not use it."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import struct
from pathlib import Path

#: statfs(2) `f_type` magic numbers (linux/magic.h, and the vendors' own) of network and cluster
#: file systems, where several hosts open one file.
NETWORK_FILESYSTEMS = {
    0x6969: "nfs",
    0x517B: "smb",
    0xFF534D42: "cifs",
    0xFE534D42: "smb2",
    0x0BD00BD0: "lustre",
    0x47504653: "gpfs",
    0x00C36400: "ceph",
    0x19830326: "beegfs",
    0x01021997: "9p",
    0x5346414F: "afs",
    0x7461636F: "ocfs2",
    0x01161970: "gfs2",
    0xAAD7AAEA: "panfs",
}


def statfs_type(path: Path) -> int | None:
    """statfs(2)'s `f_type` for the nearest existing folder of `path`; None where it cannot
    be asked (not Linux)."""
    existing = Path(path).absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    with contextlib.suppress(OSError, AttributeError, TypeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        buffer = ctypes.create_string_buffer(512)  # struct statfs is 120 bytes on 64-bit Linux
        if libc.statfs(os.fsencode(existing), buffer) == 0:
            # f_type is the first field, a long (__fsword_t) on every 64-bit Linux ABI.
            return int(struct.unpack_from("l", buffer)[0]) & 0xFFFFFFFF
    return None


def network_filesystem(path: Path) -> str | None:
    """The network file system `path` is on (`nfs`, `lustre`, …), or None for a local one."""
    kind = statfs_type(path)
    return NETWORK_FILESYSTEMS.get(kind) if kind is not None else None
