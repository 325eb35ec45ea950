"""Whether runs may be compared as clarifier systems (docs/reading-the-report.md, "Systems").

A difference between two runs' scores is the clarifier's only when everything else that makes
a record is the same: the User Answerer, the rewriter, the searcher and its summarizer (model,
sampling, prompt), the search backend, corpus and budgets, the judge and its options, the golden
nuggets and the queries. What belongs to the clarifier may differ — its model, sampling and
prompt, the clarification mode and whether it may stop — and so may what cannot change a record
or only selects keys (seeds, conditions, `dataset.limit`; pairing handles the instances), the
question-type classifier (a diagnostic, never a score) and golden construction's settings (the
nuggets themselves are compared). Runs that differ by judge answer another question: how far
two judges agree (`cts judge agreement`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cts.eval.data.schema import Instance
from cts.eval.run.config import ResolvedExperiment
from cts.eval.run.config_sections import Role
from cts.eval.run.fingerprint import CODE_KEY, PROMPT_KEY, model_content, model_view

#: The roles whose difference is not the clarifier's (each compared by model config, as
#: records depend on it, and by the sampling it sends).
OTHER_ROLES: tuple[Role, ...] = ("user_answerer", "rewriter", "searcher", "summarizer", "judge")
#: Experiment sections compared key by key, less the keys that cannot change a record.
SECTIONS: dict[str, tuple[str, ...]] = {
    # The canary is a diagnostic beside the labels: it changes no label nor score.
    "judge": ("canary",),
    "search": ("tool_cache", "offline", "price_per_call", "price_per_visit"),
    "budgets": (),
}
#: The User Answerer's options (the rest of `clarification:` is the clarifier's or a diagnostic).
ANSWERER_OPTIONS = ("answerer", "answer_span")
#: Prompts no difference of which is another setup: the clarifier's own, the question-type
#: classifier's (a diagnostic) and golden construction's (the nuggets are compared instead).
FREE_PROMPTS = frozenset(
    f"{PROMPT_KEY}agents/{name}"
    for name in (
        "clarifier.yaml",
        "clarifier_all_at_once.yaml",
        "question_classifier.yaml",
        "nugget_builder.yaml",
    )
)
#: The prompts only some runs send: the clarify@k roles' (a run without clarify@k sends none)
#: and the judge's (the lexical judge sends no prompt). A run that does not send one has no
#: such key in its setup, so that a difference in it is not compared.
ROLE_PROMPTS: dict[str, Role] = {
    f"{PROMPT_KEY}agents/user_answerer.yaml": "user_answerer",
    f"{PROMPT_KEY}agents/user_answerer_abstractive.yaml": "user_answerer",
    f"{PROMPT_KEY}agents/rewriter.yaml": "rewriter",
    f"{PROMPT_KEY}agents/judge.yaml": "judge",
}
#: The setup key of where a run's final answers come from (`answers_of`): two runs holding the
#: same answers are not two clarifier systems.
ANSWERS = "answers"


class IncomparableRuns(ValueError):
    """Runs given as clarifier systems that differ beyond the clarifier."""


def _flat(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict) and value:
        found: dict[str, Any] = {}
        for key, child in value.items():
            found.update(_flat(child, f"{prefix}.{key}"))
        return found
    return {prefix: value}


def _digest(rows: Any) -> str:
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]


def _data(instances: Sequence[Instance]) -> dict[str, str]:
    """The queries and the golden nuggets (what scores them), each as one digest."""
    queries = [
        [i.id, i.blurred_query, i.fused_query, i.language, list(i.removed_constraints)]
        for i in instances
    ]
    nuggets = [
        [i.id, [[n.id, n.text, n.weight] for n in (i.golden.nuggets if i.golden else [])]]
        for i in instances
    ]
    return {"dataset (queries)": _digest(queries), "golden nuggets": _digest(nuggets)}


def _content(fingerprint: dict[str, str], role: str, ref: str) -> dict[str, str]:
    """The digests of what the role's model is made of locally (a replay file, an adapter or
    checkpoint folder: `fingerprint.model_prints`), so that one trained again in place under
    the same config is another setup. Named outside `<role>.model.`, so that a run written
    before these digests compares on the rest alone."""
    content = model_content(fingerprint, ref)
    return {f"{role} model content ({part})": digest for part, digest in content.items()}


def setup_of(
    resolved: ResolvedExperiment,
    fingerprint: dict[str, str],
    instances: Sequence[Instance] | None,
    answers: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything but the clarifier that a run's records depend on, as readable dotted keys:
    with the digests of the code that made them (`code:agents`, …). `instances` is the whole
    dataset (None: it does not load, and its fingerprint stands in); `answers`, where its final
    answers come from: `{of: digest, rejudge: bool}`, `of` the digest of what the records of
    the run that made them depend on (for a rejudge, its source's)."""
    experiment = resolved.experiment
    setup: dict[str, Any] = {}
    for role in OTHER_ROLES:
        if role not in experiment.roles:
            continue
        # The model's sampling defaults are compared as the sampling the role sends.
        model = resolved.model_for(role).model_dump(
            mode="json", exclude_none=True, exclude={"sampling"}
        )
        setup.update(_flat(model_view(model), f"{role}.model"))
        setup.update(_flat(resolved.sampling_for(role).model_dump(mode="json"), f"{role}.sampling"))
        setup.update(_content(fingerprint, role, experiment.roles[role].model))
    document = experiment.model_dump(mode="json")
    for section, free in SECTIONS.items():
        kept = {k: v for k, v in document[section].items() if k not in free}
        setup.update(_flat(kept, section))
    for option in ANSWERER_OPTIONS:
        setup.update(_flat(document["clarification"][option], f"user_answerer.{option}"))
    if instances is not None:
        setup.update(_data(instances))
    else:
        # Not verifiable: equal only to a run whose dataset did not load either, with the same
        # fingerprint (a digest of every instance as loaded).
        unknown = f"not loaded (fingerprint {fingerprint.get('dataset', 'none')[:16]})"
        setup.update(dict.fromkeys(_data([]), unknown))
    if "corpus" in fingerprint:
        setup["corpus (content)"] = fingerprint["corpus"]
    prompts = {k: v for k, v in fingerprint.items() if k.startswith(PROMPT_KEY)}
    if prompts:
        sent = _sending(resolved)
        setup.update(
            {
                k: v
                for k, v in prompts.items()
                if k not in FREE_PROMPTS and ROLE_PROMPTS.get(k, "searcher") in sent
            }
        )
    elif "prompts" in fingerprint:
        # Written before each prompt file had its digest: which role's differs is not known.
        setup["prompts (some role's; not recorded which)"] = fingerprint["prompts"]
    setup.update({k: v for k, v in fingerprint.items() if k.startswith(CODE_KEY)})
    if answers is not None:
        setup[ANSWERS] = answers
    return setup


