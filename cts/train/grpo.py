"""Online RL of the clarifier's first question: TRL's GRPOTrainer, rewarded end to end.

Each step samples `num_generations` questions per training query from the current policy,
under the clarifier's own JSON schema (outlines on the CPU or with transformers, vLLM's
structured outputs with `use_vllm`). Each question is then put through the experiment's own
pipeline, exactly as `cts run` would put a served clarifier's reply (cts/eval/run/pipeline.py
`run_instance` on clarify@1): the User Answerer answers it, the Rewriter fuses, the search agent
searches, the judge labels the golden nuggets, and the restore score becomes the reward of
cts/train/config.py's `RewardSettings` (gain over the query's blurred score, less the price of the
question and of an `unknown` answer). GRPO compares each question with the others of its group.

The rollouts (question, answer, score, reward and its parts, per step) go to
OUTPUT_DIR/grpo/rollouts.jsonl; checkpoints every `save_steps` to OUTPUT_DIR/grpo/trainer/, where
a rerun resumes; at the end the adapter, the merged checkpoint and clarifier.yaml, as `fit`
writes them. The downstream roles' calls go through the response cache, so a resumed step
pays only for what it had not asked.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections import Counter
from contextlib import AsyncExitStack
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from statistics import mean
from typing import Any

from cts.agents import clarifier
from cts.eval.data.dataset import load_instances
from cts.eval.data.schema import Instance, Record
from cts.eval.experiment import no_nuggets
from cts.eval.run.config import ResolvedExperiment
from cts.eval.run.config_sections import Role
from cts.eval.run.dialogue import Clarification
from cts.eval.run.engines import open_engines
from cts.eval.run.pipeline import PipelineContext, run_instance
from cts.eval.run.search_agent import open_agent
from cts.serving.checks import TRL_VLLM_RANGE, version_tuple
from cts.serving.constrained import RowGuide, output_regex, row_rules, vocabulary
from cts.serving.engine import Engine
from cts.serving.model_config import ModelConfig
from cts.serving.types import ChatRequest, ChatResponse, JsonSchemaOutput, Sampling
from cts.train.config import GrpoSettings, TrainConfig
from cts.train.fit import (
    base_model,
    checkpointing,
    load_policy,
    load_tokenizer,
    lora_config,
    precision,
    require_train_extra,
    result_config,
    run_metrics,
    save_weights,
    weights_fingerprint,
    write_model_config,
)
from cts.train.grpo_resume import (
    GrpoError,
    grpo_dir,
    read_rollout_failures,
    refuse_changed_resume,
    resume_point,
)
from cts.train.pairs import SCORE, reward_of
from cts.train.sample import sampling_experiment

#: A rollout is one clarify@1 key whose question the policy wrote.
CONDITION = "clarify@1"
BLURRED = "blurred"


@dataclass
class GrpoResult:
    output: Path
    model_config_path: Path
    metrics: dict[str, Any]
    #: The checkpoint training resumed from (None: from the start).
    resumed_from: str | None


def experiment(config: TrainConfig, check_instances: bool = True) -> ResolvedExperiment:
    """The experiment that scores each question (the sampling experiment: the train split,
    sequential clarify@1, `allow_stop`); ConfigError for data the experiment evaluates on
    (with `check_instances`, compared instance by instance: cts/train/held_out.py); GrpoError for
    checkpoints trained under another configuration (`refuse_changed_resume`)."""
    refuse_changed_resume(config)
    if config.turns != 1:
        raise GrpoError(
            f"{config.where('turns')}: GRPO trains the first question (turns: 1); whole "
            f"{config.turns}-turn dialogues are credited by `cts train sample`/`pairs`/`loop`"
        )
    settings = config.grpo
    if settings.use_vllm and settings.vllm_mode == "server" and not settings.vllm_server_base_url:
        raise GrpoError(
            f"{config.where('grpo', 'vllm_mode')}: `server` needs grpo.vllm_server_base_url "
            "(where `trl vllm-serve` listens)"
        )
    return sampling_experiment(config, check_instances)


def prompt_rows(resolved: ResolvedExperiment) -> tuple[list[dict[str, Any]], list[Instance]]:
    """One row per training query: the messages `clarifier.ask` sends at turn 1, and its id
    (TRL passes the dataset's other columns to the reward function)."""
    source = resolved.experiment.dataset
    instances = load_instances(source)
    unscorable = no_nuggets(source, instances)
    if unscorable is not None:
        raise GrpoError(f"{unscorable}: the reward needs every query's golden nuggets")
    rows = [
        {
            "prompt": [m.model_dump() for m in clarifier.messages(i.blurred_query, [], i.language)],
            "instance_id": i.id,
        }
        for i in instances
    ]
    return rows, instances


class _Written(Engine):
    """The policy's sampled completion as the clarifier's reply: `clarifier.ask` validates it
    against the schema like a served clarifier's (one cut off at max_completion_length fails
    there, as `clarify`)."""

    def __init__(self, text: str, model: str) -> None:
        super().__init__()
        self.text, self.model, self.identity = text, model, f"policy:{model}"

    async def _complete(self, request: ChatRequest) -> ChatResponse:
        return ChatResponse(text=self.text)


@dataclass
class Rollout:
    step: int
    instance_id: str
    seed: int
    completion: str
    #: None: unscorable (a failure after the question: GRPO leaves it out of its group).
    reward: float | None
    record: Record
    parts: dict[str, float]

    def row(self) -> dict[str, Any]:
        r = self.record
        return {
            "step": self.step,
            "instance_id": self.instance_id,
            "seed": self.seed,
            "completion": self.completion,
            "question": r.questions[0]
            if r.questions
            else r.stop_question or _question(self.completion),
            "stop": r.stopped_early,
            "answer": r.answers[0] if r.answers else None,
            "rewrite": r.rewrite,
            "score": r.scores.get(SCORE),
            "reward": self.reward,
            **self.parts,
            "error": r.error,
            "usage": r.usage,
        }


def _question(completion: str) -> str | None:
    """The question in a completion whose dialogue failed before keeping it (None when the
    completion is not the schema's JSON)."""
    try:
        found = json.loads(completion)
    except ValueError:
        return None
    return found.get("question") if isinstance(found, dict) else None


class PipelineReward:
    """The reward function TRL calls with each step's completions. It owns an event loop
    (`asyncio.Runner`) in which the experiment's engines and search agent live from the first
    step to `close`, and scores the step's completions concurrently (`concurrency`)."""

    #: TRL logs each reward function's mean under its name.
    __name__ = "restore_reward"

    def __init__(
        self,
        config: TrainConfig,
        resolved: ResolvedExperiment,
        instances: list[Instance],
        rollouts_path: Path,
    ) -> None:
        self.config, self.resolved = config, resolved
        self.instances = {i.id: i for i in instances}
        self.rollouts_path = rollouts_path
        self._runner = asyncio.Runner()
        self._stack = AsyncExitStack()
        self._ctx: PipelineContext | None = None
        self._baselines: dict[str, asyncio.Future[float | None]] = {}

    def open(self) -> None:
        self._ctx = self._runner.run(self._open())

    async def _open(self) -> PipelineContext:
        experiment = self.resolved.experiment
        # Every role but the clarifier: the policy being trained writes the questions.
        roles_needed: list[Role] = [r for r in experiment.roles if r != "clarifier"]
        engines = await self._stack.enter_async_context(open_engines(self.resolved, roles_needed))
        agent = await self._stack.enter_async_context(open_agent(self.resolved, engines))
        sampling: dict[str, Sampling] = {
            role: self.resolved.sampling_for(role) for role in experiment.roles
        }
        roles = {str(role): engine for role, engine in engines.roles.items()}
        return PipelineContext(
            roles=roles,
            agent=agent,
            sampling=sampling,
            clarification=Clarification(roles, sampling, experiment.clarification, k_max=1),
            golden=experiment.golden,
            judge=experiment.judge,
        )

    def close(self) -> None:
        try:
            self._runner.run(self._stack.aclose())
        finally:
            self._runner.close()

    def __call__(
        self,
        prompts: list[Any],
        completions: list[Any],
        instance_id: list[str],
        trainer_state: Any = None,
        log_metric: Any = None,
        **_: Any,
    ) -> list[float | None]:
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        # The i-th question of a query in this batch runs downstream under seed i: the same
        # seeds as its blurred baseline, so the group differs by its questions only.
        seen: Counter[str] = Counter()
        seeds = []
        for iid in instance_id:
            seeds.append(seen[iid])
            seen[iid] += 1
        step = trainer_state.global_step if trainer_state is not None else 0
        rollouts = self._runner.run(self._score_all(step, instance_id, texts, seeds))
        self._append(rollouts)
        scored = [r for r in rollouts if r.parts]  # not cut off, not failed after the question
        # Left out of their groups (no reward); a question outside the schema is not: it is
        # priced invalid_reward and counted apart.
        left_out = sum(r.reward is None for r in rollouts)
        if log_metric is not None:
            if scored:
                log_metric("restore/score", mean(r.parts["score"] for r in scored))
                log_metric("restore/gain", mean(r.parts["gain"] for r in scored))
            log_metric("restore/failed", float(left_out))
            log_metric("restore/invalid", float(len(rollouts) - len(scored) - left_out))
        return [r.reward for r in rollouts]

    async def _score_all(
        self, step: int, ids: list[str], texts: list[str], seeds: list[int]
    ) -> list[Rollout]:
        limit = asyncio.Semaphore(self.resolved.experiment.concurrency)

        async def one(iid: str, text: str, seed: int) -> Rollout:
            async with limit:
                return await self._rollout(step, self.instances[iid], text, seed)

        return list(await asyncio.gather(*map(one, ids, texts, seeds)))

    async def _rollout(self, step: int, instance: Instance, text: str, seed: int) -> Rollout:
        assert self._ctx is not None, "open() first"
        ctx = self._ctx
        roles = {**ctx.roles, "clarifier": _Written(text, "policy")}
        options = self.resolved.experiment.clarification
        own = PipelineContext(
            roles=roles,
            agent=ctx.agent,
            sampling=ctx.sampling,
            clarification=Clarification(roles, ctx.sampling, options, k_max=1),
            golden=ctx.golden,
            judge=ctx.judge,
        )
        record = await run_instance(instance, CONDITION, seed, own)
        parts: dict[str, float] = {}
        reward: float | None
        if record.error is not None:
            # The question itself failed (not in the schema): the policy's fault, priced as
            # the worst gain. Anything after it (a search or judge failure) is not: left out.
            clarify = record.error.get("stage") == "clarify"
            reward = self.config.grpo.invalid_reward if clarify else None
        else:
            baseline = await self._baseline(instance)
            if baseline is None:
                reward = None
            else:
                earned = reward_of(record, baseline, self.config.reward)
                reward = earned.value
                parts = {
                    "score": earned.score,
                    "baseline": earned.baseline,
                    "gain": earned.gain,
                    "question_cost": earned.question_cost,
                    "unknown_cost": earned.unknown_cost,
                }
        return Rollout(step, instance.id, seed, text, reward, record, parts)

    async def _baseline(self, instance: Instance) -> float | None:
        """The query's mean blurred score over the group's seeds (0 with `baseline: none`);
        None when no blurred run of it scored. Run once per query: the rollouts of a group
        that ask at the same time wait on the same runs."""
        if self.config.reward.baseline == "none":
            return 0.0
        if instance.id not in self._baselines:
            self._baselines[instance.id] = asyncio.ensure_future(self._blurred(instance))
        return await self._baselines[instance.id]

    async def _blurred(self, instance: Instance) -> float | None:
        assert self._ctx is not None
        ctx = self._ctx
        seeds = range(self.config.grpo.num_generations)
        runs = await asyncio.gather(*(run_instance(instance, BLURRED, s, ctx) for s in seeds))
        scores = [r.scores[SCORE] for r in runs if r.error is None and SCORE in r.scores]
        return mean(scores) if scores else None

    def _append(self, rollouts: list[Rollout]) -> None:
        with self.rollouts_path.open("a", encoding="utf-8") as f:
            for r in rollouts:
                f.write(json.dumps(r.row(), ensure_ascii=False) + "\n")


def constrained_rollouts(
    schema: JsonSchemaOutput, chat_kwargs: dict[str, Any], max_tokens: int
) -> Any:
    """TRL's `rollout_func` for generation with transformers: the current policy samples each
    prompt's completion under the clarifier's JSON schema (the same constraint the
    transformers engine applies), with the trainer's own generation settings."""
    index: Any = None

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        nonlocal index
        import torch
        from outlines_core import Index
        from transformers import LogitsProcessorList
        from trl.models import unwrap_model_for_generation

        tok = trainer.processing_class
        if index is None:
            index = Index(output_regex(schema), vocabulary(tok))
        texts = [
            tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True, **chat_kwargs)
            for p in prompts
        ]
        side, tok.padding_side = tok.padding_side, "left"
        try:
            enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        finally:
            tok.padding_side = side
        enc = enc.to(trainer.accelerator.device)
        width = enc["input_ids"].shape[1]
        processors = [RowGuide(index) for _ in prompts]
        constraints, stops = row_rules(
            tok, processors, width, [max_tokens] * len(prompts), [()] * len(prompts)
        )
        with (
            unwrap_model_for_generation(
                trainer.model_wrapped,
                trainer.accelerator,
                generation_kwargs=trainer.generation_kwargs,
            ) as model,
            torch.no_grad(),
        ):
            out = model.generate(
                **enc,
                generation_config=trainer.generation_config,
                logits_processor=LogitsProcessorList([constraints]),
                stopping_criteria=[stops],
            )
        eos = {tok.eos_token_id, tok.pad_token_id}
        prompt_ids, completion_ids = [], []
        for row, mask in zip(out, enc["attention_mask"], strict=True):
            prompt_ids.append(row[:width][mask.bool()].tolist())
            generated = row[width:].tolist()[:max_tokens]
            # Up to and with the first end of sequence, as TRL's own generation keeps it.
            end = next((j for j, t in enumerate(generated) if t in eos), None)
            completion_ids.append(generated if end is None else generated[: end + 1])
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    return rollout


