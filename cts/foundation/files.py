"""Local files: the toolkit's home directory ($CTS_HOME) and file digests."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cts_home() -> Path:
    """$CTS_HOME, by default ~/.cache/cts: converted models, downloads, search indexes."""
    return Path(os.environ.get("CTS_HOME") or Path.home() / ".cache" / "cts").expanduser()


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
