"""Sampling candidate dialogues = an evaluation run of the train config's experiment.

Each candidate is the clarify@k condition (k = `turns`) under one seed: the clarifier asks at
the config's temperature, turn after turn, and the whole pipeline (answers, rewrite, search,
judge) scores the dialogue with its restore score; the blurred condition under the same seeds
scores not asking. Being an ordinary run, it resumes, survives SIGTERM, shards with `--shard`
and merges with `cts merge`, all through cts/eval/experiment.py; this module only derives the
experiment.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from cts.eval.data.dataset import DatasetSource
from cts.eval.run.config import ResolvedExperiment, load_experiment
from cts.foundation.yaml_config import ConfigError, Override, parse_override
from cts.train.config import TrainConfig
from cts.train.held_out import describe, held_out_overlap

#: Splits the shipped sample reads when `split` is null (cts/eval/data/dataset.py `_source_rows`).
_SAMPLE_DEFAULT_SPLITS = {"dev", "test"}
_NATIVE_SUFFIXES = {".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".parquet"}


#: The experiment's keys sampling derives, each from the train-config key that controls it
#: (None: sampling always sets it).
_DERIVED_FROM: dict[tuple[str, ...], str | None] = {
    ("dataset", "path"): "dataset",
    ("dataset", "split"): "split",
    ("dataset", "limit"): "limit",
    ("conditions",): "turns",
    ("seeds",): "candidates",
    ("roles", "clarifier", "sampling", "temperature"): "temperature",
    ("clarification", "mode"): None,
    ("clarification", "allow_stop"): "allow_stop",
}


def sampling_overrides(config: TrainConfig) -> list[str | Override]:
    """The experiment's keys that sampling changes: the train config's own
    `experiment_overrides` (like `--set`, errors naming their line), then typed values derived
    from it, each labelled with the train-config key it comes from. ConfigError for an
    `experiment_overrides` entry that sets a derived key: it would be replaced unsaid."""
    derived: dict[tuple[str, ...], object] = {
        **({("dataset", "path"): config.dataset} if config.dataset else {}),
        ("dataset", "split"): config.split,
        ("dataset", "limit"): config.limit,
        # Whole dialogues of `turns` questions, each scored by where it ends: cts/train/pairs.py
        # credits each turn's question by the dialogues that continue from it. The blurred
        # runs give each instance the score that not asking gets (the reward's baseline).
        ("conditions",): [*baseline_conditions(config), dialogue_condition(config)],
        # One candidate per seed: each seed samples its own dialogue (and its own search).
        ("seeds",): list(range(config.candidates)),
        ("roles", "clarifier", "sampling", "temperature"): config.temperature,
        # `ask`, one question per turn: the prompt and JSON completion cts/train/pairs.py
        # rebuilds at every turn (all_at_once uses another prompt).
        ("clarification", "mode"): "sequential",
        ("clarification", "allow_stop"): config.allow_stop,
    }
    own = labelled(config, ("experiment_overrides",), config.experiment_overrides)
    for index, override in enumerate(own):
        _refuse_derived(config, index, override, derived)
    return [*own, *(Override(k, v, _derived_label(config, k)) for k, v in derived.items())]


def _derived_label(config: TrainConfig, keys: tuple[str, ...]) -> str:
    source = _DERIVED_FROM[keys]
    return config.where(source) + " →" if source else f"{config.where('experiment')} (sampling)"


def sets_key(override: Override, keys: tuple[str, ...]) -> bool:
    """Whether `override` sets `keys` (the key itself, a key inside it, or a mapping above it
    that holds it)."""
    n = len(override.keys)
    if override.keys[: len(keys)] == keys:
        return True
    if keys[:n] != override.keys:
        return False
    value: object = override.value
    for key in keys[n:]:
        if not isinstance(value, dict) or key not in value:
            return False
        value = value[key]
    return True


def _refuse_derived(
    config: TrainConfig, index: int, override: Override, derived: dict[tuple[str, ...], object]
) -> None:
    for keys in derived:
        if not sets_key(override, keys):
            continue
        source = _DERIVED_FROM[keys]
        instead = (
            f"set the train config's `{source}` instead"
            if source
            else "sampling always runs sequential dialogues, one question per turn"
        )
        raise ConfigError(
            f"{config.where('experiment_overrides', str(index))}: "
            f"{config.experiment_overrides[index]!r} sets {'.'.join(keys)}, which sampling "
            f"derives from the train config and would replace: {instead}"
        )


def labelled(config: TrainConfig, where: tuple[str, ...], entries: Sequence[str]) -> list[Override]:
    """`--set`-style entries of a train-config list (`experiment_overrides`,
    `loop.evaluation_overrides`, ...) as overrides whose errors name the entry's own line."""
    found = []
    for index, entry in enumerate(entries):
        label = config.where(*where, str(index))
        try:
            override = parse_override(entry)
        except ConfigError as e:
            raise ConfigError(f"{label}: {e}") from None
        found.append(Override(override.keys, override.value, f"{label} →"))
    return found


def dialogue_condition(config: TrainConfig) -> str:
    """The condition whose records are the sampled dialogues."""
    return f"clarify@{config.turns}"


def baseline_conditions(config: TrainConfig) -> list[str]:
    return ["blurred"] if config.reward.baseline == "blurred" else []


def sampling_experiment(config: TrainConfig, check_instances: bool = True) -> ResolvedExperiment:
    """The experiment the candidates are sampled and scored with; ConfigError when its data
    is the data the experiment evaluates on: the same file and split, or, with
    `check_instances` (which loads both datasets: DatasetError if one does not load), under
    any path, instances with an evaluated id or query (cts/train/held_out.py), named."""
    evaluated = load_experiment(config.experiment).experiment.dataset
    resolved = experiment_with(config, sampling_overrides(config))
    sampled = resolved.experiment.dataset
    _refuse_split_of_a_file(config, sampled)
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


#: The split a single file's rows are to `datasets` (and the train config's default): accepted
#: with a file, which is read whole.
_FILE_SPLIT = "train"


def _refuse_split_of_a_file(config: TrainConfig, sampled: DatasetSource) -> None:
    """A native file has no splits and is read whole: a split other than `train` (what
    `datasets` calls a file's rows, and the default) would be ignored unsaid, sampling on rows
    the user meant to leave out."""
    if _is_file(sampled.path) and config.split not in (None, _FILE_SPLIT):
        raise ConfigError(
            f"{config.where('split')}: {config.split!r}: {sampled.path} is a file, which has no "
            "splits: sampling reads all of it. Set `split: null` (or split the file)."
        )


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
    (cts/train/held_out.py)."""
    if not _same_path(sampled.path, evaluated.path):
        return False
    a, b = _splits(sampled), _splits(evaluated)
    return a is None or b is None or bool(a & b)
