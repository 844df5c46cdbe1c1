"""Head-role scores: previous-token, induction, the content-free positional kernel, and Proposition 5.

>>> from rs_interp import load_toy_model, induction_batch
>>> model = load_toy_model("induction-2l")
>>> prev = prev_token_scores(model, induction_batch(16, seed=0).tokens)
>>> tuple(prev.shape)
(2, 2)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int

from .. import _names as N
from .._backend import Model, apply_rotary, attn_scale, attn_weight, score_hooks
from .._state import preserve_state
from ..exact.certificate import require
from ..exact.needs import PATTERNS, needs
from ..exact.validate import check_int_range, check_layer, check_tokens
from ..hooks import store_matching
from ..labels import head_labels
from ..metrics import top_effects

__all__ = [
    "attention_patterns",
    "first_token_attention",
    "FirstTokenAttention",
    "prev_token_scores",
    "induction_scores",
    "InductionScores",
    "positional_scores",
    "key_score_sensitivity",
    "ScoreSensitivity",
    "find_prev_token_head",
]


@needs(*PATTERNS)
def attention_patterns(model: Model, tokens: Int[torch.Tensor, "batch pos"]
                       ) -> Float[torch.Tensor, "layer batch head query_pos key_pos"]:
    """Every layer's attention pattern, from one forward pass (only the patterns are kept).

    >>> from rs_interp import induction_batch, load_toy_model
    >>> pat = attention_patterns(load_toy_model("induction-2l"), induction_batch(3, seed=0).tokens)
    >>> tuple(pat.shape)  # (layer, batch, head, query_pos, key_pos)
    (2, 3, 2, 48, 48)
    >>> ones = torch.ones(2, 3, 2, 48)
    >>> bool(torch.allclose(pat.sum(-1), ones)), float(pat[..., 0, 1:].abs().max())  # rows sum to 1; causal
    (True, 0.0)
    """
    tokens = check_tokens(model, tokens)
    require(model, "attention_patterns")
    box: dict[str, torch.Tensor] = {}
    with preserve_state(model), torch.no_grad():
        with model.hooks(fwd_hooks=store_matching(box, model, N.every(N.pattern))):
            model(tokens, return_type=None)
    return torch.stack([box[N.pattern(l)] for l in range(model.cfg.n_layers)])


@dataclass(frozen=True)
class FirstTokenAttention:
    """Attention sinks: how much each head puts on the first position.

    Attributes:
        mass: (layer, head) mean weight on key position 0 over queries ``i >= min_query``.
        uniform: what uniform causal attention would put there, ``mean 1 / (i + 1)`` over the same
            queries: a head above it prefers the first position.
        min_query: the first query position counted (position 0 must attend to itself).

    >>> import rs_interp as ri
    >>> ft = ri.first_token_attention(ri.load_toy_model(), ri.induction_batch(8, seed=0).tokens)
    >>> tuple(ft.ratio().shape), ft.min_query  # ratio(): mass over the uniform baseline
    ((2, 2), 4)
    """

    mass: Float[torch.Tensor, "layer head"]
    uniform: float
    min_query: int

    def ratio(self) -> Float[torch.Tensor, "layer head"]:
        return self.mass / self.uniform


@needs(*PATTERNS)
def first_token_attention(model: Model, tokens: Int[torch.Tensor, "batch pos"], *,
                          min_query: int = 4) -> FirstTokenAttention:
    """Attention on the first position by head: a head "dumps" mass there (a sink) when it has nothing to copy.

    ``mass[l, h] = mean over sequences and queries i >= min_query of A^{lh}[i, 0]``, beside the uniform
    baseline ``mean_i 1 / (i + 1)``.

    >>> import rs_interp as ri
    >>> ft = first_token_attention(ri.load_toy_model(), ri.induction_batch(4, seed=0).tokens)
    >>> tuple(ft.mass.shape), round(ft.uniform, 3)
    ((2, 2), 0.054)
    """
    tokens = check_tokens(model, tokens)
    require(model, "first_token_attention")
    n = tokens.shape[1]
    if n < 2:  # query 0 can only attend to itself: there is no choice to measure
        raise ValueError(f"tokens must have at least 2 positions for first-token attention, got {n}")
    check_int_range("min_query", min_query, 1, n - 1)
    pat = attention_patterns(model, tokens)  # (layer, batch, head, query, key)
    mass = pat[:, :, :, min_query:, 0].mean(dim=(1, 3))
    uniform = float((1.0 / torch.arange(min_query + 1, n + 1, dtype=torch.float64)).mean())
    return FirstTokenAttention(mass=mass, uniform=uniform, min_query=min_query)


@needs(*PATTERNS)
def prev_token_scores(model: Model, tokens: Int[torch.Tensor, "batch pos"]) -> Float[torch.Tensor, "layer head"]:
    """Mean attention weight on the previous token, ``A[i, i-1]`` over positions ``i >= 1``.

    >>> from rs_interp import load_toy_model, induction_batch
    >>> s = prev_token_scores(load_toy_model(), induction_batch(8, seed=1).tokens)
    >>> float(s[0].max()) > 0.8
    True
    """
    tokens = check_tokens(model, tokens)
    require(model, "prev_token_scores")
    if tokens.shape[1] < 2:
        raise ValueError("tokens must have at least 2 positions for previous-token scores")
    pat = attention_patterns(model, tokens)
    return pat.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(1, 3))


@needs(*PATTERNS)
def find_prev_token_head(model: Model, tokens: Int[torch.Tensor, "batch pos"], layer: int = 0) -> tuple[int, int]:
    """The head of ``layer`` with the highest previous-token score, as a ``(layer, head)`` pair
    (found from the scores, never by index).

    >>> from rs_interp import load_toy_model, induction_batch
    >>> layer, head = find_prev_token_head(load_toy_model(), induction_batch(8, seed=1).tokens)
    >>> layer, head in (0, 1)
    (0, True)
    """
    layer = check_layer(model, layer)
    require(model, "find_prev_token_head")
    return layer, int(prev_token_scores(model, tokens)[layer].argmax())


@dataclass(frozen=True)
class InductionScores:
    """Mean attention at the scored query positions (the second period, ``i >= p``), per (layer, head).

    Attributes:
        induction: weight on position ``i - p + 1``, the token after the previous occurrence of the
            current one (the induction score).
        after_occurrence: total weight on every ``j <= i`` whose predecessor equals the current
            token, ``t[j-1] == t[i]`` (the positions after any earlier occurrence).
        labels: ``"L{l}H{h}"`` row-major.

    >>> from rs_interp import induction_batch, induction_scores, load_toy_model
    >>> b = induction_batch(32, seed=2)
    >>> s = induction_scores(load_toy_model("induction-2l"), b.tokens, periods=b.periods)
    >>> tuple(s.induction.shape), bool((s.after_occurrence[1] >= s.induction[1]).all())  # the target is one of them
    ((2, 2), True)
    """

    induction: Float[torch.Tensor, "layer head"]
    after_occurrence: Float[torch.Tensor, "layer head"]
    labels: tuple[str, ...] = ()

    def top(self, k: int = 5) -> list[tuple[str, float]]:
        """The ``k`` heads with the largest induction score, with it."""
        return top_effects(self.labels, self.induction, k)


@needs(*PATTERNS)
def induction_scores(model: Model, tokens: Int[torch.Tensor, "batch pos"], *,
                     periods: Int[torch.Tensor, " batch"]) -> InductionScores:
    """Induction scores of every head on repeated sequences ``tokens`` of periods ``periods`` (see
    :class:`InductionScores`; an induction batch has both).

    Raises:
        ValueError: ``periods`` not one positive int per sequence, or no scored position (every period
            at least the sequence's length).

    >>> from rs_interp import load_toy_model, induction_batch
    >>> b = induction_batch(32, seed=2)
    >>> s = induction_scores(load_toy_model(), b.tokens, periods=b.periods)
    >>> bool((s.induction[1] > 0.45).all())
    True
    """
    tokens = check_tokens(model, tokens)
    require(model, "induction_scores")
    if (not isinstance(periods, torch.Tensor) or periods.dtype.is_floating_point
            or tuple(periods.shape) != tokens.shape[:1]):
        raise ValueError(f"periods must be an integer tensor of one period per sequence, shape ({tokens.shape[0]},)")
    if bool((periods < 1).any()):
        raise ValueError("periods must be positive")
    periods = periods.to(tokens.device)
    pat = attention_patterns(model, tokens)[..., :-1, :]  # query positions 0..pos-2 (the scored ones)
    pos = torch.arange(tokens.shape[1] - 1, device=tokens.device)
    mask = pos[None] >= periods[:, None]  # (batch, q): the second period onwards
    n = mask.sum()
    if int(n) == 0:
        raise ValueError("no scored position: every period is at least the sequence's length")
    idx = (pos[None] - periods[:, None] + 1).clamp(min=0)  # (batch, q): i - p + 1
    on_target = pat.gather(-1, idx[None, :, None, :, None].expand(*pat.shape[:-1], 1)).squeeze(-1)
    # j is "after an occurrence" of t[i] when t[j-1] == t[i], for 1 <= j <= i.
    t = tokens
    same = t[:, None, :-1] == t[:, :-1, None]  # (batch, i, j-1): t[j-1] == t[i]
    after = torch.zeros(t.shape[0], t.shape[1] - 1, t.shape[1], dtype=torch.bool, device=t.device)
    after[:, :, 1:] = same
    after &= torch.ones_like(after).tril()  # j <= i (the causal mask already zeros j > i)
    on_after = (pat * after[None, :, None].to(pat.dtype)).sum(-1)
    avg = lambda x: (x * mask[None, :, None].to(x.dtype)).sum(dim=(1, 3)) / n  # noqa: E731
    return InductionScores(induction=avg(on_target), after_occurrence=avg(on_after),
                           labels=head_labels(model.cfg.n_layers, model.cfg.n_heads))


@needs("scores", refuses=("not rotary",))
def positional_scores(model: Model, layer: int, *, max_offset: int | None = None) -> Float[torch.Tensor, "head offset"]:
    """The content-free score ``b_q^T R(-Delta) b_k / sqrt(d_head)`` for offsets ``Delta = 0..max_offset``.

    The part of a head's attention score that comes from its query and key biases alone, computed
    with the model's own rotary implementation: the bias query at position ``Delta`` against the
    bias key at position 0 (rotary scores depend on the offset only).

    Raises:
        ValueError: the model is not rotary or has qk-norm, or ``max_offset`` is outside ``[0, n_ctx - 1]``.

    >>> from rs_interp import load_toy_model
    >>> s = positional_scores(load_toy_model("induction-2l"), 0, max_offset=3)
    >>> tuple(s.shape)  # (head, offset 0..3)
    (2, 4)
    """
    check_layer(model, layer)
    require(model, "positional_scores")  # a rotary model whose scores are the bilinear form the weights say
    n = model.cfg.n_ctx if max_offset is None else check_int_range("max_offset", max_offset, 0, model.cfg.n_ctx - 1) + 1
    attn = model.blocks[layer].attn
    with torch.no_grad():
        b_Q, b_K = (attn_weight(attn, name, model.cfg.n_heads)[None, None] for name in ("b_Q", "b_K"))
        q = apply_rotary(model, layer, b_Q.expand(1, n, -1, -1).clone())  # (1, n, head, d_head)
        k = apply_rotary(model, layer, b_K.expand(1, n, -1, -1).clone())
        return torch.einsum("ohd,hd->ho", q[0], k[0, 0]) / attn_scale(model, layer)


@dataclass(frozen=True)
class ScoreSensitivity:
    """How much the last layer's attention score at (i, j) moves when the token at j - 1 changes.

    Attributes:
        mean_abs_change: (head,) mean |delta score| over the sampled (i, j) pairs, ``j <= i``.
        max_abs_change: (head,) the largest change.
        n_pairs: how many (sequence, i, j) pairs were compared.

    >>> from rs_interp import induction_batch, key_score_sensitivity, load_toy_model
    >>> s = key_score_sensitivity(load_toy_model("induction-2l"), induction_batch(16, seed=0).tokens)
    >>> tuple(s.mean_abs_change.shape), bool((s.max_abs_change >= s.mean_abs_change).all()), s.n_pairs > 0
    ((2,), True, True)
    """

    mean_abs_change: Float[torch.Tensor, " head"]
    max_abs_change: Float[torch.Tensor, " head"]
    n_pairs: int


@needs("scores read")
def key_score_sensitivity(model: Model, tokens: Int[torch.Tensor, "batch pos"], *, seed: int = 0) -> ScoreSensitivity:
    """Proposition 5: change the token before key position ``j`` and recompute the last layer's scores.

    For each sequence a key position ``j >= 1`` is drawn, the token at ``j - 1`` is replaced by a
    different random token, and the pre-softmax scores ``s(i, j)`` for every query ``i >= j`` are
    compared (``i != j - 1``, so the query itself is unchanged). In a one-layer model the score is
    a function of ``(t_i, i, t_j, j)`` and does not move; with a previous-token head below, it does.
    Run in float64 to see the one-layer change at rounding level.

    >>> import torch
    >>> from rs_interp import as_dtype, induction_batch, load_toy_model
    >>> tokens = induction_batch(16, seed=0).tokens
    >>> one = key_score_sensitivity(as_dtype(load_toy_model("induction-1l"), torch.float64), tokens)
    >>> two = key_score_sensitivity(as_dtype(load_toy_model("induction-2l"), torch.float64), tokens)
    >>> float(one.max_abs_change.max()) < 1e-10, float(two.mean_abs_change.max()) > 1.0
    (True, True)
    """
    tokens = check_tokens(model, tokens)
    require(model, "key_score_sensitivity")
    b, n = tokens.shape
    if n < 2:
        raise ValueError("tokens must have at least 2 positions")
    g = torch.Generator().manual_seed(seed)
    j = torch.randint(1, n, (b,), generator=g)
    shift = torch.randint(1, model.cfg.d_vocab, (b,), generator=g)
    changed = tokens.clone()
    rows = torch.arange(b)
    changed[rows, j - 1] = (tokens[rows, j - 1] + shift.to(tokens.device)) % model.cfg.d_vocab
    scores = []
    for toks in (tokens, changed):
        box: dict[str, torch.Tensor] = {}
        hooks = score_hooks(model, model.cfg.n_layers - 1, box, "s")
        with preserve_state(model), torch.no_grad(), model.hooks(fwd_hooks=hooks):
            model(toks, return_type=None)
        scores.append(box["s"][rows, :, :, j])  # (batch, head, query)
    q = torch.arange(n)[None, :]
    valid = (q >= j[:, None]).to(tokens.device)  # (batch, query)
    # Scores of queries before j are -inf (causal mask): select, never multiply, to avoid NaNs.
    diff = torch.where(valid[:, None, :], (scores[1] - scores[0]).abs(), torch.zeros((), dtype=scores[0].dtype))
    n_pairs = int(valid.sum())
    return ScoreSensitivity(
        mean_abs_change=diff.sum(dim=(0, 2)) / n_pairs,
        max_abs_change=diff.amax(dim=(0, 2)),
        n_pairs=n_pairs,
    )
