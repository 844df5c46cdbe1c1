"""The finance case study: completing company names in filings by induction.

:mod:`~rs_interp.finance.corpus` makes the synthetic filings (seeded, in-process, nothing
downloaded), hashes words to 256 symbols and finds the queries; :mod:`~rs_interp.finance.study`
holds the readers (the bigram table, the filing-trained model and its direct path, the induction
models) and runs them.

>>> from rs_interp import finance
>>> len(finance.make_corpus().seen)
100
"""

from .corpus import (
    D_VOCAB,
    N_CTX,
    Company,
    Corpus,
    Filing,
    Query,
    demo_filing,
    find_queries,
    make_corpus,
    tokenize,
    word_symbol,
)
from .study import READERS, BigramTable, FinanceResult, complete_queries, evaluate_readers, run_case_study, train_filing_model
from .study import _model_reader  # noqa: F401  (the tests drive the model reader directly)

__all__ = [
    "word_symbol",
    "tokenize",
    "Company",
    "Filing",
    "Corpus",
    "make_corpus",
    "Query",
    "find_queries",
    "BigramTable",
    "train_filing_model",
    "READERS",
    "evaluate_readers",
    "FinanceResult",
    "demo_filing",
    "complete_queries",
    "run_case_study",
    "N_CTX",
    "D_VOCAB",
]
