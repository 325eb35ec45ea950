"""Train configs (`cts/configs/train/*.yaml`): which experiment scores the sampled questions, how
many candidates per query, how pairs are chosen, LoRA and trainer settings, where it all goes.

One file describes the three stages (sample → pairs → fit) so that they stay consistent when
run apart (a Slurm sampling job, then a training job). Validated like the experiment configs:
unknown keys and bad values are errors naming `file:line: key`, `--set` overrides included.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from cts.configs import CONFIG_DIR
from cts.eval.run.config_sections import ALL_CONDITIONS, check_template
from cts.foundation.yaml_config import ConfigError, Origins, Override, load_config

DEFAULT_TRAIN = "quickstart"
#: The deepest clarify@k condition an experiment runs (cts/eval/run/config.py `Condition`).
MAX_TURNS = max(int(c.split("@")[1]) for c in ALL_CONDITIONS if c.startswith("clarify@"))


class _Strict(BaseModel):
    # No inf or nan anywhere: a reward, cost or rate that is not a number turns every reward
    # into inf or nan (and rollouts.jsonl into text that is not JSON).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class LoraSettings(_Strict):
    """peft's LoraConfig; the defaults are TRL's usual starting point for 1–10B models."""

    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.05, ge=0.0, lt=1.0)
    #: `all-linear` (every linear layer but the output head) or a list of module names.
    target_modules: str | list[str] = "all-linear"


class RewardSettings(_Strict):
    """What a sampled dialogue earns: its restore gain over the instance's blurred score, less
    a price on each question asked and on each `unknown` answer, so that (with `allow_stop`)
    not asking can win. `reward = gain − question_cost × questions − unknown_cost × unknowns`,
    in restore-score points (0–100)."""

    #: blurred: gain over the instance's mean blurred score (sampling also runs the blurred
    #: condition, one search per candidate seed); none: the restore score itself (no blurred
    #: runs: cheaper, and pairs within one instance are the same, but SFT's bar is then on the
    #: score, not on the gain).
    baseline: Literal["blurred", "none"] = "blurred"
    question_cost: float = Field(0.0, ge=0.0)
    unknown_cost: float = Field(0.0, ge=0.0)


class LoopSettings(_Strict):
    """`cts train loop`: expert iteration with an evaluation after every fit (cts/train/loop.py)."""

    #: Iterations when `--iterations` is not given.
    iterations: int = Field(2, ge=1, le=50)
    #: `--set`-style overrides of the experiment for every evaluation (e.g. dataset.limit=100);
    #: its data must stay held out from the sampled data (checked).
    evaluation_overrides: list[str] = []
    #: More evaluations of every iteration, each the main one plus its overrides, e.g.
    #: `other_user: [roles.user_answerer.model=qwen3-32b]`: a clarifier that learned to exploit
    #: one simulated user (or judge) gains under it only.
    robustness: dict[str, list[str]] = {}

    @field_validator("robustness")
    @classmethod
    def _variant_names(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for name in value:
            if name == "main" or not re.fullmatch(r"[A-Za-z0-9._-]+", name):
                raise ValueError(
                    f"{name!r}: a variant name is letters, digits, '.', '_' or '-' (not 'main')"
                )
        return value


class GrpoSettings(_Strict):
    """`cts train grpo`: online RL of the clarifier's first question with TRL's GRPOTrainer.
    Every sampled question is scored end to end by the experiment's own pipeline (User
    Answerer → Rewriter → search → judge) and earns `reward`'s value (cts/train/grpo.py)."""

    #: Questions sampled per query and step: GRPO's group, whose mean reward is the baseline
    #: each question is compared with.
    num_generations: int = Field(4, ge=2)
    #: Queries per optimizer step (each with its `num_generations` questions).
    prompts_per_step: int = Field(2, ge=1)
    max_steps: int = Field(50, ge=1)
    #: The clarifier's room for one question as JSON (cts/agents/clarifier.py SAMPLING).
    max_completion_length: int = Field(96, ge=8)
    #: KL to the base (0: none, TRL's default; the LoRA adapter alone keeps it close).
    beta: float = Field(0.0, ge=0.0)
    #: The reward of a completion the clarifier's schema refuses (cut off at
    #: max_completion_length): the worst a restore gain can be, −100, or below (never above:
    #: a broken question would beat a question that lost the whole score).
    invalid_reward: float = Field(-100.0, le=-100.0)
    #: A checkpoint every N steps under OUTPUT_DIR/grpo/trainer/: a rerun resumes there.
    save_steps: int = Field(10, ge=1)
    #: Sample with vLLM inside TRL (a GPU; `vllm_mode: colocate` shares it with training,
    #: `server` uses `trl vllm-serve` at vllm_server_base_url) under the clarifier's JSON
    #: schema as a regex; otherwise transformers' generate under the same constraint (outlines).
    use_vllm: bool = False
    vllm_mode: Literal["colocate", "server"] = "colocate"
    vllm_server_base_url: str | None = None
    #: Colocated vLLM's share of the training GPU (TRL's default, 0.3): the rest trains.
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0.0, le=0.95)
    #: Colocated vLLM's context window; None: the longest training prompt plus
    #: max_completion_length (unset in TRL, vLLM takes the model's own, 40k tokens for Qwen3,
    #: whose KV cache does not fit the 0.3 share of an 80 GB GPU beside an 8B model).
    vllm_max_model_length: int | None = Field(None, gt=0)


