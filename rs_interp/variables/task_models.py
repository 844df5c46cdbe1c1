"""High-level causal models of the tasks rs_interp ships (:mod:`rs_interp.tasks`), and their pair sets.

- **induction** (token ids, no tokenizer): a sequence's ``tokens``, each position's ``previous`` token, the
  ``query`` (the last token), and the output: the token after the earlier position whose previous token is
  the query (``x[k]`` for the ``k`` with ``x[k - 1] = x[-1]``). Variables ``"previous"`` (interchanged at every
  position: the base keeps its tokens and reads which position follows the query from the source's
  previous tokens) and ``"query"`` (at the last position). Classes: the base's answer and the counterfactual one.
- **IOI** (Wang et al. 2022): the two names, which one is repeated (``s``) and so the indirect object (``io``);
  the output is ``io``. Variables ``"order"`` (whether the IO is named first: ABBA or BABA, interchanged at
  the last position; the counterfactual names the base's other name) and ``"io"`` (the source's IO).
- **greater-than** (Hanna et al. 2023): the start year's two digits ``yy``, the output ``yy + 1``, the first
  later year. Variable ``"yy"``: classes the base's ``yy + 1`` and the source's (a later year must then be
  above the source's, which only the source's ``yy + 1`` of the two is where the source's ``yy`` is larger).
- **subject-verb agreement**: the subject's ``number``, the output the verb form agreeing with it (classes
  a verb's singular and plural forms). Variable ``"number"``.

Each ``*_pairs`` function draws pairs whose base and source are as long in tokens, with the interchange at the
last position (induction's ``"previous"``: every position), read at the last position.

>>> from rs_interp.variables import induction_pairs
>>> pairs = induction_pairs(4, seed=0, variable="query")
>>> pairs.variable, pairs.n_classes, bool((pairs.labels != pairs.base_labels).all()), pairs.labels.tolist()
('query', 2, True, [1, 0, 1, 0])
"""

from __future__ import annotations

import random
from typing import Any, Literal, Sequence

import torch

from ..exact.validate import as_int, check_int_range
from ..tasks.greater_than import NOUNS, TEMPLATE, valid_years, year_tokens
from ..tasks.ioi import IOI_TEMPLATES, NAMES, OBJECTS, PLACES
from ..tasks.sva import SUBJECTS, SVA_TEMPLATES, verb_ids
from ..tasks.task import bos_id, encode, resolve_tokenizer, single_tokens
from .causal import CausalModel, Variable
from .pairs import PairSet

__all__ = ["induction_causal_model", "ioi_causal_model", "greater_than_causal_model", "sva_causal_model",
           "induction_pairs", "ioi_pairs", "greater_than_pairs", "sva_pairs"]


# --- the causal models -----------------------------------------------------------------------------------

def _induction_output(tokens: tuple, previous: tuple, query: Any) -> Any:
    """The token after the one earlier position whose previous token is the query (None: none or several)."""
    found = {tokens[k] for k in range(1, len(tokens)) if previous[k] == query}
    return found.pop() if len(found) == 1 else None


def induction_causal_model() -> CausalModel:
    """Induction on a token sequence (module docstring).

    >>> cm = induction_causal_model()
    >>> cm.run((5, 6, 7, 5))["output"], cm.counterfactual((5, 6, 7, 5), (1, 1, 1, 7), "query")
    (6, 5)
    """
    return CausalModel("induction", (
        Variable("tokens", ("input",), tuple, True, "the tokens"),
        Variable("previous", ("tokens",), lambda t: (None,) + t[:-1], True, "each position's previous token"),
        Variable("query", ("tokens",), lambda t: t[-1], False, "the last token"),
        Variable("output", ("tokens", "previous", "query"), _induction_output, False,
                 "the token after the earlier position whose previous token is the query"),
    ), output="output")


