"""Subject-verb agreement (SVA), as a :class:`~rs_interp.tasks.Task`: does the model prefer the verb
form that agrees with the subject?

The prompts follow Marvin & Linzen's (2018) constructions and stop where the main verb comes: a bare
subject ("The author"), a prepositional phrase with an attractor noun ("The author near the
guards"), or an object relative clause whose own verb agrees with the attractor ("The author that
the guards like"). The corrupted prompt flips the subject's number and nothing else (the attractor
keeps its number), and, as in ``hannamw/eap-ig-faithfulness`` (``data/sva/create_dataset.py``), a
pair is kept only where the clean and corrupted prompts are as long in tokens (under GPT-2,
"painter" is one token and "painters" two: those rows are drawn again).

The metric is the verb-form probability difference: the total probability of the verb forms that
agree with the clean subject (:data:`VERBS`, each one token with its leading space) minus that of
the forms that do not, at the last position (Hanna et al. 2024's SVA metric, on a verb list of our own).

>>> from rs_interp.tokenizers import gpt2_tokenizer
>>> task = sva_task(gpt2_tokenizer(), 2, seed=0)
>>> task.prompts[1], task.corrupted_prompts[1], int(task.label[1])
('The lawyer behind the soldiers', 'The lawyers behind the soldiers', 0)
"""

from __future__ import annotations

import random
from typing import Any, Sequence

from .task import Task, encode, pack, resolve_tokenizer, single_tokens

__all__ = ["sva_task", "SVA_TEMPLATES", "SUBJECTS", "VERBS", "SVA_SPANS"]

#: The position schema of an SVA prompt (``task.spans``): ``"The"``, the subject, the words between it and the
#: attractor (``" near the"``, ``" that the"`` ...), the attractor, a relative clause's verb, and the right padding;
#: a construction without an attractor leaves those spans empty.
SVA_SPANS = ("prefix", "subject", "connector", "attractor", "verb", "pad")


def _segments(template: str, subj: str, attr: str, rel: str) -> list[tuple[str, str]]:
    """The prompt of ``template`` as (span, text) segments of :data:`SVA_SPANS`."""
    out = [("prefix", "The"), ("subject", f" {subj}")]
    rest = template.removeprefix("The {subj}")
    if rest:
        connector, _, tail = rest.partition(" {attr}")
        out += [("connector", connector), ("attractor", f" {attr}")] + ([("verb", f" {rel}")] if tail else [])
    return out

#: The constructions: ``{subj}`` the subject, ``{attr}`` an attractor noun, ``{rel}`` a relative
#: clause's verb agreeing with the attractor; each stops before the main verb.
SVA_TEMPLATES = (
    "The {subj}",
    "The {subj} near the {attr}",
    "The {subj} next to the {attr}",
    "The {subj} behind the {attr}",
    "The {subj} that the {attr} {rel}",
)

#: (singular, plural) nouns, animate, as in Marvin & Linzen's lists; subjects and attractors.
SUBJECTS = (
    ("author", "authors"), ("pilot", "pilots"), ("surgeon", "surgeons"), ("farmer", "farmers"),
    ("manager", "managers"), ("customer", "customers"), ("officer", "officers"), ("teacher", "teachers"),
    ("senator", "senators"), ("athlete", "athletes"), ("dancer", "dancers"), ("doctor", "doctors"),
    ("lawyer", "lawyers"), ("student", "students"), ("minister", "ministers"), ("executive", "executives"),
    ("guard", "guards"), ("skater", "skaters"), ("chef", "chefs"), ("architect", "architects"),
    ("painter", "painters"), ("consultant", "consultants"), ("singer", "singers"), ("driver", "drivers"),
    ("judge", "judges"), ("nurse", "nurses"), ("soldier", "soldiers"), ("engineer", "engineers"),
    ("child", "children"), ("woman", "women"), ("man", "men"),
)

