"""A run directory's Slurm submission history (`RunDir.jobs`): what `submit` appends and
`status` reads, kept apart from both so neither imports the other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cts.eval.run.run_dir import RunDir, RunDirError
from cts.foundation.disk import write_whole


def record_submission(path: Path, submission: dict[str, Any]) -> None:
    """Append to the run's submission history (a resubmission after a failure adds a line)."""
    history = json.loads(path.read_text()) if path.is_file() else []
    history.append(submission)
    write_whole(path, json.dumps(history, indent=1))


def latest_chain(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The latest submission, with the chain it belongs to (a train loop's steps)."""
    chain = history[-1].get("chain")
    return [s for s in history if s.get("chain") == chain] if chain else history[-1:]


def submissions(run_dir: Path) -> list[dict[str, Any]]:
    """Every submission recorded for `run_dir`, oldest first; RunDirError when there is none."""
    path = RunDir(run_dir).jobs
    if not path.is_file():
        raise RunDirError(f"{path}: no Slurm submission recorded for this run directory")
    return list(json.loads(path.read_text()))
