"""Expert iteration: sample dialogues with the current clarifier, build pairs or SFT rows, fit,
evaluate the new clarifier with the experiment's own pipeline on its own (held-out) data, and
continue from it.

The loop's directory (the train config's output dir):

    iter-<i>/              i = 1..R: what `cts train all` leaves for iteration i (samples/,
                           pairs.jsonl or sft.jsonl, candidates.jsonl, adapter/, checkpoint/,
                           clarifier.yaml, train_metrics.json), sampled with iteration i−1's
                           clarifier (the base one for i = 1) and fitted on top of it
    eval/<variant>/iter-<i>/   i = 0..R: the evaluation run of iteration i's clarifier (0: the
                           base); `main` is the experiment as it is, every other variant is the
                           same with `loop.robustness` overrides (another User Answerer, judge)
    loop/<variant>/        the report of every iteration's evaluation together, loop.json and
                           loop.md: the table per iteration

This module plans the steps (`loop_steps`: the one list) and reads the finished runs into the
table; cts/train/loop_runner.py runs the steps (each an ordinary sampling, pairs, fit or evaluation,
resumable like them).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any, Literal, cast, get_args

from cts.eval.data.schema import Record
from cts.eval.report.diagnostics import (
    FailurePolicy,
    compare_systems,
    paired_instances,
    score_records,
)
from cts.eval.report.markdown import MAIN_COLUMNS
from cts.eval.report.report import RunView, load_run
from cts.eval.report.summary import Comparison, Summary
from cts.eval.run.config import ResolvedExperiment
from cts.eval.run.config_sections import Role
from cts.eval.run.pipeline import clarify_turns
from cts.eval.run.usage import role_usage
from cts.foundation.yaml_config import ConfigError, Override, parse_override
from cts.train.config import TrainConfig
from cts.train.fit import fit_changes, lora_base
from cts.train.held_out import describe, held_out_overlap
from cts.train.sample import experiment_with, labelled, overlaps, sampling_experiment, sets_key

MAIN = "main"
CLARIFIER = ("roles", "clarifier", "model")
ROLES: tuple[str, ...] = get_args(Role)


class LoopError(ValueError):
    """A loop that cannot run or be read (the message says where and why)."""


@dataclass(frozen=True)
class Iteration:
    """Iteration `index` of a loop: its train config (1..R) and its evaluation runs."""

    index: int
    root: Path
    #: None for iteration 0 (the base clarifier is evaluated, not trained).
    train: TrainConfig | None

    def clarifier(self) -> Path | None:
        """The model config of this iteration's clarifier (None: the experiment's own)."""
        if self.train is None:
            return None
        return self.train.resolved_output_dir() / "clarifier.yaml"

    def fitted(self) -> bool:
        """Whether the fit finished (it writes clarifier.yaml, then train_metrics.json). A fit
        made with another configuration than this iteration's is a LoopError listing what
        changed: resuming on it would evaluate a clarifier the config does not describe."""
        if self.train is None:
            return True
        out = self.train.resolved_output_dir()
        if not (out / "clarifier.yaml").is_file() or not (out / "train_metrics.json").is_file():
            return False
        changed = fit_changes(self.train)
        if changed:
            raise LoopError(
                f"{out / 'train_metrics.json'}: iteration {self.index} was fitted with another "
                "configuration; resuming would evaluate (and continue from) that fit. What "
                "changed:\n  " + "\n  ".join(changed) + f"\nMove {out} aside to fit it again "
                "under this configuration, or give the loop another output_dir."
            )
        return True

    def eval_dir(self, variant: str) -> Path:
        return self.root / "eval" / variant / f"iter-{self.index}"


def _literal(path: Path) -> str:
    """A path as an output_dir template that formats to itself."""
    return str(path).replace("{", "{{").replace("}", "}}")


def iterations(config: TrainConfig, count: int) -> list[Iteration]:
    """Iterations 0..count; iteration i ≥ 1 samples and fits on iteration i−1's clarifier."""
    if not config.merge and lora_base(config) is None:
        raise LoopError(
            f"{config.where('merge')}: the loop continues from each iteration's merged "
            "checkpoint, or from its adapter when the clarifier is a model `cts serve` starts "
            "(engine: openai, vllm.serve: true; every iteration is then a LoRA adapter on "
            "that one server); set merge: true"
        )
    variants(config)  # its refusals (a clarifier set there) before any step
    root = config.resolved_output_dir()
    found = [Iteration(0, root, None)]
    for i in range(1, count + 1):
        previous = found[-1].clarifier()
        overrides = list(config.experiment_overrides)
        if previous is not None:
            overrides.append(f"roles.clarifier.model={previous.resolve()}")
        train = config.model_copy(
            update={
                "name": f"{config.name}-iter{i}",
                "output_dir": _literal(root / f"iter-{i}"),
                "experiment_overrides": overrides,
            }
        )
        found.append(Iteration(i, root, train))
    return found