class TrainConfig(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._-]+$")
    description: str = ""
    #: The experiment whose pipeline scores each sampled question (a name or a path): its
    #: roles, search and budgets define what "a good question" means.
    experiment: str = "quickstart"
    #: `--set`-style overrides of the experiment for sampling only, e.g. smaller budgets; a
    #: clarifier set here (`roles.clarifier.model=...`) is also the one a loop's iteration 0
    #: evaluates: the base every later iteration is compared with.
    experiment_overrides: list[str] = []
    #: Queries to sample on; None = the experiment's dataset path. Must not be the data the
    #: experiment evaluates on (checked), or the clarifier is trained on the test set.
    dataset: str | None = None
    #: The dataset split to sample on (the shipped sample has train/dev/test; quickstart
    #: evaluates on dev).
    split: str | None = "train"
    #: Only the first N instances of the split.
    limit: int | None = Field(None, ge=1)
    #: Dialogues sampled per instance (one seed each); preference needs at least two.
    candidates: int = Field(4, ge=2)
    #: Turns of each sampled dialogue (clarify@turns, sequential). 1: first questions only;
    #: above, every turn's question is credited by the dialogues that continue from it. At
    #: most the deepest clarify@k condition there is.
    turns: int = Field(1, ge=1, le=MAX_TURNS)
    #: Let the clarifier stop before `turns` questions; a stop is then an action that can be
    #: chosen or rejected like a question (its reward pays no further question cost).
    allow_stop: bool = False
    reward: RewardSettings = RewardSettings()
    loop: LoopSettings = LoopSettings()
    grpo: GrpoSettings = GrpoSettings()
    #: The clarifier's sampling temperature for the candidates: above 0, or every seed asks
    #: the same question and nothing can be preferred.
    temperature: float = Field(1.0, gt=0.0)
    #: dpo: preference pairs (best vs worst question of an instance); sft: fine-tune on each
    #: instance's best question (rejection sampling / best-of-N).
    method: Literal["dpo", "sft"] = "dpo"
    #: Reward points (0–100 scale) the chosen action must beat the rejected one by: the
    #: search and judge are noisy, small differences are not a preference.
    min_margin: float = Field(10.0, ge=0.0)
    #: best_worst: one pair per instance, so every query weighs the same; best_vs_rest: the
    #: best against every candidate at least min_margin below it (more pairs, but instances
    #: with many distinct questions dominate).
    pairing: Literal["best_worst", "best_vs_rest"] = "best_worst"
    #: SFT keeps the best action of a dialogue state when its reward is above this (0 with
    #: the blurred baseline: asking did better than not asking) ...
    sft_min_score: float = 0.0
    #: ... and, with this on, only when it beat the state's mean reward (the question, not
    #: the query, made the difference).
    sft_above_mean: bool = False
    lora: LoraSettings = LoraSettings()
    #: LoRA adapters want about ten times the full fine-tuning rates TRL defaults to.
    learning_rate: float = Field(5e-5, gt=0.0)
    epochs: float = Field(2.0, gt=0.0)
    #: Per device; the effective batch is batch_size × grad_accum × devices.
    batch_size: int = Field(4, ge=1)
    grad_accum: int = Field(4, ge=1)
    #: DPO's KL strength (TRL's default): higher keeps the model closer to the base.
    beta: float = Field(0.1, gt=0.0)
    #: Tokens of prompt + question; the clarifier prompt is short, questions are ≤ 200 chars.
    max_length: int = Field(512, ge=32)
    seed: int = 42
    #: auto: bfloat16 on a GPU that supports it, float32 otherwise (CPUs train in float32).
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    #: Trades compute for memory (TRL's default); off is faster for small models.
    gradient_checkpointing: bool = True
    logging_steps: int = Field(10, ge=1)
    #: Merge the adapter into a full checkpoint (served like any model); false keeps only the
    #: adapter and writes a vLLM LoRA-serving model config instead.
    merge: bool = True
    output_dir: str = "runs/train-{name}"

    #: Kept for errors found after validation (a split that is the evaluation data) to name
    #: the line too.
    _origins: Origins = PrivateAttr(default_factory=lambda: Origins(None))

    @field_validator("output_dir")
    @classmethod
    def _output_dir_fields(cls, template: str) -> str:
        return check_template(template, ("name",))

    @property
    def path(self) -> Path | None:
        """The YAML file it was loaded from (None when built in code)."""
        return self._origins.path

    def where(self, *key: str) -> str:
        """`file:line: key` (or `--set key`) for errors found after validation."""
        return self._origins.where(*key)

    def resolved_output_dir(self) -> Path:
        return Path(self.output_dir.format(name=self.name))

    def samples_dir(self) -> Path:
        """The sampling run: an ordinary run directory (records, traces, report)."""
        return self.resolved_output_dir() / "samples"

    def data_file(self) -> Path:
        """What `pairs` writes and `fit` reads: preference pairs or SFT examples."""
        name = "pairs.jsonl" if self.method == "dpo" else "sft.jsonl"
        return self.resolved_output_dir() / name


def find_train_config(config: str | Path | None) -> Path:
    """`None` → the quickstart; a path; or a bare name under cts/configs/train/."""
    path = Path(config or DEFAULT_TRAIN).expanduser()
    if path.is_file():
        return path
    candidate = CONFIG_DIR / "train" / f"{config or DEFAULT_TRAIN}.yaml"
    if candidate.is_file():
        return candidate
    raise ConfigError(
        f"{path}: train config file not found (a path, or a name under {candidate.parent})"
    )


def load_train_config(
    config: str | Path | None = None, overrides: Sequence[str | Override] = ()
) -> TrainConfig:
    """Read, override and validate a train config; ConfigError names file:line: key."""
    loaded = load_config(TrainConfig, find_train_config(config), overrides)
    loaded.config._origins = loaded.origins
    return loaded.config
