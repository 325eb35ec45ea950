"""The report of one or more runs: summary.json for machines, report.md and a self-contained
report.html (figures embedded) for people, and the figures as PNG.

One row per clarifier system (a run directory) in the paper-style main table: blurred,
clarify@1..3 and oracle with 95% bootstrap CIs. Blurred and oracle do not depend on the
clarifier; with the shared response cache, comparing clarifiers re-uses them (the report says so).
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

import yaml

from eval.diagnostics import QUESTION_TYPES, summarize
from eval.pipeline import Record
from eval.runner import RecordStore
from serving.model_config import model_label

MAIN_COLUMNS = ["blurred", "clarify@1", "clarify@2", "clarify@3", "oracle"]


def load_run(run_dir: Path) -> tuple[str, list[str], list[Record]]:
    """(system name, conditions, records) of a run directory."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    experiment = config["experiment"]
    ref = experiment["roles"].get("clarifier", {}).get("model", "?")
    clarifier = model_label(ref, config.get("models", {}).get(ref, {}).get("name", ref))
    records = list(RecordStore(run_dir).completed().values())
    return f"{experiment['name']} ({clarifier})", experiment["conditions"], records


def _cell(entry: dict[str, Any] | None) -> str:
    if not entry or "restore_score_100" not in entry:
        return "–"
    s = entry["restore_score_100"]
    return f"{s['mean']:.1f} [{s['low']:.1f}, {s['high']:.1f}]"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f}%"


def markdown(systems: list[tuple[str, dict[str, Any]]]) -> str:
    lines = [
        "# Clarify-Then-Search report",
        "",
        "restore_score_100 (weighted nugget coverage, 0–100), mean over instances with a "
        "95% bootstrap CI.",
        "",
        "| system | " + " | ".join(MAIN_COLUMNS) + " |",
        "|---|" + "---|" * len(MAIN_COLUMNS),
    ]
    for name, summary in systems:
        cells = [_cell(summary["scores"].get(c)) for c in MAIN_COLUMNS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Blurred and oracle searches do not depend on the clarifier; runs that share "
        "the response cache re-use them instead of recomputing:",
        "",
    ]
    for name, summary in systems:
        reused = [
            f"{c} {u['cached']} of {u['search_llm_calls']}"
            for c, u in summary["reuse"].items()
            if c in ("blurred", "oracle")
        ]
        if reused:
            lines.append(f"- {name}: search-agent model calls from the cache: {', '.join(reused)}.")
    lines.append("")
    for name, summary in systems:
        lines += [
            f"## {name}",
            "",
            f"{summary['instances']} instances, seeds "
            f"{summary['seeds']}, {summary['records']} records.",
            "",
            "| condition | strict | unweighted | gain over blurred [CI], p | gain recovered |",
            "|---|---|---|---|---|",
        ]
        for condition, entry in summary["scores"].items():
            strict = entry.get("strict", {}).get("mean")
            unweighted = entry.get("unweighted", {}).get("mean")
            gain = summary["gains"].get(condition)
            gain_text = (
                (
                    f"{gain['gain_over_blurred']:+.1f} [{gain['low']:+.1f}, "
                    f"{gain['high']:+.1f}], p={gain['p_value']:.3f}"
                )
                if gain
                else "–"
            )
            recovered = gain.get("gain_recovered") if gain else None
            lines.append(
                f"| {condition} | {'–' if strict is None else f'{strict:.1f}'} | "
                f"{'–' if unweighted is None else f'{unweighted:.1f}'} | {gain_text} | "
                f"{'–' if recovered is None else f'{recovered:.2f}'} |"
            )
        c = summary["clarification"]
        lines += [
            "",
            "| k | UA answerability | all-unknown rate | stopped early |",
            "|---|---|---|---|",
        ]
        for k, value in c["answerability_per_k"].items():
            lines.append(
                f"| {k} | {_pct(value)} | {_pct(c['all_unknown_rate_per_k'].get(k))} | "
                f"{_pct(c['stopped_early_rate_per_k'].get(k))} |"
            )
        lines += ["", "| question type | share of questions | unknown rate |", "|---|---|---|"]
        for t in QUESTION_TYPES:
            lines.append(
                f"| {t} | {_pct(c['question_type_mix'][t])} | "
                f"{_pct(c['unknown_rate_per_type'][t])} |"
            )
        lines += [
            "",
            f"Region-only rate (every question asked about region): "
            f"{_pct(c['region_only_rate'])}. Answerability per turn: "
            + ", ".join(f"turn {t}: {_pct(v)}" for t, v in c["answerability_per_turn"].items())
            + ".",
            *(
                [
                    "",
                    f"Abstractive answers with content words not in the fused query: "
                    f"{_pct(c['unsupported_answers']['rate'])} of "
                    f"{c['unsupported_answers']['checked']} answers.",
                ]
                if c["unsupported_answers"]["checked"]
                else []
            ),
            "",
            f"Failures: {summary['failures']['total']} "
            f"{json.dumps(summary['failures']['by_kind'])}.",
            "",
        ]
    return "\n".join(lines)


def figures(systems: list[tuple[str, dict[str, Any]]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
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
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    for key, title, name in (
        ("question_type_mix", "Question-type mix", "question_types.png"),
        ("unknown_rate_per_type", "UA unknown rate per question type", "unknown_rate_per_type.png"),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        width = 0.8 / max(1, len(systems))
        for s, (system, summary) in enumerate(systems):
            values = [summary["clarification"][key][t] or 0.0 for t in QUESTION_TYPES]
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
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths


def to_html(markdown_text: str, images: list[Path]) -> str:
    """A self-contained page: the Markdown tables as HTML tables, figures inlined as base64."""
    body: list[str] = []
    rows: list[list[str]] = []

    def flush() -> None:
        if rows:
            head, *rest = rows
            body.append(
                "<table><tr>"
                + "".join(f"<th>{html.escape(c)}</th>" for c in head)
                + "</tr>"
                + "".join(
                    "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                    for r in rest
                )
                + "</table>"
            )
            rows.clear()

    for line in markdown_text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if not all(set(c) <= {"-"} for c in cells):
                rows.append(cells)
            continue
        flush()
        if line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.strip():
            body.append(f"<p>{html.escape(line)}</p>")
    flush()
    for image in images:
        data = base64.b64encode(image.read_bytes()).decode()
        body.append(
            f'<figure><img alt="{image.stem}" src="data:image/png;base64,{data}">'
            f"<figcaption>{image.stem}</figcaption></figure>"
        )
    style = (
        "body{font-family:sans-serif;max-width:60em;margin:2em auto}table{border-collapse:"
        "collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:"
        "right}td:first-child,th:first-child{text-align:left}img{max-width:100%}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>Clarify-Then-Search report"
        f"</title><style>{style}</style></head><body>{''.join(body)}</body></html>"
    )


def write_report(run_dirs: list[Path], out: Path) -> dict[str, Path]:
    systems = []
    for run_dir in run_dirs:
        name, conditions, records = load_run(run_dir)
        systems.append((name, summarize(records, conditions)))
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(
        json.dumps({name: summary for name, summary in systems}, indent=2, ensure_ascii=False)
    )
    text = markdown(systems)
    (out / "report.md").write_text(text)
    images = figures(systems, out / "figures")
    (out / "report.html").write_text(to_html(text, images))
    return {
        "summary": out / "summary.json",
        "markdown": out / "report.md",
        "html": out / "report.html",
        "figures": out / "figures",
    }