#: A loop step's name: eval (iteration I's clarifier, every variant; sharded), sample
#: (iteration I's sampling, I ≥ 1; sharded), fit (pairs and fit of iteration I ≥ 1), table (the
#: report and loop tables of iterations 0..I).
StepName = Literal["eval", "sample", "fit", "table"]
STEP_NAMES: tuple[StepName, ...] = get_args(StepName)


@dataclass(frozen=True)
class LoopStep:
    """One step of the loop, on one iteration: what `cts train loop` runs in order, what
    `cts train loop-step` runs alone and what each job of the Slurm chain runs."""

    name: StepName
    iteration: Iteration

    @property
    def sharded(self) -> bool:
        """An evaluation run (eval, sample) that array tasks share; fit and table run once."""
        return self.name in ("eval", "sample")

    def records_dir(self) -> Path:
        """The run whose records this step writes (sharded steps) or reads."""
        if self.name in ("sample", "fit"):
            assert self.iteration.train is not None
            return self.iteration.train.samples_dir()
        return self.iteration.eval_dir(MAIN)


def loop_steps(plan: list[Iteration]) -> list[LoopStep]:
    """The loop's steps in order, the one list every runner of the loop iterates: eval 0,
    table 0, then per iteration i ≥ 1 sample i, fit i, eval i, table i."""
    steps = []
    for it in plan:
        if it.train is not None:
            steps += [LoopStep("sample", it), LoopStep("fit", it)]
        steps += [LoopStep("eval", it), LoopStep("table", it)]
    return steps


def loop_step(plan: list[Iteration], name: str, index: int) -> LoopStep:
    """Step `name` of iteration `index`, or a LoopError saying what exists."""
    if name not in STEP_NAMES:
        raise LoopError(f"step {name!r}: expected one of {', '.join(STEP_NAMES)}")
    if index >= len(plan):
        raise LoopError(f"iteration {index}: the loop has iterations 0..{len(plan) - 1}")
    if name in ("sample", "fit") and index == 0:
        raise LoopError(f"{name} of iteration 0: iteration 0 is the base clarifier (≥ 1)")
    return LoopStep(name, plan[index])


def variants(config: TrainConfig) -> dict[str, list[Override]]:
    """Evaluation variants: `main` (the experiment with `loop.evaluation_overrides`) and each
    `loop.robustness` entry (the same, then its own overrides), each override naming its own
    line in errors. ConfigError for one that sets the clarifier: every iteration's evaluation
    sets it (iteration 0 the base one, from `experiment_overrides`), and one set here would
    make iteration 0 evaluate another model than the one the loop trains from."""
    base = labelled(config, ("loop", "evaluation_overrides"), config.loop.evaluation_overrides)
    found = {MAIN: base}
    for name, extra in config.loop.robustness.items():
        found[name] = [*base, *labelled(config, ("loop", "robustness", name), extra)]
    for where, entries in [
        (("loop", "evaluation_overrides"), config.loop.evaluation_overrides),
        *((("loop", "robustness", name), extra) for name, extra in config.loop.robustness.items()),
    ]:
        _refuse_clarifier(config, where, entries)
    return found


