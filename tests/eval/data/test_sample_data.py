"""The shipped sample benchmark: valid, complete, and built so that clarification matters."""

from __future__ import annotations

import math
import re
from collections import Counter

import pytest
from typer.testing import CliRunner

from cts.cli import app
from cts.eval.data.dataset import SAMPLE_DIR, DatasetSource, load_corpus, load_instances
from cts.eval.data.schema import CONSTRAINT_TYPES, Instance

REGION_WORDS = re.compile(r"\b(in|at|near|across)\s+[A-Z]")


def sample(split: str) -> list[Instance]:
    return load_instances(DatasetSource(path="sample", split=split))


@pytest.fixture(scope="module")
def evaluation() -> list[Instance]:
    return sample("dev") + sample("test")


@pytest.fixture(scope="module")
def train() -> list[Instance]:
    return sample("train")


@pytest.fixture(scope="module")
def corpus():
    return load_corpus("sample")


def test_cts_data_validate_passes_on_the_shipped_data():
    result = CliRunner().invoke(app, ["data", "validate", "sample"])
    assert result.exit_code == 0, result.output
    assert "sample: OK" in result.output


def test_sizes_and_mix(evaluation, train, corpus):
    assert len(evaluation) >= 40 and len(train) >= 24
    everything = evaluation + train
    assert sum(i.language == "zh" for i in everything) >= 8
    types = Counter(t for i in everything for t in i.removed_constraints)
    assert all(types[t] >= 3 for t in CONSTRAINT_TYPES), types
    assert len(corpus) >= 400
    for i in everything:
        assert i.golden is not None and 3 <= len(i.golden.nuggets) <= 8


def test_train_is_disjoint_from_evaluation(evaluation, train):
    assert not {i.id for i in evaluation} & {i.id for i in train}
    assert not {i.fused_query for i in evaluation} & {i.fused_query for i in train}


def test_a_good_share_of_intents_have_no_region(evaluation):
    """Region questions must be answerable only with `unknown` for these."""
    no_region = [i for i in evaluation if not i.meta.get("has_region")]
    assert len(no_region) >= 0.3 * len(evaluation)
    assert not [i.id for i in no_region if "region" in i.removed_constraints]


def test_every_nugget_source_exists(evaluation, train, corpus):
    ids = {d.doc_id for d in corpus}
    for i in evaluation + train:
        assert i.golden is not None
        for n in i.golden.nuggets:
            assert n.source_ids and set(n.source_ids) <= ids, (i.id, n.id)


def test_size_under_5_mb():
    assert sum(p.stat().st_size for p in SAMPLE_DIR.iterdir()) < 5_000_000


# -- clarification matters: lexical evidence ---------------------------------------------------


def tokens(text: str) -> list[str]:
    """Lowercased words; CJK runs as character unigrams and bigrams."""
    out: list[str] = []
    for run in re.findall(r"[\u4e00-\u9fff]+|[a-z0-9]+", text.lower()):
        if "\u4e00" <= run[0] <= "\u9fff":
            out += list(run) + [run[k : k + 2] for k in range(len(run) - 1)]
        else:
            out.append(run)
    return out


class BM25:
    def __init__(self, docs: dict[str, str], k1: float = 1.2, b: float = 0.75) -> None:
        self.tf = {d: Counter(tokens(t)) for d, t in docs.items()}
        self.length = {d: sum(c.values()) for d, c in self.tf.items()}
        self.avg = sum(self.length.values()) / len(self.length)
        df = Counter(term for c in self.tf.values() for term in c)
        n = len(docs)
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}
        self.k1, self.b = k1, b

    def score(self, query: str, doc: str) -> float:
        tf, total = self.tf[doc], 0.0
        for term in set(tokens(query)):
            f = tf.get(term, 0)
            if f:
                norm = self.k1 * (1 - self.b + self.b * self.length[doc] / self.avg)
                total += self.idf.get(term, 0.0) * f * (self.k1 + 1) / (f + norm)
        return total

    def top(self, query: str, k: int) -> list[str]:
        return sorted(self.tf, key=lambda d: -self.score(query, d))[:k]


@pytest.fixture(scope="module")
def bm25(corpus) -> BM25:
    return BM25({d.doc_id: f"{d.title} {d.text}" for d in corpus})


def sources(instance: Instance) -> set[str]:
    assert instance.golden is not None
    return {s for n in instance.golden.nuggets for s in n.source_ids}


def test_fused_query_overlaps_its_sources_much_more_than_the_blurred_query(evaluation, bm25):
    fused = blurred = 0.0
    for i in evaluation:
        docs = sources(i)
        fused += sum(bm25.score(i.fused_query, d) for d in docs) / len(docs)
        blurred += sum(bm25.score(i.blurred_query, d) for d in docs) / len(docs)
    assert fused >= 1.3 * blurred, (fused, blurred)


def test_the_blurred_query_cannot_single_out_the_right_documents(evaluation, bm25):
    """Competing documents crowd the blurred query's top hits; the fused query's constraint
    brings the sources up."""

    def hits(query_of) -> float:
        return sum(len(set(bm25.top(query_of(i), 3)) & sources(i)) / 3 for i in evaluation)

    fused, blurred = hits(lambda i: i.fused_query), hits(lambda i: i.blurred_query)
    assert fused >= blurred + 0.15 * len(evaluation), (fused, blurred)
