"""One LoRA SFT fit of the tiny model for an agent role, on CPU: what `cts train judge`,
`answerer`, `rewriter` and `searcher` share. Each role is one `RoleAdapter` (cts/train/judge_fit.py,
answerer_fit.py, rewriter_fit.py, searcher_fit.py declare theirs, with the settings that built
its shipped adapter; cts/train/adapters.py lists them).

`fit_lora_sft` trains TRL's SFT trainer with a peft LoRA adapter on prompt/completion rows (the
loss on the completion only), saves the adapter (weights and config only) and writes a JSON
record beside it: the command that rebuilds it, the settings, what the caller says about its
data, the steps made, the losses and the wall time. TRL, peft and torch are imported inside:
they are the `train` extra.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from cts.configs import CONFIG_DIR
from cts.train.answerer_data import read_instances
from cts.train.fit import checkpointing, load_model, load_tokenizer, require_train_extra
from cts.train.held_out import TRAINED_ON, fitting_record
from cts.train.sft import sft_row

#: Where every role adapter's examples are read from (`answerer_data.read_instances`).
TRAINED_FROM = "sample:train"


@dataclass(frozen=True)
class LoraSftSettings:
    """What a role fine-tune depends on; recorded beside the adapter. A role's settings
    subclass it with its own defaults."""

    examples: int = 160
    seed: int = 0
    epochs: float = 1.0
    #: Optimizer steps to stop after (0: the epochs' worth).
    max_steps: int = 0
    #: Wall-clock seconds after which training stops at the end of its step (0: no limit); the
    #: steps it made are recorded, and `--max-steps` with them rebuilds the same adapter.
    max_seconds: float = 0.0
    #: One example a micro-batch: on 2 CPU cores padding costs more than batching gains (the
    #: judge: 19 s a step of 8 against 22 s at 2 a micro-batch and 39 s at 8).
    batch_size: int = 1
    grad_accum: int = 8
    learning_rate: float = 1e-3
    lora_r: int = 8
    lora_alpha: int = 16
    #: LoRA on the top layers only (of SmolLM2-135M's 30): the backward pass stops below them,
    #: which on 2 CPU cores is most of a step's time.
    first_layer: int = 16
    layers: int = 30
    max_length: int = 1024
    threads: int = 2
    base: str = "smollm2-135m-instruct"


Counts = Callable[[Sequence[Any]], dict[str, Any]]


@dataclass(frozen=True)
class RoleAdapter:
    """One role's LoRA adapter of the tiny model: the examples its data module generates (train
    split only), the fit, and where the adapter and its record go. `cts train ROLE` is this.
    Declared in one line of its `cts/train/<role>_fit.py`: role, settings, data, what, doc."""

    #: The role as `cts train ROLE` names it.
    role: str
    #: The defaults, those that built the shipped adapter.
    settings: LoraSftSettings
    #: The role's data generator: `generate(n, seed)` and `label_counts`.
    data: ModuleType
    #: The examples, as --help names them ("judge calls").
    what: str
    #: `cts train ROLE --help`.
    doc: str
    #: What the record counts of the examples besides labels and languages (name, counter).
    counts: tuple[tuple[str, Counts], ...] = ()

    @property
    def model(self) -> str:
        """The model config that serves the adapter (cts/configs/models/<model>.yaml)."""
        return f"smollm2-135m-{self.role}"

    @property
    def adapter_dir(self) -> Path:
        return CONFIG_DIR / "models" / "adapters" / self.model

    @property
    def record(self) -> str:
        """The record written beside the adapter."""
        return f"{self.role}_train.json"

    def rebuild_command(self, settings: LoraSftSettings) -> str:
        return rebuild_command(self.role, settings)

    def fit(self, settings: LoraSftSettings, output: Path | None = None) -> dict[str, Any]:
        """Generate the examples, train the adapter on CPU, save it (weights and config only)
        to `output` (default: the shipped adapter's folder) with its record (the rebuild
        command, settings, the examples' counts, steps, losses, wall time)."""
        examples = self.data.generate(settings.examples, settings.seed)
        data = {
            "labels": self.data.label_counts(examples),
            **{name: count(examples) for name, count in self.counts},
            "languages": language_counts(examples),
            # Every role's examples come from the sample's train split: the loop checks it.
            TRAINED_ON: fitting_record(read_instances(), TRAINED_FROM),
        }
        rows = [sft_row(e) for e in examples]
        return fit_lora_sft(
            self.role, settings, rows, data, output or self.adapter_dir, self.record
        )


def language_counts(examples: Sequence[Any]) -> dict[str, int]:
    """How many examples (each with a `language`) are English and how many Chinese."""
    return {lang: sum(e.language == lang for e in examples) for lang in ("en", "zh")}


def rebuild_command(role: str, settings: LoraSftSettings) -> str:
    """The `cts train ROLE` line that trains with `settings` (those it takes as options)."""
    return (
        f"cts train {role} --examples {settings.examples} --seed {settings.seed} "
        f"--epochs {settings.epochs:g} --learning-rate {settings.learning_rate:g}"
        + (f" --max-steps {settings.max_steps}" if settings.max_steps else "")
    )


def _base_path(base: str) -> str:
    from cts.serving.model_config import load_model_config

    return load_model_config(CONFIG_DIR / "models" / f"{base}.yaml").resolved_path()


def _trainer(settings: LoraSftSettings, model: Any, tokenizer: Any, rows: list, work: Path) -> Any:
    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        output_dir=str(work),
        save_strategy="no",
        report_to="none",
        learning_rate=settings.learning_rate,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=2,
        num_train_epochs=settings.epochs,
        max_steps=settings.max_steps or -1,
        per_device_train_batch_size=settings.batch_size,
        gradient_accumulation_steps=settings.grad_accum,
        max_length=settings.max_length,
        seed=settings.seed,
        logging_steps=5,
        use_cpu=True,
        bf16=False,
        fp16=False,
        completion_only_loss=True,
        **checkpointing(False),
    )
    lora = LoraConfig(
        r=settings.lora_r,
        lora_alpha=settings.lora_alpha,
        lora_dropout=0.0,
        target_modules=[
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ],
        layers_to_transform=list(range(settings.first_layer, settings.layers)),
        task_type="CAUSAL_LM",
    )
    return SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=lora,
        callbacks=[_deadline(settings.max_seconds)] if settings.max_seconds else None,
    )


