"""The one task type: clean and corrupted prompts, the answers to tell apart, where to read them, a metric.

A :class:`Task` row is a pair of prompts of equal token length (clean, corrupted), the position whose
next-token logits are read (the prompt's last token), the answer ids the clean prompt should favour
and the wrong ids it should not (several of each where the task has them: greater-than's later and
earlier years, subject-verb agreement's verb forms; -1 pads a row's list). Rows of different lengths
are right-padded; the models are causal, so a padded position never reaches the read position.

``task.metric()`` is a :data:`rs_interp.Metric` built from the answers: the mean over rows of

- ``"logit_diff"``: mean logit of the answers minus mean logit of the wrong ids (IOI: the IO - S
  logit difference of Wang et al. 2022);
- ``"prob_diff"``: total probability of the answers minus that of the wrong ids (greater-than's
  metric, Hanna et al. 2023; subject-verb agreement's, Hanna et al. 2024).

Every helper takes it with the corrupted prompts as the reference run:

>>> import rs_interp as ri
>>> from rs_interp.tasks import induction_task
>>> model = ri.load_toy_model("induction-2l")
>>> task = induction_task(8, seed=0, d_vocab=model.cfg.d_vocab)
>>> eap = ri.edge_attribution_patching(model, task.clean, task.metric(), reference=task.corrupted)
>>> task.metric()(model(task.clean)) > task.metric()(model(task.corrupted))
tensor(True)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal, Sequence

import torch
from jaxtyping import Float, Int

from .._messages import few
from ..metrics import declare_direction

__all__ = ["Task", "MetricKind", "NotSingleTokens"]

MetricKind = Literal["logit_diff", "prob_diff"]
_KINDS = ("logit_diff", "prob_diff")


@dataclass(frozen=True, eq=False)
class Task:
    """A circuit task: paired prompts, the answers to tell apart, and the metric built from them.

    Attributes:
        name: ``"ioi"``, ``"greater-than"``, ``"sva"``, ``"induction"`` (or a CSV's task name).
        clean: (batch, pos) token ids of the clean prompts (right-padded).
        corrupted: (batch, pos) the corrupted prompts, each as long as its clean one in tokens.
        answers: (batch, answer) the ids the clean prompt should favour, -1 padding.
        wrong: (batch, wrong) the ids it should not favour, -1 padding.
        positions: (batch,) the position whose logits are read: each clean prompt's last token.
        kind: the metric (module docstring): ``"logit_diff"`` or ``"prob_diff"``.
        label: (batch,) one number per row where the task has one: EAP-IG's CSV label column
            (greater-than: the clean year's last two digits; sva: 1 where the clean subject is
            plural) or induction's period of each clean row; None for IOI (its ids are the answers).
        prompts: the clean texts (no BOS), or None for token-id tasks (induction).
        corrupted_prompts: the corrupted texts, or None.
        seed: the seed the rows were drawn with (None for a task read from a file).
        spans: the task's position schema (:class:`rs_interp.circuits.positions.PositionSchema` of ``clean``: the
            subject, the verb, the end ...), aligning prompts of different lengths for position-aware edges
            (``spans=task.spans``); None where the builder gives none.

    Raises:
        ValueError: shapes or ids that do not fit together (the message says which).

    Example:
        >>> t = Task("toy", clean=torch.tensor([[1, 2, 3]]), corrupted=torch.tensor([[1, 4, 3]]),
        ...          answers=torch.tensor([[5]]), wrong=torch.tensor([[6]]), positions=torch.tensor([2]))
        >>> logits = torch.zeros(1, 3, 8)
        >>> logits[0, 2, 5] = 2.0
        >>> float(t.metric()(logits)), len(t)
        (2.0, 1)
    """

    name: str
    clean: Int[torch.Tensor, "batch pos"]
    corrupted: Int[torch.Tensor, "batch pos"]
    answers: Int[torch.Tensor, "batch answer"]
    wrong: Int[torch.Tensor, "batch wrong"]
    positions: Int[torch.Tensor, " batch"]
    kind: MetricKind = "logit_diff"
    label: Int[torch.Tensor, " batch"] | None = None
    prompts: tuple[str, ...] | None = None
    corrupted_prompts: tuple[str, ...] | None = None
    seed: int | None = None
    spans: Any = None

    def __post_init__(self) -> None:
        for field in ("clean", "corrupted", "answers", "wrong"):
            t = getattr(self, field)
            if not isinstance(t, torch.Tensor) or t.ndim != 2 or t.dtype != torch.long:
                raise ValueError(f"Task.{field} must be a 2-D torch.long tensor, got {_describe(t)}")
        B, P = self.clean.shape
        if B == 0 or P == 0:
            raise ValueError(f"Task.clean is empty: shape {(B, P)}")
        if self.corrupted.shape != self.clean.shape:
            raise ValueError(f"Task.corrupted has shape {tuple(self.corrupted.shape)}, clean {(B, P)}: the pairs must "
                             "be as long")
        for field in ("answers", "wrong", "positions") + (("label",) if self.label is not None else ()):
            t = getattr(self, field)
            if field in ("positions", "label") and (not isinstance(t, torch.Tensor) or t.ndim != 1
                                                    or t.dtype != torch.long):
                raise ValueError(f"Task.{field} must be a 1-D torch.long tensor, got {_describe(t)}")
            if t.shape[0] != B:
                raise ValueError(f"Task.{field} has {t.shape[0]} rows, clean has {B}")
        if bool(((self.positions < 0) | (self.positions >= P)).any()):
            raise ValueError(f"Task.positions must lie in [0, {P}), got {few(self.positions.tolist(), 8)}")
        for field in ("clean", "corrupted", "answers", "wrong"):
            if bool((getattr(self, field) < (-1 if field in ("answers", "wrong") else 0)).any()):
                padding = " other than the -1 padding" if field in ("answers", "wrong") else ""
                raise ValueError(f"Task.{field} holds negative ids{padding}")
        for field in ("answers", "wrong"):
            empty = ((getattr(self, field) >= 0).sum(1) == 0).nonzero().flatten().tolist()
            if empty:
                raise ValueError(f"Task.{field} is empty in rows {few(empty, 8)}: every row needs at least one id")
        if self.kind not in _KINDS:
            raise ValueError(f"Task.kind must be one of {_KINDS}, got {self.kind!r}")
        for field in ("prompts", "corrupted_prompts"):
            texts = getattr(self, field)
            if texts is not None and len(texts) != B:
                raise ValueError(f"Task.{field} has {len(texts)} texts for {B} rows")
        if self.spans is not None and tuple(self.spans.span_of.shape) != (B, P):
            raise ValueError(f"Task.spans gives spans to {tuple(self.spans.span_of.shape)} positions, clean has "
                             f"{(B, P)}")

    def __len__(self) -> int:
        return self.clean.shape[0]

    def scores(self, logits: Float[torch.Tensor, "batch pos d_vocab"],
               kind: MetricKind | None = None) -> Float[torch.Tensor, " batch"]:
        """The metric of each row (module docstring) from logits of this task's prompts, in float32
        at least (float64 stays float64), differentiable.

        Raises:
            ValueError: logits whose (batch, pos) differ from the prompts', or too few logits for the ids.
        """
        kind = self.kind if kind is None else kind
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
        if logits.ndim != 3 or tuple(logits.shape[:2]) != tuple(self.clean.shape):
            raise ValueError(f"{self.name}: logits of shape {tuple(logits.shape)} do not match the prompts' (batch, "
                             f"pos) {tuple(self.clean.shape)}")
        top = int(max(self.answers.max(), self.wrong.max()))
        if top >= logits.shape[-1]:
            raise ValueError(f"{self.name}: answer id {top} is outside the model's {logits.shape[-1]} logits")
        x = logits if logits.dtype == torch.float64 else logits.float()
        x = x[torch.arange(len(self), device=x.device), self.positions.to(x.device)]  # (batch, d_vocab)
        if kind == "prob_diff":
            x = x.softmax(-1)

        def side(ids: torch.Tensor) -> torch.Tensor:
            ids = ids.to(x.device)
            mask = (ids >= 0).to(x.dtype)
            total = (x.gather(1, ids.clamp(min=0)) * mask).sum(1)
            return total if kind == "prob_diff" else total / mask.sum(1)

        return side(self.answers) - side(self.wrong)

    def metric(self, kind: MetricKind | None = None):
        """A :data:`rs_interp.Metric`: the mean of :meth:`scores` over the rows (``kind`` defaults to the task's),
        declaring its direction, higher is better (both kinds are differences of the answers over the wrong
        ones: :func:`rs_interp.metrics.declare_direction`), which the faithfulness curves and MIB's scores read.

        Example:
            >>> from rs_interp.tasks import induction_task
            >>> task = induction_task(4, seed=0)
            >>> m = task.metric()
            >>> float(m(torch.zeros(4, task.clean.shape[1], 256)))  # equal logits: no preference
            0.0
        """
        kind = self.kind if kind is None else kind
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")

        def metric(logits: Float[torch.Tensor, "batch pos d_vocab"]) -> Float[torch.Tensor, ""]:
            return self.scores(logits, kind).mean()

        return declare_direction(metric, True)

    def digest(self) -> str:
        """sha256 of every tensor's bytes and every text: equal digests mean identical datasets.

        Example:
            >>> from rs_interp.tasks import induction_task
            >>> a, b, c = (induction_task(4, seed=s).digest() for s in (1, 1, 2))
            >>> a == b != c
            True
        """
        h = hashlib.sha256()
        h.update(f"{self.name}\0{self.kind}\0".encode())
        for field in ("clean", "corrupted", "answers", "wrong", "positions", "label"):
            t = getattr(self, field)
            h.update(field.encode() + b"\0")
            if t is not None:
                h.update(str(tuple(t.shape)).encode() + t.contiguous().numpy().tobytes())
        for texts in (self.prompts, self.corrupted_prompts):
            h.update(b"\1" if texts is None else "\0".join(texts).encode() + b"\2")
        return h.hexdigest()


def _describe(t: Any) -> str:
    if isinstance(t, torch.Tensor):
        return f"a {t.ndim}-D {t.dtype} tensor"
    return type(t).__name__


# --- what the task builders share -------------------------------------------------------------


def resolve_tokenizer(tokenizer_or_model: Any) -> Any:
    """A tokenizer given as itself or as a model carrying one (``model.tokenizer``).

    Raises:
        ValueError: a model without a tokenizer.
    """
    if hasattr(tokenizer_or_model, "cfg") and hasattr(tokenizer_or_model, "tokenizer"):
        tok = tokenizer_or_model.tokenizer
        if tok is None:
            raise ValueError("this model has no tokenizer: pass a tokenizer (for GPT-2's vocabulary, "
                             "rs_interp.tokenizers.gpt2_tokenizer())")
        return tok
    if tokenizer_or_model is None:
        raise ValueError("a tokenizer is needed to build a text task")
    return tokenizer_or_model


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` with no special tokens, from a Hugging Face tokenizer or a ``tokenizers.Tokenizer``."""
    if hasattr(tokenizer, "convert_ids_to_tokens"):  # a Hugging Face tokenizer
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer.encode(text, add_special_tokens=False).ids)


