"""`cts golden audit`: the figures against hand counts on a hand-written dataset, near-duplicates
(English and Chinese), lexical and model-judged grounding, citations resolved through a golden
trace, the exit codes and the review sample; and the shipped sample benchmark audited."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

import cts.eval.audit.golden_audit as golden_audit_module
from cts.agents.grounding import grounding_schema
from cts.eval.audit.citations import Citations, citations_for, load_audit_dataset, trace_texts
from cts.eval.audit.golden_audit import (
    check_nuggets,
    golden_audit,
    lexical_verdict,
    model_grounding,
    near_duplicates,
    sample_checks,
)
from cts.eval.audit.text_terms import similarity, terms
from cts.eval.data.golden import GOLDEN, golden_dataset
from cts.eval.data.schema import Instance
from cts.eval.run.config import ResolvedExperiment
from cts.eval.run.config_sections import Role
from cts.eval.run.engines import Engines
from cts.eval.run.pipeline import run_instance
from cts.serving.scripted import ScriptedEngine
from cts.serving.types import ChatRequest, Sampling
from cts.webdancer.backends.local import LocalSearch
from tests.builders import cts
from tests.scripted import scripted_context

pytestmark = pytest.mark.usefixtures("wide_terminal")


# -- a hand-written dataset and corpus ------------------------------------------------------------

CORPUS = [
    {
        "doc_id": "d1",
        "url": "https://korvex.example/aura-pro",
        "title": "Korvex Aura Pro battery",
        "text": "The Aura Pro earbuds play for up to 7.5 hours on a single charge. The case adds "
        "three full charges, about 30 hours in total.",
    },
    {
        "doc_id": "d2",
        "url": "https://korvex.example/aura-pro/charging",
        "title": "Aura Pro charging",
        "text": "A full recharge of the earbuds in the case takes about 70 minutes. A 10-minute "
        "quick charge gives 2 hours of playback.",
    },
    {
        "doc_id": "d3",
        "url": "https://huayue.example/2023",
        "title": "华岳医学会2023年版失眠共识",
        "text": "2023年版共识将失眠认知行为疗法列为成人慢性失眠的首选一线治疗。"
        "连续使用苯二氮䓬类药物原则上不超过4周。",
        "language": "zh",
    },
    {
        "doc_id": "d4",
        "url": "https://vvr.example/passes",
        "title": "Vendrick Valley rail passes",
        "text": "An all-zone adult monthly pass costs €89.",
    },
]


def nugget(i: str, text: str, weight: int, *sources: str) -> dict[str, object]:
    return {"id": i, "text": text, "weight": weight, "source_ids": list(sources)}


def row(i: str, nuggets: list[dict[str, object]] | None, language: str = "en") -> dict:
    data: dict[str, object] = {
        "id": i,
        "language": language,
        "blurred_query": "a query",
        "fused_query": "a full query",
    }
    if nuggets is not None:
        data["golden"] = {"nuggets": nuggets}
    return data


SUPPORTED = {
    "e1": [
        nugget("n1", "The Aura Pro earbuds play for about 7.5 hours per charge.", 3, "d1"),
        nugget("n2", "Each Aura Pro earbud plays for up to 7.5 hours on one charge.", 3, "d1"),
        nugget("n3", "A full recharge takes about 70 minutes.", 2, "d2"),
        nugget("n4", "A 10-minute quick charge gives 2 hours of playback.", 1, "d1", "d2"),
    ],
    "z1": [
        nugget("n1", "2023年版共识将失眠认知行为疗法列为首选一线治疗。", 3, "d3"),
        nugget("n2", "2023年版共识把失眠认知行为疗法作为首选的一线治疗。", 2, "d3"),
        nugget("n3", "连续使用苯二氮䓬类药物不超过4周。", 1, "d3"),
    ],
}
#: One unsupported nugget of each kind: verdict none, no citation, a citation to nothing.
UNSUPPORTED = {
    "e1": [nugget("n5", "The Aura Pro case is waterproof to 50 metres.", 2, "d4")],
    "e2": [
        nugget("n1", "The all-zone monthly pass costs €89.", 3),
        nugget("n2", "Riders under 26 get 40% off.", 1, "d9"),
    ],
}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    return path


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "corpus.jsonl", CORPUS)


def clean_rows() -> list[dict]:
    return [row("e1", SUPPORTED["e1"]), row("z1", SUPPORTED["z1"], "zh")]


def dirty_rows() -> list[dict]:
    return [
        row("e1", SUPPORTED["e1"] + UNSUPPORTED["e1"]),
        row("e2", UNSUPPORTED["e2"]),
        row("z1", SUPPORTED["z1"], "zh"),
        row("x1", None),
    ]


def audited(tmp_path: Path, corpus: Path, rows: list[dict]):
    data = load_audit_dataset(str(write_jsonl(tmp_path / "data.jsonl", rows)))
    citations = citations_for(data, str(corpus))
    return data, golden_audit(data.instances, check_nuggets(data.instances, citations))


# -- the figures ----------------------------------------------------------------------------------


def test_figures_match_hand_counts(tmp_path, corpus):
    _, audit = audited(tmp_path, corpus, dirty_rows())
    f = audit.figures()
    assert f["instances"] == {"n": 4, "with_golden": 3, "without_golden": 1}
    assert audit.without_golden == ["x1"]
    per = f["nuggets_per_instance"]
    assert per["n_instances"] == 3
    assert per["distribution"] == {"2": 1, "3": 1, "5": 1}
    assert (per["min"], per["median"], per["mean"], per["max"]) == (2, 3, 3.33, 5)
    assert audit.few_nuggets() == {"e2": 2}
    assert f["fewer_than_3"] == {"n_instances": 3, "count": 1}
    # Weights 3: e1 n1, n2, e2 n1, z1 n1; 2: e1 n3, n5, z1 n2; 1: e1 n4, e2 n2, z1 n3.
    assert f["weight_mix"]["n_nuggets"] == 10
    assert f["weight_mix"]["counts"] == {"3": 4, "2": 3, "1": 3}
    assert f["weight_mix"]["shares"] == {"3": 0.4, "2": 0.3, "1": 0.3}
    # One nugget cites nothing, one cites two sources, eight cite one: 10 citations.
    assert f["sources_per_nugget"] == {
        "n_nuggets": 10,
        "distribution": {"0": 1, "1": 8, "2": 1},
        "mean": 1.0,
    }
    assert f["citations"] == {
        "n": 10,
        "resolved_in_corpus": 9,
        "resolved_in_trace": 0,
        "unresolved": 1,
    }
    # Pairs within an instance: 5·4/2 + 2·1/2 + 3·2/2.
    assert f["near_duplicates"]["n_pairs_compared"] == 14
    assert f["grounding"]["n_nuggets"] == 10
    assert f["grounding"]["verdicts"] == {
        "support": 7,
        "partial": 0,
        "none": 1,
        "no verdict": 2,
    }
    assert f["grounding"]["flagged"] == 3
    assert {(c.instance_id, c.nugget_id, c.problem) for c in audit.flagged} == {
        ("e1", "n5", "verdict none"),
        ("e2", "n1", "no citation"),
        ("e2", "n2", "cites only sources that resolve to nothing"),
    }


def test_near_duplicates_in_english_and_chinese(tmp_path, corpus):
    _, audit = audited(tmp_path, corpus, dirty_rows())
    assert {(d.instance_id, d.first, d.second) for d in audit.duplicates} == {
        ("e1", "n1", "n2"),
        ("z1", "n1", "n2"),
    }
    assert all(d.similarity >= 0.6 for d in audit.duplicates)
    # The same sentence about another figure is another fact, not a duplicate.
    assert similarity("The pass costs €89.", "The pass costs €84.") < 0.6
    assert similarity("春茶收购均价为每斤42元。", "明前茶收购均价在每斤120元以上。") < 0.6
    # Chinese goes through jieba words, not single characters or one long run.
    zh = Instance.model_validate(row("z", SUPPORTED["z1"], "zh"))
    assert [(d.first, d.second) for d in near_duplicates(zh)] == [("n1", "n2")]
    assert near_duplicates(zh, threshold=1.01) == []


# -- lexical grounding ----------------------------------------------------------------------------


def test_lexical_verdicts():
    doc = CORPUS[0]["text"]
    assert lexical_verdict("The earbuds play for 7.5 hours per charge.", [doc]).verdict == "support"
    # Close wording with a figure the evidence does not have: one level down.
    wrong = lexical_verdict("The earbuds play for up to 9.5 hours on a single charge.", [doc])
    assert (wrong.verdict, wrong.missing_numbers) == ("partial", ("9.5",))
    assert lexical_verdict("The case is waterproof to 50 metres.", [doc]).verdict == "none"
    # Several cited sources are read together.
    both = lexical_verdict("30 hours in total and a 70 minutes recharge.", [doc, CORPUS[1]["text"]])
    assert both.verdict == "support"
    # d1 alone has half the terms (partial) and lacks the 70: none.
    alone = lexical_verdict("30 hours in total and a 70 minutes recharge.", [doc])
    assert (alone.verdict, alone.coverage, alone.missing_numbers) == ("none", 0.5, ("70",))
    zh = CORPUS[2]["text"]
    assert lexical_verdict("连续使用苯二氮䓬类药物不超过4周。", [zh]).verdict == "support"
    assert lexical_verdict("连续使用苯二氮䓬类药物不超过8周。", [zh]).verdict == "partial"
    assert lexical_verdict("该共识新增了儿童哮喘的用药章节。", [zh]).verdict == "none"
    # Thousands separators do not make a number "missing".
    assert lexical_verdict("About 14200 hectares.", ["About 14,200 hectares."]).verdict == (
        "support"
    )


@pytest.mark.parametrize(
    "words",
    [
        ("play", "plays", "played", "playing"),
        ("charge", "charges", "charged", "charging"),
        ("price", "prices", "priced", "pricing"),
        ("zone", "zones"),
        ("fare", "fares"),
        ("time", "times"),
        ("rate", "rates", "rated", "rating"),
        ("case", "cases"),
        ("class", "classes"),
        ("box", "boxes"),
    ],
)
def test_a_word_and_its_plural_or_tense_are_one_term(words):
    # A singular in -e met its plural nowhere ("prices" lost the e with its -es, "price" kept
    # it): the stem drops a final e as "pricing" does.
    assert len({terms(w) for w in words}) == 1, [sorted(terms(w)) for w in words]


def test_a_plural_in_the_evidence_supports_the_singular_in_the_nugget():
    # Hand count. Nugget terms: fare, single, zone, rise, peak, time (6). The evidence has
    # fare(s), single, zone, peak, time(s) but not "rise": 5/6 = 0.833 ≥ 0.7, support. With a
    # stem that kept the -e of a singular, zone/zones and time/times missed: 3/6, partial.
    evidence = "Vendrick Valley Rail fares: the single-zone fare is €3.10 and peak times add a fee."
    found = lexical_verdict("Fares for single zones rise at peak time.", [evidence])
    assert (found.verdict, found.coverage, found.missing_numbers) == ("support", 0.833, ())


# -- model grounding ------------------------------------------------------------------------------


def _listed(request: ChatRequest) -> dict[str, str]:
    """Nugget id → text, from the user message's listing."""
    listing = request.messages[-1].content.rsplit("\n\n", 1)[1]
    return dict(line.split(": ", 1) for line in listing.splitlines()[1:])


