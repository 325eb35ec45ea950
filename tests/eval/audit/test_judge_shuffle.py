"""`judge.shuffle` and `judge.batch_size`: the nugget order a record's key fixes, the labels
that still land on their nuggets, and the limit of 10 nuggets per judge call."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cts.agents import judge
from cts.eval.data.dataset import DatasetSource, corpus_path, load_instances
from cts.eval.data.schema import Instance, Nugget
from cts.eval.run.config import load_experiment
from cts.eval.run.config_sections import JudgeConfig
from cts.eval.run.fingerprint import changes, results_view
from cts.eval.run.pipeline import PipelineContext, _judge, judge_order, run_instance
from cts.eval.run.run_dir import RunDir
from cts.foundation.yaml_config import ConfigError
from cts.serving.scripted import ScriptedEngine
from cts.serving.types import ChatRequest, Sampling
from cts.webdancer.backends.local import LocalSearch
from tests.scripted import scripted_context

ROOT = Path(__file__).resolve().parents[3]

NUGGETS = [Nugget(id=f"n{k}", text=f"Fact number {k}.", weight=3 - k % 3) for k in range(1, 8)]
#: What the content-reading judge below answers for a nugget of weight w.
BY_WEIGHT = {3: "full", 2: "partial", 1: "none"}


def _order(key: tuple[str, str, int]) -> list[str]:
    return [n.id for n in judge_order(NUGGETS, key)]


def test_the_same_key_gives_the_same_order_in_other_processes():
    """The order must not depend on Python's per-process hash seed, or a resumed run, another
    shard or a rejudge would show the nuggets differently."""
    keys = [("A-dev-01", "clarify@2", 0), ("B-dev-05", "blurred", 3)]
    here = [_order(k) for k in keys]
    code = (
        "import json, sys; from tests.eval.audit.test_judge_shuffle import _order; "
        "print(json.dumps([_order(tuple(k)) for k in json.loads(sys.argv[1])]))"
    )
    for hash_seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code, json.dumps(keys)],
            cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert json.loads(out) == here


def test_different_keys_give_different_orders():
    keys = [
        (instance, condition, seed)
        for instance in ("A-dev-01", "A-dev-02")
        for condition in ("blurred", "clarify@1", "oracle")
        for seed in (0, 1, 2)
    ]
    orders = [_order(k) for k in keys]
    for order in orders:
        assert sorted(order) == sorted(n.id for n in NUGGETS)  # a permutation, nothing lost
    # 18 keys over 7! = 5040 orders: each key its own (fixed, so this cannot flake).
    assert len({tuple(o) for o in orders}) == len(keys)
    assert sum(o != [n.id for n in NUGGETS] for o in orders) == len(keys)
    # One field of the key is enough to change it.
    assert _order(("A-dev-01", "blurred", 0)) != _order(("A-dev-01", "blurred", 1))
    assert _order(("A-dev-01", "blurred", 0)) != _order(("A-dev-01", "oracle", 0))


def _reads_content(shown: list[list[str]]):
    """A judge that labels each nugget by its text (the nugget's weight decides), whatever
    place or id it is given; `shown` collects each batch's ids in the order listed."""
    weight_of = {n.text: n.weight for n in NUGGETS}

    def script(request: ChatRequest) -> str:
        lines = request.messages[-1].content.split("Nuggets:\n", 1)[1].split("\n")
        listed = [line.split(": ", 1) for line in lines]
        shown.append([i for i, _ in listed])
        return json.dumps(
            {i: {"evidence": t[:20], "label": BY_WEIGHT[int(weight_of[t])]} for i, t in listed}
        )

    return script


def _context(engine: ScriptedEngine, options: JudgeConfig) -> PipelineContext:
    # The judge stage reads only the judge's engine, sampling and options.
    return PipelineContext(
        roles={"judge": engine},
        agent=None,  # type: ignore[arg-type]
        sampling={"judge": Sampling(max_tokens=64)},
        clarification=None,  # type: ignore[arg-type]
        judge=options,
    )


INSTANCE = Instance(id="i1", blurred_query="q", fused_query="q*")


@pytest.mark.parametrize("batch_size", [10, 3])
def test_shuffled_labels_land_on_their_nuggets(batch_size):
    shown: list[list[str]] = []
    engine = ScriptedEngine(_reads_content(shown), name="judge")
    key = ("i1", "clarify@1", 0)
    ctx = _context(engine, JudgeConfig(shuffle=True, batch_size=batch_size))
    labels, scores = asyncio.run(_judge(INSTANCE, NUGGETS, "an answer", ctx, key))
    # Shown in the key's order, cut into batches of batch_size.
    order = _order(key)
    assert order != [n.id for n in NUGGETS]
    assert [i for batch in shown for i in batch] == order
    assert [len(b) for b in shown] == [
        len(order[i : i + batch_size]) for i in range(0, 7, batch_size)
    ]
    # Each label is its own nugget's (by weight), and says where it was shown.
    for nugget in NUGGETS:
        assert labels[nugget.id]["label"] == BY_WEIGHT[int(nugget.weight)]
        assert labels[nugget.id]["position"] == str(order.index(nugget.id) + 1)
    # Weights 2, 1, 3, 2, 1, 3, 2 → full 2·3, partial 3·2·0.5: (6 + 3) / 14.
    assert scores["restore_score_100"] == pytest.approx(100 * 9 / 14)
    # Unshuffled: the gold's order, and labels as records always held them.
    shown.clear()
    plain, _ = asyncio.run(
        _judge(INSTANCE, NUGGETS, "an answer", _context(engine, JudgeConfig()), key)
    )
    assert [i for batch in shown for i in batch] == [n.id for n in NUGGETS]
    assert all(set(v) == {"label", "evidence"} for v in plain.values())
    assert {i: v["label"] for i, v in plain.items()} == {i: v["label"] for i, v in labels.items()}


def test_the_pipeline_orders_by_the_records_key(tmp_path):
    """Through run_instance: the judge call gets the record's own key."""
    search = LocalSearch(corpus_path("sample"), tmp_path / "index")
    ctx, roles = scripted_context(search)
    ctx.judge = JudgeConfig(shuffle=True)
    instance = load_instances(DatasetSource(path="sample", split="dev", limit=1))[0]
    nuggets = instance.golden.nuggets  # type: ignore[union-attr]
    for condition, seed in (("blurred", 0), ("oracle", 2)):
        roles["judge"].requests.clear()
        record = asyncio.run(run_instance(instance, condition, seed, ctx))
        assert record.error is None, record.error
        expected = [n.id for n in judge_order(nuggets, (instance.id, condition, seed))]
        (request,) = roles["judge"].requests
        assert request.output.json_schema["required"] == expected  # type: ignore[union-attr]
        listed = re.findall(r"^(n\d+): ", request.messages[-1].content, re.M)
        assert listed == expected
        positions = {i: int(v["position"]) for i, v in record.labels.items()}
        assert sorted(positions, key=positions.__getitem__) == expected


def test_batch_size_is_at_most_ten(tmp_path):
    assert load_experiment(None, ["judge.batch_size=10"]).experiment.judge.batch_size == 10
    for bad in (11, 0):
        with pytest.raises(ConfigError, match=r"^--set judge\.batch_size: "):
            load_experiment(None, [f"judge.batch_size={bad}"])
    config = tmp_path / "experiments" / "big.yaml"
    config.parent.mkdir()
    config.write_text(
        "name: big\nroles:\n  judge: {model: smollm2-135m-instruct}\njudge:\n  batch_size: 11\n"
    )
    with pytest.raises(ConfigError, match=rf"{re.escape(str(config))}:5: judge\.batch_size: "):
        load_experiment(config)
    with pytest.raises(ValueError, match=r"batch_size must be 1\.\.10"):
        asyncio.run(
            judge.judge(
                ScriptedEngine(lambda r: "{}"), "a", NUGGETS, "en", Sampling(), batch_size=11
            )
        )


def test_the_shuffle_is_part_of_what_records_depend_on(tmp_path):
    """A run cannot be resumed with the shuffle switched: its labels would mix two orders."""
    plain = load_experiment(None)
    shuffled = load_experiment(None, ["judge.shuffle=true"])
    old = results_view(yaml.safe_load(plain.to_yaml()))
    new = results_view(yaml.safe_load(shuffled.to_yaml()))
    assert changes(old, new) == ["judge.shuffle: false → true"]
    run = RunDir(tmp_path / "run")
    run.write_config(plain)
    with pytest.raises(ConfigError, match=r"judge\.shuffle: false → true"):
        run.write_config(shuffled)