def bos_id(tokenizer: Any) -> int:
    """The tokenizer's BOS id (``<|endoftext|>`` for a ``tokenizers.Tokenizer`` that has it).

    Raises:
        ValueError: the tokenizer has none (then build with ``prepend_bos=False``).
    """
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None and hasattr(tokenizer, "token_to_id"):
        bos = tokenizer.token_to_id("<|endoftext|>")
    if bos is None:
        raise ValueError("the tokenizer has no BOS token: build the task with prepend_bos=False")
    return int(bos)


class NotSingleTokens(ValueError):
    """Words a task needs as one token each that are not, under the tokenizer given (a ``ValueError``).

    The message shows a few; the attributes hold them all, for code (the command line words its own advice).

    Attributes:
        words: every such word (with its leading space, if any) and how many tokens it takes.
        what: which of the task's lists (``"names"``, ``"nouns"``, ``"verbs"``, ``"two-digit years"``).
        total: how many words that list holds.
        keyword: the builder's argument that takes the list instead (``"names"``), or None (a list the
            task fixes, such as the years: only another tokenizer helps).

    >>> from rs_interp.tasks import ioi_task
    >>> from rs_interp.models import SHIPPED_MODELS
    >>> try:
    ...     ioi_task(SHIPPED_MODELS["code-2l"].tokenizer(), 2)
    ... except NotSingleTokens as err:
    ...     print(err.what, err.keyword, len(err.words), err.total, list(err.words.items())[0])
    names names 99 99 (' Michael', 5)
    """

    def __init__(self, words: dict[str, int], what: str, total: int, keyword: str | None):
        shown = few((f"{w!r} -> {n} tokens" for w, n in words.items()), show=str)
        advice = (f"Pass {keyword}= a list of words that are one token each" if keyword else
                  "Use a tokenizer in which they are (GPT-2's is)")
        super().__init__(f"{len(words)} of {total} {what} are not single tokens under this tokenizer: {shown}. "
                         f"{advice}; this error's .words holds them all.")
        self.words, self.what, self.total, self.keyword = dict(words), what, total, keyword


