"""The compiled models' ground truth: the run each is scored on, its metric, and which known edges
carry effect under a patch (:mod:`rs_interp.circuits.ground_truth` scores the methods on it).

>>> case = tracr_case("tracr-hist", n_pairs=4)
>>> tuple(case.tokens.shape), len(case.known)
((4, 6), 6)
"""

from __future__ import annotations

import random
from typing import Any, Sequence

import torch

from .._backend import Model
from ..metrics import Metric
from . import tracr as _tracr
from ._substrate import record, sender_points, writes
from .graph import edge_layout
from .ground_truth import GroundTruthCase, as_float64, receiver_response
from .positions import PositionSchema

__all__ = ["tracr_metric", "edge_classes", "tracr_case"]


def tracr_metric(name: str, inputs: Sequence[Sequence[Any]]) -> Metric:
    """The metric of a compiled program on ``inputs`` (equal-length sequences, without BOS), over
    the logits at the output positions (every position but the BOS), summed over them and averaged
    over the batch:

    - categorical programs: the log-probability of the program's correct output (from the plain
      Python :func:`rs_interp.circuits.tracr.reference`, not from the model). The compiled model's output
      logits are one-hot of size about 1, so this is far from saturated (about ``-0.6`` per
      position with three output values), and it moves whenever an output value does.
    - numerical programs: the output itself (the one logit, the value the program computes).
      Linear in the logits, so a patch moves it by exactly how much the computed values move; a
      squared error to the correct value would sit at its minimum on the clean run, where every
      gradient is 0 (the failure the attribution patching section shows with the loss).

    >>> metric = tracr_metric("frac_prevs", [["x", "y"]])
    >>> float(metric(torch.tensor([[[9.0], [1.0], [0.5]]])))   # 1.0 + 0.5: the BOS is dropped
    1.5
    """
    meta = _tracr.metadata(name)
    if meta.output == "numerical":
        def numerical(logits: torch.Tensor) -> torch.Tensor:
            x = logits if logits.dtype == torch.float64 else logits.float()
            return x[:, 1:, 0].sum(-1).mean()

        return numerical
    index = {v: i for i, v in enumerate(meta.output_values)}
    targets = torch.tensor([[index[y] for y in _tracr.reference(meta.name, x)] for x in inputs], dtype=torch.long)

    def categorical(logits: torch.Tensor) -> torch.Tensor:
        x = logits if logits.dtype == torch.float64 else logits.float()
        logp = x[:, 1:].log_softmax(-1)
        return logp.gather(-1, targets.to(logp.device)[..., None])[..., 0].sum(-1).mean()

    return categorical


def edge_classes(model: Model, name: str, tokens: torch.Tensor, reference: torch.Tensor, *,
                 tol: float = 1e-9) -> dict[tuple[str, str], tuple[str, str]]:
    """Each known edge of compiled model ``name``, classed by what a patch from ``reference`` does to it:

    - ``"same"``: the two runs write the same along it (the sender's write differs by at most
      ``tol`` on every residual direction the receiver reads): positions, the constant ``"one"``
      and whatever is computed from the length alone are equal in any two inputs of one length;
    - ``"ignored"``: they differ along it, yet the receiver's own output does not move when it is
      patched (:func:`receiver_response` at most ``tol``): the receiver's computation does not
      depend on the difference (an always-true selector reads the tokens it does not compare);
    - ``"effect"``: the receiver's output moves.

    Returns ``edge -> (class, what it carries)``: the residual labels both ends share, a variable
    by its name where it carries every value of it (``"indices"``), else with the values (``"tokens:BOS"``).

    >>> model = as_float64(_tracr.load_tracr_model("frac_prevs"))
    >>> a, b = _tracr.encode("frac_prevs", [["x", "y", "x"]]), _tracr.encode("frac_prevs", [["y", "y", "z"]])
    >>> classes = edge_classes(model, "frac_prevs", a, b)
    >>> classes[("embed", "L1H0.q")], classes[("MLP0", "L1H0.v")][0]
    (('same', 'indices, one'), 'effect')
    """
    meta = _tracr.metadata(name)
    layout = edge_layout(model)
    points = sender_points(model)
    with torch.no_grad():
        delta = writes(model, record(model, reference, points), record(model, tokens, points))
    position = {label: i for i, label in enumerate(meta.residual_labels)}
    classes, differing = {}, []
    for s, r in sorted(meta.edges):
        shared = sorted(meta.writes[s] & meta.reads[r], key=position.get)
        d = delta[layout.senders.index(s)][..., [position[label] for label in shared]]
        differs = bool(d.numel()) and float(d.abs().max()) > tol
        differing += [(s, r)] if differs else []
        classes[(s, r)] = ("effect" if differs else "same", _variables(shared, meta.residual_labels))
    for edge, moved in receiver_response(model, tokens, reference, differing).items():
        if moved <= tol:
            classes[edge] = ("ignored", classes[edge][1])
    return classes


