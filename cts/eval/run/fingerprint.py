"""What a run directory's records depend on, so that a resumed run cannot mix two experiments.

A record is the product of the models and their sampling, the prompts, the search tools and
budgets, the corpus's and the dataset's content, the clarification options and the judge.
Resuming a run with any of these changed would add records of another experiment under the old
ones, and overwrite the config that labels them. What cannot change a record may differ between
starts: where files go, how fast it runs, how a model is reached, and how many instances,
conditions and seeds the run covers (extending a run is resuming it)."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from cts.eval.data.schema import Instance
from cts.foundation.yaml_config import ConfigError
from cts.serving.model_config import ModelConfig

#: Experiment keys a resumed run may change.
FREE_EXPERIMENT_KEYS: tuple[tuple[str, ...], ...] = (
    ("name",),
    ("description",),
    # Inline model overrides: compared as the resolved model configs below.
    ("models",),
    ("concurrency",),
    ("key_order",),
    ("output_dir",),
    ("cache",),
    ("report",),
    # A diagnostic beside the labels: it changes no label nor score.
    ("judge", "canary"),
    ("search", "tool_cache"),
    ("search", "offline"),
    ("search", "price_per_call"),
    ("search", "price_per_visit"),
    ("dataset", "limit"),
    ("conditions",),
    ("seeds",),
)
#: Model-config keys a resumed run may change: how the model is reached and served.
FREE_MODEL_KEYS: tuple[tuple[str, ...], ...] = (
    ("endpoint",),
    ("api_key_env",),
    ("timeout_s",),
    ("max_retries",),
    ("max_concurrency",),
    ("max_batch_size",),
    ("threads",),
    ("vllm", "serve"),
    ("vllm", "tensor_parallel_size"),
    ("vllm", "gpu_memory_utilization"),
    ("vllm", "port"),
    ("vllm", "gpus"),
    ("vllm", "env"),
    ("throughput_tokens_per_s",),
)


def _leaves(value: Any, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    if isinstance(value, dict) and value:
        found: dict[tuple[str, ...], Any] = {}
        for key, child in value.items():
            found.update(_leaves(child, (*prefix, str(key))))
        return found
    return {prefix: value}


def _bound(leaves: dict[tuple[str, ...], Any], free: Sequence[tuple[str, ...]]) -> dict[str, Any]:
    return {
        ".".join(key): value
        for key, value in leaves.items()
        if not any(key[: len(f)] == f for f in free)
    }


def bound_view(document: dict[str, Any], free: Sequence[tuple[str, ...]]) -> dict[str, Any]:
    """The dotted keys of `document` outside `free`, with their values (for `changes`)."""
    return _bound(_leaves(document), free)


def results_view(document: dict[str, Any]) -> dict[str, Any]:
    """The dotted keys of a run's config.yaml document that its records depend on."""
    view = _bound(_leaves(document.get("experiment", {})), FREE_EXPERIMENT_KEYS)
    for ref, model in (document.get("models") or {}).items():
        for key, value in _bound(_leaves(model), FREE_MODEL_KEYS).items():
            view[f"models.{ref}.{key}"] = value
    for key, value in (document.get("fingerprint") or {}).items():
        view[f"fingerprint.{key}"] = value
    return view


def results_digest(document: dict[str, Any]) -> str:
    """What a run's records depend on (its config.yaml document's `results_view`), hashed: a
    rejudge keeps its source's as `fingerprint.source`."""
    view = json.dumps(results_view(document), sort_keys=True, default=str)
    return hashlib.sha256(view.encode()).hexdigest()


#: `judge:` options that do not make another judge: a diagnostic beside the labels, and
#: whether requests run one by one (the same model reading the same prompts).
NOT_THE_JUDGE = ("canary", "deterministic")


#: The prompt files the judge role is sent (cts/agents/judge.py renders `judge` only, its canary
#: too), as `fingerprint` keys them.
JUDGE_PROMPTS = ("agents/judge.yaml",)


def judge_prompts(prints: dict[str, Any]) -> Any:
    """What the judge's labels depend on among a run's prompt digests: the judge's own prompt
    files, so that an edit to another role's prompt (which a rejudge does not even send) keeps
    the judge the same. A config.yaml written before one digest per file has only the digest of
    every prompt: then that, which tells one judge from another only when no prompt changed."""
    keys = [f"{PROMPT_KEY}{name}" for name in JUDGE_PROMPTS]
    if any(key in prints for key in keys):
        return {key: prints.get(key) for key in keys}
    return prints.get("prompts")