def _sending(resolved: ResolvedExperiment) -> set[Role]:
    """The roles whose prompts the run's records were made with."""
    experiment = resolved.experiment
    roles = set(experiment.roles)
    if not any(str(c).startswith("clarify@") for c in experiment.conditions):
        roles -= {"clarifier", "user_answerer", "rewriter"}
    if "judge" in roles and resolved.model_for("judge").engine == "lexical":
        roles.discard("judge")
    return roles


#: How a key one side lacks reads in a difference (as `cts run`'s resume check writes it).
UNSET = "(unset)"


def _roles(setup: dict[str, Any]) -> set[str]:
    return {role for role in OTHER_ROLES if any(k.startswith(f"{role}.model.") for k in setup)}


def _role_keys(setup: dict[str, Any], roles: set[str]) -> set[str]:
    prefixes = tuple(f"{role}.{part}." for role in roles for part in ("model", "sampling"))
    return {k for k in setup if k.startswith(prefixes)}


def _value(setup: dict[str, Any], key: str) -> Any:
    # A model config dumps without its unset keys, and an empty mapping (no chat-template
    # kwargs) is one key where a filled one is others: both read as unset.
    value = setup.get(key, UNSET)
    return UNSET if value == {} else value


def differences(first: dict[str, Any], second: dict[str, Any]) -> list[str]:
    """`key: first → second` for each key of two setups that differs. A role both runs have is
    compared over the union of its model and sampling keys, a key one side lacks read as unset
    (a LoRA adapter only one searcher has). A key only one side has otherwise is not compared:
    a role the other run lacks (its conditions are not compared), a prompt digest written by
    one version only."""
    roles = _roles(first) & _roles(second)
    keys = (set(first) & set(second)) | _role_keys(first, roles) | _role_keys(second, roles)
    keys.discard(ANSWERS)  # compared the other way round: by `unlike_pairs`
    lines = []
    for key in sorted(keys):
        before, after = _value(first, key), _value(second, key)
        if before != after:
            lines.append(f"{key}: {json.dumps(before)} → {json.dumps(after)}")
    return lines


