"""Sampling candidate dialogues = an evaluation run of the train config's experiment.

Each candidate is the clarify@k condition (k = `turns`) under one seed: the clarifier asks at
the config's temperature, turn after turn, and the whole pipeline (answers, rewrite, search,
judge) scores the dialogue with its restore score; the blurred condition under the same seeds
scores not asking. Being an ordinary run, it resumes, survives SIGTERM, shards with `--shard`
and merges with `cts merge`, all through eval/experiment.py; this module only derives the
experiment.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from eval.data.dataset import DatasetSource
from eval.run.config import ResolvedExperiment, load_experiment
from serving.yaml_config import ConfigError, Override
from train.config import TrainConfig
from train.held_out import describe, held_out_overlap

#: Splits the shipped sample reads when `split` is null (eval/data/dataset.py `_source_rows`).
_SAMPLE_DEFAULT_SPLITS = {"dev", "test"}
_NATIVE_SUFFIXES = {".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".parquet"}


def sampling_overrides(config: TrainConfig) -> list[str | Override]:
    """The experiment's keys that sampling changes: the train config's own
    `experiment_overrides` (text, like `--set`), then typed values derived from it."""
    derived: dict[tuple[str, ...], object] = {
        **({("dataset", "path"): config.dataset} if config.dataset else {}),
        ("dataset", "split"): config.split,
        ("dataset", "limit"): config.limit,
        # Whole dialogues of `turns` questions, each scored by where it ends: train/pairs.py
        # credits each turn's question by the dialogues that continue from it. The blurred
        # runs give each instance the score that not asking gets (the reward's baseline).
        ("conditions",): [*baseline_conditions(config), dialogue_condition(config)],
        # One candidate per seed: each seed samples its own dialogue (and its own search).
        ("seeds",): list(range(config.candidates)),
        ("roles", "clarifier", "sampling", "temperature"): config.temperature,
        # `ask`, one question per turn: the prompt and JSON completion train/pairs.py
        # rebuilds at every turn (all_at_once uses another prompt).
        ("clarification", "mode"): "sequential",
        ("clarification", "allow_stop"): config.allow_stop,
    }
    return [*config.experiment_overrides, *(Override(k, v) for k, v in derived.items())]


def dialogue_condition(config: TrainConfig) -> str:
    """The condition whose records are the sampled dialogues."""
    return f"clarify@{config.turns}"


def baseline_conditions(config: TrainConfig) -> list[str]:
    return ["blurred"] if config.reward.baseline == "blurred" else []


def sampling_experiment(config: TrainConfig, check_instances: bool = True) -> ResolvedExperiment:
    """The experiment the candidates are sampled and scored with; ConfigError when its data
    is the data the experiment evaluates on: the same file and split, or, with
    `check_instances` (which loads both datasets: DatasetError if one does not load), under
    any path, instances with an evaluated id or query (train/held_out.py), named."""
    evaluated = load_experiment(config.experiment).experiment.dataset
    resolved = experiment_with(config, sampling_overrides(config))
    sampled = resolved.experiment.dataset
    if overlaps(sampled, evaluated):
        splits = _splits(sampled)
        read = (
            "the whole file (a file has no splits)"
            if splits is None
            else f"split(s) {', '.join(sorted(splits))}"
        )
        # Name the key the user can change: a file is wrong whatever its split.
        key = "dataset" if splits is None else "split"
        raise ConfigError(
            f"{config.where(key)}: sampling would read the data experiment "
            f"{resolved.experiment.name!r} evaluates on ({sampled.path}, {read}): the "
            "fine-tuned clarifier would be evaluated on its own training queries. Set `split` "
            "to another split or `dataset` to other queries."
        )
    found = held_out_overlap(sampled, evaluated) if check_instances else []
    if found:
        key = "dataset" if config.dataset else "split"
        raise ConfigError(
            f"{config.where(key)}: {len(found)} of the instances sampling would read "
            f"({sampled.path}) are instances experiment {resolved.experiment.name!r} evaluates "
            f"on ({evaluated.path}), whatever their path or split: {describe(found)}. The "
            "fine-tuned clarifier would be evaluated on its own training queries: sample on "
            "held-out queries."
        )
    return resolved


def experiment_with(config: TrainConfig, overrides: Sequence[str | Override]) -> ResolvedExperiment:
    """The train config's experiment with overrides; an error says it came through this
    train config (an `experiment_overrides` entry reads like a `--set`)."""
    try:
        return load_experiment(config.experiment, overrides)
    except ConfigError as e:
        raise ConfigError(
            f"{config.where('experiment')} {config.experiment!r}, as this train config "
            f"overrides it:\n{e}"
        ) from None


def _is_file(path: str) -> bool:
    return Path(path).expanduser().suffix in _NATIVE_SUFFIXES


def _splits(source: DatasetSource) -> set[str] | None:
    """The splits a source reads; None = the whole file (native files ignore `split`)."""
    if source.path == "sample":
        return {source.split} if source.split else set(_SAMPLE_DEFAULT_SPLITS)
    if _is_file(source.path):
        return None
    return {source.split or "train"}  # `datasets` loads "train" when no split is given


def _same_path(a: str, b: str) -> bool:
    if a == "sample" or b == "sample":
        return a == b
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def overlaps(sampled: DatasetSource, evaluated: DatasetSource) -> bool:
    """The same file and split: the quick check, before the instances are compared
    (train/held_out.py)."""
    if not _same_path(sampled.path, evaluated.path):
        return False
    a, b = _splits(sampled), _splits(evaluated)
    return a is None or b is None or bool(a & b)