#: (third person singular, plural) present verb forms whose probabilities the metric compares.
VERBS = (
    ("is", "are"), ("was", "were"), ("has", "have"), ("does", "do"), ("likes", "like"), ("says", "say"),
    ("seems", "seem"), ("makes", "make"), ("knows", "know"), ("goes", "go"), ("needs", "need"), ("wants", "want"),
    ("thinks", "think"), ("gets", "get"), ("takes", "take"), ("looks", "look"), ("feels", "feel"),
    ("comes", "come"), ("writes", "write"), ("plays", "play"), ("loves", "love"), ("hates", "hate"),
    ("runs", "run"), ("lives", "live"), ("works", "work"), ("believes", "believe"), ("helps", "help"),
    ("tells", "tell"), ("gives", "give"), ("remains", "remain"), ("appears", "appear"), ("becomes", "become"),
    ("keeps", "keep"), ("uses", "use"), ("finds", "find"), ("sees", "see"),
)
#: The relative clauses' verbs (they agree with the attractor), from :data:`VERBS`.
_REL_VERBS = (("likes", "like"), ("loves", "love"), ("hates", "hate"))


def verb_ids(tokenizer: Any, verbs: Sequence[tuple[str, str]] = VERBS) -> tuple[list[int], list[int]]:
    """(singular ids, plural ids) of the verb forms, each one token with its leading space.

    Raises:
        ValueError: naming the forms that are not single tokens.
    """
    tok = resolve_tokenizer(tokenizer)
    return (single_tokens(tok, [s for s, _ in verbs], "verbs", keyword="verbs"),
            single_tokens(tok, [p for _, p in verbs], "verbs", keyword="verbs"))


def sva_task(tokenizer: Any, n: int = 32, *, seed: int = 0, prepend_bos: bool = True,
             subjects: Sequence[tuple[str, str]] = SUBJECTS, verbs: Sequence[tuple[str, str]] = VERBS) -> Task:
    """``n`` subject-verb agreement rows (module docstring), drawn by ``random.Random(seed)``: a
    template, a subject and its number, an attractor and its number; rows whose clean and corrupted
    prompts differ in token length are skipped (the next draw replaces them).

    Args:
        tokenizer: a Hugging Face tokenizer, a ``tokenizers.Tokenizer``, or a model carrying one.
        n: number of rows.
        seed: the same seed gives the same task, byte for byte.
        prepend_bos: start every prompt with the tokenizer's BOS.
        subjects: (singular, plural) nouns for the subject and the attractor.
        verbs: (singular, plural) verb forms the metric compares; each a single token with a leading space.

    Returns:
        A :class:`Task` named ``"sva"``, ``kind="prob_diff"``; ``label`` is 1 where the clean subject is plural.

    Raises:
        ValueError: verb forms that are not single tokens (named); no subject whose two forms give
            prompts of equal length within ``100 * n`` draws.

    Example:
        >>> from rs_interp.tokenizers import gpt2_tokenizer
        >>> tok = gpt2_tokenizer()
        >>> t = sva_task(tok, 4, seed=0)
        >>> plural = bool(t.label[0])
        >>> tok.decode(t.answers[0, :2]) == (" are were" if plural else " is was")
        True
    """
    tok = resolve_tokenizer(tokenizer)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    singular, plural = verb_ids(tok, verbs)
    subjects = list(subjects)
    if not subjects:
        raise ValueError("subjects is empty")
    rng = random.Random(seed)
    clean, corrupted, answers, wrong, label, segments = [], [], [], [], [], []
    for _ in range(100 * n):
        if len(clean) == n:
            break
        template = SVA_TEMPLATES[rng.randrange(len(SVA_TEMPLATES))]
        subj, is_plural = rng.choice(subjects), rng.random() < 0.5
        attr, attr_plural = rng.choice(subjects), rng.random() < 0.5
        rel = rng.choice(_REL_VERBS)[attr_plural]
        c, x = (template.format(subj=subj[p], attr=attr[attr_plural], rel=rel) for p in (is_plural, not is_plural))
        if len(encode(tok, c)) != len(encode(tok, x)):
            continue  # eap-ig-faithfulness's rule: only pairs of equal token length
        clean.append(c), corrupted.append(x), label.append(int(is_plural))
        segments.append(_segments(template, subj[is_plural], attr[attr_plural], rel))
        answers.append(plural if is_plural else singular)
        wrong.append(singular if is_plural else plural)
    if len(clean) < n:
        raise ValueError(f"only {len(clean)} of {n} subject-verb pairs were as long in tokens as their corruption "
                         f"within {100 * n} draws: pass subjects= whose two forms tokenize alike")
    return pack(tok, "sva", clean, corrupted, answers, wrong, kind="prob_diff", prepend_bos=prepend_bos, seed=seed,
                label=label, segments=segments, span_names=SVA_SPANS)
