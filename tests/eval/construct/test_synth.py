"""The synthetic benchmark (`cts data synth`): the same seed writes the same bytes, every row is
valid, every type and both languages are there, no page is shared between splits, every nugget
is stated by the page it cites, and the blurred query finds competing pages where the fused
query finds the right one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cts.eval.construct.synth import FAMILIES_PATH, counts, load_families, synthesize
from cts.eval.data.dataset import DatasetSource, check_source
from cts.eval.data.schema import QUESTION_TYPES
from cts.webdancer.backends.local import LocalSearch
from cts.webdancer.corpus import check_corpus
from tests.builders import cts

SIZES = {"train": 14, "heldout": 14}


def _synth(out: Path) -> list[str]:
    return ["data", "synth", "--out", str(out), "--train", "14", "--heldout", "14"]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "bench"
    result = cts(*_synth(out))
    assert result.exit_code == 0, result.output
    assert "train: 14 instances" in result.output and "corpus:" in result.output
    return out


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_the_same_seed_writes_the_same_bytes_and_another_seed_other_ones(written, tmp_path):
    again = tmp_path / "again"
    assert cts(*_synth(again)).exit_code == 0
    for name in ("train.jsonl", "heldout.jsonl", "corpus.jsonl"):
        assert (again / name).read_bytes() == (written / name).read_bytes()
    other = synthesize(SIZES, seed=1)
    assert other.splits["train"] != _rows(written / "train.jsonl")
    readme = (written / "README.md").read_text(encoding="utf-8")
    assert "cts data synth --out" in readme and "--seed 0" in readme
    assert "true of anything" in readme


def test_every_row_and_page_is_valid_and_every_type_and_language_is_there(written):
    for split in SIZES:
        checked = check_source(DatasetSource(path=str(written / f"{split}.jsonl")))
        assert checked.problems == [] and len(checked.instances) == SIZES[split]
        assert {i.language for i in checked.instances} == {"en", "zh"}
        assert {t for i in checked.instances for t in i.removed_constraints} == set(QUESTION_TYPES)
        for instance in checked.instances:  # the removed span is the value the page is about
            assert instance.removed_spans and instance.removed_spans[0] in instance.fused_query
    pages, problems = check_corpus(written / "corpus.jsonl")
    assert problems == [] and len(pages) == counts(synthesize(SIZES))["corpus"]["pages"]


def test_no_page_is_cited_by_two_splits_and_every_nugget_is_on_its_page(written):
    pages = {p.doc_id: p.text for p in check_corpus(written / "corpus.jsonl")[0]}
    cited: dict[str, set[str]] = {}
    for split in SIZES:
        for row in _rows(written / f"{split}.jsonl"):
            for nugget in row["golden"]["nuggets"]:
                (doc,) = nugget["source_ids"]
                assert nugget["text"] in pages[doc]
                cited.setdefault(split, set()).add(doc)
    assert not cited["train"] & cited["heldout"]


def test_the_blurred_query_finds_competing_pages_and_the_fused_query_the_right_one(
    written, tmp_path
):
    search = LocalSearch(written / "corpus.jsonl", tmp_path / "index")
    url_of = {p.doc_id: p.url for p in check_corpus(written / "corpus.jsonl")[0]}
    blurred_right = 0
    rows = _rows(written / "heldout.jsonl")
    for row in rows:
        right = url_of[row["golden"]["nuggets"][0]["source_ids"][0]]
        entity = right.rsplit("/", 1)[0] + "/"
        assert search.search_sync(row["fused_query"], 5)[0].url == right, row["id"]
        hits = search.search_sync(row["blurred_query"], 5)
        assert sum(h.url.startswith(entity) for h in hits) >= 3, row["id"]
        blurred_right += hits[0].url == right
    assert blurred_right < len(rows)  # the blurred query alone cannot tell the pages apart


def test_a_families_file_naming_an_undeclared_slot_or_missing_a_type_is_refused(tmp_path):
    text = FAMILIES_PATH.read_text(encoding="utf-8")
    broken = tmp_path / "slot.yaml"
    broken.write_text(text.replace("at a starting price of €{price1}", "at €{cost1}"), "utf-8")
    with pytest.raises(ValueError, match=r"launches\.en names undeclared \{'cost1'\}"):
        load_families(broken)
    missing = tmp_path / "type.yaml"
    missing.write_text(text.replace("type: other", "type: scope"), "utf-8")
    with pytest.raises(ValueError, match="no family for the type"):
        load_families(missing)
