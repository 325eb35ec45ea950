"""One writer per shard, and one shard count at a time, on a run directory (or a building
step's folder): the kernel's locks (flock), so that a killed holder leaves none behind. Apart
from the runner: `cts data fuse|blur` takes them too."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from cts.eval.run.run_dir import Shard
from cts.foundation.disk import storage_errors


class ShardBusy(RuntimeError):
    """Another live process is running this shard of this run directory."""


@contextmanager
def shard_lock(root: Path, shard: Shard) -> Iterator[None]:
    """Hold the shard's lock while running it. Two writers of one shard (a requeued Slurm task
    that starts while the old one still runs, a command typed twice) would each repair the
    other's torn lines and write each key twice. The lock is the kernel's (flock): a killed
    holder releases it, so a crash never leaves a stale lock behind."""
    path = root / f".{shard.name}.lock"
    with storage_errors(path):
        root.mkdir(parents=True, exist_ok=True)
        handle = path.open("a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise ShardBusy(
                f"{path}: shard {shard.index}/{shard.count} of this run is being run by another "
                f"process (pid {holder}); two writers would mix their records: wait for it to "
                "end, or stop it, then run the same command again"
            ) from None
        with suppress(OSError):  # the pid only names the holder; a full disk must not stop here
            handle.truncate(0)
            handle.write(str(os.getpid()))
            handle.flush()
        yield
    finally:
        handle.close()  # releases the lock


def _count_of(path: Path) -> int | None:
    """N of a shard count's lock file `.of-N.lock` (None: another file)."""
    count = path.name.removeprefix(".of-").removesuffix(".lock")
    return int(count) if count.isdigit() else None


def _live_other_count(root: Path, count: int) -> int | None:
    """Another shard count whose lock some live process holds, if any. A held lock is known
    only by failing to take it: a free one is taken and let go at once."""
    for path in sorted(root.glob(".of-*.lock")):
        other = _count_of(path)
        if other is None or other == count:
            continue
        with storage_errors(path), path.open("rb") as probe:
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return other
    return None


@contextmanager
def shard_count_lock(root: Path, shard: Shard) -> Iterator[None]:
    """Hold the lock of the shard's count (`.of-N.lock`) while running it. Shards of one count
    split the instances alike, so they run side by side (the lock is shared); a writer of
    another count would take keys a live shard has yet to write and record them twice, which
    `merge` then refuses for good: it is ShardBusy, naming the other count. Each writer takes
    its own count's lock before looking for another's, so of two starting at once at least
    one is refused. The kernel's lock (flock): a killed holder leaves none behind."""
    path = root / f".of-{shard.count}.lock"
    with storage_errors(path):
        root.mkdir(parents=True, exist_ok=True)
        handle = path.open("a+")
    try:
        # Waits only while another count's writer looks at this lock (an instant).
        fcntl.flock(handle, fcntl.LOCK_SH)
        other = _live_other_count(root, shard.count)
        if other is not None:
            raise ShardBusy(
                f"{root / f'.of-{other}.lock'}: another live process runs this run as {other} "
                f"shard(s); running it as {shard.count} shard(s) beside it would write keys "
                "twice (each count splits the instances its own way): wait for those shards to "
                "end, or stop them, then run again"
            )
        yield
    finally:
        handle.close()  # releases the lock