def _refuse_clarifier(config: TrainConfig, where: tuple[str, ...], entries: list[str]) -> None:
    for index, entry in enumerate(entries):
        if sets_key(parse_override(entry), CLARIFIER):
            raise ConfigError(
                f"{config.where(*where, str(index))}: {entry!r} sets the clarifier of the "
                "loop's evaluations: each iteration is evaluated with its own clarifier, "
                "iteration 0 with the base one (the experiment's, or the one "
                "experiment_overrides sets). Set it in experiment_overrides."
            )


def base_clarifier(config: TrainConfig) -> list[str]:
    """The override that makes iteration 0 evaluate the clarifier iteration 1 trains from:
    `experiment_overrides` apply to sampling only, but a clarifier set there is the loop's
    base, and "Δ vs base" against the experiment's own clarifier would compare two models."""
    found = [o for o in config.experiment_overrides if sets_key(parse_override(o), CLARIFIER)]
    return found[-1:]


def evaluation(
    config: TrainConfig, iteration: Iteration, variant: str, check_instances: bool = True
) -> ResolvedExperiment:
    """The experiment that evaluates `iteration`'s clarifier; ConfigError when its data is the
    data the loop samples on (a gain measured on the training queries is no gain): the same
    file and split, or, with `check_instances` (both datasets loaded), the same instances
    under any path."""
    overrides: list[str | Override] = list(variants(config)[variant])
    clarifier = iteration.clarifier()
    if clarifier is not None:
        overrides.append(f"roles.clarifier.model={clarifier.resolve()}")
    else:
        overrides += base_clarifier(config)
    resolved = experiment_with(config, overrides)
    sampled = sampling_experiment(config, check_instances).experiment.dataset
    if overlaps(sampled, resolved.experiment.dataset):
        raise ConfigError(
            f"{config.where('loop')}: the loop's evaluation reads the data it samples on "
            f"({sampled.path}); evaluate on held-out data (loop.evaluation_overrides)"
        )
    found = held_out_overlap(sampled, resolved.experiment.dataset) if check_instances else []
    if found:
        raise ConfigError(
            f"{config.where('loop')}: the loop's evaluation ({resolved.experiment.dataset.path})"
            f" holds {len(found)} of the instances it samples on ({sampled.path}): "
            f"{describe(found)}; evaluate on held-out data (loop.evaluation_overrides)"
        )
    return resolved


# -- the table --------------------------------------------------------------------------------


def _spent(records: Iterable[Record]) -> dict[str, int]:
    """Model calls a model answered (not the response cache) and their tokens, every role.
    Per role through `role_usage`: a record's `search_*` fields repeat the searcher's."""
    used = [u for r in records for role in ROLES if (u := role_usage(r.usage, role))]
    return {
        "model_calls": sum(u.calls for u in used),
        "prompt_tokens": sum(u.prompt_tokens for u in used),
        "completion_tokens": sum(u.completion_tokens for u in used),
    }


def _questions_asked(records: Iterable[Record]) -> dict[str, float]:
    """Mean questions per dialogue, per clarify@k, over the records that did not fail."""
    asked: dict[str, list[int]] = {}
    for record in records:
        if clarify_turns(record.condition) and record.error is None:
            asked.setdefault(record.condition, []).append(len(record.questions))
    return {c: mean(v) for c, v in sorted(asked.items())}


def _delta(comparisons: list[Comparison], earlier: str, later: str) -> dict[str, Any]:
    """later − earlier per condition, from paired comparisons (`paired_comparisons`, which
    give the first system listed minus the second, the earlier iteration first)."""
    out: dict[str, Any] = {}
    for row in comparisons:
        if (row.a, row.b) == (earlier, later):
            assert row.difference is not None and row.low is not None and row.high is not None
            # 0.0 − x, not −x: no difference reads 0.0, never −0.0.
            out[row.condition] = {
                "difference": 0.0 - row.difference,
                "low": 0.0 - row.high,
                "high": 0.0 - row.low,
                "p_holm": row.p_holm,
                "p_value": row.p_value,
                "n": row.n,
            }
    return out


