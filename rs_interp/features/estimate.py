"""How long an attribution graph will take and how much memory it will hold, from the shapes alone, before the run.

With ``P`` positions, ``L`` layers, width ``d``, ``H`` heads, MLP width ``m``, ``A = a P L`` active
features (``a`` a token and layer: TopK's ``k``, else given), ``S`` feature rows computed (the
``max_feature_nodes`` cap, else ``A``), ``T = (L + 1) P`` error and token columns, ``B`` the batch and
``b`` bytes a number (the model's dtype), the peak above the loaded model and transcoders is the
largest of the two phases' sums (:attr:`GraphEstimate.parts` names every term):

- rows: a fixed ~0.1 GB (autograd's and the allocator's bookkeeping); the clean logits ``P V b``; the
  clean run's patterns, frozen, and the backward's saved copy, ``2 L H P^2 b``; the
  streams the run keeps, ``(3 L + 1) P d b``; the active features' indices and activations, ``A (32 + b)``;
  the feature rows, each over the features of the layers before its own, counted as ``S (0.7 A + T) b``
  (the features chosen by their influence on the logits sit mostly in the later layers; 0.7 is fitted
  to the peaks measured at 64, 256 and 1,024 tokens on GPT-2 small's shape, ``benchmarks/bench_long_graphs.py``)
  (:class:`~rs_interp.features._rows.FeatureRows`); one batch's gradients, ``(L + 1) B P d b`` twice
  (the backward's own and the returned), and its rows ``B (A + T) b`` twice (computed, kept);
- assembly: the same fixed part, the logits of the clean and the frozen run ``2 P V b``, the feature
  rows, the kept block ``(S + n_logit) (S + T) b`` twice, the dense
  ``(S + T + n_logit)^2 b`` (``dense=True``), and the pruning's float copies of the block (four).

Time: the FLOPs of the backward passes (one per batch of ``B`` targets, each through the layers below
its target, half the model on average for feature rows, all of it for logits; the patterns are frozen
and the MLPs cut, so per token and layer only ``W_O``, the pattern and ``W_V``: ``4 d^2 + 2 P d``), the
rows' dot products ``2 B d (A / 2 + T)`` a batch, the transcoders' encode and decode ``4 P L d W``, four
forward passes and the influence rounds, over a large-matmul rate (FLOP/s) measured in the same
process (:func:`matmul_rate`): that is :attr:`GraphEstimate.flops` and the bound ``flops / rate``. The
time, :attr:`GraphEstimate.seconds`, weighs each term by how far its kind of product runs below the
large-matmul rate (:data:`_COST`), fitted to the CPU seconds of each phase of the graph on GPT-2 small's
shape (12 x 24,576 TopK-64 transcoders, 1,024 feature nodes, batches of 16, one thread) at 64 and 256
tokens, and, for the pattern's growth past 256 tokens, the 1,024-token graph's total
(docs/project/benchmarks.md#attribution-graphs-of-long-prompts): the ``4 d^2`` products at the rate; the
pattern's ``2 P d`` (a batched ``P x P`` by ``P x d_head`` product, one per head: far from a large matmul)
2.5 times slower, and past 256 tokens (a head's pattern past 256 KiB) slower again as ``(P / 256)^(2/3)``;
the rows' dot products (gathers at the active features) 5.6 times; the encoding, TopK included, 1.3; the
forward passes 1.4; the influence rounds 7.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from .._keywords import renamed
from .transcoders import TranscoderSet

__all__ = ["GraphEstimate", "estimate_graph", "matmul_rate"]

#: The share of the active features a chosen feature's row spans (the features of the layers before its
#: own), fitted to GPT-2 small's shape at 64, 256 and 1,024 tokens (docs/project/benchmarks.md).
_ROW_SHARE = 0.7

#: How many times slower than the large-matmul rate each term of the time runs (module docstring):
#: fitted to the phases' CPU seconds on GPT-2 small's shape (64 and 256 tokens) and the 1,024-token total.
_COST = {"dense": 1.0, "pattern": 2.5, "dots": 5.6, "encode": 1.3, "forward": 1.4, "rounds": 7.0}

#: Past this many positions a head's pattern leaves the cache: the pattern's product slows as ``(P / this)^(2/3)``.
_PATTERN_CACHED = 256

#: What a graph's run holds whatever its size (autograd's and the allocator's bookkeeping, the
#: certificate's probe): measured on GPT-2 small's shape, 64 tokens.
_OVERHEAD = 100 * 2**20


@dataclass(frozen=True)
class GraphEstimate:
    """An attribution graph's cost before the run (module docstring).

    Attributes:
        peak_bytes: the peak memory above the loaded model and transcoders.
        flops: the floating-point operations counted (``flops / rate``: the bound).
        seconds: the time, each term of ``flops`` weighed by how far it runs below ``rate`` (module docstring).
        rate: the FLOP/s used.
        n_active, n_rows: active features and feature rows computed.
        parts: each term of the peak, bytes, by name (``phase: what``).

    >>> e = GraphEstimate(2**30, 1e12, 10.0, 1e11, 100, 50, {"rows: patterns": 2**30})
    >>> str(e)  # doctest: +NORMALIZE_WHITESPACE
    'attribution graph estimate: 1.00 GB peak above the model and transcoders,
     10 s at 100 GFLOP/s (100 active features, 50 rows)'
    """

    peak_bytes: int
    flops: float
    seconds: float
    rate: float
    n_active: int
    n_rows: int
    parts: dict

    def __str__(self) -> str:
        return (f"attribution graph estimate: {self.peak_bytes / 2**30:.2f} GB peak above the model and transcoders, "
                f"{self.seconds:.0f} s at {self.rate / 1e9:.0f} GFLOP/s "
                f"({self.n_active} active features, {self.n_rows} rows)")


def matmul_rate(n: int = 1024, repeats: int = 3, dtype: torch.dtype = torch.float32) -> float:
    """The FLOP/s of an ``n x n`` by ``n x n`` matmul in this process, the best of ``repeats``, in the
    process's CPU time (on a shared machine, what its threads get, not the wall clock).

    >>> matmul_rate(64, 1) > 0
    True
    """
    g = torch.Generator().manual_seed(0)  # its own generator: measuring leaves the caller's random state alone
    a, b = torch.randn(n, n, dtype=dtype, generator=g), torch.randn(n, n, dtype=dtype, generator=g)
    best = math.inf
    for _ in range(repeats):
        t = time.process_time()
        a @ b
        best = min(best, time.process_time() - t)
    return 2 * n**3 / max(best, 1e-9)


@renamed(n_logits="max_logits")
def estimate_graph(model, transcoders: TranscoderSet, n_pos: int, *, max_feature_nodes: int | None = None,
                   active_per_token: float | None = None, max_logits: int = 10, batch_size: int = 64,
                   dense: bool = True, prune: bool = True, rate: float | None = None) -> GraphEstimate:
    """The time and peak memory of ``attribution_graph(model, transcoders, tokens of n_pos, ...)``, from the
    shapes (module docstring for the formula). ``model`` is read for its config only (a config works too).

    Args:
        active_per_token: active features a token and layer; default TopK's ``k`` (needed for ReLU and JumpReLU sets).
        max_logits: logit nodes (as :func:`~rs_interp.features.attribution_graph`'s ``max_logits``).
        prune: count the pruning of the finished graph (``graph.prune()``, ``graph.scores()``).
        rate: FLOP/s; default :func:`matmul_rate` measured now.

    Raises:
        ValueError: no ``active_per_token`` for transcoders without a TopK ``k``; a shape below 1.

    >>> from rs_interp import load_toy_model
    >>> from rs_interp.features import shipped_transcoders
    >>> e = estimate_graph(load_toy_model("code-2l"), shipped_transcoders("code-2l"), 64, rate=1e10)
    >>> e.n_active == 2 * 64 * shipped_transcoders("code-2l")[0].k, e.peak_bytes > 0
    (True, True)
    """
    cfg = getattr(model, "cfg", model)
    if active_per_token is None:
        if transcoders[0].k is None:
            raise ValueError("estimate_graph: the transcoders are not TopK, so how many features a token activates "
                             "is not known from the shapes: pass active_per_token (e.g. measured on a few prompts)")
        active_per_token = transcoders[0].k
    if n_pos < 1 or batch_size < 1 or max_logits < 1:
        raise ValueError("estimate_graph: n_pos, batch_size and max_logits must be >= 1")
    P, L, d = int(n_pos), cfg.n_layers, cfg.d_model
    A = int(round(active_per_token * P * L))
    V = cfg.d_vocab_out if getattr(cfg, "d_vocab_out", -1) and cfg.d_vocab_out > 0 else cfg.d_vocab
    half = cfg.dtype in (torch.float16, torch.bfloat16)
    z = _Sizes(P=P, L=L, d=d, H=cfg.n_heads, m=cfg.d_mlp or 4 * d, W=transcoders[0].d_transcoder,
               b=torch.finfo(torch.float32 if half else cfg.dtype).bits // 8,
               A=A, S=A if max_feature_nodes is None else min(max_feature_nodes, A), T=(L + 1) * P, B=batch_size,
               V=V, n_logits=max_logits)
    parts = _memory(z, dense, prune)
    phases = ("rows", "assembly", "pruning")
    peak = max(sum(v for k, v in parts.items() if k.startswith(phase + ":")) for phase in phases)
    terms = _flops(z, capped=max_feature_nodes is not None)
    slower = dict(_COST, pattern=_COST["pattern"] * max(1.0, P / _PATTERN_CACHED) ** (2 / 3))
    flops = sum(terms.values())
    weighted = sum(slower[k] * v for k, v in terms.items())
    rate = matmul_rate() if rate is None else float(rate)
    return GraphEstimate(int(peak), float(flops), float(weighted / rate), rate, A, z.S, parts)


@dataclass(frozen=True)
class _Sizes:
    """The shapes :func:`estimate_graph` counts with (its module docstring's letters); ``n_logits`` the logit nodes."""

    P: int
    L: int
    d: int
    H: int
    m: int
    W: int
    b: int
    A: int
    S: int
    T: int
    B: int
    V: int
    n_logits: int


def _memory(z: _Sizes, dense: bool, prune: bool) -> dict[str, int]:
    """Each term of the three phases' memory, bytes, by ``phase: what`` (module docstring)."""
    P, L, d, H, b, A, S, T, B, V = z.P, z.L, z.d, z.H, z.b, z.A, z.S, z.T, z.B, z.V
    rows = {
        "rows: bookkeeping (autograd, allocator)": _OVERHEAD,
        "rows: patterns (frozen and saved)": 2 * L * H * P * P * b,
        "rows: the clean logits": P * V * b,
        "rows: streams": (3 * L + 1) * P * d * b,
        "rows: active features": A * (32 + b),
        "rows: feature rows": S * (_ROW_SHARE * A + T) * b,
        "rows: a batch's gradients": 2 * (L + 1) * B * P * d * b,
        "rows: a batch's rows": 2 * B * (A + T) * b,
    }
    n_nodes = S + T + z.n_logits
    assembly = {
        "assembly: bookkeeping (autograd, allocator)": _OVERHEAD,
        "assembly: logits (clean, frozen run)": 2 * P * V * b,
        "assembly: feature rows": rows["rows: feature rows"],
        "assembly: patterns": rows["rows: patterns (frozen and saved)"],
        "assembly: kept block": 2 * (S + z.n_logits) * (S + T) * b,
        "assembly: dense adjacency": n_nodes * n_nodes * b if dense else 0,
    }
    pruning = {"pruning: float copies of the block": 4 * (S + z.n_logits) * (S + T) * b if prune else 0,
               "pruning: dense adjacency": assembly["assembly: dense adjacency"]}
    return {k: int(v) for part in (rows, assembly, pruning) for k, v in part.items()}


def _flops(z: _Sizes, capped: bool) -> dict[str, float]:
    """Each kind of product's FLOPs (module docstring); ``capped``: ``max_feature_nodes`` given."""
    P, L, d, A, S, T, B = z.P, z.L, z.d, z.A, z.S, z.T, z.B
    # the backward of the frozen model: patterns detached (no gradient to q, k) and MLPs cut, so a target's
    # gradient crosses each layer below it through W_O, the pattern and W_V only: 2 (2 d^2) + 2 P d a token
    feature_batches, logit_batches = math.ceil(S / B), math.ceil(z.n_logits / B)
    crossed = (feature_batches * B * (L / 2) + logit_batches * B * L) * P  # (token, layer) steps of the backward
    forward_layer = 2 * (4 * d * d + 2 * d * z.m) + 2 * 2 * P * d
    return {
        "dense": crossed * 2 * 2 * d * d,
        "pattern": crossed * 2 * P * d,
        "dots": (feature_batches + logit_batches) * 2 * B * d * (A / 2 + T),
        "encode": 4 * P * L * d * z.W,  # the transcoders
        "forward": 4 * P * L * forward_layer,  # four forward passes
        # eight influence estimates, each walking (at most L steps) over the rows computed so far (half on average)
        "rounds": 0 if not capped or S >= A else 8 * L * (S / 2) * (_ROW_SHARE * A + T) * 4,
    }