def single_tokens(tokenizer: Any, words: Sequence[str], what: str, *, prefix: str = " ",
                  keyword: str | None = None) -> list[int]:
    """The one token id of ``prefix + word`` for each word.

    Raises:
        NotSingleTokens: (a ``ValueError``) naming the words that are not single tokens under this tokenizer
            (a few in the message, all in its ``words``), and ``keyword``, the builder's argument to pass others.
    """
    ids, bad = [], {}
    for w in words:
        t = encode(tokenizer, prefix + w)
        if len(t) == 1:
            ids.append(t[0])
        else:
            bad[prefix + w] = len(t)
    if bad:
        raise NotSingleTokens(bad, what, len(words), keyword)
    return ids


def pack(tokenizer: Any, name: str, clean: Sequence[str], corrupted: Sequence[str], answers: Sequence[Sequence[int]],
         wrong: Sequence[Sequence[int]], *, kind: MetricKind, prepend_bos: bool, seed: int | None,
         label: Sequence[int] | None = None, segments: Sequence[Sequence[tuple[str, str]]] | None = None,
         span_names: Sequence[str] = ()) -> Task:
    """Tokenize the paired texts into a :class:`Task` (right-padded, BOS first if asked).

    Raises:
        ValueError: a clean and corrupted prompt of different token lengths (naming the row).
    """
    bos = [bos_id(tokenizer)] if prepend_bos else []
    rows_c, rows_x = [], []
    for i, (c, x) in enumerate(zip(clean, corrupted)):
        tc, tx = bos + encode(tokenizer, c), bos + encode(tokenizer, x)
        if len(tc) != len(tx):
            raise ValueError(f"{name} row {i}: the clean prompt {c!r} has {len(tc)} tokens, the corrupted {x!r} has "
                             f"{len(tx)}: paired prompts must be as long")
        if not tc:
            raise ValueError(f"{name} row {i}: an empty prompt")
        rows_c.append(tc)
        rows_x.append(tx)
    pad = getattr(tokenizer, "pad_token_id", None)
    pad = int(pad) if pad is not None else (bos[0] if bos else 0)  # never read: positions come first
    width = max(len(r) for r in rows_c)

    def matrix(rows: Sequence[Sequence[int]], fill: int, w: int) -> torch.Tensor:
        return torch.tensor([list(r) + [fill] * (w - len(r)) for r in rows], dtype=torch.long)

    spans = None if segments is None else segment_spans(tokenizer, span_names, segments, clean, prepend_bos, width)
    return Task(name, clean=matrix(rows_c, pad, width), corrupted=matrix(rows_x, pad, width), spans=spans,
                answers=matrix(answers, -1, max(map(len, answers))), wrong=matrix(wrong, -1, max(map(len, wrong))),
                positions=torch.tensor([len(r) - 1 for r in rows_c], dtype=torch.long), kind=kind,
                label=None if label is None else torch.tensor(list(label), dtype=torch.long),
                prompts=tuple(clean), corrupted_prompts=tuple(corrupted), seed=seed)


