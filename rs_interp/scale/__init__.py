"""Past one batch and one process: every dataset-level analysis streamed, resumable and data-parallel.

The helpers of :mod:`rs_interp` take one batch of tokens. Their namesakes here take a dataset of pairs,
a :class:`rs_interp.tasks.Task` cut into ``batch_size`` rows at a time or any iterable of
:class:`Batch`, and return exactly what one call on the concatenated batch returns (to float64
rounding: sums and counts are accumulated in float64), with memory bounded by one result and one
batch. ``resume=FILE`` writes the partial sums and the position every ``save_every`` batches and goes
on from them; under ``torchrun`` the batches are shared over the ranks (batch ``k`` on rank
``k mod world``), the sums added with one ``all_reduce``, and every rank returns the same result.

- :mod:`rs_interp.scale.pairs`: :class:`Batch` (a batch, its metric and the metric's weight), :func:`batches`;
- :mod:`rs_interp.scale.sums`: float64 sums, and which fields of a result add and which must agree;
- :mod:`rs_interp.scale.resume`: the resume files;
- :mod:`rs_interp.scale.distributed`: ranks, devices, the one reduction;
- :mod:`rs_interp.scale.engine`: :func:`stream`, the loop they all run;
- :mod:`rs_interp.scale.circuits`: attribution patching (nodes, edges, EAP-IG), head ablation scans, path patching,
  circuits, faithfulness curves, MIB's scores, the metric on clean and corrupted prompts;
- :mod:`rs_interp.scale.summaries`: DLA and the lenses, summarised.

>>> import rs_interp as ri
>>> from rs_interp import scale
>>> from rs_interp.tasks import induction_task
>>> model, task = ri.load_toy_model("induction-2l"), induction_task(7, seed=0, seq_len=12, max_period=5, min_period=3)
>>> one = ri.attribution_patching(model, task.clean, task.metric(), reference=task.corrupted)
>>> streamed = scale.attribution_patching(model, task, batch_size=3, progress=False)   # batches of 3, 3 and 1
>>> float((streamed.effect - one.effect).abs().max()) < 1e-5, abs(streamed.clean - one.clean) < 1e-5
(True, True)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import attach

#: Every public name and its module, imported on first use (rs_interp._lazy): ``import rs_interp.scale``
#: loads neither torch nor TransformerLens.
_WHERE: dict[str, str] = {
    "Batch": ".pairs",
    "Dataset": ".pairs",
    "RowScores": ".pairs",
    "batches": ".pairs",
    "n_batches": ".pairs",
    "MetricValues": ".circuits",
    "attribution_patching": ".circuits",
    "edge_attribution_patching": ".circuits",
    "edge_relevance_patching": ".circuits",
    "evaluate_circuit": ".circuits",
    "faithfulness_curve": ".circuits",
    "head_ablation_scan": ".circuits",
    "metric_values": ".circuits",
    "mib_scores": ".circuits",
    "path_patching": ".circuits",
    "run_method": ".circuits",
    "DLASummary": ".summaries",
    "LensSummary": ".summaries",
    "direct_logit_attribution": ".summaries",
    "lens_kl": ".summaries",
    "logit_lens": ".summaries",
    "Analysis": ".engine",
    "stream": ".engine",
    "rank_device": ".distributed",
    "rank_gpus": ".distributed",
    "world": ".distributed",
}

if TYPE_CHECKING:  # the names, for type checkers and the documentation
    from .circuits import (
        MetricValues,
        attribution_patching,
        edge_attribution_patching,
        edge_relevance_patching,
        evaluate_circuit,
        faithfulness_curve,
        head_ablation_scan,
        metric_values,
        mib_scores,
        path_patching,
        run_method,
    )
    from .distributed import rank_device, rank_gpus, world
    from .engine import Analysis, stream
    from .pairs import Batch, Dataset, RowScores, batches, n_batches
    from .summaries import DLASummary, LensSummary, direct_logit_attribution, lens_kl, logit_lens

__getattr__, __dir__ = attach(__name__, _WHERE, globals())

__all__ = [
    "Batch", "Dataset", "RowScores", "batches", "n_batches",
    "attribution_patching", "edge_attribution_patching", "edge_relevance_patching", "head_ablation_scan",
    "path_patching", "evaluate_circuit",
    "run_method", "faithfulness_curve", "mib_scores", "metric_values", "MetricValues",
    "direct_logit_attribution", "DLASummary", "logit_lens", "LensSummary", "lens_kl",
    "stream", "Analysis", "world", "rank_device", "rank_gpus",
]
