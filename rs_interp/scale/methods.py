"""The methods registry streamed (:data:`rs_interp.circuits.methods.METHODS`): how each helper's result adds over
batches (:data:`_RULES`, by the result's class), the checks every streamed helper shares (what the dataset provides,
what does not add over batches). :mod:`rs_interp.scale.circuits` writes each helper's own entry point on these, and
:func:`rs_interp.scale.circuits.run_method`, which streams any registry entry that is one helper's call.
"""

from __future__ import annotations

from typing import Any

from .. import circuits as _c
from .._backend import Model
from ..heads import head_ablation as _h
from .engine import Analysis, no_overrides, quiet, stream, weight_of
from .pairs import Dataset
from .sums import weighted

__all__: list[str] = []

_ROW_COUPLED = ("mean", "position_mean")
_STREAM = ("batch_size", "resume", "save_every", "progress", "kind")


def _rowwise(ablation: str, helper: str) -> None:
    if ablation in _ROW_COUPLED:
        raise ValueError(f"{helper}: ablation={ablation!r} ablates with the reference's mean over the whole batch; "
                         "batch by batch that is each batch's own mean, not the dataset's, so no sum over batches "
                         "gives one call's result. "
                         f"Use 'resample' or 'zero', or call rs_interp.{helper} on the whole dataset at once")


def _estimate_options(options: dict, helper: str) -> None:
    """Refuse the estimates' options whose result is not a weighted sum over batches (named)."""
    if options.get("grad_drop"):
        raise ValueError(f"{helper}: grad_drop=True scores the sum over layers of |the estimate on the whole batch|, "
                         "and |a + b| is not |a| + |b|: no sum over batches gives one call's result. Stream the plain "
                         "or QK-fixed "
                         f"estimate, or call rs_interp.{helper} with grad_drop=True on the whole dataset at once")
    if options.get("spans") is not None:
        raise ValueError(f"{helper}: spans= gives each batch's rows their own spans; streamed, the batches' schemas "
                         f"are not carried (not built): call rs_interp.{helper} with spans= on the pairs whose "
                         "positions you need")
    if options.get("per_example"):
        raise ValueError(f"{helper}: per_example=True keeps one share per pair, a result as large as the dataset, "
                         f"which the streamed helpers exist to avoid holding; call rs_interp.{helper} with "
                         "per_example=True on the pairs "
                         "whose shares you need (rs_interp.circuits.uncertainty.bootstrap reads them)")


def _metric_analysis(name: str, helper: Any, rule: tuple, options: dict, **fixed_kw: Any) -> Analysis:
    parts, build = rule

    def run(model: Any, batch: Any) -> Any:
        weight_of(batch, name)
        return helper(model, batch.tokens, batch.metric, reference=batch.reference, **fixed_kw, **options,
                      **quiet(helper))

    return Analysis(name, run, lambda r, b: parts(r, b.weight), build, {**options, **fixed_kw})


#: How each result of a registry helper (:attr:`rs_interp.circuits.methods.Method.helper`) streams, by the result's
#: class: (the fields averaged with the batches' weights, the fields every batch must give alike).
#: :func:`run_method` streams any entry whose helper returns one of them, a new helper included.
_RULES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "AttributionPatching": (("effect", "effect_per_position", "clean", "first_order"),
                            ("labels", "ig_steps", "ig_rule", "which", "qk_fix", "grad_drop", "correction")),
    "EdgeAttributionPatching": (("effect", "clean", "first_order"),
                                ("layout", "ig_steps", "ig_rule", "qk_fix", "grad_drop", "correction")),
    "EdgeRelevancePatching": (("effect", "clean"), ("layout", "ablation", "qk_fix")),
    "HeadAblationScan": (("effect", "clean", "ablated"), ("ablation", "labels")),
    "PathPatching": (("effect", "clean"), ("layout",)),
}
#: The analyses' names (progress bars, resume files) of the helpers streamed before the registry drove them.
_NAMES = {"edge_relevance_patching": "relevance patching"}
#: The estimates, whose options :func:`_estimate_options` checks.
_ESTIMATES = ("attribution_patching", "edge_attribution_patching", "edge_relevance_patching")


def _result_of(helper: Any) -> Any:
    """The result class ``helper`` returns (its return annotation, a name in :mod:`rs_interp.circuits` or
    :mod:`rs_interp.heads.head_ablation`), or None."""
    import inspect

    returned = inspect.signature(helper).return_annotation
    name = returned if isinstance(returned, str) else getattr(returned, "__name__", "")
    return getattr(_c, name, None) or getattr(_h, name, None) if name in _RULES else None


def _streamed(helper: Any, result: Any, model: Model, data: Dataset, options: dict, **fixed_kw: Any) -> Any:
    """``helper`` over ``data`` by the rule of its ``result`` class (:data:`_RULES`): the streaming keywords split
    off, the options the sum cannot carry refused."""
    name = helper.__name__
    run_kw, options = _split(options, name)
    if name in _ESTIMATES:
        _estimate_options(options, name)
    mean, same = _RULES[result.__name__]
    rule = weighted(result, mean=mean, same=same)
    analysis = _metric_analysis(_NAMES.get(name, name.replace("_", " ")), helper, rule, options, **fixed_kw)
    return stream(analysis, model, data, **run_kw)




def _split(options: dict, helper: str) -> tuple[dict, dict]:
    """(the streaming keywords, the helper's options), refusing what the dataset provides."""
    no_overrides(options, helper)
    return {k: options[k] for k in _STREAM if k in options}, {k: v for k, v in options.items() if k not in _STREAM}
