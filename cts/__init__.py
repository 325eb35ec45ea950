"""Clarify-Then-Search: does a clarification question, asked before a deep search, restore what
a vague query left out? The Python API's front door (docs/python-api.md):

    import cts
    resolved = cts.load_experiment(None, ["dataset.limit=2"])   # the quickstart, 2 instances
    result = cts.run(resolved, "runs/demo")                      # serve (if asked), then run
    run = cts.open_run("runs/demo")                              # .config .records() .summary()
    frame = cts.runs_frame(["runs/a", "runs/b"])                 # clarifier systems side by side

Every name in `__all__` is public and stays, with its meaning, within a minor version; one
that must go first warns (DeprecationWarning) for a minor version. Modules below `cts` are the
implementation: importable, documented, but free to move. Names are imported on first use, so
`import cts` loads no model library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cts.api import Run, open_run, rejudge, runs_frame
    from cts.eval.audit.golden_review import audit_golden
    from cts.eval.construct.blur import blur_file as blur
    from cts.eval.construct.fuse import fuse_file as fuse
    from cts.eval.estimate import estimate_run as estimate
    from cts.eval.experiment import serve_and_run as run
    from cts.eval.report.report import write_report as report
    from cts.eval.run.config import load_experiment
    from cts.eval.sweep_power import detect
    from cts.serving.scripted import ScriptedEngine, scripted_roles
    from cts.serving.server_group import ServeOptions
    from cts.train.config import load_train_config
    from cts.train.loop_runner import run_loop as train_loop

#: Public name → (module, name there).
_FRONT = {
    "load_experiment": ("cts.eval.run.config", "load_experiment"),
    "run": ("cts.eval.experiment", "serve_and_run"),
    "ServeOptions": ("cts.serving.server_group", "ServeOptions"),
    "report": ("cts.eval.report.report", "write_report"),
    "open_run": ("cts.api", "open_run"),
    "Run": ("cts.api", "Run"),
    "runs_frame": ("cts.api", "runs_frame"),
    "rejudge": ("cts.api", "rejudge"),
    "estimate": ("cts.eval.estimate", "estimate_run"),
    "detect": ("cts.eval.sweep_power", "detect"),
    "audit_golden": ("cts.eval.audit.golden_review", "audit_golden"),
    "fuse": ("cts.eval.construct.fuse", "fuse_file"),
    "blur": ("cts.eval.construct.blur", "blur_file"),
    "ScriptedEngine": ("cts.serving.scripted", "ScriptedEngine"),
    "scripted_roles": ("cts.serving.scripted", "scripted_roles"),
    "load_train_config": ("cts.train.config", "load_train_config"),
    "train_loop": ("cts.train.loop_runner", "run_loop"),
}

__all__ = [
    "Run",
    "ScriptedEngine",
    "ServeOptions",
    "audit_golden",
    "blur",
    "detect",
    "estimate",
    "fuse",
    "load_experiment",
    "load_train_config",
    "open_run",
    "rejudge",
    "report",
    "run",
    "runs_frame",
    "scripted_roles",
    "train_loop",
]


def __getattr__(name: str) -> Any:
    if name not in _FRONT:
        raise AttributeError(f"module 'cts' has no attribute {name!r}")
    module, attribute = _FRONT[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # once: the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_FRONT))
