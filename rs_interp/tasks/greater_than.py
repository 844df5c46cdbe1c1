"""Greater-than (Hanna et al. 2023, "How does GPT-2 compute greater-than?"), as a :class:`~rs_interp.tasks.Task`.

"The war lasted from the year 1732 to 17" -> a two-digit year above 32. The prompt is ACDC's
(``acdc/greaterthan/utils.py``, Conmy et al. 2023): "The {noun} lasted from the year {YY}{yy} to {YY}",
with the paper's nouns (each one GPT-2 token with its leading space) and its year filter: for each
century YY from 11 to 17, the years YY02 ... YY98 whose " YYyy" is the two tokens " YY" + "yy", less
the first and the last of each century's list (:func:`valid_years`). The corruption is the paper's
"01": the same prompt with the start year YY01, which tells nothing about which end years are later.

The answers are the tokens "yy+1" ... "99", the wrong ids "00" ... "yy" (each two-digit number one
token), and the metric is the probability difference: P(later years) - P(earlier or equal years).

>>> from rs_interp.tokenizers import gpt2_tokenizer
>>> task = greater_than_task(gpt2_tokenizer(), 2, seed=0)
>>> task.prompts[0], task.corrupted_prompts[0], int(task.label[0])
('The testing lasted from the year 1578 to 15', 'The testing lasted from the year 1501 to 15', 78)
"""

from __future__ import annotations

import random
from typing import Any, Sequence

from .task import Task, encode, pack, resolve_tokenizer, single_tokens

__all__ = ["greater_than_task", "valid_years", "year_tokens", "NOUNS", "TEMPLATE", "GREATER_THAN_SPANS"]

#: The position schema of a greater-than prompt (``task.spans``; PEAP's, Haklay et al. 2025, for this template):
#: ``"The"``, the noun, ``" lasted from the year"``, the start year's century ``XX1`` and its last two digits ``YY``,
#: ``" to"``, the end year's century ``XX2`` (where the answer is read), and the right padding.
GREATER_THAN_SPANS = ("prefix", "noun", "context", "XX1", "YY", "to", "XX2", "pad")

#: ACDC's prompt: a noun, the start year, and the end year's century.
TEMPLATE = "The {noun} lasted from the year {year} to {century}"

#: The paper's nouns (ACDC's list): each one GPT-2 token with its leading space.
NOUNS = (
    "abduction", "accord", "affair", "agreement", "appraisal", "assaults", "assessment", "attack", "attempts",
    "campaign", "captivity", "case", "challenge", "chaos", "clash", "collaboration", "coma", "competition",
    "confrontation", "consequence", "conspiracy", "construction", "consultation", "contact", "contract",
    "convention", "cooperation", "custody", "deal", "decline", "decrease", "demonstrations", "development",
    "disagreement", "disorder", "dispute", "domination", "dynasty", "effect", "effort", "employment", "endeavor",
    "engagement", "epidemic", "evaluation", "exchange", "existence", "expansion", "expedition", "experiments",
    "fall", "fame", "flights", "friendship", "growth", "hardship", "hostility", "illness", "impact",
    "imprisonment", "improvement", "incarceration", "increase", "insurgency", "invasion", "investigation",
    "journey", "kingdom", "marriage", "modernization", "negotiation", "notoriety", "obstruction", "operation",
    "order", "outbreak", "outcome", "overhaul", "patrols", "pilgrimage", "plague", "plan", "practice", "process",
    "program", "progress", "project", "pursuit", "quest", "raids", "reforms", "reign", "relationship",
    "retaliation", "riot", "rise", "rivalry", "romance", "rule", "sanctions", "shift", "siege", "slump",
    "stature", "stint", "strikes", "study", "test", "testing", "tests", "therapy", "tour", "tradition", "treaty",
    "trial", "trip", "unemployment", "voyage", "warfare", "work",
)