def parts(lines: Sequence[str]) -> list[str]:
    """What the `differences` lines are about, each named once: `judge`, `search`, `golden
    nuggets`, `prompt:agents/judge.yaml`."""
    keys = [line.split(": ", 1)[0] for line in lines]
    named = [k if k.startswith(PROMPT_KEY) or "." not in k else k.split(".")[0] for k in keys]
    return list(dict.fromkeys(named))


@dataclass(frozen=True)
class Unlike:
    """Two runs of a report that differ beyond the clarifier."""

    first: str
    second: str
    differences: list[str]

    @property
    def judge_differs(self) -> bool:
        return any(
            d.startswith(("judge.", f"{CODE_KEY}judge", SAME_ANSWERS)) for d in self.differences
        )

    def as_dict(self) -> dict[str, Any]:
        return {"a": self.first, "b": self.second, "differences": self.differences}


#: The difference of two runs whose final answers are the same ones (a run and its rejudge,
#: two rejudges of one run): whatever their judges, one clarifier's answers judged twice.
SAME_ANSWERS = (
    "answers: the same final answers (a run and its rejudge, or two rejudges of one run): one "
    "clarifier's answers judged twice, not two clarifier systems"
)


def _same_answers(x: Any, y: Any) -> bool:
    """Whether two runs' `answers` ({of, rejudge}) are the same answers: one of them a rejudge
    whose source is the other, or two rejudges of one source. Two runs that made their own
    answers never are, whatever their configs."""
    if not (isinstance(x, dict) and isinstance(y, dict)):
        return False
    return (bool(x.get("rejudge")) or bool(y.get("rejudge"))) and x.get("of") == y.get("of")


def unlike_pairs(setups: Sequence[tuple[str, dict[str, Any]]]) -> list[Unlike]:
    """Every pair of runs (name, setup) that differs beyond the clarifier, or that holds the
    same answers, in report order."""
    found = []
    for a in range(len(setups)):
        for b in range(a + 1, len(setups)):
            (first, x), (second, y) = setups[a], setups[b]
            differ = differences(x, y)
            if _same_answers(x.get(ANSWERS), y.get(ANSWERS)):
                differ.insert(0, SAME_ANSWERS)
            if differ:
                found.append(Unlike(first, second, differ))
    return found


def refusal(unlike: Sequence[Unlike], run_dirs: Sequence[str]) -> IncomparableRuns:
    """The error that refuses such a report: each pair with what differs, and where to go."""
    lines = ["these runs differ beyond the clarifier, so they are not compared as clarifier "]
    lines[0] += "systems (a difference would not be the clarifier's):"
    for pair in unlike:
        lines.append(f"  {pair.first} vs {pair.second}:")
        lines += [f"    {d}" for d in pair.differences]
    if any(pair.judge_differs for pair in unlike):
        lines.append(
            "runs that differ by judge, or hold the same answers, are compared by how far their "
            "judges agree: "
            f"`cts judge agreement {' '.join(run_dirs)}`"
        )
    lines.append("to show the comparison anyway, with a warning on every row: --allow-unlike")
    return IncomparableRuns("\n".join(lines))
