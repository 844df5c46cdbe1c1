"""Indirect object identification (IOI; Wang et al. 2022, "Interpretability in the Wild"), as a
:class:`~rs_interp.tasks.Task`.

A prompt names two people, then repeats one (the subject, S) giving something to the other, and
stops before the indirect object (IO): "When Mary and John went to the store, John gave a drink to"
-> " Mary". The templates are the paper's fifteen (as in ACDC's ``acdc/ioi/ioi_dataset.py``, Conmy
et al. 2023), in both orders: ABBA (IO named first) and BABA (S named first). The names (ACDC's 99
first names, from the paper), places and objects are single GPT-2 tokens with their leading space,
so the clean and corrupted prompts of a row are as long.

The corruption is the paper's ABC distribution: the three name slots (IO, S1, S2) get three other
names, all distinct and distinct from the row's IO and S; place, object and template stay. With
``corruption="s2"`` only the second S is replaced (EAP-IG's and MIB's IOI ``corrupted`` column).
The metric is the logit difference IO - S at the last position.

>>> from rs_interp.tokenizers import gpt2_tokenizer
>>> task = ioi_task(gpt2_tokenizer(), 2, seed=0)
>>> task.prompts[0]
'The house Benjamin and Jennifer went to had a computer. Jennifer gave it to'
>>> task.corrupted_prompts[0]
'The house Steven and Nathan went to had a computer. Jamie gave it to'
"""

from __future__ import annotations

import random
from typing import Any, Literal, Sequence

from .task import Task, pack, resolve_tokenizer, single_tokens

__all__ = ["ioi_task", "IOI_TEMPLATES", "NAMES", "PLACES", "OBJECTS", "IOI_SPANS"]

#: The position schema of an IOI prompt (``task.spans``), in order: the words before the first name, the first name
#: (IO in ABBA, S in BABA), ``" and"``, the second name, the words up to the subject's repeat, the repeat (S2), the
#: words after it, the last token (``" to"``, where the answer is read), and the right padding.
IOI_SPANS = ("prefix", "first name", "and", "second name", "context", "S2", "action", "end", "pad")


def _segments(template: str, values: dict[str, str]) -> list[tuple[str, str]]:
    """The prompt of ``template`` filled with ``values`` as (span, text) segments of :data:`IOI_SPANS` (a name with its
    leading space; the last word ``" to"`` its own span)."""
    import re

    out, span, text = [], "prefix", ""
    after = {"first": "and", "second": "context", "s2": "action"}
    for piece in re.split(r"(\{\w+\})", template):
        field = piece[1:-1] if piece.startswith("{") else None
        if field in after:
            out.append((span, text.removesuffix(" ")))
            out.append(({"first": "first name", "second": "second name", "s2": "S2"}[field], " " + values[field]))
            span, text = after[field], ""
        else:
            text += piece.format(**values) if field else piece
    out += [(span, text.removesuffix(" to")), ("end", " to")]
    return [(s, t) for s, t in out if t]

#: Wang et al.'s fifteen templates, ``{first} and {second}`` the two names of the first clause
#: (BABA: S then IO; ABBA: IO then S), ``{s2}`` the subject's repeat; each stops before the IO.
IOI_TEMPLATES = (
    "Then, {first} and {second} went to the {place}. {s2} gave a {object} to",
    "Then, {first} and {second} had a lot of fun at the {place}. {s2} gave a {object} to",
    "Then, {first} and {second} were working at the {place}. {s2} decided to give a {object} to",
    "Then, {first} and {second} were thinking about going to the {place}. {s2} wanted to give a {object} to",
    "Then, {first} and {second} had a long argument, and afterwards {s2} said to",
    "After {first} and {second} went to the {place}, {s2} gave a {object} to",
    "When {first} and {second} got a {object} at the {place}, {s2} decided to give it to",
    "When {first} and {second} got a {object} at the {place}, {s2} decided to give the {object} to",
    "While {first} and {second} were working at the {place}, {s2} gave a {object} to",
    "While {first} and {second} were commuting to the {place}, {s2} gave a {object} to",
    "After the lunch, {first} and {second} went to the {place}. {s2} gave a {object} to",
    "Afterwards, {first} and {second} went to the {place}. {s2} gave a {object} to",
    "Then, {first} and {second} had a long argument. Afterwards {s2} said to",
    "The {place} {first} and {second} went to had a {object}. {s2} gave it to",
    "Friends {first} and {second} found a {object} at the {place}. {s2} gave it to",
)