def judge_setup(document: dict[str, Any]) -> str | None:
    """A digest of the judge a run's labels come from: its model config (less how the model is
    reached and served), its role's sampling, the `judge:` options but NOT_THE_JUDGE, and its
    prompts (`judge_prompts`). Two runs with one digest had the same judge, whatever the model's
    name in each; None when the config names no judge."""
    experiment = document.get("experiment") or {}
    role = (experiment.get("roles") or {}).get("judge")
    if not role:
        return None
    model = (document.get("models") or {}).get(str(role.get("model"))) or {}
    options = {k: v for k, v in (experiment.get("judge") or {}).items() if k not in NOT_THE_JUDGE}
    view = {
        "model": _bound(_leaves(model), FREE_MODEL_KEYS),
        "sampling": role.get("sampling"),
        "options": options,
        "prompts": judge_prompts(document.get("fingerprint") or {}),
    }
    judge_code = (document.get("fingerprint") or {}).get(f"{CODE_KEY}judge")
    if judge_code:  # recorded since runs keep their code's digest: its rules changed, or not
        view["code"] = judge_code
    content = model_content(document.get("fingerprint") or {}, str(role.get("model")))
    if content:  # a judge adapter or replay file trained or edited in place is another judge
        view["content"] = content
    return hashlib.sha256(json.dumps(view, sort_keys=True, default=str).encode()).hexdigest()


#: Fingerprint keys compared even when one side lacks them: a rejudge's source digest, which
#: an ordinary run never has (one side only: a rejudge against an ordinary run).
ALWAYS_COMPARED = frozenset({"fingerprint.source"})


def changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """`key: old → new` for each key the records depend on that differs. A fingerprint only
    one side has (a config.yaml written before fingerprints, or before one digest per prompt
    file) cannot be compared: it is skipped, but for ALWAYS_COMPARED."""
    lines = []
    for key in sorted(set(old) | set(new)):
        one_side = key not in old or key not in new
        if key.startswith("fingerprint.") and one_side and key not in ALWAYS_COMPARED:
            continue
        before, after = old.get(key, "(unset)"), new.get(key, "(unset)")
        if before != after:
            lines.append(f"{key}: {json.dumps(before)} → {json.dumps(after)}")
    return lines


def dataset_digest(instances: Sequence[Instance]) -> str:
    """Every instance as loaded (queries, gold nuggets, ids): an edited dataset file, or a gold
    table that joins differently, changes it."""
    h = hashlib.sha256()
    for instance in instances:
        h.update(json.dumps(instance.model_dump(mode="json"), sort_keys=True).encode())
        h.update(b"\n")
    return h.hexdigest()


#: Prompts no record is made with (the audit of the gold, building a benchmark's queries):
#: adding or editing one must not make every earlier run directory refuse to resume.
NOT_IN_RECORDS = frozenset({"grounding.yaml", "fuser.yaml", "blurrer.yaml", "question_check.yaml"})


def _prompt_files() -> list[tuple[str, bytes]]:
    """(package/file, text) of every prompt a record is made with, as this version ships them."""
    found = []
    for package in ("agents", "webdancer"):
        folder = resources.files(f"cts.{package}").joinpath("prompts")
        for entry in sorted(folder.iterdir(), key=lambda e: e.name):
            if entry.is_file() and entry.name not in NOT_IN_RECORDS:
                found.append((f"{package}/{entry.name}", entry.read_bytes()))
    return found


def prompts_digest() -> str:
    """The text of every role's prompt and of the search agent's, as this version ships them."""
    h = hashlib.sha256()
    for name, text in _prompt_files():
        h.update(name.split("/", 1)[1].encode() + b"\0" + text + b"\0")
    return h.hexdigest()


#: Fingerprint keys of one prompt file each (`prompt:agents/judge.yaml`): which role's prompt
#: two runs differ by (cts/eval/report/comparability.py), where `prompts` only says that one does.
PROMPT_KEY = "prompt:"


#: Fingerprint keys of the code that makes a record (`code:agents`), one per part: which code
#: two runs differ by, so that a change of rules (the lexical judge's, say) is never read as
#: the clarifier's difference, nor mixed into a resumed run's records.
CODE_KEY = "code:"
#: The source folders whose Python makes a record: the roles, the engines, the search agent,
#: the data as loaded, the pipeline that runs a key, and the scores.
CODE_PARTS = ("agents", "serving", "webdancer", "eval/data", "eval/run", "eval/score")
#: Of those, the files a judge's labels come from: the judge setup digests them
#: (`judge_setup`), so that a rejudge under changed judge code is another judge.
JUDGE_CODE = (
    "agents/judge.py",
    "agents/lexical_judge.py",
    "agents/prompts.py",
    "serving/lexical.py",
)
_ROOT = Path(__file__).resolve().parents[2]


