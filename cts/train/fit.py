"""Fine-tune the clarifier on the training data with TRL (DPO or SFT) and a LoRA adapter.

The base is the checkpoint the sampling experiment's clarifier runs (`roles.clarifier.model`),
so DPO learns from the model's own questions. The result is written as a model config beside
the weights (`clarifier.yaml`), which an experiment takes with one line:
`cts run --set roles.clarifier.model=<output_dir>/clarifier.yaml`.

TRL, peft and torch are imported inside `fit` and its steps: they are the `train` extra, and
loading them would slow every other `cts` command.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from cts.eval.run.fingerprint import bound_view, changes
from cts.serving.model_config import ModelConfig, model_label
from cts.train.config import TrainConfig
from cts.train.pairs import no_data_message, read_rows
from cts.train.sample import experiment_with

#: The ranks vLLM accepts for `--max-lora-rank` (its default is 16).
_VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class FitError(RuntimeError):
    """Training cannot start or finish; the message says why and what to change."""


@dataclass
class FitResult:
    adapter_dir: Path
    checkpoint_dir: Path | None
    model_config_path: Path
    model_config: ModelConfig
    metrics: dict[str, Any]


def base_model(config: TrainConfig) -> tuple[str, ModelConfig]:
    """The clarifier's model key and config in the sampling experiment (the policy that
    produced the samples). A model config file is known by its served name, path-safe, as
    runs label it: a loop's iteration 2 is named after iteration 1's model, not after the
    file `clarifier.yaml`."""
    resolved = experiment_with(config, config.experiment_overrides)
    ref = resolved.experiment.roles["clarifier"].model
    base = resolved.model_for("clarifier")
    return model_label(ref, base.name), base


def lora_base(config: TrainConfig) -> str | None:
    """The model key whose vLLM server serves an adapter fitted on the clarifier (the new
    config's `lora_of`), or None: the clarifier is no model `cts serve` starts (an
    in-process engine, a server someone else runs). A clarifier that is itself such an
    adapter names its own base, so every iteration of a loop hangs on one server."""
    resolved = experiment_with(config, config.experiment_overrides)
    ref = resolved.experiment.roles["clarifier"].model
    clarifier = resolved.model_configs[ref]
    if clarifier.lora_of is not None:
        return clarifier.lora_of
    if clarifier.engine != "openai" or not clarifier.vllm.serve:
        return None
    file = resolved.model_files[ref]
    # A path as written may be relative to the experiment; the new config lives elsewhere.
    return str(file.resolve()) if file is not None and ref.endswith((".yaml", ".yml")) else ref


def fine_tuned_config(
    base: ModelConfig,
    name: str,
    output: Path,
    merged: bool,
    lora_rank: int,
    lora_of: str | None = None,
) -> ModelConfig:
    """The model config of the result: a copy of the base's (engine, sampling, chat template,
    vLLM settings) pointing at the merged checkpoint; for an adapter only, the adapter served
    by the server of model `lora_of` (one server for many fine-tunes), or, without one, the
    base served by vLLM with the adapter as a LoRA module that requests name."""
    # No server runs the new weights yet: `cts serve` starts one, whatever served the base.
    vllm = base.vllm.model_copy(update={"serve": True})
    if merged:
        update: dict[str, Any] = {
            "name": name,
            "path": str((output / "checkpoint").resolve()),
            "revision": None,
            # The merged weights hold the base's adapter: none is applied twice.
            "adapter": None,
            "lora_of": None,
        }
        if base.engine == "openai":
            update.update(endpoint=None, vllm=vllm)
        return base.model_copy(update=update)
    adapter = str((output / "adapter").resolve())
    if lora_of is not None:
        return base.model_copy(
            update={
                "name": name,
                "engine": "openai",
                "endpoint": None,
                "adapter": adapter,
                "lora_of": lora_of,
            }
        )
    # vLLM serves the base under `--served-model-name` and the adapter under its module name;
    # they must differ, or requests for the module reach the base. `cts serve` passes the
    # config's name as --served-model-name first, so the one here (later; vLLM warns about the
    # duplicate and the last wins) gives the base its own name back, leaving `name` to the
    # adapter.
    args = [
        "--served-model-name",
        base.name,
        "--enable-lora",
        "--lora-modules",
        f"{name}={adapter}",
    ]
    if lora_rank > 16:
        args += ["--max-lora-rank", str(next(r for r in _VLLM_LORA_RANKS if r >= lora_rank))]
    vllm = vllm.model_copy(update={"extra_args": [*base.vllm.extra_args, *args]})
    # The in-process engines cannot apply an adapter: served by vLLM, always.
    return base.model_copy(
        update={"name": name, "engine": "openai", "endpoint": None, "adapter": None, "vllm": vllm}
    )


def _dataset_rows(
    rows: list[dict[str, Any]], method: str, template_kwargs: dict[str, Any]
) -> list[dict[str, Any]]:
    """Only the columns TRL reads. SFT rows become prompt/completion so the loss covers the
    question alone, not the prompt (sft.jsonl keeps `messages` for other tools)."""
    extra = {"chat_template_kwargs": template_kwargs} if template_kwargs else {}
    if method == "dpo":
        return [
            {"prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"], **extra}
            for r in rows
        ]
    return [{"prompt": r["messages"][:-1], "completion": r["messages"][-1:], **extra} for r in rows]


def _too_long(
    rows: list[dict[str, Any]], tokenizer: Any, max_length: int, template_kwargs: dict[str, Any]
) -> list[int]:
    """Rows whose prompt plus longest completion exceed max_length: TRL would cut the
    question (or drop the row) silently."""
    long = []
    for i, row in enumerate(rows):
        completions = (
            [row["completion"]] if "completion" in row else [row["chosen"], row["rejected"]]
        )
        length = max(
            len(
                tokenizer.apply_chat_template(
                    row["prompt"] + c, tokenize=True, return_dict=True, **template_kwargs
                )["input_ids"]
            )
            for c in completions
        )
        if length > max_length:
            long.append(i)
    return long


def precision(config: TrainConfig) -> tuple[Any, bool, bool, bool]:
    """(weights dtype, use_cpu, bf16, fp16): mixed precision only on a GPU; a CPU trains in
    the dtype it loads (float32 unless asked otherwise)."""
    import torch

    cuda = torch.cuda.is_available()
    name = config.dtype
    if name == "auto":
        name = "bfloat16" if cuda and torch.cuda.is_bf16_supported() else "float32"
    dtype = getattr(torch, name)
    return dtype, not cuda, cuda and name == "bfloat16", cuda and name == "float16"


def fit(config: TrainConfig) -> FitResult:
    """Train the LoRA adapter; write adapter/, checkpoint/ (merge), clarifier.yaml and
    train_metrics.json under the config's output dir."""
    rows = read_rows(config.data_file(), config.method)
    output = config.resolved_output_dir()
    if not rows:
        raise _nothing_to_train_on(config, output)
    require_train_extra()

    key, base = base_model(config)
    base_path = base.resolved_path()
    dtype, use_cpu, bf16, fp16 = precision(config)
    tokenizer = load_tokenizer(base_path, base.revision)
    data, dropped = _training_data(rows, config, tokenizer, dict(base.chat_template_kwargs))
    model, continued = load_policy(base, dtype)
    trainer = _trainer(config, model, tokenizer, data, output, use_cpu, bf16, fp16)
    started = time.perf_counter()
    result = trainer.train()
    seconds = time.perf_counter() - started

    adapter_dir, checkpoint_dir = save_weights(trainer, tokenizer, output, config.merge)
    # The weights' fingerprint in the name: a retrained adapter is a new model to the
    # response cache (keyed by served name for vLLM), never answered with the old one's replies.
    name = f"{key}-{config.name}-{weights_fingerprint(adapter_dir)}"
    model_config = result_config(config, base, name, output)
    model_config_path = write_model_config(model_config, base, config, output, config.method)
    metrics = _metrics(
        config,
        base_path,
        trainer,
        result,
        examples=len(data),
        dropped_too_long=dropped,
        seconds=seconds,
        use_cpu=use_cpu,
        dtype=dtype,
        continued=continued,
    )
    (output / "train_metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    return FitResult(adapter_dir, checkpoint_dir, model_config_path, model_config, metrics)


#: Train-config keys no fit depends on: a loop may resume on its fits with them changed.
FREE_FIT_KEYS: tuple[tuple[str, ...], ...] = (
    ("description",),
    ("output_dir",),
    ("logging_steps",),
    ("loop",),
    ("grpo",),
)


def fit_changes(config: TrainConfig) -> list[str]:
    """`key: old → new` for each key a fit depends on (its data and its training) where the
    finished fit in `config`'s output dir was made with another value (train_metrics.json
    records the config). Empty when nothing changed, or for a fit that recorded no config
    (made before it did): that one cannot be compared."""
    path = config.resolved_output_dir() / "train_metrics.json"
    try:
        recorded = json.loads(path.read_text()).get("train_config")
    except (OSError, ValueError, AttributeError) as e:
        return [f"(the recorded configuration cannot be read: {e})"]
    if recorded is None:
        return []
    # Keys added since it was written compare at their defaults; a config that no longer
    # validates is compared as it reads.
    with contextlib.suppress(ValidationError):
        recorded = TrainConfig.model_validate(recorded).model_dump(mode="json")
    return changes(
        bound_view(recorded, FREE_FIT_KEYS),
        bound_view(config.model_dump(mode="json"), FREE_FIT_KEYS),
    )


def _nothing_to_train_on(config: TrainConfig, output: Path) -> FitError:
    """The error for an empty data file; the pairs step's stats, when there, say why it kept no
    rows."""
    stats_path = output / "pairs_stats.json"
    detail = (
        no_data_message(json.loads(stats_path.read_text()), config)
        if stats_path.is_file()
        else "no rows"
    )
    return FitError(f"{config.data_file()}: nothing to train on: {detail}")


def require_train_extra() -> None:
    """Fail with one clear message, before any work, when the `train` extra is missing; the
    steps below import what they use again (already loaded by then)."""
    try:
        import torch  # noqa: F401
        from datasets import Dataset  # noqa: F401
        from peft import LoraConfig  # noqa: F401
        from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401
        from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer  # noqa: F401
    except ImportError as e:
        raise FitError(
            f"training needs the `train` extra ({e.name} is missing): "
            'pip install "clarify-then-search[train]"'
        ) from None


def load_tokenizer(path: str, revision: str | None) -> Any:
    """The base's tokenizer, padding with EOS where it has no pad token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, revision=revision)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(path: str, revision: str | None, dtype: Any) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, revision=revision, dtype=dtype)


def _training_data(
    rows: list[dict[str, Any]],
    config: TrainConfig,
    tokenizer: Any,
    template_kwargs: dict[str, Any],
) -> tuple[list[dict[str, Any]], int]:
    """The rows TRL trains on, without those longer than max_length; and how many were
    dropped."""
    data = _dataset_rows(rows, config.method, template_kwargs)
    too_long = set(_too_long(data, tokenizer, config.max_length, template_kwargs))
    data = [row for i, row in enumerate(data) if i not in too_long]
    if not data:
        raise FitError(
            f"{config.where('max_length')}: all {len(too_long)} row(s) are longer than "
            f"max_length={config.max_length} tokens; raise it"
        )
    return data, len(too_long)


def _trainer_args(
    config: TrainConfig, output: Path, use_cpu: bool, bf16: bool, fp16: bool
) -> dict[str, Any]:
    """The arguments DPOConfig and SFTConfig share."""
    return {
        # Checkpoints during training are not kept: the adapter is saved once at the end.
        "output_dir": str(output / "trainer"),
        "save_strategy": "no",
        "report_to": "none",
        "learning_rate": config.learning_rate,
        "num_train_epochs": config.epochs,
        "per_device_train_batch_size": config.batch_size,
        "gradient_accumulation_steps": config.grad_accum,
        "max_length": config.max_length,
        "seed": config.seed,
        "logging_steps": config.logging_steps,
        **checkpointing(config.gradient_checkpointing),
        "use_cpu": use_cpu,
        # TRL turns bf16 on by default; a CPU without it would fail or crawl.
        "bf16": bf16,
        "fp16": fp16,
    }


def _trainer(
    config: TrainConfig,
    model: Any,
    tokenizer: Any,
    data: list[dict[str, Any]],
    output: Path,
    use_cpu: bool,
    bf16: bool,
    fp16: bool,
) -> Any:
    """TRL's DPO or SFT trainer over the base model with a fresh LoRA adapter, or over the
    adapter `model` already carries (`load_policy`)."""
    from datasets import Dataset
    from peft import PeftModel
    from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

    lora = None if isinstance(model, PeftModel) else lora_config(config)
    common = _trainer_args(config, output, use_cpu, bf16, fp16)
    dataset = Dataset.from_list(data)
    if config.method == "dpo":
        return DPOTrainer(
            model=model,
            args=DPOConfig(**common, beta=config.beta),
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=lora,
        )
    return SFTTrainer(
        model=model,
        args=SFTConfig(**common, completion_only_loss=True),
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora,
    )


def checkpointing(on: bool) -> dict[str, Any]:
    """The trainer argument that recomputes activations: transformers 5 renamed
    `gradient_checkpointing` (the old name warns at every start); 4.x knows the old only."""
    import dataclasses

    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    name = (
        "activation_checkpointing"
        if "activation_checkpointing" in names
        else "gradient_checkpointing"
    )
    return {name: on}


def lora_config(config: TrainConfig) -> Any:
    """peft's LoraConfig of the train config (a fresh adapter on the causal LM)."""
    from peft import LoraConfig

    lora = config.lora
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )


