"""The report's figures as PNG: the score against clarification turns, and the question-type
mix and unknown rate per type, one series per system.

Apart because it alone needs matplotlib (imported when a figure is drawn, so that loading a
report's module does not), and because a figure changes for other reasons than the tables.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cts.agents.question_type import QUESTION_TYPES
from cts.eval.report.markdown import MAIN_COLUMNS
from cts.foundation.disk import write_whole

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def figures(systems: list[tuple[str, dict[str, Any]]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, summary in systems:
        xs, ys, lows, highs = [], [], [], []
        for k, condition in enumerate(MAIN_COLUMNS):
            entry = summary["scores"].get(condition, {}).get("restore_score_100")
            if entry:
                xs.append(k)
                ys.append(entry["mean"])
                lows.append(entry["mean"] - entry["low"])
                highs.append(entry["high"] - entry["mean"])
        ax.errorbar(xs, ys, yerr=[lows, highs], marker="o", capsize=3, label=name)
    ax.set_xticks(range(len(MAIN_COLUMNS)), ["blurred", "k=1", "k=2", "k=3", "oracle"])
    ax.set_ylabel("restore_score_100")
    ax.set_ylim(0, 100)
    ax.set_title("Score vs. clarification turns")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out / "score_vs_k.png")
    _save(fig, paths[-1])
    plt.close(fig)

    for key, title, name in (
        ("question_type_share", "Question-type mix", "question_types.png"),
        ("unknown_rate_per_type", "UA unknown rate per question type", "unknown_rate_per_type.png"),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        width = 0.8 / max(1, len(systems))
        for s, (system, summary) in enumerate(systems):
            shown = summary["clarification"][key]
            values = [
                (shown[t]["rate"] if isinstance(shown[t], dict) else shown[t]) or 0.0
                for t in QUESTION_TYPES
            ]
            ax.bar([i + s * width for i in range(len(QUESTION_TYPES))], values, width, label=system)
        ax.set_xticks(
            [i + width * (len(systems) - 1) / 2 for i in range(len(QUESTION_TYPES))],
            QUESTION_TYPES,
            rotation=30,
        )
        ax.set_ylim(0, 1)
        ax.set_title(title)
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(out / name)
        _save(fig, paths[-1])
        plt.close(fig)
    return paths


def _save(fig: Figure, path: Path) -> None:
    """A PNG whole or not at all (a full disk: StorageFull)."""
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=120)
    write_whole(path, image.getvalue())
