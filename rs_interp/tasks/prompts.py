"""Your own task from your own text: prompt pairs and their answers, tokenized and checked, as a
:class:`~rs_interp.tasks.Task`.

A circuit task is pairs of prompts, clean and corrupted, as long in tokens, and the answers to tell
apart at the end of each: the text the clean prompt should continue with (correct) and the text it
should not (wrong). :func:`prompt_task` takes them as strings, with the model's tokenizer (GPT-2's, a
shipped model's such as ``code-2l``'s, or a model that carries one), and returns the
:class:`~rs_interp.tasks.Task` every circuit helper takes (``task.clean``, ``task.metric()``,
``reference=task.corrupted``). An answer is the text exactly as it follows its prompt: after ``"gave a
drink to"`` it is ``" Mary"``, with its space; after ``"self."`` it is ``"weight"``, without.

Each answer must be one token, and each pair as long in tokens: a refusal names the pair, the word and
how it splits (and a one-token spelling nearby, where there is one). :func:`word_pieces` shows how
words split before you write the prompts; :func:`one_token_words` lists the words a tokenizer has as
one token.

>>> from rs_interp.tokenizers import gpt2_tokenizer
>>> tok = gpt2_tokenizer()
>>> task = prompt_task(tok, [("When Mary and John went to the store, John gave a drink to",
...                           "When Mary and John went to the store, Mary gave a drink to")], [(" Mary", " John")])
>>> task.kind, tuple(task.clean.shape), tok.decode(task.answers[0]), tok.decode(task.wrong[0])
('logit_diff', (1, 15), ' Mary', ' John')
>>> word_pieces(tok, [" Mary", " Kristen", " Xyzzy"])
{' Mary': (' Mary',), ' Kristen': (' Kristen',), ' Xyzzy': (' X', 'y', 'zzy')}
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Sequence

from .task import MetricKind, Task, encode, pack, resolve_tokenizer

__all__ = ["prompt_task", "word_pieces", "one_token_words"]

#: How much of a prompt a message quotes.
_QUOTED = 48


def prompt_task(tokenizer: Any, pairs: Sequence[tuple[str, str]], answers: Sequence[tuple[Any, Any]], *,
                kind: MetricKind = "logit_diff", prepend_bos: bool = True, name: str = "custom") -> Task:
    """A :class:`~rs_interp.tasks.Task` from prompt pairs and their answers (module docstring).

    The metric (``task.metric()``) is the mean over the pairs of the correct answers' mean logit minus
    the wrong answers' (``kind="logit_diff"``), or of their total probabilities' difference
    (``"prob_diff"``), at each clean prompt's last token.

    Args:
        tokenizer: a Hugging Face tokenizer, a ``tokenizers.Tokenizer``, or a model carrying one
            (``model.tokenizer``: ``load_toy_model("code-2l")``, ``load_gpt2(...)``); given a model, the
            ids are also checked against its vocabulary and the prompts against its context.
        pairs: ``(clean, corrupted)`` prompts, each pair as long in tokens.
        answers: one ``(correct, wrong)`` per pair, each a string or a list of strings (several
            answers: their mean logit), each string one token as it follows its prompt.
        kind: ``"logit_diff"`` or ``"prob_diff"``.
        prepend_bos: start every prompt with the tokenizer's BOS (as TransformerLens does by default).
        name: the task's name (the circuit command's pages and files show it).

    Returns:
        The task: ``prompts`` and ``corrupted_prompts`` the texts, ``seed`` None.

    Raises:
        ValueError: naming the pair and the word: an answer that is not one token (with its pieces and a
            one-token spelling nearby where there is one), a pair of different token lengths (with the
            words that split differently), an answer both correct and wrong, an id outside the model's
            vocabulary, a prompt longer than its context, or malformed arguments.

    Example:
        >>> import rs_interp as ri, torch
        >>> model = ri.load_toy_model("code-2l")
        >>> text = "        x = self.plonk_{}(x)\\n        x = self.plonk_"      # induction: copy the name seen before
        >>> task = prompt_task(model, [(text.format("norm"), text.format("bias"))], [("norm", "bias")])
        >>> with torch.no_grad():
        ...     float(task.metric()(model(task.clean))) > float(task.metric()(model(task.corrupted)))
        True
    """
    tok = resolve_tokenizer(tokenizer)
    model = tokenizer if hasattr(tokenizer, "cfg") else None
    _check_arguments(pairs, answers, kind, name)
    right = [_answer_ids(tok, i, pairs[i][0], a, "correct") for i, (a, _) in enumerate(answers)]
    wrong = [_answer_ids(tok, i, pairs[i][0], w, "wrong") for i, (_, w) in enumerate(answers)]
    for i, (r, w) in enumerate(zip(right, wrong)):
        both = sorted(set(r) & set(w))
        if both:
            word = _pieces(tok, both[:1])[0]
            raise ValueError(f"Pair {i}: {word!r} is both a correct and a wrong answer, so the metric cannot tell "
                             "them apart. Give each answer on one side only.")
    for i, (clean, corrupted) in enumerate(pairs):
        _check_lengths(tok, i, clean, corrupted)
    task = pack(tok, name, [c for c, _ in pairs], [x for _, x in pairs], right, wrong, kind=kind,
                prepend_bos=prepend_bos, seed=None)
    if model is not None:
        _check_model(model, task)
    return task


def word_pieces(tokenizer: Any, words: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """How the tokenizer splits each word: ``word -> its tokens' texts`` (one piece: one token).

    A word is taken exactly as written: ``" Mary"`` (with the space that precedes it in a sentence)
    and ``"Mary"`` are different tokens.

    Args:
        tokenizer: a tokenizer, or a model carrying one.
        words: the words (any text).

    Raises:
        ValueError: ``words`` is a bare string or holds something else than strings.

    Example:
        >>> import rs_interp as ri
        >>> word_pieces(ri.load_toy_model("code-2l"), [" self", " Mary"])
        {' self': (' self',), ' Mary': (' M', 'ary')}
    """
    tok = resolve_tokenizer(tokenizer)
    if isinstance(words, str) or not all(isinstance(w, str) for w in words):
        raise ValueError("words must be a list of strings, e.g. [' Mary', ' John'].")
    return {w: tuple(_pieces(tok, encode(tok, w))) for w in words}


def one_token_words(tokenizer: Any, *, prefix: str = " ") -> tuple[str, ...]:
    """Every word the tokenizer has as one token: ``prefix`` then letters, digits or underscores (a
    letter or underscore first), each encoding back to that one token, in the vocabulary's order
    (a BPE vocabulary's: the most frequent merges first).

    Args:
        tokenizer: a tokenizer, or a model carrying one.
        prefix: what precedes the word: ``" "`` (a word inside a sentence or after a keyword) or ``""``
            (after ``.`` or ``(``, or at a line's start after indentation).

    Example:
        >>> import rs_interp as ri
        >>> words = one_token_words(ri.load_toy_model("code-2l"))
        >>> len(words) > 500, " self" in words, " Mary" in words
        (True, True, False)
    """
    tok = resolve_tokenizer(tokenizer)
    if not isinstance(prefix, str):
        raise ValueError(f"prefix must be a string, e.g. ' ' or '', got {type(prefix).__name__}.")
    vocab = tok.get_vocab() if hasattr(tok, "get_vocab") else {}
    ids = sorted(set(vocab.values()))
    texts = _pieces(tok, ids)
    word = re.compile(re.escape(prefix) + r"[A-Za-z_][A-Za-z0-9_]*\Z")
    found = [(i, t) for i, t in zip(ids, texts) if word.match(t)]
    return tuple(t for (i, t), back in zip(found, _encode_all(tok, [t for _, t in found])) if back == [i])


def _check_arguments(pairs: Any, answers: Any, kind: Any, name: Any) -> None:
    if isinstance(pairs, str) or not isinstance(pairs, Sequence) or len(pairs) == 0:
        raise ValueError("pairs must be a non-empty list of (clean, corrupted) prompt pairs.")
    for i, p in enumerate(pairs):
        if not (isinstance(p, (tuple, list)) and len(p) == 2 and all(isinstance(x, str) and x for x in p)):
            raise ValueError(f"Pair {i} must be two non-empty strings (clean, corrupted), got {_short(repr(p))}.")
    if isinstance(answers, str) or not isinstance(answers, Sequence) or len(answers) != len(pairs):
        n = len(answers) if isinstance(answers, Sequence) and not isinstance(answers, str) else "no list of"
        raise ValueError(f"answers must hold one (correct, wrong) per pair: {len(pairs)} pairs, {n} answers.")
    for i, a in enumerate(answers):
        if not (isinstance(a, (tuple, list)) and len(a) == 2):
            raise ValueError(f"The answers of pair {i} must be (correct, wrong), each a string or a list of strings, "
                             f"got {_short(repr(a))}.")
    if kind not in ("logit_diff", "prob_diff"):
        raise ValueError(f"kind must be 'logit_diff' or 'prob_diff', got {kind!r}.")
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}.")


def _answer_ids(tok: Any, i: int, prompt: str, words: Any, side: str) -> list[int]:
    """The one token of each of a pair's ``side`` answers.

    Raises:
        ValueError: an answer that is not one token under ``tok``, naming the pair, the word, its pieces and
            a one-token spelling nearby where there is one.
    """
    listed = [words] if isinstance(words, str) else list(words) if isinstance(words, (tuple, list)) else None
    if not listed or not all(isinstance(w, str) and w for w in listed):
        raise ValueError(f"The {side} answer of pair {i} must be a non-empty string or a list of them, "
                         f"got {_short(repr(words))}.")
    ids = []
    for w in listed:
        t = encode(tok, w)
        if len(t) != 1:
            near = _near(tok, w)
            hint = f" {near!r} is one token." if near else " rs_interp.tasks.one_token_words lists those that are."
            raise ValueError(f"Pair {i} ({_short(prompt)!r}): the {side} answer {w!r} is {len(t)} tokens, "
                             f"{_plus(_pieces(tok, t))}; an answer must be one token.{hint}")
        _check_continuation(tok, i, prompt, w, t[0], side)
        ids.append(t[0])
    return ids


def _check_continuation(tok: Any, i: int, prompt: str, word: str, token: int, side: str) -> None:
    """Refuse an answer that, written after its prompt, is not that one token (``"to" + "Mary"`` is ``"toMary"``)."""
    head, whole = encode(tok, prompt), encode(tok, prompt + word)
    if whole == head + [token]:
        return
    k = next((j for j, (x, y) in enumerate(zip(head, whole)) if x != y), min(len(head), len(whole)))
    if prompt[-1:].isspace():
        advice = f"end the prompt before its last space and start the answer with it ({' ' + word.lstrip()!r})."
    elif not word.startswith(" ") and _continues(tok, prompt, " " + word.lstrip()):
        advice = f"try {' ' + word.lstrip()!r}."
    else:
        advice = "choose another answer (rs_interp.tasks.word_pieces shows how text splits)."
    raise ValueError(f"Pair {i} ({_short(prompt)!r}): written after its prompt, the {side} answer {word!r} is not its "
                     f"own token: the text ends {_joined(_pieces(tok, whole[k:]))}. An answer is the text that follows "
                     f"the prompt: {advice}")


def _continues(tok: Any, prompt: str, word: str) -> bool:
    """Whether ``word`` is one token and stays that token written after ``prompt``."""
    t = encode(tok, word)
    return len(t) == 1 and encode(tok, prompt + word) == encode(tok, prompt) + t


def _near(tok: Any, word: str) -> str | None:
    """A one-token spelling of ``word`` (its space added or removed, another case, a plural's singular, its
    first piece where that is a word of three letters or more), or None."""
    bare = word.strip()
    space = " " if word.startswith(" ") or not word else ""
    tries = [" " + bare, bare, space + bare.lower(), space + bare.capitalize(), " " + bare.lower(),
             " " + bare.capitalize()]
    if bare.endswith("s") and len(bare) > 2:
        tries += [space + bare[:-1], " " + bare[:-1]]
    first = _pieces(tok, encode(tok, word)[:1])
    if first and len(first[0].strip()) >= 3 and first[0].strip().isalpha():
        tries.append(first[0])
    return next((t for t in dict.fromkeys(tries) if t != word and t.strip() and len(encode(tok, t)) == 1), None)


def _check_lengths(tok: Any, i: int, clean: str, corrupted: str) -> None:
    """Refuse a pair whose prompts differ in token length, naming the words that split differently."""
    a, b = _pieces(tok, encode(tok, clean)), _pieces(tok, encode(tok, corrupted))
    if len(a) == len(b):
        return
    ops = [op for op in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes() if op[0] != "equal"]
    where = ""
    if ops:
        _, i1, i2, j1, j2 = ops[0]
        where = (f" Where they differ, the clean prompt has {_joined(a[i1:i2])} and the corrupted {_joined(b[j1:j2])}.")
    raise ValueError(f"Pair {i} ({_short(clean)!r}): the clean prompt is {len(a)} tokens and the corrupted "
                     f"{len(b)}; a pair must be as long in tokens.{where}")


def _check_model(model: Any, task: Task) -> None:
    cfg = model.cfg
    top = int(max(task.clean.max(), task.answers.max(), task.wrong.max(), task.corrupted.max()))
    if top >= cfg.d_vocab:
        raise ValueError(f"This tokenizer gives token id {top}, outside the model's {cfg.d_vocab}-token vocabulary: "
                         "pass the model's own tokenizer.")
    long = (task.positions + 1 > cfg.n_ctx).nonzero().flatten().tolist()
    if long:
        raise ValueError(f"Pair {long[0]} is {int(task.positions[long[0]]) + 1} tokens, more than the model's context "
                         f"of {cfg.n_ctx}: shorten its prompts.")


def _pieces(tok: Any, ids: Sequence[int]) -> list[str]:
    """Each id's text, as the tokenizer decodes it alone (one batch call: a vocabulary is 50,000 ids)."""
    one = [[int(i)] for i in ids]
    return list(tok.batch_decode(one) if hasattr(tok, "batch_decode") else tok.decode_batch(one))


def _encode_all(tok: Any, texts: Sequence[str]) -> list[list[int]]:
    """:func:`~rs_interp.tasks.task.encode` of each text, in one batch call."""
    if not texts:
        return []
    if hasattr(tok, "convert_ids_to_tokens"):  # a Hugging Face tokenizer
        return [list(ids) for ids in tok(list(texts), add_special_tokens=False)["input_ids"]]
    return [list(e.ids) for e in tok.encode_batch(list(texts), add_special_tokens=False)]


def _plus(pieces: Sequence[str], k: int = 6) -> str:
    """``' Krist' + 'en'``: at most ``k`` pieces, then how many more (a message holds a few)."""
    shown = " + ".join(map(repr, pieces[:k]))
    return shown if len(pieces) <= k else f"{shown} and {len(pieces) - k} more"


def _joined(pieces: Sequence[str]) -> str:
    """``' Krist' + 'en' (2 tokens)``."""
    n = len(pieces)
    return f"{_plus(pieces)} ({n} token{'' if n == 1 else 's'})" if n else "nothing"


def _short(text: str) -> str:
    return text if len(text) <= _QUOTED else text[: _QUOTED - 3] + "..."