def load_policy(base: ModelConfig, dtype: Any) -> tuple[Any, str | None]:
    """The model to train and the adapter it goes on training (None: a fresh one is added).
    A clarifier with an adapter is trained from base + adapter, the policy that sampled its
    data, and stays one adapter on the same base (servable beside the others); DPO's
    reference is then a frozen copy of that adapter (TRL adds it), not the bare base."""
    model = load_model(base.resolved_path(), base.revision, dtype)
    adapter = base.resolved_adapter()
    if adapter is None:
        return model, None
    from peft import PeftModel

    return PeftModel.from_pretrained(model, adapter, is_trainable=True), adapter


def result_config(config: TrainConfig, base: ModelConfig, name: str, output: Path) -> ModelConfig:
    """The fitted clarifier's model config (`fine_tuned_config` for this train config)."""
    lora_of = None if config.merge else lora_base(config)
    return fine_tuned_config(base, name, output, config.merge, config.lora.r, lora_of)


def save_weights(
    trainer: Any, tokenizer: Any, output: Path, merge: bool
) -> tuple[Path, Path | None]:
    """Save the adapter (and, to merge, the merged checkpoint) with the tokenizer beside it;
    their directories."""
    with contextlib.suppress(OSError):
        (output / "trainer").rmdir()  # TRL's working dir, empty as nothing is checkpointed
    trained = trainer.accelerator.unwrap_model(trainer.model)
    if "ref" in trained.peft_config:
        # DPO's frozen reference copy of a continued adapter: neither saved nor merged.
        trained.delete_adapter("ref")
    adapter_dir = output / "adapter"
    trained.save_pretrained(adapter_dir)
    tokenizer.save_pretrained(adapter_dir)
    if not merge:
        return adapter_dir, None
    checkpoint_dir = output / "checkpoint"
    merged = trained.merge_and_unload()
    # Gradient checkpointing turns the KV cache off in the config; generation wants it.
    merged.config.use_cache = True
    merged.save_pretrained(checkpoint_dir)
    tokenizer.save_pretrained(checkpoint_dir)
    return adapter_dir, checkpoint_dir


