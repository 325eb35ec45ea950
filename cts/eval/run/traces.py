"""Reading a run's trace files: where a record's trace path may point, and how large a trace is
parsed. Shared by the viewer (`cts/eval/viewer/runs.py`) and the cost estimate
(`cts/eval/pilot_records.py`), which both read traces named by records (untrusted paths)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: A trace larger than this is not parsed (a runaway page dump would stall the server); its raw
#: file is still served.
MAX_TRACE_BYTES = 16 * 1024 * 1024


def inside(base: Path, relative: str) -> Path | None:
    """`base/relative` resolved (symbolic links followed), or None when it is not below
    `base`: an absolute path, `..`, or a link out."""
    if not relative or "\x00" in relative or Path(relative).is_absolute():
        return None
    root = base.resolve()
    path = (root / relative).resolve()
    return path if path.is_relative_to(root) and path != root else None


def read_trace_file(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The trace at `path` (a file already known to lie inside its run's traces/), or why it
    was not read: over `MAX_TRACE_BYTES`, unreadable, nested too deeply, or not an object."""
    try:
        if path.stat().st_size > MAX_TRACE_BYTES:
            return None, f"trace file over {MAX_TRACE_BYTES >> 20} MiB: not read"
        loaded = json.loads(path.read_bytes())
    except (ValueError, OSError) as e:
        return None, f"trace file unreadable: {e}"
    except RecursionError:  # json.loads recurses per level: a file nested ~1000 deep
        return None, "trace file unreadable: JSON nested too deeply"
    if not isinstance(loaded, dict):
        return None, "trace file is not a JSON object"
    return loaded, None