def require_trl_vllm(config: TrainConfig) -> None:
    """GrpoError, before any work, when `use_vllm` meets no vLLM TRL supports."""
    try:
        found = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        found = None
    low, high = TRL_VLLM_RANGE
    assert high is not None
    if found is None or not low <= version_tuple(found) < high:
        raise GrpoError(
            f"{config.where('grpo', 'use_vllm')}: TRL samples with vLLM >= 0.22, < 0.32 in this "
            f"environment; {'none is installed' if found is None else f'it has {found}'}: "
            "pip install -e '.[train-vllm]' (or set grpo.use_vllm: false)"
        )


def vllm_args(
    settings: GrpoSettings, rows: list[dict[str, Any]], tokenizer: Any, template: dict[str, Any]
) -> dict[str, Any]:
    """GRPOConfig's vLLM arguments. Colocated, vLLM's window is the longest training prompt
    plus max_completion_length (rounded up to 256), unless set: unset, it would take the
    model's own (40k tokens for Qwen3), whose KV cache overflows its share of the GPU."""
    args: dict[str, Any] = {
        "use_vllm": settings.use_vllm,
        "vllm_mode": settings.vllm_mode,
        "vllm_server_base_url": settings.vllm_server_base_url,
    }
    if not settings.use_vllm or settings.vllm_mode != "colocate":
        return args
    length = settings.vllm_max_model_length
    if length is None:
        longest = max(
            len(
                tokenizer(
                    tokenizer.apply_chat_template(
                        row["prompt"], add_generation_prompt=True, tokenize=False, **template
                    ),
                    add_special_tokens=False,
                )["input_ids"]
            )
            for row in rows
        )
        length = -(-(longest + settings.max_completion_length) // 256) * 256
    return {
        **args,
        "vllm_gpu_memory_utilization": settings.vllm_gpu_memory_utilization,
        "vllm_max_model_length": length,
    }


def downstream_models(resolved: ResolvedExperiment) -> dict[str, ModelConfig]:
    """The models of every role but the clarifier: what the rollouts call (and `--serve`
    starts; the policy is trained in-process)."""
    roles = resolved.experiment.roles
    return {
        r.model: resolved.model_configs[r.model] for role, r in roles.items() if role != "clarifier"
    }


def grpo(config: TrainConfig, resolved: ResolvedExperiment | None = None) -> GrpoResult:
    """Train the clarifier with GRPO; write OUTPUT_DIR/grpo/ (see the module's doc).
    `resolved`: the scoring experiment pointed at its servers (default: `experiment(config)`)."""
    resolved = resolved or experiment(config)
    rows, instances = prompt_rows(resolved)
    settings = config.grpo
    require_train_extra()
    if settings.use_vllm:
        require_trl_vllm(config)
    from datasets import Dataset
    from transformers.trainer_utils import get_last_checkpoint
    from trl import GRPOConfig, GRPOTrainer

    output = grpo_dir(config)
    trainer_dir, rollouts_path = output / "trainer", output / "rollouts.jsonl"
    last = resume_point(config, get_last_checkpoint)

    key, base = base_model(config)
    template_kwargs = dict(base.chat_template_kwargs)
    dtype, use_cpu, bf16, fp16 = precision(config)
    tokenizer = load_tokenizer(base.resolved_path(), base.revision)
    model, continued = load_policy(base, dtype)
    schema = clarifier.output(config.allow_stop)
    args = GRPOConfig(
        output_dir=str(trainer_dir),
        report_to="none",
        learning_rate=config.learning_rate,
        max_steps=settings.max_steps,
        per_device_train_batch_size=settings.prompts_per_step * settings.num_generations,
        gradient_accumulation_steps=1,
        num_generations=settings.num_generations,
        max_completion_length=settings.max_completion_length,
        temperature=config.temperature,
        top_p=1.0,
        beta=settings.beta,
        seed=config.seed,
        logging_steps=config.logging_steps,
        save_strategy="steps",
        save_steps=settings.save_steps,
        **checkpointing(config.gradient_checkpointing),
        use_cpu=use_cpu,
        bf16=bf16,
        fp16=fp16,
        chat_template_kwargs=template_kwargs or None,
        **vllm_args(settings, rows, tokenizer, template_kwargs),
        vllm_structured_outputs_regex=output_regex(schema) if settings.use_vllm else None,
    )
    reward = PipelineReward(config, resolved, instances, rollouts_path)
    # TRL warns that rollout_func is experimental at every start; pyproject pins the TRL line
    # it is tested against, so the warning says nothing a user can act on.
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=None if continued is not None else lora_config(config),
        rollout_func=None
        if settings.use_vllm
        else constrained_rollouts(schema, template_kwargs, settings.max_completion_length),
    )
    reward.open()
    started = time.perf_counter()
    try:
        result = trainer.train(resume_from_checkpoint=last)
    finally:
        reward.close()
    seconds = time.perf_counter() - started

    adapter_dir, _ = save_weights(trainer, tokenizer, output, config.merge)
    name = f"{key}-{config.name}-grpo-{weights_fingerprint(adapter_dir)}"
    model_config = result_config(config, base, name, output)
    model_config_path = write_model_config(model_config, base, config, output, "grpo")
    metrics = _metrics(config, base, trainer, result, seconds, use_cpu, dtype, reward, last)
    (output / "grpo_metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    return GrpoResult(output, model_config_path, metrics, last)


def _metrics(
    config: TrainConfig,
    base: ModelConfig,
    trainer: Any,
    result: Any,
    seconds: float,
    use_cpu: bool,
    dtype: Any,
    reward: PipelineReward,
    resumed_from: str | None,
) -> dict[str, Any]:
    """grpo_metrics.json: the logged steps (loss, reward, its spread, KL, restore score and
    gain), what failed, the config."""
    log = [
        {k: v for k, v in entry.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        for entry in trainer.state.log_history
        if "loss" in entry
    ]
    return {
        "method": "grpo",
        "base_model": base.resolved_path(),
        "steps": result.global_step,
        "train_loss": result.training_loss,
        "final_loss": log[-1]["loss"] if log else None,
        "resumed_from": resumed_from,
        "rollout_failures": read_rollout_failures(reward.rollouts_path),
        **run_metrics(config, seconds, use_cpu, dtype, log),
    }