#: The paper's first names (ACDC's list): each one GPT-2 token with its leading space.
NAMES = (
    "Michael", "Christopher", "Jessica", "Matthew", "Ashley", "Jennifer", "Joshua", "Amanda", "Daniel", "David",
    "James", "Robert", "John", "Joseph", "Andrew", "Ryan", "Brandon", "Jason", "Justin", "Sarah", "William",
    "Jonathan", "Stephanie", "Brian", "Nicole", "Nicholas", "Anthony", "Heather", "Eric", "Elizabeth", "Adam",
    "Megan", "Melissa", "Kevin", "Steven", "Thomas", "Timothy", "Christina", "Kyle", "Rachel", "Laura", "Lauren",
    "Amber", "Brittany", "Danielle", "Richard", "Kimberly", "Jeffrey", "Amy", "Crystal", "Michelle", "Tiffany",
    "Jeremy", "Benjamin", "Mark", "Emily", "Aaron", "Charles", "Rebecca", "Jacob", "Stephen", "Patrick", "Sean",
    "Erin", "Jamie", "Kelly", "Samantha", "Nathan", "Sara", "Dustin", "Paul", "Angela", "Tyler", "Scott",
    "Katherine", "Andrea", "Gregory", "Erica", "Mary", "Travis", "Lisa", "Kenneth", "Bryan", "Lindsey", "Kristen",
    "Jose", "Alexander", "Jesse", "Katie", "Lindsay", "Shannon", "Vanessa", "Courtney", "Christine", "Alicia",
    "Cody", "Allison", "Bradley", "Samuel",
)
#: The paper's places and objects.
PLACES = ("store", "garden", "restaurant", "school", "hospital", "office", "house", "station")
OBJECTS = ("ring", "kiss", "bone", "basketball", "computer", "necklace", "drink", "snack")


def ioi_task(tokenizer: Any, n: int = 32, *, seed: int = 0, order: Literal["mixed", "ABBA", "BABA"] = "mixed",
             corruption: Literal["abc", "s2"] = "abc", prepend_bos: bool = True, names: Sequence[str] = NAMES,
             places: Sequence[str] = PLACES, objects: Sequence[str] = OBJECTS) -> Task:
    """``n`` IOI rows (module docstring), drawn by ``random.Random(seed)``.

    Args:
        tokenizer: a Hugging Face tokenizer, a ``tokenizers.Tokenizer``, or a model carrying one.
        n: number of rows.
        seed: the same seed gives the same task, byte for byte (:meth:`Task.digest`).
        order: ``"ABBA"``, ``"BABA"`` or ``"mixed"`` (each row picks one, even odds).
        corruption: ``"abc"`` (three new names) or ``"s2"`` (only the subject's repeat replaced).
        prepend_bos: start every prompt with the tokenizer's BOS (TransformerLens's default for GPT-2).
        names, places, objects: the word lists; each entry must be one token with a leading space.

    Returns:
        A :class:`Task` named ``"ioi"``: answers the IO's id, wrong the S's, ``kind="logit_diff"``; ``spans`` the
        prompts' position schema (:data:`IOI_SPANS`).

    Raises:
        ValueError: words that are not single tokens (all named), fewer than five names, ``n < 1``,
            an unknown ``order`` or ``corruption``.

    Example:
        >>> from rs_interp.tokenizers import gpt2_tokenizer
        >>> tok = gpt2_tokenizer()
        >>> t = ioi_task(tok, 4, seed=1)
        >>> tok.decode(t.answers[0]), tok.decode(t.wrong[0]), bool((t.clean != t.corrupted).any(1).all())
        (' Bradley', ' Daniel', True)
    """
    tok = resolve_tokenizer(tokenizer)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if order not in ("mixed", "ABBA", "BABA"):
        raise ValueError(f"order must be 'mixed', 'ABBA' or 'BABA', got {order!r}")
    if corruption not in ("abc", "s2"):
        raise ValueError(f"corruption must be 'abc' or 's2', got {corruption!r}")
    names, places, objects = list(names), list(places), list(objects)
    if len(set(names)) < 5:
        raise ValueError(f"need at least 5 distinct names (IO, S and three for the corruption), got {len(set(names))}")
    name_ids = dict(zip(names, single_tokens(tok, names, "names", keyword="names")))
    single_tokens(tok, places, "places", keyword="places")
    single_tokens(tok, objects, "objects", keyword="objects")
    rng = random.Random(seed)
    clean, corrupted, answers, wrong, segments = [], [], [], [], []
    for _ in range(n):
        template = IOI_TEMPLATES[rng.randrange(len(IOI_TEMPLATES))]
        abba = rng.random() < 0.5 if order == "mixed" else order == "ABBA"
        io, s = rng.sample(names, 2)
        c, d, e = rng.sample([x for x in names if x not in (io, s)], 3)
        words = dict(place=rng.choice(places), object=rng.choice(objects))
        first, second = (io, s) if abba else (s, io)
        clean.append(template.format(first=first, second=second, s2=s, **words))
        segments.append(_segments(template, dict(first=first, second=second, s2=s, **words)))
        if corruption == "abc":
            corrupted.append(template.format(first=c, second=d, s2=e, **words))
        else:
            corrupted.append(template.format(first=first, second=second, s2=c, **words))
        answers.append([name_ids[io]])
        wrong.append([name_ids[s]])
    return pack(tok, "ioi", clean, corrupted, answers, wrong, kind="logit_diff", prepend_bos=prepend_bos, seed=seed,
                segments=segments, span_names=IOI_SPANS)