def ioi_causal_model() -> CausalModel:
    """IOI on ``(template, first, second, s2, place, object)``: the names in the order they come, and the
    repeated one (module docstring).

    >>> cm = ioi_causal_model()
    >>> base, source = (0, "Mary", "John", "John", "store", "drink"), (0, "Anna", "Bob", "Anna", "store", "drink")
    >>> cm.run(base)["output"], cm.counterfactual(base, source, "order")
    ('Mary', 'John')
    """
    def io(first: str, second: str, order: str) -> str:
        return first if order == "ABBA" else second

    return CausalModel("ioi", (
        Variable("first", ("input",), lambda x: x[1], False, "the name said first"),
        Variable("second", ("input",), lambda x: x[2], False, "the name said second"),
        Variable("order", ("input",), lambda x: "ABBA" if x[3] == x[2] else "BABA", False,
                 "ABBA: the IO is named first (the second name is repeated); BABA: second"),
        Variable("io", ("first", "second", "order"), io, False, "the indirect object"),
        Variable("output", ("io",), lambda x: x, False, "the name the model should say"),
    ), output="output")


def greater_than_causal_model() -> CausalModel:
    """Greater-than on ``(noun, year)`` (module docstring).

    >>> greater_than_causal_model().counterfactual(("war", 1732), ("war", 1760), "yy")
    61
    """
    return CausalModel("greater-than", (
        Variable("century", ("input",), lambda x: x[1] // 100, False, "the start year's century"),
        Variable("yy", ("input",), lambda x: x[1] % 100, False, "the start year's last two digits"),
        Variable("output", ("yy",), lambda yy: yy + 1, False, "the first later year's two digits"),
    ), output="output")


def sva_causal_model() -> CausalModel:
    """Subject-verb agreement on ``(template, subject, plural, attractor, attractor plural)`` (module docstring).

    >>> sva_causal_model().counterfactual((1, "author", False, "guard", True), (1, "pilot", True, "guard", False),
    ...                                   "number")
    'plural'
    """
    return CausalModel("sva", (
        Variable("number", ("input",), lambda x: "plural" if x[2] else "singular", False, "the subject's number"),
        Variable("attractor", ("input",), lambda x: "plural" if x[4] else "singular", False, "the attractor's number"),
        Variable("output", ("number",), lambda n: n, False, "the number of the verb form that agrees"),
    ), output="output")


# --- pair sets -------------------------------------------------------------------------------------------

def _pairs(rows: Sequence[tuple[list[int], list[int], list[int], int, int, bool]], variable: str, *,
           every_position: bool = False) -> PairSet:
    """A PairSet from ``(base ids, source ids, candidates, label, base label, several)`` rows of one length each,
    interchanged at the last position (or every one) and read there. Every other row's two candidates swap
    places, so that the labels are balanced (a model that always prefers one place scores chance, not 1)."""
    rows = [r if i % 2 == 0 or len(r[2]) != 2 else (r[0], r[1], r[2][::-1], 1 - r[3], 1 - r[4], r[5])
            for i, r in enumerate(rows)]
    width = max(len(r[0]) for r in rows)
    k = max(len(r[2]) for r in rows)

    def matrix(i: int, fill: int, w: int) -> torch.Tensor:
        return torch.tensor([list(r[i]) + [fill] * (w - len(r[i])) for r in rows], dtype=torch.long)

    lengths = torch.tensor([len(r[0]) for r in rows], dtype=torch.long)
    last = lengths - 1
    return PairSet(base=matrix(0, 0, width), source=matrix(1, 0, width), labels=torch.tensor([r[3] for r in rows]),
                   base_labels=torch.tensor([r[4] for r in rows]), read=last, candidates=matrix(2, -1, k),
                   base_positions=None if every_position else last, source_positions=None if every_position else last,
                   base_lengths=None if bool((lengths == width).all()) else lengths,
                   source_lengths=None if bool((lengths == width).all()) else lengths,
                   several=torch.tensor([r[5] for r in rows]), variable=variable)


def induction_pairs(n: int = 32, *, seed: int = 0, variable: Literal["previous", "query"] = "previous",
                    d_vocab: int = 256, seq_len: int = 48, period: int = 12) -> PairSet:
    """``n`` induction pairs (module docstring) of ``seq_len`` token ids in ``[0, d_vocab)``: a base repeating a
    random block of ``period`` distinct tokens; a source that makes another position ``j`` follow the query
    (``"previous"``: a random sequence with the query at ``j - 1`` only; ``"query"``: the base with its last token
    replaced by the one at ``j - 1``). Classes: the base's answer, the counterfactual's (``x[j]``). Drawn by
    ``random.Random(seed)``.

    Raises:
        ValueError: an unknown variable, or sizes that leave no room (``2 * period > seq_len``, ``period > d_vocab``).
    """
    if variable not in ("previous", "query"):
        raise ValueError(f"variable must be 'previous' or 'query', got {variable!r}")
    n, seq_len, period = check_int_range("n", n, 1), check_int_range("seq_len", seq_len, 4), as_int("period", period)
    if not 2 <= period <= min(d_vocab - 1, seq_len // 2):
        raise ValueError(f"period must be in [2, min(d_vocab - 1, seq_len // 2)], got {period}")
    rng, cm = random.Random(as_int("seed", seed)), induction_causal_model()
    rows = []
    while len(rows) < n:
        block = rng.sample(range(d_vocab), period)
        base = tuple((block * (seq_len // period + 1))[:seq_len])
        answer = cm.run(base)["output"]
        j = rng.randrange(1, seq_len - 1)
        if base[j] == answer or base[j - 1] == base[-1]:
            continue
        if variable == "previous":
            others = [t for t in range(d_vocab) if t != base[-1]]
            source = [rng.choice(others) for _ in range(seq_len)]
            source[j - 1] = base[-1]
            source = tuple(source)
        else:
            source = base[:-1] + (base[j - 1],)
        cf = cm.counterfactual(base, source, variable)
        if cf is None or cf == answer:
            continue
        rows.append((list(base), list(source), [answer, cf], 1, 0, True))
    return _pairs(rows, variable, every_position=variable == "previous")


def _texts_to_rows(tok: Any, drawn: list[tuple[str, str, list[str], int, int, bool]], prepend_bos: bool, n: int,
                   what: str, prefix: str = " ") -> list[tuple]:
    """Tokenized rows of ``(base text, source text, candidate words, label, base label, several)``, keeping the
    pairs as long in tokens, until ``n``; each candidate ``prefix + word`` one token."""
    bos = [bos_id(tok)] if prepend_bos else []
    rows = []
    for base, source, words, label, base_label, several in drawn:
        b, s = bos + encode(tok, base), bos + encode(tok, source)
        if len(b) == len(s):
            rows.append((b, s, single_tokens(tok, words, what, prefix=prefix), label, base_label, several))
        if len(rows) == n:
            return rows
    raise ValueError(f"only {len(rows)} of {n} {what} pairs were as long in tokens as their source")


def ioi_pairs(tokenizer: Any, n: int = 32, *, seed: int = 0, variable: Literal["order", "io"] = "order",
              prepend_bos: bool = True) -> PairSet:
    """``n`` IOI pairs (module docstring): base and source share the template, place and object, with other
    names; for ``"order"`` the source's order is the base's other one (classes: the base's IO and S), for
    ``"io"`` the source names another IO (classes: the base's IO and the source's). Drawn by
    ``random.Random(seed)``.

    Raises:
        ValueError: an unknown variable, or names that are not single tokens.
    """
    if variable not in ("order", "io"):
        raise ValueError(f"variable must be 'order' or 'io', got {variable!r}")
    tok, rng, cm = resolve_tokenizer(tokenizer), random.Random(as_int("seed", seed)), ioi_causal_model()
    drawn = []
    for _ in range(20 * check_int_range("n", n, 1)):
        template, place, obj = rng.choice(IOI_TEMPLATES), rng.choice(PLACES), rng.choice(OBJECTS)
        io, s, io2, s2 = rng.sample(NAMES, 4)
        abba = rng.random() < 0.5
        source_abba = (not abba) if variable == "order" else rng.random() < 0.5
        base = (template, *((io, s) if abba else (s, io)), s, place, obj)
        source = (template, *((io2, s2) if source_abba else (s2, io2)), s2, place, obj)
        out, cf = cm.run(base)["output"], cm.counterfactual(base, source, variable)
        words = [io, s] if variable == "order" else [io, io2]
        several = bool(set(cm.differing(base, source)) - {variable, "io", "output"})
        drawn.append((_render_ioi(base), _render_ioi(source), words, words.index(cf), words.index(out), several))
    return _pairs(_texts_to_rows(tok, drawn, prepend_bos, n, "names"), variable)


def _render_ioi(x: tuple) -> str:
    template, first, second, s2, place, obj = x
    return template.format(first=first, second=second, s2=s2, place=place, object=obj)


def greater_than_pairs(tokenizer: Any, n: int = 32, *, seed: int = 0, prepend_bos: bool = True) -> PairSet:
    """``n`` greater-than pairs (module docstring): the same noun and century, another start year; classes
    the base's and the source's ``yy + 1``; the variable ``"yy"``. Drawn by ``random.Random(seed)``."""
    tok, rng, cm = resolve_tokenizer(tokenizer), random.Random(as_int("seed", seed)), greater_than_causal_model()
    year_tokens(tok)  # refuses a tokenizer whose two-digit years are not single tokens
    years = [y for y in valid_years(tok) if y % 100 < 98]
    by_century: dict[int, list[int]] = {}
    for y in years:
        by_century.setdefault(y // 100, []).append(y)
    drawn = []
    for _ in range(20 * check_int_range("n", n, 1)):
        noun, year = rng.choice(NOUNS), rng.choice(years)
        other = rng.choice([y for y in by_century[year // 100] if y != year] or [year])
        if other == year:
            continue
        base, source = (noun, year), (noun, other)
        out, cf = cm.run(base)["output"], cm.counterfactual(base, source, "yy")
        words = [f"{out:02d}", f"{cf:02d}"]
        drawn.append((TEMPLATE.format(noun=noun, year=year, century=year // 100),
                      TEMPLATE.format(noun=noun, year=other, century=other // 100), words, 1, 0, False))
    return _pairs(_texts_to_rows(tok, drawn, prepend_bos, n, "two-digit years", prefix=""), "yy")


def sva_pairs(tokenizer: Any, n: int = 32, *, seed: int = 0, prepend_bos: bool = True) -> PairSet:
    """``n`` subject-verb agreement pairs (module docstring): the same template, another subject of the other
    number (the attractor drawn afresh: ``several`` where its number differs too); classes the verb ``" is"``
    and ``" are"``; the variable ``"number"``. Drawn by ``random.Random(seed)``."""
    tok, rng, cm = resolve_tokenizer(tokenizer), random.Random(as_int("seed", seed)), sva_causal_model()
    verb_ids(tok, [("is", "are")])  # refuses a tokenizer where they are not single tokens
    drawn = []
    for _ in range(50 * check_int_range("n", n, 1)):
        template = rng.choice(SVA_TEMPLATES)
        (subj, subj2), plural = rng.sample(SUBJECTS, 2), rng.random() < 0.5
        attr, attr2 = rng.choice(SUBJECTS), rng.choice(SUBJECTS)
        a_pl, a2_pl = rng.random() < 0.5, rng.random() < 0.5
        base, source = (template, subj, plural, attr, a_pl), (template, subj2, not plural, attr2, a2_pl)
        out, cf = cm.run(base)["output"], cm.counterfactual(base, source, "number")
        words, classes = ["is", "are"], ["singular", "plural"]
        drawn.append((_render_sva(base), _render_sva(source), words, classes.index(cf), classes.index(out),
                      a_pl != a2_pl))
    return _pairs(_texts_to_rows(tok, drawn, prepend_bos, n, "verbs"), "number")


def _render_sva(x: tuple) -> str:
    template, subj, plural, attr, attr_plural = x
    rel = ("likes", "like")[attr_plural]
    return template.format(subj=subj[plural], attr=attr[attr_plural], rel=rel)