def paired_comparisons(summary: Summary, runs: list[RunView]) -> list[Comparison]:
    """Every two iterations compared per condition on the instances the report's scores
    (`summary`, of `runs`) stand on: those every run scored under every condition. The report's
    own comparisons pair two runs on what those two scored, more instances where a third run
    failed one; beside scores on the paired instances such a Δ would describe other instances,
    and Δ vs base would not be Δ vs previous plus the previous iteration's Δ vs base."""
    if summary.report.failure_policy not in get_args(FailurePolicy):
        raise LoopError(f"{summary.report.runs}: no failure policy {summary.report.failure_policy}")
    policy = cast(FailurePolicy, summary.report.failure_policy)
    scored = [
        score_records(run.records, list(run.experiment.conditions), run.experiment.seeds, policy)
        for run in runs
    ]
    ids = paired_instances(
        [(s, list(run.experiment.conditions)) for s, run in zip(scored, runs, strict=True)]
    )
    if len(ids) != summary.report.paired_instances:
        # A summary written before a run changed: its scores would stand on other instances.
        raise LoopError(
            f"{summary.report.runs}: the report pairs {summary.report.paired_instances} "
            f"instances, its runs now {len(ids)}; write the report again"
        )
    conditions = [c for c in MAIN_COLUMNS if any(c in r.experiment.conditions for r in runs)]
    systems = list(zip(summary.systems, scored, strict=True))
    return [Comparison(**row) for row in compare_systems(systems, conditions, ids)]


def table(summary: Summary, loop: list[Iteration], eval_dirs: list[Path]) -> list[dict[str, Any]]:
    """One row per iteration from the combined report of its evaluation runs (`summary`, the
    report's summary.json, systems in iteration order): restore score per condition with its
    CI, the paired Δ against the base and the previous iteration, User Answerer answerability,
    questions asked, and what the iteration spent (its sampling and evaluation runs). Scores
    and Δs all stand on the report's paired instances (`paired_comparisons`)."""
    names = list(summary.systems)
    runs = [load_run(run_dir) for run_dir in eval_dirs]
    comparisons = paired_comparisons(summary, runs)
    rows = []
    for position, (iteration, run) in enumerate(zip(loop, runs, strict=True)):
        system = summary.systems[names[position]]
        evaluated = run.records
        sampled = load_run(iteration.train.samples_dir()).records if iteration.train else []
        rows.append(
            {
                "iteration": iteration.index,
                "system": names[position],
                "paired_instances": summary.report.paired_instances,
                "scores": {
                    c: {
                        k: entry.get("restore_score_100", {}).get(k)
                        for k in ("mean", "low", "high")
                    }
                    | {"n": entry["n"], "failed": entry["failed"]}
                    for c, entry in system.scores.items()
                },
                "delta_vs_base": _delta(comparisons, names[0], names[position]) if position else {},
                "delta_vs_previous": _delta(comparisons, names[position - 1], names[position])
                if position
                else {},
                "answerability": {
                    k: v["rate"]
                    for k, v in system.clarification.get("answerability_per_k", {}).items()
                },
                "questions_asked": _questions_asked(evaluated),
                "spent": _spent([*evaluated, *sampled]),
                "signal": _signal(iteration),
            }
        )
    return rows


def _signal(iteration: Iteration) -> dict[str, Any] | None:
    """What the iteration's sampling gave its fit to prefer (pairs_stats.json, cts/train/
    signal.py); None for the base, or before the pairs are built."""
    if iteration.train is None:
        return None
    path = iteration.train.data_file().parent / "pairs_stats.json"
    if not path.is_file():
        return None
    found = json.loads(path.read_text(encoding="utf-8"))
    return {
        "candidates": found.get("candidates"),
        "distinct_questions": found.get("distinct_questions"),
        "reward_spread": found.get("reward_spread"),
        "kept": found.get("pairs", found.get("examples")),
        "kept_questions": found.get("kept_questions"),
    }


