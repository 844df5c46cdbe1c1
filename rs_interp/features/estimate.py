"""How long an attribution graph will take and how much memory it will hold, from the shapes alone, before the run.

With ``P`` positions, ``L`` layers, width ``d``, ``H`` heads, MLP width ``m``, ``A = a P L`` active
features (``a`` a token and layer: TopK's ``k``, else given), ``S`` feature rows computed (the
``max_feature_nodes`` cap, else ``A``), ``T = (L + 1) P`` error and token columns, ``B`` the batch and
``b`` bytes a number (the model's dtype), the peak above the loaded model and transcoders is the
largest of the three phases' sums (:attr:`GraphEstimate.parts` names every term). Each term is a tensor the
run allocates (its bytes), and one is the allocator's:

- held from the clean run on: its logits ``P V b``, its frozen patterns ``L H P^2 b``, its streams (transcoder
  inputs, MLP outputs, error vectors, embeddings) ``(3 L + 1) P d b``, the active features' index triples and
  activations ``A (24 + b)``, the logit rows ``n_logit (A + T) b`` and the feature rows
  (:class:`~rs_interp.features._rows.FeatureRows`): a row of a feature at layer ``l`` spans the active features
  of the layers before it, ``l / L`` of them, ``(L - 1) / (2 L)`` on average when the chosen features spread
  over the layers, so ``S ((L - 1) / (2 L) A + T) b``;
- the heap's holes (glibc's allocator): a freed block under glibc's largest mmap threshold (32 MiB) stays in the
  heap, and while the batch's ``(B, P, d)`` tensors are under it, each block of ``B`` feature rows is kept in a
  hole a batch's tensor left, the rest of the hole too small for the next batch's: the heap holds ``B P d b``
  for a block, ``S max(0, P d - (L - 1) / (2 L) A - T) b`` more than the rows (0 once a batch's tensor is
  mmapped, 32 MiB and up);
- rows (the backward passes), above that: the gradient run's saved patterns ``L H P^2 b`` and its streams
  ``(2 L + 1) P d b``; one batch's gradients at the MLP outputs below its targets and the embeddings
  ``max(L B, (L + 1) n_logit) P d b``, its backward in flight (the targets' gradients, the stream's and the
  attention's, ``3 B P d b``, and the frozen pattern expanded over the batch by the batched backward of its
  product with ``v``, ``B H P^2 b``) and its rows ``2 B (A + T) b`` (computed, gathered);
- assembly: the frozen run's logits ``P V b``, the kept block ``(S + n_logit) (S + T) b`` twice (gathered,
  stacked) and the dense ``(S + T + n_logit)^2 b`` (``dense=True``); pruning: four float copies of the block.

Measured on GPT-2 small's shape (``benchmarks/bench_long_graphs.py``; docs/project/benchmarks.md): the run's
allocations (glibc's ``mallinfo2``) peak within 10% of the terms without the holes at 64, 256 and 1,024 tokens
(0.166, 0.714 and 4.22 GiB against 0.173, 0.779 and 4.52); with the allocator returning every freed block of
128 KiB or more (``MALLOC_MMAP_THRESHOLD_=131072``) the peak resident memory is those allocations (0.165 and
0.712 GiB at 64 and 256 tokens); with the default allocator the holes are what is added.

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
forward passes 1.4; the influence rounds (over the rows' ``(L - 1) / (2 L)`` share) 10.5.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from .._keywords import renamed
from .transcoders import TranscoderSet

__all__ = ["GraphEstimate", "estimate_graph", "matmul_rate"]

#: How many times slower than the large-matmul rate each term of the time runs (module docstring):
#: fitted to the phases' CPU seconds on GPT-2 small's shape (64 and 256 tokens) and the 1,024-token total
#: (the rounds' 10.5: their 7 when a row was counted over 0.7 of the active features, over the derived share).
_COST = {"dense": 1.0, "pattern": 2.5, "dots": 5.6, "encode": 1.3, "forward": 1.4, "rounds": 10.5}

#: Past this many positions a head's pattern leaves the cache: the pattern's product slows as ``(P / this)^(2/3)``.
_PATTERN_CACHED = 256

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


#: A row of a feature at layer ``l`` spans the active features of the layers before it, ``l / L`` of them when the
#: chosen features spread evenly over the layers: ``(L - 1) / (2 L)`` on average (module docstring).
def _row_share(n_layers: int) -> float:
    return (n_layers - 1) / (2 * n_layers)


#: glibc's largest mmap threshold (``DEFAULT_MMAP_THRESHOLD_MAX`` on 64-bit): a freed block of this size or more
#: goes back to the system at once; smaller ones are served from the heap, which keeps them (module docstring).
_MMAP_CEILING = 32 * 2**20


def _memory(z: _Sizes, dense: bool, prune: bool) -> dict[str, int]:
    """Each term of the three phases' memory, bytes, by ``phase: what`` (module docstring)."""
    P, L, d, H, b, A, S, T, B, V = z.P, z.L, z.d, z.H, z.b, z.A, z.S, z.T, z.B, z.V
    share = _row_share(L)
    held = {  # from the clean run to the end of the rows: what every phase after it holds as well
        "clean run: logits": P * V * b,
        "clean run: frozen patterns": L * H * P * P * b,
        "clean run: streams (transcoder inputs, MLP outputs, errors, embeddings)": (3 * L + 1) * P * d * b,
        "clean run: active features (index triples, activations)": A * (24 + b),
        "logit rows": z.n_logits * (A + T) * b,
        "feature rows": S * (share * A + T) * b,
    }
    slot = B * P * d * b  # a batch's (batch, pos, d_model) tensor, the size of the holes the heap keeps
    holes = S * max(0.0, P * d - share * A - T) * b if slot < _MMAP_CEILING else 0
    held["heap holes around the feature rows (glibc)"] = holes
    rows = {f"rows: {k}": v for k, v in held.items()} | {
        "rows: gradient run's patterns (saved for the backward)": L * H * P * P * b,
        "rows: gradient run's streams (transcoder inputs, MLP outputs, final)": (2 * L + 1) * P * d * b,
        "rows: a batch's gradients": max(L * B, (L + 1) * min(B, z.n_logits)) * P * d * b,
        # the targets' gradients, the stream's and the attention's, and the pattern expanded over the batch
        "rows: a batch's backward in flight": 3 * B * P * d * b + B * H * P * P * b,
        "rows: a batch's rows (computed, gathered)": 2 * B * (A + T) * b,
    }
    n_nodes, block = S + T + z.n_logits, (S + z.n_logits) * (S + T) * b
    assembly = {f"assembly: {k}": v for k, v in held.items()} | {
        "assembly: the frozen run's logits": P * V * b,
        "assembly: kept block (gathered, stacked)": 2 * block,
        "assembly: dense adjacency": n_nodes * n_nodes * b if dense else 0,
    }
    pruning = {"pruning: float copies of the block": 4 * block if prune else 0,
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
        "rounds": 0 if not capped or S >= A else 8 * L * (S / 2) * (_row_share(L) * A + T) * 4,
    }
