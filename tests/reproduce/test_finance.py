import time

import pytest

from rs_interp.reproduce import finance as F
from rs_interp.reproduce.expected import EXPECTED


@pytest.fixture(scope="module")
def corpus():
    return F.make_corpus(0)


def test_corpus_is_fast_seeded_and_shaped(corpus):
    t = time.perf_counter()
    again = F.make_corpus(0)
    assert time.perf_counter() - t < 2.0
    assert again == corpus and F.make_corpus(1) != corpus
    assert (len(corpus.train), len(corpus.seen), len(corpus.unseen)) == (300, 100, 100)
    assert len(corpus.roster) == 96 and len(corpus.train_companies) == 72 and len(corpus.heldout_companies) == 24
    assert {c.sector for c in corpus.train_companies}.isdisjoint({c.sector for c in corpus.heldout_companies})
    assert all(2 <= len(c.name) <= 4 for c in corpus.roster)


def test_heldout_names_never_occur_in_training(corpus):
    train_words = {w for f in corpus.train for w in f.words}
    for c in corpus.heldout_companies:
        assert c.name[0] not in train_words and c.full_name not in " ".join(" ".join(f.words) for f in corpus.train[:50])
    assert all(f.company in corpus.train_companies for f in corpus.train + corpus.seen)
    assert all(f.company in corpus.heldout_companies for f in corpus.unseen)


def test_every_filing_names_its_company_in_full_first(corpus):
    filings = corpus.train + corpus.seen + corpus.unseen
    assert all(f.mentions[0] == 0 for f in filings)
    assert sum(len(f.mentions) >= 2 for f in filings) >= 0.9 * len(filings)  # most name it again later


def test_hash_is_stable_and_documented():
    import zlib

    assert F.word_symbol("Retail") == zlib.crc32(b"Retail") % 256
    words, symbols = F.tokenize("Tamsin Retail Group ( TRG ) rose 4.50 percent .")
    assert words == ["Tamsin", "Retail", "Group", "(", "TRG", ")", "rose", "4.50", "percent", "."]
    assert all(0 <= s < 256 for s in symbols)


def test_queries_follow_the_definition(corpus):
    qs = F.find_queries(corpus.seen)
    assert len(qs) > 100
    for q in qs[:200]:
        f = corpus.seen[q.filing]
        name = f.company.name
        k = name.index(q.query_word)
        assert k < len(name) - 1 and q.answer_word == name[k + 1]
        assert len(q.context) <= 48 and q.context[-1] == F.word_symbol(q.query_word)
        # the full name occurred earlier inside the window
        window_words = f.words[q.position - len(q.context) + 1 : q.position + 1]
        joined = " ".join(window_words[: -(k + 1)])
        assert " ".join(name) in joined


def test_bigram_table_counts(corpus):
    table = F.BigramTable(corpus.train[:3])
    s = corpus.train[0].symbols
    assert table.counts.sum() == sum(len(f.symbols) - 1 for f in corpus.train[:3])
    assert table.counts[s[0], s[1]] >= 1
    assert table.predict(next(x for x in range(256) if table.counts[x].sum() == 0)) is None


@pytest.mark.slow
def test_the_table(train_cache):
    res = F.run_case_study(seed=0, progress=False, cache=train_cache)
    s, u = res.seen, res.unseen
    # every reader's rate within the band reproduce/expected.py holds for it (the one place a band is typed)
    for reader in ("bigram table", "filing-trained model, direct path", "filing-trained model", "induction model, one layer",
                   "induction model, two layers"):
        for split, rates in (("seen", s), ("unseen", u)):
            assert EXPECTED[f"finance.{reader}.{split}"].holds(rates[reader]), (reader, split, rates[reader])
    demo = res.demo
    assert sum(demo["induction model, two layers"]) >= 0.8 * len(demo["induction model, two layers"])
    assert sum(demo["bigram table"]) == 0 and sum(demo["filing-trained model"]) == 0