def _signal_cells(signal: dict[str, Any] | None) -> str:
    if signal is None:
        return "– | – | – | – | –"
    spread, kept = signal.get("reward_spread") or {}, signal.get("kept_questions") or {}
    spreads = (
        "–"
        if spread.get("mean") is None
        else f"{spread['mean']:.1f} (max {spread['max']:.1f}; {spread['apart']} of "
        f"{spread['states']} states apart)"
    )
    about = (
        f"{kept.get('about_removed', 0)} of {kept.get('with_spans', 0)}"
        if kept.get("with_spans")
        else "no spans"
    )
    return (
        f"{signal['candidates']} | {signal['distinct_questions']} | {spreads} | "
        f"{signal['kept']} | {about}"
    )


def _ci(entry: dict[str, Any] | None) -> str:
    if not entry or entry.get("mean") is None:
        return "–"
    return f"{entry['mean']:.1f} [{entry['low']:.1f}, {entry['high']:.1f}]"


def _change(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "–"
    p = "" if entry["p_holm"] is None else f", p_holm {entry['p_holm']:.3f}"
    return f"{entry['difference']:+.1f} [{entry['low']:+.1f}, {entry['high']:+.1f}]{p}"


def markdown(rows: list[dict[str, Any]], variant: str) -> str:
    """loop.md: per iteration and condition, the score and both paired Δs; then what each
    iteration's clarifier did in its dialogues and what the iteration cost."""
    if not rows:
        return ""
    conditions = [c for c in rows[0]["scores"] if clarify_turns(c) or c in ("blurred", "oracle")]
    lines = [
        f"# Clarifier loop — evaluation `{variant}`",
        "",
        f"restore_score_100 [95% CI] and every Δ on the {rows[0]['paired_instances']} "
        "instances every iteration scored under every condition; Δ is the paired difference "
        "(this iteration − the other) with a bootstrap CI and the Holm-corrected sign-flip p "
        "over the clarify@k conditions.",
        "",
        "| iteration | condition | score | Δ vs base | Δ vs previous |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        for c in conditions:
            lines.append(
                f"| {row['iteration']} | {c} | {_ci(row['scores'].get(c))} | "
                f"{_change(row['delta_vs_base'].get(c))} | "
                f"{_change(row['delta_vs_previous'].get(c))} |"
            )
    lines += [
        "",
        "| iteration | answerability per k | questions asked per k | model calls | prompt "
        "tokens | generated tokens |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        answered = ", ".join(
            f"@{k} {'–' if v is None else f'{100 * v:.0f}%'}"
            for k, v in row["answerability"].items()
        )
        asked = ", ".join(f"{c.split('@')[1]}: {v:.2f}" for c, v in row["questions_asked"].items())
        spent = row["spent"]
        lines.append(
            f"| {row['iteration']} | {answered or '–'} | {asked or '–'} | "
            f"{spent['model_calls']} | {spent['prompt_tokens']} | {spent['completion_tokens']} |"
        )
    lines += [
        "",
        "What each iteration's sampling gave its fit (kept: pairs or SFT examples; about a "
        "removed constraint: kept questions whose answer held a removed span, of those on "
        "instances that record spans):",
        "",
        "| iteration | candidates | distinct questions | reward spread | kept | about a removed "
        "constraint |",
        "|---|---|---|---|---|---|",
    ]
    lines += [f"| {row['iteration']} | {_signal_cells(row.get('signal'))} |" for row in rows]
    return "\n".join(lines) + "\n"


def write_table(out: Path, rows: list[dict[str, Any]], variant: str) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "loop.json").write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")
    (out / "loop.md").write_text(markdown(rows, variant))
    return out / "loop.json", out / "loop.md"