def _deadline(seconds: float) -> Any:
    """A trainer callback that stops training at the first step end after `seconds`."""
    from transformers import TrainerCallback

    class Deadline(TrainerCallback):
        def __init__(self) -> None:
            self.started = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if time.perf_counter() - self.started > seconds:
                control.should_training_stop = True
            return control

    return Deadline()


def fit_lora_sft(
    role: str,
    settings: LoraSftSettings,
    rows: list[dict[str, Any]],
    data: dict[str, Any],
    output: Path,
    record_name: str,
) -> dict[str, Any]:
    """Train the adapter for `role` on CPU on the prompt/completion `rows` and save it
    (weights and config only) to `output` with `record_name`: a JSON record of the rebuild
    command, the settings, `data` (what the caller counts of its examples: labels,
    languages), the steps, losses and wall time."""
    require_train_extra()
    import torch

    torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    path = _base_path(settings.base)
    tokenizer = load_tokenizer(path, None)
    model = load_model(path, None, torch.float32)
    with tempfile.TemporaryDirectory(prefix=f"cts-{role}-") as work:
        trainer = _trainer(settings, model, tokenizer, rows, Path(work))
        started = time.perf_counter()
        result = trainer.train()
        seconds = time.perf_counter() - started
    trainer.accelerator.unwrap_model(trainer.model).save_pretrained(output)
    (output / "README.md").unlink(missing_ok=True)  # peft's model-card template
    log = [
        {k: v for k, v in entry.items() if isinstance(v, (int, float))}
        for entry in trainer.state.log_history
        if "loss" in entry
    ]
    # The steps made (a deadline may have cut them short) are what rebuilds this adapter.
    made = replace(settings, max_steps=result.global_step, max_seconds=0.0)
    record = {
        "command": rebuild_command(role, made),
        "stopped_by_deadline": result.global_step < trainer.state.max_steps,
        "settings": asdict(settings),
        **data,
        "steps": result.global_step,
        "train_loss": result.training_loss,
        "seconds": round(seconds, 1),
        "torch": torch.__version__,
        "log": log,
    }
    (output / record_name).write_text(json.dumps(record, indent=1) + "\n")
    return record