def _source_digest(files: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for path in files:
        h.update(path.relative_to(_ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@functools.cache
def code_digests() -> dict[str, str]:
    """`code:<part>`: a digest of every Python file of each part as it is on disk now (an
    edited checkout included, whatever git says), `code:judge` of JUDGE_CODE, and
    `code:version`, the installed distribution's version."""
    found = {
        f"{CODE_KEY}{part}": _source_digest(sorted((_ROOT / part).rglob("*.py")))
        for part in CODE_PARTS
    }
    found[f"{CODE_KEY}judge"] = _source_digest([_ROOT / name for name in JUDGE_CODE])
    try:
        found[f"{CODE_KEY}version"] = metadata.version("clarify-then-search")
    except metadata.PackageNotFoundError:  # run from a checkout that is not installed
        found[f"{CODE_KEY}version"] = "not installed"
    return found


def fingerprint(instances: Sequence[Instance], corpus: str | None = None) -> dict[str, str]:
    """What config.yaml keeps beside the config itself (compared key by key); `corpus`: the
    digest of the corpus the tools read (an edited corpus changes every search), if any."""
    files = {
        f"{PROMPT_KEY}{name}": hashlib.sha256(text).hexdigest() for name, text in _prompt_files()
    }
    prints = {
        "dataset": dataset_digest(instances),
        "prompts": prompts_digest(),
        **files,
        **code_digests(),
    }
    if corpus is not None:
        prints["corpus"] = corpus
    return prints


def model_view(model: dict[str, Any]) -> dict[str, Any]:
    """The dotted keys of one model config (as config.yaml holds it) that records depend on."""
    return _bound(_leaves(model), FREE_MODEL_KEYS)


#: Fingerprint keys of what a model config names by path (`model:judge-ft:adapter`): a replay
#: file edited, or an adapter or checkpoint retrained in place, is another model under the
#: same config.
MODEL_KEY = "model:"

#: The files of a checkpoint or adapter folder that make the model (as the response cache's
#: cts/serving/batching.weights_fingerprint lists them).
_MODEL_FILES = frozenset({".json", ".safetensors", ".bin", ".jinja", ".model"})

#: Bytes read at each end of a model file: its weights are never read whole (gigabytes), yet a
#: retrained adapter, whose files keep their names and sizes, differs within them.
_ENDS = 256 * 1024


def _file_ends(path: Path) -> str:
    """A file's size and a digest of its first and last `_ENDS` bytes (all of a small one)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        size = f.seek(0, 2)
        f.seek(0)
        h.update(f.read(_ENDS))
        if size > _ENDS:
            f.seek(max(_ENDS, size - _ENDS))
            h.update(f.read(_ENDS))
    return f"{size}:{h.hexdigest()}"


def _folder_digest(root: Path) -> str:
    """The model files of a checkpoint or adapter folder: names, sizes and ends (never
    modification times: a copy of the same weights is the same model)."""
    h = hashlib.sha256()
    for path in sorted(root.iterdir()):
        if path.suffix in _MODEL_FILES and path.is_file():
            h.update(f"{path.name}:{_file_ends(path)}\n".encode())
    return h.hexdigest()


def _local_files(model: ModelConfig) -> dict[str, Path]:
    """What `model` reads from this machine's disk: its replay file, its checkpoint folder,
    its adapter. A hub id, an endpoint's model, the tiny model (built from its pinned spec)
    and what is not here have none."""
    if model.engine == "scripted":
        replay = Path(model.replay).expanduser() if model.replay else None
        return {"replay": replay} if replay is not None and replay.is_file() else {}
    found: dict[str, Path] = {}
    checkpoint = Path(model.path).expanduser()
    if model.engine != "lexical" and not model.is_tiny and checkpoint.is_dir():
        found["path"] = checkpoint
    try:
        adapter = model.resolved_adapter()
    except ConfigError:
        adapter = None  # not on this machine: nothing to compare (a run refuses it itself)
    if adapter is not None:
        found["adapter"] = Path(adapter)
    return found


def _local_content(model: ModelConfig) -> dict[str, str]:
    """A digest of each of `_local_files`: a replay file's content; a folder's model files
    (`_folder_digest`). One this process may not read has none (nothing to compare)."""
    found: dict[str, str] = {}
    for part, path in _local_files(model).items():
        try:
            found[part] = (
                _folder_digest(path)
                if path.is_dir()
                else hashlib.sha256(path.read_bytes()).hexdigest()
            )
        except OSError:
            continue
    return found


def model_content(prints: Mapping[str, str], ref: str) -> dict[str, str]:
    """`part` → digest of model `ref`'s local content, as `model_prints` keyed it in a run's
    fingerprint (empty for a run written before them, or a model with no local content)."""
    prefix = f"{MODEL_KEY}{ref}:"
    return {key[len(prefix) :]: digest for key, digest in prints.items() if key.startswith(prefix)}


def model_prints(models: Mapping[str, ModelConfig]) -> dict[str, str]:
    """`model:<ref>:<part>` → digest of each model's local content (`_local_content`), compared
    on resume as every fingerprint is; a config.yaml written before them resumes (`changes`
    skips a fingerprint one side lacks)."""
    return {
        f"{MODEL_KEY}{ref}:{part}": digest
        for ref, model in models.items()
        for part, digest in _local_content(model).items()
    }