def verdict_by_words(request: ChatRequest) -> str:
    """support when the nugget mentions 7.5 or 70, none otherwise (scripted, not a model)."""
    assert request.output is not None and request.output.kind == "json"
    listed = _listed(request)
    assert list(listed) == request.output.json_schema["required"]
    return json.dumps(
        {
            i: {"quote": "q", "verdict": "support" if ("7.5" in t or "70" in t) else "none"}
            for i, t in listed.items()
        }
    )


def test_model_grounding_uses_the_cited_evidence_and_its_verdicts(tmp_path, corpus):
    data = load_audit_dataset(str(write_jsonl(tmp_path / "d.jsonl", dirty_rows())))
    checks = check_nuggets(data.instances, citations_for(data, str(corpus)))
    engine = ScriptedEngine(verdict_by_words)
    model = asyncio.run(model_grounding(engine, checks, Sampling(temperature=0.0, seed=0)))
    # One call per (instance, cited sources): e1 {d1}, {d2}, {d1, d2}, {d4}; z1 {d3}. Nuggets
    # citing nothing that resolves are not sent.
    assert model.calls == len(engine.requests) == 5
    sent = [set(_listed(r).values()) for r in engine.requests]
    assert all(len(s) <= 10 for s in sent)
    assert not any("Riders under 26" in t for s in sent for t in s)
    for request in engine.requests:
        user = request.messages[-1].content
        if "waterproof" in user:  # cites d4 only: sees d4, not the other documents
            assert "[d4]" in user and "€89" in user and "[d1]" not in user
    audit = golden_audit(data.instances, checks, model)
    assert audit.method == "model scripted"
    verdicts = {c.key: c.verdict for c in audit.checks}
    assert verdicts[("e1", "n1")] == "support"
    assert verdicts[("e1", "n4")] == "none"  # the model's verdict wins over the lexical one
    assert verdicts[("z1", "n1")] == "none"
    assert {c.key for c in audit.flagged} == {
        ("e1", "n4"),
        ("e1", "n5"),
        ("e2", "n1"),
        ("e2", "n2"),
        ("z1", "n1"),
        ("z1", "n2"),
        ("z1", "n3"),
    }
    agreement = audit.figures()["grounding"]["lexical_agreement"]
    # Both say support for e1 n1-n3, none for e1 n5; they differ on e1 n4 and z1 n1-n3.
    assert agreement == {"n_nuggets": 8, "agree": 4, "share": 0.5}
    # The Chinese nuggets get the Chinese prompt.
    zh = [r for r in engine.requests if "要点" in r.messages[-1].content]
    assert len(zh) == 1 and "[d3]" in zh[0].messages[-1].content