def year_tokens(tokenizer: Any) -> list[int]:
    """The ids of "00", "01", ..., "99" (no leading space): the end years' last two digits.

    Raises:
        ValueError: naming the two-digit numbers that are not one token under this tokenizer.
    """
    return single_tokens(resolve_tokenizer(tokenizer), [f"{k:02d}" for k in range(100)], "two-digit years", prefix="")


def valid_years(tokenizer: Any, centuries: Sequence[int] = range(11, 18)) -> list[int]:
    """The start years of the task: ACDC's filter (module docstring), plus the condition that makes the
    corruption as long as the prompt: " YY01" is the two tokens " YY" + "01".

    Example:
        >>> from rs_interp.tokenizers import gpt2_tokenizer
        >>> years = valid_years(gpt2_tokenizer())
        >>> len(years), years[:3], years[-1]
        (604, [1112, 1119, 1130], 1797)
    """
    tok = resolve_tokenizer(tokenizer)
    two = lambda y: [encode(tok, f" {y // 100}")[0], encode(tok, f"{y % 100:02d}")[0]]  # noqa: E731
    out = []
    for century in centuries:
        if encode(tok, f" {century}01") != two(century * 100 + 1):
            continue
        ok = [y for y in range(century * 100 + 2, century * 100 + 99) if encode(tok, f" {y}") == two(y)]
        out += ok[1:-1]  # ACDC drops each century's first and last
    return out


def greater_than_task(tokenizer: Any, n: int = 32, *, seed: int = 0, prepend_bos: bool = True,
                      nouns: Sequence[str] = NOUNS) -> Task:
    """``n`` greater-than rows (module docstring), drawn by ``random.Random(seed)``: a noun and a
    start year from :func:`valid_years`, uniformly.

    Args:
        tokenizer: a Hugging Face tokenizer, a ``tokenizers.Tokenizer``, or a model carrying one.
        n: number of rows.
        seed: the same seed gives the same task, byte for byte.
        prepend_bos: start every prompt with the tokenizer's BOS.
        nouns: each entry one token with a leading space.

    Returns:
        A :class:`Task` named ``"greater-than"``, ``kind="prob_diff"``; ``label`` holds each row's yy.

    Raises:
        ValueError: nouns or two-digit numbers that are not single tokens (named), no valid year.

    Example:
        >>> from rs_interp.tokenizers import gpt2_tokenizer
        >>> t = greater_than_task(gpt2_tokenizer(), 3, seed=0)
        >>> yy = int(t.label[1])  # 1619 -> "to 16": the answers are "20" ... "99"
        >>> yy, int((t.answers[1] >= 0).sum()), int((t.wrong[1] >= 0).sum())
        (19, 80, 20)
    """
    tok = resolve_tokenizer(tokenizer)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    nouns = list(nouns)
    single_tokens(tok, nouns, "nouns", keyword="nouns")
    digits = year_tokens(tok)
    years = valid_years(tok)
    if not years:
        raise ValueError("no start year splits into ' YY' + 'yy' under this tokenizer: the task cannot be built")
    rng = random.Random(seed)
    clean, corrupted, answers, wrong, label, segments = [], [], [], [], [], []
    for _ in range(n):
        noun, year = rng.choice(nouns), rng.choice(years)
        yy, century = year % 100, year // 100
        clean.append(TEMPLATE.format(noun=noun, year=year, century=century))
        segments.append([("prefix", "The"), ("noun", f" {noun}"), ("context", " lasted from the year"),
                         ("XX1", f" {century}"), ("YY", f"{yy:02d}"), ("to", " to"), ("XX2", f" {century}")])
        corrupted.append(TEMPLATE.format(noun=noun, year=f"{century}01", century=century))
        answers.append(digits[yy + 1:])
        wrong.append(digits[: yy + 1])
        label.append(yy)
    return pack(tok, "greater-than", clean, corrupted, answers, wrong, kind="prob_diff", prepend_bos=prepend_bos,
                seed=seed, label=label, segments=segments, span_names=GREATER_THAN_SPANS)
