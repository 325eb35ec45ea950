"""The tiny searcher's training data (cts/train/searcher_data.py), its fit command (`cts train
searcher`, cts/train/searcher_fit.py on the fit the judge and User Answerer share) and its model
config (cts/configs/models/smollm2-135m-searcher.yaml), which runs without the protocol's
grammar."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from cts.cli import app
from cts.configs import CONFIG_DIR
from cts.eval.run.config import load_experiment
from cts.serving.model_config import load_model_config
from cts.train import searcher_data, searcher_fit
from cts.train.searcher_data import generate, label_counts, question, read_instances, variant_counts
from cts.webdancer.backends.local import LocalSearch
from cts.webdancer.protocol import FinalAnswer, ToolCall, initial_messages, observation, parse_turn
from cts.webdancer.search import render_hits
from tests.builders import assert_seeded, shipped_adapter

SEARCHER_CONFIG = CONFIG_DIR / "models" / "smollm2-135m-searcher.yaml"
runner = CliRunner()


def test_the_generator_is_deterministic_and_its_seed_matters():
    assert_seeded(generate, 24)


def test_each_run_is_the_agents_own_messages_and_turns():
    """The first example of a run: the agent's opening messages, and a search whose query is
    the question; the second: those messages, that turn and the real search tool's
    observation, and an answer that is the first hit's snippet."""
    search = LocalSearch(searcher_data.CORPUS_FILE)
    examples = generate(60, seed=1)
    for first, second in zip(examples[::2], examples[1::2], strict=True):
        assert (first.kind, second.kind) == ("search", "answer")
        asked = first.messages[1]["content"].rsplit("User: ", 1)[1]
        date = first.messages[0]["content"].rsplit("Current date: ", 1)[1]
        assert first.messages == initial_messages(asked, date)
        call = parse_turn(first.completion)
        assert isinstance(call, ToolCall) and call.arguments == {"query": [asked]}
        hits = search.search_sync(asked, searcher_data.TOP_K)
        assert second.messages == [
            *first.messages,
            {"role": "assistant", "content": first.completion},
            {"role": "user", "content": observation(render_hits(asked, hits))},
        ]
        answer = parse_turn(second.completion)
        assert isinstance(answer, FinalAnswer) and len(answer.text) > 40
        assert answer.text.strip() in hits[0].snippet


def test_the_questions_are_the_train_splits_three_variants_in_both_languages():
    examples = generate(144, seed=0)
    assert label_counts(examples) == {"answer": 72, "search": 72}
    assert variant_counts(examples) == {"blurred": 48, "clarified": 48, "fused": 48}
    assert {e.language for e in examples} == {"en", "zh"}
    assert all("-train-" in e.instance_id for e in examples)
    instances = {i.id: i for i in read_instances()}
    english = instances["A-train-01"]
    assert question(english, "blurred") == english.blurred_query
    assert question(english, "fused") == english.fused_query
    assert question(english, "clarified") == (
        "Which smartphones did Nyvra launch, and what were their starting prices, 2023?"
    )
    chinese = instances["D-train-06"]
    assert question(chinese, "clarified").endswith("（澄穗优218）？")


def test_write_data_writes_the_rows_without_training(tmp_path):
    path = tmp_path / "rows.jsonl"
    result = runner.invoke(app, ["train", "searcher", "--examples", "6", "--write-data", str(path)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in path.read_text("utf-8").splitlines()]
    assert [r["kind"] for r in rows] == ["search", "answer"] * 3
    assert all(
        set(r) == {"prompt", "completion", "instance_id", "language", "variant", "kind"}
        for r in rows
    )


def test_the_searcher_config_names_the_adapter_and_runs_without_the_grammar():
    config = load_model_config(SEARCHER_CONFIG)
    assert config.path == "tiny:smollm2-135m-instruct" and config.knows_webdancer
    record = shipped_adapter(config, searcher_fit.ADAPTER.adapter_dir, "searcher_train.json")
    assert record["command"].startswith("cts train searcher ")
    base = load_model_config(CONFIG_DIR / "models" / "smollm2-135m-instruct.yaml")
    assert not base.knows_webdancer  # the tiny model itself still searches under the grammar
    quickstart = load_experiment("quickstart")
    assert quickstart.experiment.roles["searcher"].model == "smollm2-135m-searcher"
    assert not quickstart.constrained_search()
    base_searcher = load_experiment(
        "quickstart", overrides=["roles.searcher.model=smollm2-135m-instruct"]
    )
    assert base_searcher.constrained_search()
    forced = load_experiment("quickstart", overrides=["search.constrained=true"])
    assert forced.constrained_search()