def _variables(labels: Sequence[str], every: Sequence[str]) -> str:
    """Residual labels in words: a variable by its name where all its values are there, else with
    the values present (``"tokens:BOS"``), in the residual order."""
    values: dict[str, list[str]] = {}
    for label in labels:
        var, _, value = label.partition(":")
        values.setdefault(var, []).append(value)
    total = {}
    for label in every:
        total[label.partition(":")[0]] = total.get(label.partition(":")[0], 0) + 1
    return ", ".join(var if len(v) == total[var] else f"{var}:{'|'.join(v)}" for var, v in values.items())


def _inert_reason(edge: tuple[str, str], kind: str, carried: str) -> str:
    if kind == "same":
        return f"carries {carried}: the same in both runs (inputs of one length)"
    return (f"carries {carried}, which differ between the runs, but {edge[1].split('.')[0]}'s output does not "
            "depend on the difference")


def tracr_case(name: str, *, n_pairs: int = 64, seed: int = 0) -> GroundTruthCase:
    """The run a compiled model's methods are scored on: ``n_pairs`` random inputs of the program's
    longest length (every position computes), each paired with another random input of that length
    as the reference (what a patch brings in), drawn from ``seed``; :func:`tracr_metric`; the known
    circuit from the weights, split by :func:`edge_classes`. The model runs in float64.

    >>> case = tracr_case("tracr-hist", n_pairs=4)
    >>> tuple(case.tokens.shape), len(case.known), sorted(case.inert)
    ((4, 6), 6, [('embed', 'L0H0.v'), ('embed', 'MLP0')])
    """
    meta = _tracr.metadata(name)
    rng = random.Random(f"ground-truth-{seed}-{meta.name}")
    draw = lambda: [[rng.choice(meta.vocab) for _ in range(meta.max_seq_len)] for _ in range(n_pairs)]  # noqa: E731
    inputs, others = draw(), draw()
    model = as_float64(_tracr.load_tracr_model(meta.name))
    tokens, reference = _tracr.encode(meta.name, inputs), _tracr.encode(meta.name, others)
    classes = edge_classes(model, meta.name, tokens, reference)
    what = ("log-probability of the correct output, summed over the output positions" if meta.output == "categorical"
            else "the output value, summed over the output positions")
    # the positional methods' spans: the BOS (what tracr's selectors fall back to) and the input's tokens
    spans = PositionSchema(("BOS", "tokens"), (torch.arange(tokens.shape[1]) >= 1).long().expand_as(tokens).clone())
    return GroundTruthCase(f"tracr-{meta.name}", model, tokens, reference, tracr_metric(meta.name, inputs),
                           _tracr.ground_truth_edges(meta.name),
                           frozenset(e for e, (k, _) in classes.items() if k == "effect"),
                           {e: _inert_reason(e, k, c) for e, (k, c) in sorted(classes.items()) if k != "effect"}, what,
                           spans=spans)
