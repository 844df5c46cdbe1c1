"""The circuit analyses over a dataset: node and edge attribution patching (EAP-IG included), head
ablation scans, exact path patching, circuits' metrics, faithfulness curves and MIB's scores.

Each is the helper of the same name in :mod:`rs_interp` run batch by batch (:func:`~rs_interp.scale.engine.stream`)
and returns what one call on the concatenated batch returns. Every field these results hold is a
metric, or a derivative or difference of one, at rows the model processes independently, so with
``M = sum_b w_b M_b / W`` (:mod:`rs_interp.scale.pairs`) each field is the weighted mean of the
batches' fields:

    field(dataset) = sum over batches b of w_b * field(b)  /  sum over batches b of w_b

(the estimates are linear in the metric's gradient, their Hessian correction in its Hessian, the
exact effects in its value; EAP-IG's interpolation, the QK fix's recomputed attention, are row by
row). Faithfulness is not linear: the curve's ``values``, ``clean`` and ``empty`` are summed first
and its ratio and areas computed from the totals, its circuits chosen from the dataset's scores.
Options pass through to the helper (``ig_steps``, ``edges``, ``positions``, ``fractions`` ... and
those added later), so a new option streams as long as its result's fields are declared
(:func:`rs_interp.scale.sums.weighted` refuses one it does not know).

Refused, naming why: the ablations ``"mean"`` and ``"position_mean"`` (they ablate with the mean over
the whole batch, which per batch is not the dataset's mean), GradDrop (a sum of magnitudes of
whole-batch estimates), ``per_example`` (one share per pair: as large as the dataset), and ``metric=``
(a bare metric carries no weight: each batch brings its own).

>>> import rs_interp as ri
>>> from rs_interp import scale
>>> from rs_interp.tasks import induction_task
>>> model, task = ri.load_toy_model("induction-2l"), induction_task(5, seed=0, seq_len=12, max_period=5, min_period=3)
>>> scan = scale.head_ablation_scan(model, task, batch_size=2, ablation="resample", progress=False)
>>> one = ri.head_ablation_scan(model, task.clean, task.metric(), ablation="resample", reference=task.corrupted)
>>> abs(scan.clean - one.clean) < 1e-5, bool(torch.allclose(scan.effect, one.effect, atol=1e-5))
(True, True)
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch

from .. import circuits as _c
from .._backend import Model
from .._keywords import renamed
from .._messages import few
from ..circuits.evaluation import MIB_FRACTIONS, FaithfulnessCurve, MIBScores, mib_counts
from ..circuits.selection import circuit_at, mib_weights, prune
from ..exact.certificate import require
from ..exact.needs import needs
from ..heads import head_ablation as _h
from ..metrics import declared_direction, metric_value
from .engine import Analysis, quiet, stream, weight_of
from .methods import _STREAM, _result_of, _rowwise, _split, _streamed
from .pairs import Dataset
from .sums import weighted

__all__ = ["attribution_patching", "edge_attribution_patching", "edge_relevance_patching", "head_ablation_scan",
           "path_patching",
           "run_method", "evaluate_circuit",
           "faithfulness_curve", "mib_scores", "metric_values", "MetricValues"]

@needs(like=_c.attribution_patching, name="scale.attribution_patching")
@renamed(nodes="which")
def attribution_patching(model: Model, data: Dataset, **options: Any) -> _c.AttributionPatching:
    """:func:`rs_interp.attribution_patching` over a dataset: the result of one call on every pair.

    Args:
        data: a :class:`rs_interp.tasks.Task` (its corrupted prompts the reference run) or an iterable
            of :class:`rs_interp.scale.Batch`.
        **options: ``batch_size``, ``resume``, ``save_every``, ``progress``, ``kind`` (:func:`rs_interp.scale.stream`);
            the rest (``ig_steps``, ``ig_rule``, ``which``, ``qk_fix``, ``correction`` ...) pass to the helper.

    Raises:
        ValueError: ``grad_drop=True`` (a sum of magnitudes of whole-batch estimates: not a sum over
            batches) and ``per_example=True`` (a result as large as the dataset), each saying so.
    """
    require(model, "scale.attribution_patching", adapts=False)  # read by the helper each batch runs
    return _streamed(_c.attribution_patching, _c.AttributionPatching, model, data, options)


@needs(like=_c.edge_attribution_patching, name="scale.edge_attribution_patching")
def edge_attribution_patching(model: Model, data: Dataset, **options: Any) -> _c.EdgeAttributionPatching:
    """:func:`rs_interp.edge_attribution_patching` (EAP, EAP-IG with ``ig_steps``) over a dataset;
    arguments as :func:`attribution_patching`.

    Example:
        >>> import rs_interp as ri
        >>> from rs_interp.tasks import induction_task
        >>> model = ri.load_toy_model("induction-2l")
        >>> task = induction_task(5, seed=0, seq_len=12, max_period=5, min_period=3)
        >>> eap_ig = edge_attribution_patching(model, task, batch_size=2, ig_steps=2, progress=False)
        >>> eap_ig.ig_steps, eap_ig.layout.n_edges
        (2, 29)
    """
    require(model, "scale.edge_attribution_patching", adapts=False)  # read by the helper each batch runs
    return _streamed(_c.edge_attribution_patching, _c.EdgeAttributionPatching, model, data, options)


@needs(like=_c.edge_relevance_patching, name="scale.edge_relevance_patching")
def edge_relevance_patching(model: Model, data: Dataset, **options: Any) -> _c.EdgeRelevancePatching:
    """:func:`rs_interp.edge_relevance_patching` (RelP; with ``qk_fix``, ``ig_steps``) over a dataset; arguments as
    :func:`attribution_patching`. A RelP estimate is linear in the metric's gradient, each batch's row by row, so the
    dataset's is the batches' weighted mean.

    Example:
        >>> import rs_interp as ri
        >>> from rs_interp.tasks import induction_task
        >>> model = ri.load_toy_model("induction-2l")
        >>> task = induction_task(5, seed=0, seq_len=12, max_period=5, min_period=3)
        >>> relp = edge_relevance_patching(model, task, batch_size=2, progress=False)
        >>> relp.layout.n_edges, relp.ablation
        (29, 'resample')
    """
    require(model, "scale.edge_relevance_patching")
    return _streamed(_c.edge_relevance_patching, _c.EdgeRelevancePatching, model, data, options)


@needs(like=_h.head_ablation_scan, name="scale.head_ablation_scan")
@renamed(method="ablation")
def head_ablation_scan(model: Model, data: Dataset, *, ablation: str = "zero", **options: Any) -> _h.HeadAblationScan:
    """:func:`rs_interp.head_ablation_scan` over a dataset (``"zero"`` or ``"resample"``, the reference
    run the batch's); arguments as :func:`attribution_patching`.

    Raises:
        ValueError: ``ablation="mean"`` or ``"position_mean"`` (module docstring).
    """
    require(model, "scale.head_ablation_scan", adapts=False)  # read by the helper each batch runs
    _rowwise(ablation, "head_ablation_scan")
    return _streamed(_h.head_ablation_scan, _h.HeadAblationScan, model, data, options, ablation=ablation)


@needs(like=_c.path_patching, name="scale.path_patching")
def path_patching(model: Model, data: Dataset, **options: Any) -> _c.PathPatching:
    """:func:`rs_interp.path_patching` (every edge, or ``edges``) over a dataset; arguments as
    :func:`attribution_patching`."""
    require(model, "scale.path_patching", adapts=False)  # read by the helper each batch runs
    return _streamed(_c.path_patching, _c.PathPatching, model, data, options)

def run_method(model: Model, data: Dataset, name: str, **options: Any) -> Any:
    """The entry ``name`` of the methods registry (:data:`rs_interp.circuits.methods.METHODS`, by name) over a
    dataset: its helper's streamed version run with the entry's options, ``options`` on top (``ig_steps=3``,
    ``batch_size``, ``progress`` ...). What :func:`rs_interp.ui.circuit_command.run_circuit` scores with.

    Example:
        >>> import rs_interp as ri
        >>> from rs_interp.tasks import induction_task
        >>> model = ri.load_toy_model("induction-2l")
        >>> task = induction_task(5, seed=0, seq_len=12, max_period=5, min_period=3)
        >>> run_method(model, task, "EAP-IG (m = 5)", batch_size=2, progress=False).ig_steps
        5

    Raises:
        ValueError: no method of that name, or one whose scores are not one streamed helper's call (ACDC, the
            patched screens: each batch would choose its own edges), naming the ones that stream.
    """
    from ..circuits.methods import METHODS

    entry = METHODS.get(name)
    if entry is None or entry.helper is None or _result_of(entry.helper) is None:
        streams = [n for n, m in METHODS.items() if m.helper is not None and _result_of(m.helper) is not None]
        raise ValueError(f"{name!r} is not a registry method that streams; these do: {few(streams)}")
    options = {**entry.options, **options}
    wrappers = {_c.attribution_patching: attribution_patching, _c.path_patching: path_patching,
                _c.edge_attribution_patching: edge_attribution_patching,
                _c.edge_relevance_patching: edge_relevance_patching,
                _h.head_ablation_scan: head_ablation_scan}  # their own checks and certificate entries
    if entry.helper in wrappers:
        return wrappers[entry.helper](model, data, **options)
    # a new helper: it certifies the model in every batch
    return _streamed(entry.helper, _result_of(entry.helper), model, data, options)


@needs(like=_c.evaluate_circuit, name="scale.evaluate_circuit")
@renamed(method="ablation")
def evaluate_circuit(model: Model, data: Dataset, circuit: Iterable[tuple[str, str]], *, ablation: str = "resample",
                     **options: Any) -> float:
    """:func:`rs_interp.evaluate_circuit` over a dataset: the metric with every edge outside ``circuit``
    ablated; arguments as :func:`attribution_patching`."""
    require(model, "scale.evaluate_circuit")
    _rowwise(ablation, "evaluate_circuit")
    run_kw, options = _split(options, "evaluate_circuit")
    circuit = [tuple(e) for e in circuit]

    def run(model: Any, batch: Any) -> float:
        weight_of(batch, "evaluate_circuit")
        return _c.evaluate_circuit(model, batch.tokens, batch.metric, circuit, reference=batch.reference,
                                   ablation=ablation, **options,
                                   **quiet(_c.evaluate_circuit))

    def parts(value: float, batch: Any) -> tuple[dict, dict]:
        return {"value": batch.weight * torch.tensor(value, dtype=torch.float64),
                "weight": torch.tensor(batch.weight, dtype=torch.float64)}, {}

    build = lambda totals, fixed, model: float(totals["value"] / totals["weight"])  # noqa: E731
    return stream(Analysis("circuit", run, parts, build, {"circuit": circuit, "ablation": ablation, **options}),
                  model, data, **run_kw)


def _area(x: Sequence[float], y: Sequence[float]) -> float:
    """The trapezoid rule, as :func:`rs_interp.faithfulness_curve` takes it."""
    return float(sum((x[i + 1] - x[i]) * (y[i] + y[i + 1]) / 2 for i in range(len(x) - 1)))


def _finish(v: dict) -> dict:
    clean, empty = v["clean"], v["empty"]
    if clean == empty:
        raise ValueError(f"over the dataset the clean run and the empty circuit give the same metric ({clean}): "
                         "faithfulness is undefined")
    faith = tuple((x - empty) / (clean - empty) for x in v["values"])
    # a direction no argument or metric gave (only an absolute ranking runs without one): the dataset's runs'
    way = ({} if v.get("higher_is_better") is not None
           else {"higher_is_better": clean > empty, "direction_from": "clean and empty"})
    return {"faithfulness": faith, "area_under": _area(v["fractions"], faith),
            "area_from_1": _area(v["fractions"], [abs(1 - f) for f in faith])} | way


_CURVE = weighted(FaithfulnessCurve, mean=("values", "clean", "empty"),
                  same=("fractions", "ranking", "n_requested", "n_edges", "mib_counts", "higher_is_better",
                        "direction_from"),
                  derived=("faithfulness", "area_under", "area_from_1"), finish=_finish)


def _declared(metric: Any, options: dict, ranking: str) -> Any:
    """The metric's direction every batch agrees on before any run (the argument's, else the metric's own:
    :func:`rs_interp.metrics.declared_direction`), None where neither says: then the dataset's clean and
    empty runs decide it (:func:`_finish`), which only an absolute ranking can wait for."""
    way = declared_direction(metric, options.get("higher_is_better"))
    if way is None and ranking == "signed":
        raise ValueError("over a dataset the signed ranking needs the metric's direction before the batches run: pass "
                         "higher_is_better=True (a logit or probability difference) or False (a loss), or a task's "
                         "batches.")
    return way


def _curve_on(model: Any, batch: Any, scores: Any, options: dict) -> FaithfulnessCurve:
    """One batch's curve. A batch on which the clean run and the empty circuit give the same metric
    (faithfulness undefined on it alone) still has values that add up: they are measured circuit by
    circuit with :func:`rs_interp.evaluate_circuit` (the same circuits, the same runs). The metric's
    direction is the one every batch agrees on (:func:`_declared`), not each batch's own runs'."""
    way = _declared(batch.metric, options, options.get("ranking", "absolute"))
    if way is not None:
        options = {**options, "higher_is_better": way.higher_is_better}
    try:
        curve = _c.faithfulness_curve(model, batch.tokens, batch.metric, scores, reference=batch.reference, **options,
                                      **quiet(_c.faithfulness_curve))
        # the direction is the dataset's: the declared one, or left to the totals (an absolute ranking: unused here)
        return dataclasses.replace(curve, higher_is_better=way and way.higher_is_better,
                                   direction_from=way and way.source)
    except ValueError as err:
        if ("faithfulness is undefined" not in str(err)
                or set(options) - {"fractions", "ranking", "ablation", "pruned", "higher_is_better"}):
            raise
    fr = tuple(float(f) for f in options.get("fractions", MIB_FRACTIONS))
    ranking, ablation = options.get("ranking", "absolute"), options.get("ablation", "resample")
    layout, weights = scores.layout, mib_weights(scores.layout)
    way = _declared(batch.metric, options, ranking)
    chosen = [circuit_at(scores, f, ranking=ranking, pruned=False, higher_is_better=bool(way and way.higher_is_better))
              for f in fr]
    keeps = [prune(layout, k) if options.get("pruned", True) else k for k in chosen]
    kw = dict(reference=batch.reference, ablation=ablation)
    with warnings.catch_warnings():  # a dangling circuit: faithfulness_curve evaluates it without a warning
        warnings.simplefilter("ignore")
        values = [_c.evaluate_circuit(model, batch.tokens, batch.metric, _edges(layout, k), **kw) for k in keeps]
        empty = _c.evaluate_circuit(model, batch.tokens, batch.metric, [], **kw)
    with torch.no_grad():
        clean = metric_value(batch.metric(model(batch.tokens, return_type="logits")), "clean run")
    total = float(weights.sum())
    nan = float("nan")
    return FaithfulnessCurve(fractions=fr, ranking=ranking, n_requested=tuple(int(f * total) for f in fr),
                             n_edges=tuple(int(float((weights * k).sum())) for k in keeps), values=tuple(values),
                             faithfulness=(nan,) * len(fr), clean=clean, empty=empty, area_under=nan, area_from_1=nan,
                             mib_counts=mib_counts(layout, chosen), higher_is_better=way and way.higher_is_better,
                             direction_from=way and way.source)


def _edges(layout: Any, keep: torch.Tensor) -> list[tuple[str, str]]:
    return [(layout.senders[i], layout.receivers[j]) for i, j in keep.nonzero().tolist()]


def _check_scores(model: Any, scores: Any) -> None:
    from ..circuits.graph import embedding_of

    if not isinstance(scores, _c.EdgeEffects):
        raise ValueError("scores must be edge scores (EdgeEffects) of this model's edge layout")
    layout = _c.edge_layout(model, embedding_of(scores.layout))
    if scores.layout.senders != layout.senders or scores.layout.receivers != layout.receivers:
        raise ValueError("scores must be edge scores (EdgeEffects) of this model's edge layout")


@needs(like=_c.faithfulness_curve, name="scale.faithfulness_curve")
@renamed(method="ablation")
def faithfulness_curve(model: Model, data: Dataset, scores: _c.EdgeEffects, **options: Any) -> FaithfulnessCurve:
    """:func:`rs_interp.faithfulness_curve` over a dataset: the circuits chosen once from ``scores``
    (the dataset's), each circuit's metric, the clean and the empty one summed over the batches,
    then the faithfulness and the areas from the totals. Arguments as :func:`attribution_patching`.
    The metric's direction (``higher_is_better``) is the one rule of :func:`rs_interp.metrics.direction`
    over the dataset: the argument, else the batches' metrics' declaration (a task's batches declare
    theirs), else the dataset's clean run against its empty circuit, which only the absolute ranking can
    wait for (the signed one chooses its circuits from it in every batch: it asks for ``higher_is_better=``).

    Raises:
        ValueError: ``ablation="mean"``/``"position_mean"``; the clean run and the empty circuit giving
            the same metric over the dataset (faithfulness undefined); ``ranking="signed"`` with no direction.
    """
    require(model, "scale.faithfulness_curve")
    _rowwise(options.get("ablation", "resample"), "faithfulness_curve")
    _check_scores(model, scores)
    run_kw, options = _split(options, "faithfulness_curve")
    parts, build = _CURVE

    def run(model: Any, batch: Any) -> FaithfulnessCurve:
        weight_of(batch, "faithfulness_curve")
        return _curve_on(model, batch, scores, options)

    analysis = Analysis("faithfulness curve", run, lambda r, b: parts(r, b.weight), build,
                        {"scores": scores, **options})
    return stream(analysis, model, data, **run_kw)


@needs(like=_c.mib_scores, name="scale.mib_scores")
@renamed(method="ablation")
def mib_scores(model: Model, data: Dataset, scores: _c.EdgeEffects, *, fractions: Sequence[float] = MIB_FRACTIONS,
               ablation: str = "resample", **options: Any) -> MIBScores:
    """:func:`rs_interp.mib_scores` over a dataset: both curves (signed and absolute ranking) in one
    pass over the batches. Arguments as :func:`attribution_patching`."""
    require(model, "scale.mib_scores")
    _rowwise(ablation, "mib_scores")
    _check_scores(model, scores)
    run_kw, options = _split(options, "mib_scores")
    parts, build = _CURVE
    kw = {"fractions": fractions, "ablation": ablation, **options}

    def run(model: Any, batch: Any) -> tuple[FaithfulnessCurve, FaithfulnessCurve]:
        weight_of(batch, "mib_scores")
        return tuple(_curve_on(model, batch, scores, {**kw, "ranking": r}) for r in ("signed", "absolute"))

    def split(curves: tuple, batch: Any) -> tuple[dict, dict]:
        (ps, fs), (pa, fa) = (parts(c, batch.weight) for c in curves)
        return ({**{f"signed.{k}": v for k, v in ps.items()}, **{f"absolute.{k}": v for k, v in pa.items()}},
                {"signed": fs, "absolute": fa})

    def assemble(totals: dict, fixed: dict, model: Any) -> MIBScores:
        s, a = (build({k.split(".", 1)[1]: v for k, v in totals.items() if k.startswith(f"{r}.")}, fixed[r], model)
                for r in ("signed", "absolute"))
        return MIBScores(cpr=s.area_under, cmd=a.area_from_1, signed=s, absolute=a)

    return stream(Analysis("MIB scores", run, split, assemble, {"scores": scores, **kw}), model, data, **run_kw)


@dataclass(frozen=True)
class MetricValues:
    """A dataset's metric on the clean prompts and on the corrupted ones (:func:`metric_values`).

    Attributes:
        clean: the metric of the runs on the batches' ``tokens``.
        corrupted: the metric of the runs on their ``reference`` (the corrupted prompts).
    """

    clean: float
    corrupted: float


def metric_values(model: Model, data: Dataset, **options: Any) -> MetricValues:
    """The dataset's metric on the clean and on the corrupted prompts, each one forward pass per
    batch: what ``metric(model(tokens))`` and ``metric(model(reference))`` give on the concatenated
    batch. Arguments as :func:`attribution_patching` (no helper options).

    Example:
        >>> import rs_interp as ri
        >>> from rs_interp.tasks import induction_task
        >>> model = ri.load_toy_model("induction-2l")
        >>> task = induction_task(5, seed=0, seq_len=12, max_period=5, min_period=3)
        >>> v = metric_values(model, task, batch_size=2, progress=False)
        >>> abs(v.clean - float(task.metric()(model(task.clean)).detach())) < 1e-5
        True
    """
    run_kw, options = _split(options, "metric_values")
    if options:
        raise ValueError(f"metric_values takes no options beyond {_STREAM}, got {few(sorted(options))}")

    def run(model: Any, batch: Any) -> MetricValues:
        weight_of(batch, "metric_values")
        if batch.reference is None:
            raise ValueError("metric_values needs each batch's reference (the corrupted prompts)")
        with torch.no_grad():
            return MetricValues(*(metric_value(batch.metric(model(t, return_type="logits")), what)
                                  for t, what in ((batch.tokens, "clean run"), (batch.reference, "corrupted run"))))

    parts, build = weighted(MetricValues, mean=("clean", "corrupted"))
    return stream(Analysis("metric", run, lambda r, b: parts(r, b.weight), build, {}), model, data, **run_kw)