def test_a_failed_or_malformed_model_answer_is_no_verdict_not_a_pass(tmp_path, corpus):
    data = load_audit_dataset(str(write_jsonl(tmp_path / "d.jsonl", clean_rows())))
    checks = check_nuggets(data.instances, citations_for(data, str(corpus)))

    def script(request: ChatRequest) -> str | Exception:
        if "要点" in request.messages[-1].content:
            return RuntimeError("server fell over")
        # An answer outside the schema: a verdict the check does not have.
        ids = request.output.json_schema["required"]  # type: ignore[union-attr]
        return json.dumps({i: {"quote": "q", "verdict": "maybe"} for i in ids})

    model = asyncio.run(model_grounding(ScriptedEngine(script), checks, Sampling()))
    audit = golden_audit(data.instances, checks, model)
    assert len(audit.unjudged) == 7 and all(c.verdict is None for c in audit.checks)
    assert any("server fell over" in (c.model_error or "") for c in audit.unjudged)
    assert any("ConstrainedOutputError" in (c.model_error or "") for c in audit.unjudged)
    assert audit.figures()["grounding"]["verdicts"]["no verdict"] == 7


def test_the_schema_admits_exactly_the_ids_sent_and_three_verdicts():
    import jsonschema

    schema = grounding_schema(["n1", "n2"])
    ok = {"n1": {"quote": "", "verdict": "support"}, "n2": {"quote": "x", "verdict": "none"}}
    jsonschema.validate(ok, schema)
    for bad in (
        {"n1": ok["n1"]},
        {**ok, "n3": ok["n1"]},
        {**ok, "n2": {"quote": "x", "verdict": "full"}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


# -- the command ----------------------------------------------------------------------------------


def test_cli_exit_0_on_a_clean_dataset_and_the_review_sample(tmp_path, corpus):
    data = write_jsonl(tmp_path / "clean.jsonl", clean_rows())
    out = tmp_path / "audit"
    result = cts(
        "golden", "audit", str(data), "--corpus", str(corpus), "--sample", "3", "--out", str(out)
    )
    assert result.exit_code == 0, result.output
    assert "7 nuggets" in result.output and "grounding by lexical" in result.output
    assert "near-duplicates: e1 n1 ~ n2" in result.output
    assert "near-duplicates: z1 n1 ~ n2" in result.output
    written = json.loads((out / "audit.json").read_text())
    assert written["figures"]["grounding"]["verdicts"]["support"] == 7
    sheet = (out / "sample.md").read_text()
    rows = [line for line in sheet.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 1 + 3  # the header and the three sampled nuggets
    drawn = sample_checks(
        check_nuggets(
            load_audit_dataset(str(data)).instances,
            citations_for(load_audit_dataset(str(data)), str(corpus)),
        ),
        3,
        0,
    )
    for check in drawn:
        line = next(r for r in rows if r.startswith(f"| {check.instance_id} | {check.nugget_id} "))
        assert check.text in line and "support" in line
        assert check.excerpt()[:40] in line  # the cited evidence a reviewer reads


def test_cli_exit_1_lists_every_nugget_that_cites_nothing_supporting_it(tmp_path, corpus):
    data = write_jsonl(tmp_path / "dirty.jsonl", dirty_rows())
    result = cts(
        "golden", "audit", str(data), "--corpus", str(corpus), "--out", str(tmp_path / "a")
    )
    assert result.exit_code == 1
    lines = result.output.splitlines()
    expected = {
        ("e1", "n5", "verdict none", "The Aura Pro case is waterproof to 50 metres.", "d4"),
        ("e2", "n1", "no citation", "The all-zone monthly pass costs €89.", "(none)"),
        (
            "e2",
            "n2",
            "cites only sources that resolve to nothing",
            "Riders under 26 get 40% off.",
            "d9 (unresolved)",
        ),
    }
    listed = {
        (*line.split("\t")[:4], line.split("\t")[4].removeprefix("cited: "))
        for line in lines
        if line.count("\t") == 4
    }
    assert listed == expected
    assert "3 of 10 nuggets cite nothing that supports them" in result.output
    assert "fewer than 3 nuggets: e2 has 2" in result.output


@pytest.mark.parametrize(
    "content, expected",
    [
        ('{"id": "a", "blurred_query": "q", "fused_query": "f"}\nnot json\n', ":2: <row>"),
        (json.dumps(row("a", [nugget("n1", "x", 0, "d1")])) + "\n", ":1: golden.nuggets[0].weight"),
        (json.dumps(row("a", None)) + "\n", "no instance has golden nuggets"),
    ],
)
def test_cli_exit_2_on_bad_input(tmp_path, corpus, content, expected):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content, "utf-8")
    result = cts("golden", "audit", str(bad), "--corpus", str(corpus), "--out", str(tmp_path))
    assert result.exit_code == 2
    assert "dataset error" in result.output and expected in result.output


def test_cli_exit_2_without_anything_to_resolve_citations(tmp_path):
    data = write_jsonl(tmp_path / "clean.jsonl", clean_rows())
    result = cts("golden", "audit", str(data), "--out", str(tmp_path / "a"))
    assert result.exit_code == 2
    assert "give --corpus" in result.output
    # --set without an experiment to change is a usage error, not a silent default experiment.
    result = cts("golden", "audit", str(data), "--corpus", "sample", "--set", "seeds=[1]")
    assert result.exit_code == 2 and "-c/--config" in result.output


def test_cli_judges_with_the_experiments_judge_model(tmp_path, corpus, monkeypatch):
    engine = ScriptedEngine(verdict_by_words)

    @asynccontextmanager
    async def engines(
        resolved: ResolvedExperiment, roles: list[Role] | None = None, use_cache: bool = True
    ) -> AsyncIterator[Engines]:
        assert roles == ["judge"]
        yield Engines({"judge": engine}, {"judge": engine}, None)

    monkeypatch.setattr(golden_audit_module, "open_engines", engines)
    data = write_jsonl(tmp_path / "clean.jsonl", clean_rows())
    out = tmp_path / "a"
    args = ["golden", "audit", str(data), "--corpus", str(corpus), "--out", str(out)]
    # The quickstart's judge is the lexical one (no chat model): a language model instead.
    judge = ("-c", "quickstart", "--set", "roles.judge.model=smollm2-135m-judge")
    result = cts(*args, *judge)
    assert result.exit_code == 1, result.output
    assert "grounding by model" in result.output
    assert "z1\tn3\tverdict none" in result.output
    # The judge role's configured sampling, with the check's own: temperature 0, seed 0.
    assert {(r.sampling.temperature, r.sampling.seed) for r in engine.requests} == {(0.0, 0)}
    assert "(model: “q”; lexical support, coverage" in (out / "sample.md").read_text()
    calls = len(engine.requests)
    # --lexical: no model call, the lexical verdicts.
    assert cts(*args, *judge, "--lexical").exit_code == 0
    assert len(engine.requests) == calls


def test_cli_refuses_a_judge_that_answers_no_chat_request(tmp_path, corpus, monkeypatch):
    # The quickstart's judge is the lexical judge: every grounding request would fail, each
    # nugget "no verdict". Refused before any engine is opened, naming roles.judge.
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("no engine may be opened")

    monkeypatch.setattr(golden_audit_module, "open_engines", never)
    data = write_jsonl(tmp_path / "clean.jsonl", clean_rows())
    out = tmp_path / "a"
    args = ["golden", "audit", str(data), "--corpus", str(corpus), "--out", str(out)]
    result = cts(*args, "-c", "quickstart")
    assert result.exit_code == 2, result.output
    assert "quickstart.yaml" in result.output and "roles.judge.model:" in result.output
    assert "'lexical-judge'" in result.output and "answers no chat request" in result.output
    assert "--lexical" in result.output
    assert not out.exists()
    # The suggestion works: the lexical pre-filter, the experiment's corpus setting kept.
    done = cts(*args, "-c", "quickstart", "--lexical")
    assert done.exit_code == 0, done.output
    assert "grounding by lexical" in done.output


# -- a golden construction folder: citations resolve to what its trace showed ---------------------


def test_trace_texts_take_each_hit_and_each_page():
    trace = {
        "steps": [
            {"kind": "llm", "text": "…"},
            {
                "kind": "tool",
                "tool": "search",
                "result": "A Google search for 'q' found 2 results:\n\n## Web Results\n"
                "1. [First](https://a.example/1)\nDate published: 2024-01-01\n\nSnippet one.\n\n"
                "2. [Second](https://a.example/2)\n\nSnippet two.",
                "evidence": [
                    {"id": "https://a.example/1", "url": "https://a.example/1"},
                    {"id": "https://a.example/2", "url": "https://a.example/2"},
                ],
            },
            {
                "kind": "tool",
                "tool": "visit",
                "result": "The useful information in https://a.example/2 …\nEvidence in page: x",
                "evidence": [{"id": "https://a.example/2", "url": "https://a.example/2"}],
            },
            {"kind": "tool", "tool": "visit", "result": "could not be accessed", "evidence": []},
        ]
    }
    shown = trace_texts(trace)
    assert set(shown) == {"https://a.example/1", "https://a.example/2"}
    assert "Snippet one." in shown["https://a.example/1"]
    assert "Snippet two" not in shown["https://a.example/1"]
    assert "Snippet two." in shown["https://a.example/2"]
    assert "Evidence in page: x" in shown["https://a.example/2"]
    citations = Citations(traces={"i": shown})
    found = citations.resolve("i", "https://a.example/1")
    assert found is not None and found.origin == "trace" and "Snippet one." in found.text
    assert citations.resolve("j", "https://a.example/1") is None  # another instance's trace


def test_a_golden_folder_resolves_citations_through_its_traces(tmp_path):
    from cts.eval.data.dataset import DatasetSource, corpus_path, load_instances

    search = LocalSearch(corpus_path("sample"), tmp_path / "index")
    run = tmp_path / "golden"
    ctx, _ = scripted_context(search, run / "traces")
    instance = load_instances(DatasetSource(path="sample", split="dev", limit=1))[0]
    record = asyncio.run(run_instance(instance, GOLDEN, 1000, ctx))
    assert record.error is None and record.nuggets
    golden_dataset([instance], {instance.id: record}, run / "dataset.jsonl")

    data = load_audit_dataset(str(run))
    assert data.traces_dir == run / "traces"
    checks = check_nuggets(data.instances, citations_for(data, None))
    assert checks and all(c.sources and not c.unresolved for c in checks)
    assert {s.origin for c in checks for s in c.sources} == {"trace"}
    # The scripted builder's nuggets ("The first fact.") state nothing the evidence says.
    result = cts("golden", "audit", str(run), "--out", str(tmp_path / "a"))
    assert result.exit_code == 1
    assert f"{instance.id}\tn1\tverdict none\tThe first fact." in result.output
    # With the corpus, the same ids resolve to the whole documents.
    with_corpus = check_nuggets(data.instances, citations_for(data, "sample"))
    assert {s.origin for c in with_corpus for s in c.sources} == {"corpus"}


# -- the shipped sample benchmark -----------------------------------------------------------------


def test_the_shipped_sample_benchmark_audit(tmp_path):
    out = tmp_path / "sample-audit"
    result = cts("golden", "audit", "sample", "--out", str(out), "--sample", "10")
    assert result.exit_code == 0, result.output
    figures = json.loads((out / "audit.json").read_text())["figures"]
    assert figures["instances"] == {"n": 72, "with_golden": 72, "without_golden": 0}
    assert figures["weight_mix"]["n_nuggets"] == 382
    assert figures["fewer_than_3"]["count"] == 0
    assert figures["citations"]["unresolved"] == 0
    assert figures["near_duplicates"]["count"] == 0
    verdicts = figures["grounding"]["verdicts"]
    assert verdicts["none"] == 0 and verdicts["no verdict"] == 0
    assert verdicts["support"] >= 0.95 * 382
