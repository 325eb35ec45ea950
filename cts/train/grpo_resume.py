"""Where a GRPO run resumes (cts/train/grpo.py): the checkpoint to go on from, once a changed
configuration is refused (a checkpoint trained under another config is not this run's); a run
already finished; and the rollouts file kept up to that checkpoint's step, so that a resumed
step does not count its rollouts twice."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cts.eval.run.fingerprint import bound_view, changes
from cts.train.config import TrainConfig
from cts.train.fit import FitError


class GrpoError(FitError):
    """GRPO cannot start; the message says why and what to change."""


def grpo_dir(config: TrainConfig) -> Path:
    return config.resolved_output_dir() / "grpo"


def resume_point(config: TrainConfig, last_checkpoint: Any) -> str | None:
    """The checkpoint to resume from (None: from the start), once a changed config is refused;
    drops the rollouts after it and records the config beside the checkpoints, before the
    first is written (a rerun compares its config with it)."""
    refuse_changed_resume(config)  # before the rollouts after the checkpoint are dropped
    trainer_dir = grpo_dir(config) / "trainer"
    last: str | None = last_checkpoint(str(trainer_dir)) if trainer_dir.is_dir() else None
    _keep_rollouts_before(grpo_dir(config) / "rollouts.jsonl", _checkpoint_step(last))
    trainer_dir.mkdir(parents=True, exist_ok=True)
    (trainer_dir / TRAIN_CONFIG_FILE).write_text(
        json.dumps(config.model_dump(mode="json"), indent=1) + "\n"
    )
    return last


def finished(config: TrainConfig) -> Path | None:
    """clarifier.yaml of a GRPO run that finished with this very config (a rerun does
    nothing); None otherwise."""
    output = grpo_dir(config)
    metrics_path, model_config = output / "grpo_metrics.json", output / "clarifier.yaml"
    if not (metrics_path.is_file() and model_config.is_file()):
        return None
    done = json.loads(metrics_path.read_text())
    return model_config if done.get("train_config") == config.model_dump(mode="json") else None


#: The train config the checkpoints under OUTPUT_DIR/grpo/trainer/ were trained with.
TRAIN_CONFIG_FILE = "train_config.json"

#: Train-config keys no GRPO-trained weight depends on: a rerun may resume the checkpoints
#: with them changed (more steps, other checkpoint spacing or logging, the end's merge, where
#: vLLM runs), and the settings of DPO/SFT fits, which GRPO does not read.
FREE_GRPO_KEYS: tuple[tuple[str, ...], ...] = (
    ("name",),
    ("description",),
    ("output_dir",),
    ("logging_steps",),
    ("merge",),
    ("gradient_checkpointing",),
    ("loop",),
    ("candidates",),
    ("method",),
    ("min_margin",),
    ("pairing",),
    ("sft_min_score",),
    ("sft_above_mean",),
    ("epochs",),
    ("batch_size",),
    ("grad_accum",),
    ("beta",),
    ("max_length",),
    ("grpo", "max_steps"),
    ("grpo", "save_steps"),
    ("grpo", "vllm_mode"),
    ("grpo", "vllm_server_base_url"),
    ("grpo", "vllm_gpu_memory_utilization"),
    ("grpo", "vllm_max_model_length"),
)


def resume_changes(config: TrainConfig) -> list[str]:
    """`key: old → new` for each key the trained weights depend on where the checkpoints in
    OUTPUT_DIR/grpo/trainer/ were trained with another value. Empty without a checkpoint, or
    for checkpoints that recorded no config (made before they did): those cannot be
    compared."""
    trainer_dir = grpo_dir(config) / "trainer"
    path = trainer_dir / TRAIN_CONFIG_FILE
    if not path.is_file() or not any(trainer_dir.glob("checkpoint-*")):
        return []
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return [f"(the recorded configuration cannot be read: {e})"]
    # Keys added since it was written compare at their defaults.
    with contextlib.suppress(ValidationError):
        recorded = TrainConfig.model_validate(recorded).model_dump(mode="json")
    return changes(
        bound_view(recorded, FREE_GRPO_KEYS),
        bound_view(config.model_dump(mode="json"), FREE_GRPO_KEYS),
    )


def refuse_changed_resume(config: TrainConfig) -> None:
    """GrpoError listing what changed when the checkpoints a rerun would resume were trained
    under another configuration: their steps and rollouts would be mixed with this one's."""
    changed = resume_changes(config)
    if changed:
        out = grpo_dir(config)
        raise GrpoError(
            f"{out / 'trainer' / TRAIN_CONFIG_FILE}: the checkpoints were trained under another "
            "configuration; resuming would continue them under this one, and rollouts.jsonl "
            "and grpo_metrics.json would mix the two. What changed:\n  "
            + "\n  ".join(changed)
            + f"\nMove {out} aside to train again under this configuration, or give the run "
            "another output_dir."
        )


def failure_counts(failures: dict[str, int]) -> tuple[int, int]:
    """(invalid questions, left out) of `rollout_failures`: questions outside the schema
    (`clarify:*`, priced `invalid_reward`, in their groups) and rollouts that failed after
    the question (left out of their groups)."""
    invalid = sum(n for key, n in failures.items() if key.startswith("clarify:"))
    return invalid, sum(failures.values()) - invalid


def read_rollout_failures(rollouts_path: Path) -> dict[str, int]:
    """Rollouts without a reward from the pipeline, over the whole run (resumes included), by
    `stage:kind`: the question's own (`clarify`, priced `invalid_reward`), a later stage's,
    or `blurred:no_score` (the query's blurred baseline never scored)."""
    found: Counter[str] = Counter()
    for line in rollouts_path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row["error"] is not None:
            found[f"{row['error']['stage']}:{row['error']['kind']}"] += 1
        elif row["reward"] is None:
            found["blurred:no_score"] += 1
    return dict(found)


def _checkpoint_step(checkpoint: str | None) -> int | None:
    return int(Path(checkpoint).name.rsplit("-", 1)[1]) if checkpoint else None


def _keep_rollouts_before(path: Path, step: int | None) -> None:
    """On resume, the rollouts of the steps after the checkpoint are sampled again: drop the
    old ones, so each step's rollouts are in the file once. From the start: none kept."""
    if not path.is_file():
        return
    if step is None:
        path.unlink()
        return
    kept = [
        line
        for line in path.read_text(encoding="utf-8").splitlines(keepends=True)
        if line.strip() and json.loads(line)["step"] < step
    ]
    path.write_text("".join(kept), encoding="utf-8")
