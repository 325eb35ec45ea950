"""A run directory: where each of a run's files goes, and the one way to write and read its
frozen config.

    RUN_DIR/config.yaml        the resolved experiment the records were made with
    RUN_DIR/records/<condition>/shard-<i>-of-<n>.jsonl (and merged.jsonl)
    RUN_DIR/dialogues/<shard>.jsonl, traces/<condition>/…, logs/serve/<shard>/
    RUN_DIR/summary.json, report.md, report.html, figures/
    RUN_DIR/endpoints.json     written by `cts serve`
    RUN_DIR/slurm/             frozen experiment(s), sbatch scripts, logs/, jobs.json
    RUN_DIR/dataset.jsonl, golden_summary.json   golden construction's result
    RUN_DIR/rejudge.json, cache/responses.sqlite  a rejudge's source run, its judge's answers
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel

from cts.eval.run.config import ExperimentConfig, ResolvedExperiment
from cts.eval.run.fingerprint import changes, model_prints, results_view
from cts.foundation.disk import storage_errors, write_whole
from cts.foundation.yaml_config import ConfigError, load_config, read_yaml
from cts.serving.model_config import ModelConfig

T = TypeVar("T")


class RunDirError(FileNotFoundError):
    """A path that should be a run directory has no config.yaml."""


@dataclass(frozen=True)
class Shard:
    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> Shard:
        try:
            index, count = (int(x) for x in text.split("/"))
        except ValueError:
            raise ShardError(f"--shard {text!r}: expected I/N, e.g. 0/4") from None
        if not 0 <= index < count:
            raise ShardError(f"--shard {text!r}: need 0 <= I < N")
        return cls(index, count)

    @property
    def name(self) -> str:
        return f"shard-{self.index}-of-{self.count}"

    def select(self, items: Sequence[T]) -> list[T]:
        """This shard's share of `items` (instances, or a benchmark build's rows): every
        count-th from its index."""
        return [item for i, item in enumerate(items) if i % self.count == self.index]


class ShardError(ValueError):
    """A shard that is not `I/N` with 0 <= I < N."""


class _RunConfig(BaseModel):
    """config.yaml as `ResolvedExperiment.to_yaml` writes it."""

    experiment: ExperimentConfig
    models: dict[str, ModelConfig] = {}
    #: Where the experiment and each model config were read from ("inline": the experiment).
    sources: dict[str, Any] = {}
    versions: dict[str, str | None] = {}
    #: Digests of the dataset and prompts the records were made with (cts/eval/run/fingerprint.py).
    fingerprint: dict[str, str] = {}


def with_models(resolved: ResolvedExperiment, fingerprint: dict[str, str] | None) -> dict[str, str]:
    """`fingerprint` with the digests of the models' local content (`model_prints`) it does not
    give: a caller that passes the run's own (a merge, which compares the dataset only) keeps
    them, so that a replay file edited after the last record refuses no merge."""
    given = fingerprint or {}
    found = model_prints(resolved.model_configs)
    return {**given, **{key: found[key] for key in found if key not in given}}


@dataclass(frozen=True)
class RunDir:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def records(self) -> Path:
        return self.root / "records"

    @property
    def traces(self) -> Path:
        return self.root / "traces"

    @property
    def dialogues(self) -> Path:
        return self.root / "dialogues"

    def serve_logs(self, shard: Shard | None = None) -> Path:
        """The vLLM servers' logs: of `cts serve`, or of one shard's `--serve`."""
        return self.root / "logs" / "serve" / (shard.name if shard else "")

    @property
    def endpoints(self) -> Path:
        return self.root / "endpoints.json"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def report_md(self) -> Path:
        return self.root / "report.md"

    @property
    def report_html(self) -> Path:
        return self.root / "report.html"

    @property
    def figures(self) -> Path:
        return self.root / "figures"

    @property
    def slurm(self) -> Path:
        return self.root / "slurm"

    @property
    def slurm_logs(self) -> Path:
        return self.slurm / "logs"

    @property
    def jobs(self) -> Path:
        """The Slurm submission history, one entry per `cts slurm submit`."""
        return self.slurm / "jobs.json"

    @property
    def golden_dataset(self) -> Path:
        return self.root / "dataset.jsonl"

    @property
    def golden_summary(self) -> Path:
        return self.root / "golden_summary.json"

    @property
    def provenance(self) -> Path:
        """A rejudge's source run (path, config digest) and both judges (`cts rejudge`)."""
        return self.root / "rejudge.json"

    @property
    def own_cache(self) -> Path:
        """A response cache only this run writes: a rejudge's, so that it never replays the
        judge answers its source run cached."""
        return self.root / "cache" / "responses.sqlite"

    def write_config(
        self, resolved: ResolvedExperiment, fingerprint: dict[str, str] | None = None
    ) -> None:
        """Record the experiment the run uses. A run directory that already holds a config is
        resumed only with one its records could have come from (ConfigError listing what
        changed, before anything is written). Shards of one run write it at once: each
        replaces the file whole, never half-written (a full disk: StorageFull, and the file
        stays as it was, or absent)."""
        text = resolved.to_yaml(with_models(resolved, fingerprint))
        with self._config_lock():  # the check and the write as one: see _config_lock
            if self.config.is_file():
                self._refuse_other_results(yaml.safe_load(text))
            write_whole(self.config, text)

    @contextmanager
    def _config_lock(self) -> Iterator[None]:
        """Hold the run directory's config lock (`.config.lock`, the kernel's flock: a killed
        holder leaves none behind). Two starts with other configs at once both found no
        config.yaml and each wrote its own: the records were one run's while config.yaml said
        the other's. Under the lock the second finds the first's config and is refused."""
        path = self.root / ".config.lock"
        with storage_errors(path):
            self.root.mkdir(parents=True, exist_ok=True)
            handle = path.open("a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield
        finally:
            handle.close()

    def check_resume(
        self, resolved: ResolvedExperiment, fingerprint: dict[str, str] | None = None
    ) -> None:
        """What `write_config` refuses (the same ConfigError), checked writing nothing."""
        if self.config.is_file():
            prints = with_models(resolved, fingerprint)
            self._refuse_other_results(yaml.safe_load(resolved.to_yaml(prints)))

    def _refuse_other_results(self, new: dict[str, Any]) -> None:
        # The one config reader: a garbage, non-UTF-8 or aliased file is a ConfigError naming it.
        old, _ = read_yaml(self.config)
        changed = changes(self._results_view_now(old), results_view(new))
        if changed:
            raise ConfigError(
                f"{self.config}: this run directory holds records made with another "
                "configuration; resuming would mix the two. What changed:\n  "
                + "\n  ".join(changed)
                + "\nRun into another --output-dir, or move this one aside."
            )

    def _results_view_now(self, old: dict[str, Any]) -> dict[str, Any]:
        """The old config's view with the keys this version added since it was written filled
        in as this version reads it (their defaults), so that a new option whose default keeps
        the old behaviour does not make every earlier run refuse to resume."""
        view = results_view(old)
        try:
            now = self.read_config().to_yaml(old.get("fingerprint"))
        except ConfigError:
            return view  # it no longer loads: compare what it says
        for key, value in results_view(yaml.safe_load(now)).items():
            view.setdefault(key, value)
        return view

    def read_config(self) -> ResolvedExperiment:
        """The experiment the records were made with; RunDirError when there is none,
        ConfigError (file:line: key) when it does not validate."""
        if not self.config.is_file():
            raise RunDirError(f"not a run directory (no config.yaml): {self.root}")
        loaded = load_config(_RunConfig, self.config)
        run = loaded.config
        files = run.sources.get("models", {})
        return ResolvedExperiment(
            path=self.config,
            experiment=run.experiment,
            model_configs=run.models,
            model_files={
                k: None if files.get(k, "inline") == "inline" else Path(files[k])
                for k in run.models
            },
            origins=loaded.origins,
        )

    def read_fingerprint(self) -> dict[str, str]:
        """The digests config.yaml keeps beside the config (cts/eval/run/fingerprint.py); {} when it
        was written before them."""
        document, _ = read_yaml(self.config)
        found = document.get("fingerprint") if isinstance(document, dict) else None
        return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}

    def system_name(self) -> str:
        """How reports name the clarifier system of this run."""
        return self.read_config().system_name()

    def freeze(
        self, resolved: ResolvedExperiment, output_dir: Path, name: str = "experiment.yaml"
    ) -> Path:
        """RUN_DIR/slurm/<name>: the experiment with every model config inlined and its output
        directory fixed, a config every Slurm task (a requeued one too) loads with `--config`,
        whatever is edited after submission."""
        return self.write_slurm_file(name, frozen_experiment(resolved, output_dir))

    def write_slurm_file(self, name: str, document: dict[str, Any]) -> Path:
        path = self.slurm / name
        write_whole(path, yaml.safe_dump(document, sort_keys=False, allow_unicode=True))
        return path


def frozen_experiment(resolved: ResolvedExperiment, output_dir: Path) -> dict[str, Any]:
    """What `RunDir.freeze` writes, built in memory."""
    # None is kept: `split: null` must not fall back to the default split.
    experiment = resolved.experiment.model_dump(mode="json")
    experiment["models"] = {k: m.model_dump(mode="json") for k, m in resolved.model_configs.items()}
    experiment["output_dir"] = str(output_dir)
    return experiment
