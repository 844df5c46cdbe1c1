"""The finance case study: completing company names in filings by induction.

:mod:`~rs_interp.reproduce.finance.corpus` makes the synthetic filings (seeded, in-process, nothing
downloaded), hashes words to 256 symbols and finds the queries; :mod:`~rs_interp.reproduce.finance.study`
holds the readers (the bigram table, the filing-trained model and its direct path, the induction
models) and runs them.

>>> from rs_interp import finance
>>> len(finance.make_corpus().seen)
100
"""

from . import corpus, study
from .corpus import *  # noqa: F403  (the names listed in corpus.__all__)
from .study import *  # noqa: F403
from .study import _model_reader  # noqa: F401  (the tests drive the model reader directly)

__all__ = corpus.__all__ + study.__all__