def segment_spans(tokenizer: Any, names: Sequence[str], segments: Sequence[Sequence[tuple[str, str]]],
                  texts: Sequence[str],
                  prepend_bos: bool, width: int) -> Any:
    """A task's position schema from each row's segments, ``(span name, text)`` in order, whose texts make the row's
    prompt: each segment's tokens in its span (the BOS in the first span), the right padding in the last (``"pad"``).

    Raises:
        ValueError: a row whose segments do not tokenize to its prompt's tokens (a token across two segments), or
            whose segments do not make its text (each named).
    """
    from .schema import PositionSchema

    rows = []
    for i, (parts, text) in enumerate(zip(segments, texts)):
        if "".join(t for _, t in parts) != text:
            raise ValueError(f"row {i}: its segments do not make its prompt {text!r}")
        ids, tokens = [names.index(parts[0][0])] * int(prepend_bos), []
        for span, t in parts:
            piece = encode(tokenizer, t)
            ids += [names.index(span)] * len(piece)
            tokens += piece
        if tokens != encode(tokenizer, text):
            raise ValueError(f"row {i}: the segments of {text!r} tokenize apart otherwise than together: a token runs "
                             "across two spans")
        rows.append(ids + [len(names) - 1] * (width - len(ids)))
    return PositionSchema(tuple(names), torch.tensor(rows, dtype=torch.long))
