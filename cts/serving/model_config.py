"""Model configs (`cts/configs/models/*.yaml`): one file per checkpoint, and the engine it builds.

Roles name a model config; they never name a checkpoint in code. Swapping the checkpoint of a
role is a one-line edit of the experiment (`roles.clarifier.model: qwen3-8b`) or of the model
file (`path: /scratch/ckpt/step-2000`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cts.foundation.secrets import secret_from_env
from cts.foundation.yaml_config import ConfigError, load_config
from cts.serving.batching import Checkpoint, weights_fingerprint
from cts.serving.cache import CachedEngine, ResponseCache
from cts.serving.engine import ChatModel, Engine
from cts.serving.replicas import Routing

#: `path: tiny:smollm2-135m-instruct` means the converted tiny model (cts/serving/tiny_model.py).
TINY_PREFIX = "tiny:"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SamplingDefaults(_Strict):
    """Per-model defaults; a role's own sampling settings override them."""

    temperature: float = Field(0.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(512, gt=0)
    repetition_penalty: float = Field(1.0, gt=0.0)
    #: Top-k (-1: off); unset, none is sent and a vLLM server applies the checkpoint's
    #: generation config.
    top_k: int | None = Field(None, ge=-1)


class VllmServerArgs(_Strict):
    """How `cts serve` starts this model with `vllm serve` (GPU nodes) or the CPU build."""

    #: Start a server for it (engine `openai` only); false for an endpoint someone else runs.
    serve: bool = True
    #: GPUs it spans; with `gpus` unset, `cts serve` packs it onto that many free GPUs.
    tensor_parallel_size: int = Field(1, ge=1)
    #: Fraction of each of its GPUs' memory it takes; two models at 0.45 can share one GPU.
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    max_model_len: int | None = Field(None, gt=0)
    #: Copies of the server `cts serve` starts, each on GPUs of its own (`auto`: as many as fit
    #: beside the other models); requests of one key stay on one copy (`routing`).
    replicas: Annotated[int, Field(ge=1)] | Literal["auto"] = 1
    #: Fixed port; default a free one.
    port: int | None = Field(None, gt=0, lt=65536)
    #: Explicit GPU ids as CUDA_VISIBLE_DEVICES lists them (overrides the packing).
    gpus: list[int | str] | None = None
    #: Further `vllm serve` flags, e.g. ["--reasoning-parser", "qwen3"] or ["--enable-lora",
    #: "--lora-modules", "clarifier-ft=/ckpt/adapter"].
    extra_args: list[str] = []
    env: dict[str, str] = {}


class ModelConfig(_Strict):
    #: The name the server serves it under (vLLM `--served-model-name`) and requests carry.
    name: str
    #: Local checkpoint directory, hub id, or `tiny:smollm2-135m-instruct`.
    path: str
    #: `lexical`: no model, the judge role's lexical nugget matcher (cts/serving/lexical.py).
    engine: Literal["transformers", "openai", "vllm-offline", "scripted", "lexical"] = (
        "transformers"
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    revision: str | None = None
    #: Passed to the chat template (e.g. `enable_thinking: false` for Qwen3).
    chat_template_kwargs: dict[str, Any] = {}
    sampling: SamplingDefaults = SamplingDefaults()
    # openai engine
    #: Base URL (`http://host:8000/v1`), or a list of the URLs of the model's replicas.
    endpoint: str | list[str] | None = None
    #: With several endpoints: `affinity` keeps each key's requests on one replica, so its
    #: prefix cache stays warm (cts/serving/replicas.py); `round_robin` spreads every request.
    routing: Routing = "affinity"
    #: Name of the environment variable holding the API key (the key itself never goes in YAML).
    api_key_env: str | None = None
    constraint_field: Literal["structured_outputs", "response_format"] = "structured_outputs"
    timeout_s: float = Field(120.0, gt=0)
    max_retries: int = Field(4, ge=0)
    max_concurrency: int = Field(8, ge=1)
    # in-process engines
    #: A LoRA adapter (a peft adapter directory) over `path`: absolute, `~/…`, or relative to
    #: the shipped cts/configs/ folder, where the shipped ones live
    #: (`models/adapters/smollm2-135m-judge`). The transformers engine applies it itself; an
    #: `openai` model with `lora_of` is served by its base's vLLM server.
    adapter: str | None = None
    #: Many fine-tunes on one server: the key of the model config whose vLLM server serves this
    #: model's `adapter` (`--enable-lora --lora-modules NAME=ADAPTER`, NAME this config's
    #: `name`, which requests carry). The base config needs engine `openai` with `vllm.serve`.
    lora_of: str | None = None
    #: Trained on the WebDancer protocol, so that its search turns need no grammar (an
    #: experiment's `search.constrained` decides over it). None: every model but the tiny one,
    #: never trained on it; the tiny model with its searcher adapter sets it true.
    webdancer_trained: bool | None = None
    max_batch_size: int = Field(8, ge=1)
    threads: int | None = None
    vllm: VllmServerArgs = VllmServerArgs()
    # scripted engine (cts/serving/scripted.py): answers by rules, no weights (`path` is ignored)
    #: The built-in rules of one role (`judge`, `clarifier`, ...: `scripted_roles()`).
    script: str | None = None
    #: A JSONL file of `{"text": ..., "contains": ...}` lines: a request gets the text of the
    #: first line whose `contains` occurs in its messages (no `contains`: any request).
    replay: str | None = None
    #: Generated tokens per second one server of this model sustains while a run drives it
    #: (measure it: `bench/pipeline.py`'s pipeline figure, or the server's log during a pilot
    #: on your GPU), for `cts estimate`'s server- and GPU-hours; None: unknown, and it says so.
    throughput_tokens_per_s: float | None = Field(None, gt=0)

    @field_validator("endpoint")
    @classmethod
    def _endpoints_are_urls(cls, value: str | list[str] | None) -> str | list[str] | None:
        from cts.serving.openai_engine import endpoint_problem

        for i, url in enumerate([value] if isinstance(value, str) else value or []):
            problem = endpoint_problem(url)
            if problem is not None:
                raise ValueError(problem if isinstance(value, str) else f"[{i}]: {problem}")
        return value

    @model_validator(mode="after")
    def _scripted_needs_a_script(self) -> ModelConfig:
        if self.engine == "scripted":
            if (self.script is None) == (self.replay is None):
                raise ValueError("engine 'scripted' needs exactly one of `script` and `replay`")
            from cts.serving.scripted import SCRIPTED_ROLES

            if self.script is not None and self.script not in SCRIPTED_ROLES:
                raise ValueError(
                    f"script {self.script!r}: not a scripted role (one of "
                    f"{', '.join(SCRIPTED_ROLES)})"
                )
        elif self.script is not None or self.replay is not None:
            raise ValueError("`script` and `replay` are for engine 'scripted' only")
        return self

    @property
    def needs_weights(self) -> bool:
        """Whether this model runs from weights this machine must have: not a scripted
        engine, not the lexical judge, not an endpoint someone else serves (`engine: openai`,
        `vllm.serve: false`)."""
        return self.engine not in ("scripted", "lexical") and not (
            self.engine == "openai" and (not self.vllm.serve or self.lora_of is not None)
        )

    @model_validator(mode="after")
    def _replicas_are_served(self) -> ModelConfig:
        if isinstance(self.endpoint, list) and not self.endpoint:
            raise ValueError("endpoint: an empty list (give one URL, or each replica's)")
        if self.vllm.replicas != 1 and self.vllm.gpus is not None:
            raise ValueError(
                "vllm.replicas: with vllm.gpus pinning one server's GPUs, copies cannot have "
                "GPUs of their own; leave vllm.gpus unset and `cts serve` packs each copy"
            )
        return self

    @model_validator(mode="after")
    def _adapter_needs_transformers(self) -> ModelConfig:
        if self.lora_of is not None:
            if self.engine != "openai" or self.adapter is None:
                raise ValueError("lora_of: needs engine 'openai' and the `adapter` it serves")
        elif self.adapter is not None and self.engine != "transformers":
            raise ValueError(
                f"adapter: only the transformers engine applies one (engine is {self.engine!r}); "
                "a vLLM server serves one for a config with `lora_of`"
            )
        return self

    def resolved_adapter(self) -> str | None:
        """The adapter's directory (see `adapter`), or None without one; a missing directory
        is a ConfigError naming where it was looked for."""
        if self.adapter is None:
            return None
        from cts.configs import CONFIG_DIR

        path = Path(self.adapter).expanduser()
        if not path.is_absolute():
            path = CONFIG_DIR / path
        if not (path / "adapter_config.json").is_file():
            raise ConfigError(
                f"model {self.name}: adapter {path} has no adapter_config.json (a peft LoRA "
                "adapter's folder; the tiny model's are built by `cts train ROLE`, ROLE one of "
                "judge, answerer, rewriter, searcher)"
            )
        return str(path)

    @property
    def is_tiny(self) -> bool:
        return self.path.startswith(TINY_PREFIX)

    @property
    def knows_webdancer(self) -> bool:
        """Whether its search turns run without the protocol's grammar by default."""
        return not self.is_tiny if self.webdancer_trained is None else self.webdancer_trained

    def checkpoint(self, max_batch_size: int) -> Checkpoint:
        """How an in-process engine loads and prompts this model's weights."""
        return Checkpoint(
            dtype=self.dtype,
            revision=self.revision,
            chat_template_kwargs=self.chat_template_kwargs,
            max_batch_size=max_batch_size,
        )

    def served_settings(self) -> dict[str, Any]:
        """What the server of an `openai` model was started with that changes its answers,
        for the engine's identity in the response cache: the checkpoint (`checkpoint_name`),
        dtype, the LoRA adapter (its folder's fingerprint too: an adapter trained again in
        place is a new one), vLLM's extra flags (a reasoning parser, a chat template). Not the
        endpoint, port, GPUs or replicas: they change where, not what, it answers."""
        adapter = None
        if self.adapter is not None:
            from cts.configs import CONFIG_DIR

            folder = Path(self.adapter).expanduser()
            folder = folder if folder.is_absolute() else CONFIG_DIR / folder
            adapter = f"{self.adapter}@{_fingerprint(str(folder))}"
        return {
            "checkpoint": checkpoint_name(self.path),
            "dtype": self.dtype,
            "adapter": adapter,
            "extra_args": list(self.vllm.extra_args),
        }

    def resolved_path(self) -> str:
        """The checkpoint directory, preparing the tiny model first when this config needs it."""
        if self.is_tiny:
            from cts.serving.tiny_model import TINY_NAME, prepare_tiny

            wanted = self.path.removeprefix(TINY_PREFIX)
            if wanted != TINY_NAME:
                raise ConfigError(f"model {self.name}: unknown tiny model {wanted!r}")
            return str(prepare_tiny())
        return os.path.expanduser(self.path)


#: A Hugging Face cache snapshot (what `cts models download` fetches): models--ORG--NAME/
#: snapshots/<commit>.
_HUB_SNAPSHOT = re.compile(r"models--(?P<repo>[^/]+)/snapshots/[0-9a-f]{40}/?$")


def checkpoint_name(path: str) -> str:
    """The checkpoint at `path` as the response cache tells checkpoints apart: a hub id as
    written; a hub snapshot folder as the hub id it is a copy of (`cts models download`
    rewrites an experiment onto its copies, and their cached answers stay valid: the
    `revision`, when pinned, is in the identity either way); any other local folder by its
    path and the fingerprint of its files, so that a checkpoint trained again in place is a
    new one."""
    snapshot = _HUB_SNAPSHOT.search(path)
    if snapshot is not None:
        return snapshot["repo"].replace("--", "/")
    folder = os.path.expanduser(path)
    return f"{path}@{_fingerprint(folder)}" if Path(folder).is_dir() else path


def _fingerprint(path: str) -> str:
    """`weights_fingerprint(path)`; `path` itself where the folder cannot be read here (the
    server may read what this machine cannot)."""
    try:
        return weights_fingerprint(path)
    except OSError:
        return path


def model_label(ref: str, name: str) -> str:
    """How a role's model reads in directory names, logs and reports: the name roles use
    (`qwen3-8b`), or, for a model given as a path to its YAML, its served name made
    path-safe (`smollm2-135m-instruct-quickstart`)."""
    if ref.endswith((".yaml", ".yml")):
        return name.replace("/", "-")
    return ref


def load_model_config(path: Path, overrides: list[str] | None = None) -> ModelConfig:
    return load_config(ModelConfig, path, overrides or []).config


def openai_endpoint(config: ModelConfig) -> str | list[str]:
    """Where an `openai` model is reached: its `endpoint`, else CTS_OPENAI_BASE_URL (checked
    as `endpoint` is; a ConfigError names the variable, never its credentials)."""
    if config.endpoint:
        return config.endpoint
    endpoint = os.environ.get("CTS_OPENAI_BASE_URL")
    if not endpoint:
        raise ConfigError(
            f"model {config.name}: engine 'openai' needs `endpoint` (e.g. "
            "http://127.0.0.1:8000/v1) or CTS_OPENAI_BASE_URL"
        )
    from cts.serving.openai_engine import endpoint_problem

    problem = endpoint_problem(endpoint)
    if problem is not None:
        raise ConfigError(f"model {config.name}: CTS_OPENAI_BASE_URL: {problem}")
    return endpoint


def check_api_keys(models: Mapping[str, ModelConfig]) -> None:
    """A ConfigError naming the model key and its `api_key_env` for the first `openai` model
    whose key variable is unset (or blank); what opening its engine would refuse, checked
    before a run writes anything."""
    for key, config in models.items():
        if config.engine != "openai" or not config.api_key_env:
            continue
        if not secret_from_env(config.api_key_env):
            raise ConfigError(
                f"model {key}: api_key_env names {config.api_key_env}, which is not set "
                "(export it, or leave api_key_env out for a server that takes no key)"
            )


def build_engine(config: ModelConfig, cache: ResponseCache | None = None) -> ChatModel:
    """The engine a model config asks for, behind the response cache when one is given."""
    engine: Engine
    if config.engine == "transformers":
        from cts.serving.transformers_engine import TransformersEngine

        engine = TransformersEngine(
            config.name,
            config.resolved_path(),
            **config.checkpoint(config.max_batch_size),
            threads=config.threads,
            adapter=config.resolved_adapter(),
        )
    elif config.engine == "openai":
        from cts.serving.openai_engine import OpenAIEngine

        engine = OpenAIEngine(
            config.name,
            openai_endpoint(config),
            api_key_env=config.api_key_env,
            max_concurrency=config.max_concurrency,
            timeout_s=config.timeout_s,
            max_retries=config.max_retries,
            constraint_field=config.constraint_field,
            chat_template_kwargs=config.chat_template_kwargs,
            revision=config.revision,
            routing=config.routing,
            served_as=config.served_settings(),
        )
    elif config.engine == "lexical":
        from cts.serving.lexical import LexicalEngine

        engine = LexicalEngine(config.name)
    elif config.engine == "scripted":
        from cts.serving.scripted import scripted_engine

        engine = scripted_engine(config.name, script=config.script, replay=config.replay)
    else:
        from cts.serving.vllm_offline_engine import VllmOfflineEngine

        llm_kwargs: dict[str, Any] = {
            "tensor_parallel_size": config.vllm.tensor_parallel_size,
            "gpu_memory_utilization": config.vllm.gpu_memory_utilization,
        }
        if config.vllm.max_model_len:
            llm_kwargs["max_model_len"] = config.vllm.max_model_len
        engine = VllmOfflineEngine(
            config.name,
            config.resolved_path(),
            **config.checkpoint(max(config.max_batch_size, 64)),
            llm_kwargs=llm_kwargs,
        )
    return CachedEngine(engine, cache) if cache is not None else engine