def weights_fingerprint(adapter_dir: Path) -> str:
    """The first 8 hex digits of the SHA-256 of the adapter's weights."""
    digest = hashlib.sha256()
    for weights in sorted(adapter_dir.glob("*.safetensors")):
        digest.update(weights.read_bytes())
    return digest.hexdigest()[:8]


def write_model_config(
    model_config: ModelConfig, base: ModelConfig, config: TrainConfig, output: Path, method: str
) -> Path:
    """Write clarifier.yaml, headed by what it is and how to use it; its path."""
    path = output / "clarifier.yaml"
    header = (
        f"# {method.upper()} fine-tune of {base.name} ({config.path or 'train config'}).\n"
        f"# Use it: cts run --set roles.clarifier.model={path.resolve()}\n"
    )
    path.write_text(
        header
        + yaml.safe_dump(
            # Defaults left out: the file reads like a hand-written model config.
            model_config.model_dump(mode="json", exclude_defaults=True),
            sort_keys=False,
            allow_unicode=True,
        )
    )
    return path


def _metrics(
    config: TrainConfig,
    base_path: str,
    trainer: Any,
    result: Any,
    *,
    examples: int,
    dropped_too_long: int,
    seconds: float,
    use_cpu: bool,
    dtype: Any,
    continued: str | None,
) -> dict[str, Any]:
    """train_metrics.json: what was trained on, how, the losses logged and the config."""
    log = [
        {k: v for k, v in entry.items() if isinstance(v, (int, float))}
        for entry in trainer.state.log_history
        if "loss" in entry
    ]
    return {
        "method": config.method,
        "base_model": base_path,
        # The adapter the fit went on training (a loop's earlier iteration), or None: fresh.
        "continued_adapter": continued,
        "examples": examples,
        "dropped_too_long": dropped_too_long,
        "steps": result.global_step,
        "epochs": config.epochs,
        "train_loss": result.training_loss,
        "final_loss": log[-1]["loss"] if log else None,
        **run_metrics(config, seconds, use_cpu, dtype, log),
    }


def run_metrics(
    config: TrainConfig, seconds: float, use_cpu: bool, dtype: Any, log: list[dict[str, Any]]
) -> dict[str, Any]:
    """The end of a trainer's metrics (`fit`'s and GRPO's): its time, device and dtype, the
    torch version, the logged steps and the train config."""
    import torch

    return {
        "seconds": round(seconds, 2),
        "device": "cpu" if use_cpu else "cuda",
        "dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "log": log,
        "train_config": config.model_dump(mode="json"),
    }
