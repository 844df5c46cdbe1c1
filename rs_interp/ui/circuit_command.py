"""From "which edges carry this behaviour on my model?" to a verified circuit, in one call:
:func:`run_circuit` (and ``rs-interp circuit``, whose arguments :func:`add_arguments` declares and
:func:`run_command` runs).

The steps, each with a progress bar: score every edge of the model's graph on the task (a method of the
registry: EAP, EAP-IG, exact path patching, RelP ..., the corrupted prompts as the reference run); the
faithfulness curve of the top edges at MIB's ten sizes; the circuit, evaluated: at the size asked for, or by
default the smallest circuit on the curve that recovers a share of the metric (80%: faithfulness 0.8 or more;
the curve's points refined by bisection between the last below and the first at or above it); then the files,
in ``out``:

- ``scores.safetensors`` (``effect``: (sender, receiver) float64, NaN off the graph; ``exists``)
  and ``scores.json`` (the labels of its rows and columns, the run's settings, the top edges);
- ``importances_mib.json``: the scores as a MIB circuit-track importance file, in MIB's convention
  (the scores of the task's loss, ``-effect / B`` with ``B`` the pairs per batch:
  :func:`rs_interp.circuits.mib_importances`), so MIB's evaluation ranks them as rs_interp does;
- ``curve.json``: the faithfulness curve (fractions, edges kept, values, faithfulness, its areas);
- ``circuit.json``: the circuit's edges with their scores, its metric and faithfulness;
- ``diagram.json``: the circuit diagram (:func:`rs_interp.ui.circuit_figure.circuit_figure`), plotly JSON;
- ``report.html``: one offline page (plotly's JavaScript inside) with the numbers and both figures;
- ``summary.json``: what :func:`run_circuit` returns.

>>> import tempfile, rs_interp as ri
>>> from rs_interp.tasks import induction_task
>>> model = ri.load_toy_model("induction-2l")
>>> run = run_circuit(model, induction_task(8, seed=0), method="eap", out=tempfile.mkdtemp(), size=8, progress=False)
>>> run.requested, run.size, run.reaches_logits, sorted(run.files)[:3]   # 8 asked for, 7 on a path to the logits
(8, 7, True, ['circuit', 'curve', 'diagram'])
>>> run = run_circuit(model, induction_task(8, seed=0), method="eap", out=tempfile.mkdtemp(), progress=False)
>>> run.share, run.faithfulness >= 0.8, run.size < run.n_edges   # the default: the smallest recovering 80%
(0.8, True, True)
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from ._circuit_args import COMMAND_METHODS, add_arguments, check_arguments, command_task, load_command_model
from ._circuit_choice import on_the_curve as _on_the_curve
from ._circuit_choice import smallest_circuit
from ._circuit_files import FILES, write_files, write_summary

__all__ = ["CircuitRun", "run_circuit", "add_arguments", "check_arguments", "run_command", "load_command_model",
           "COMMAND_METHODS"]


@dataclass(frozen=True)
class CircuitRun:
    """What :func:`run_circuit` found and wrote.

    Attributes:
        model: the model's description (e.g. ``"GPT-2 small, random weights"``).
        task, method: the task's name and the scoring method.
        n_prompts: rows of the task.
        clean, corrupted: the task's metric on the clean and on the corrupted prompts.
        n_edges: edges in the model's graph.
        size: edges in the chosen circuit: the ``requested`` top edges by ``|score|``, pruned to those on a
            path from the embedding to the logits (MIB's pruning); ``fraction`` = ``size / n_edges``.
        value, faithfulness: the circuit's metric, and ``(value - empty) / (full - empty)``.
        area_under, area_from_1: the faithfulness curve's areas over the fractions of edges kept
            (trapezoid rule): under the curve, and between it and 1 (the edges ranked by ``|score|``).
        top_edges: the ten edges of largest ``|score|``, ``(("L9H9", "logits"), score)``.
        files: name -> path of every file written.
        seconds: step -> wall-clock seconds.
        requested: the top edges asked for (``--size``), before pruning.
        reaches_logits: whether any of them lies on a path to the logits (False: the circuit is empty,
            its faithfulness 0; a larger size is needed).
        share: the share of the metric the default circuit recovers (it is the smallest circuit on the
            faithfulness curve whose faithfulness reaches it); None where a size was asked for.
        bisection: ``(requested, edges, faithfulness)`` of each circuit evaluated between the curve's points
            to find the default circuit, in the order evaluated.
        edges: the circuit's edges, ``("L0H1", "L1H0.k")``, in the graph's order.
    """

    model: str
    task: str
    method: str
    n_prompts: int
    clean: float
    corrupted: float
    n_edges: int
    size: int
    fraction: float
    value: float
    faithfulness: float
    area_under: float
    area_from_1: float
    top_edges: tuple[tuple[tuple[str, str], float], ...]
    files: Mapping[str, str]
    seconds: Mapping[str, float]
    requested: int = 0
    reaches_logits: bool = True
    share: float | None = None
    bisection: tuple[tuple[int, int, float], ...] = ()
    edges: tuple[tuple[str, str], ...] = ()

    def diagram(self) -> Any:
        """The circuit diagram written to ``files["diagram"]``, a ``plotly`` figure (a notebook shows it)."""
        import plotly.io

        return plotly.io.read_json(self.files["diagram"])


def _circuit_size(size: int | float, total: int) -> int:
    """An edge count from ``size``: an int is a count, a float in (0, 1] a fraction (MIB's
    ``int(f * N)``, at least one edge)."""
    if isinstance(size, bool) or not isinstance(size, (int, float)):
        raise ValueError(f"size must be an edge count (int) or a fraction of the edges (float in (0, 1]), got {size!r}")
    if isinstance(size, int):
        if not 1 <= size <= total:
            raise ValueError(f"size must be between 1 and the graph's {total} edges, got {size}")
        return size
    if not 0 < size <= 1:
        raise ValueError(f"a fractional size must lie in (0, 1], got {size}")
    return max(1, int(size * total))


def _check(model: Any, task: Any) -> None:
    cfg = model.cfg
    top = int(max(task.clean.max(), task.corrupted.max(), task.answers.max(), task.wrong.max()))
    if top >= cfg.d_vocab:
        raise ValueError(f"the {task.name} task uses token id {top}, outside this model's {cfg.d_vocab}-token "
                         "vocabulary (was it built with another model's tokenizer?)")
    if task.clean.shape[1] > cfg.n_ctx:
        raise ValueError(f"the {task.name} task's prompts have {task.clean.shape[1]} tokens, more than the model's "
                         f"n_ctx {cfg.n_ctx}")


def _model_label(cfg: Any) -> str:
    """The model's ``cfg.model_name``, or its shape where that is the backend's placeholder (TransformerLens 3 calls a
    model built from a config ``"custom"``, 4's bridges ``"native"``)."""
    name = str(getattr(cfg, "model_name", "") or "")
    if name in ("", "custom", "native"):
        return f"a model of {cfg.n_layers} layers, {cfg.n_heads} heads, d_model {cfg.d_model}"
    return name


def run_circuit(model: Any, task: Any, *, method: str, out: str | os.PathLike, size: int | float | None = None,
                ig_steps: int = 5, model_name: str | None = None, progress: bool = True,
                batch_size: int | None = None, share: float | None = None) -> CircuitRun:
    """Score, curve, circuit, files (module docstring).

    Every step streams over the task (:mod:`rs_interp.scale`): ``batch_size`` pairs at a time, and under
    ``torchrun`` the batches shared over the ranks, every rank computing the same numbers and rank 0
    alone writing the files (the others return the same :class:`CircuitRun`).

    Args:
        model: a TransformerLens model (``rs_interp.load_gpt2``, ``load_toy_model`` ...).
        task: a :class:`rs_interp.tasks.Task`; its corrupted prompts are the reference run.
        method: a command name of the methods registry (:data:`COMMAND_METHODS`, the entries of
            :data:`rs_interp.circuits.methods.METHODS` with a ``command``): ``"eap"``, ``"eap-ig"`` (``ig_steps``
            steps), ``"exact"`` (path patching: one forward pass per edge, feasible on small models), ``"relp"``
            (relevance patching, :func:`rs_interp.edge_relevance_patching`) ...
        out: the output directory (created).
        size: the circuit's size: an edge count, or a fraction of the edges (MIB's ``int(f * N)``); by
            default the smallest circuit on the faithfulness curve that recovers ``share`` of the metric.
        ig_steps: EAP-IG's interpolation steps.
        model_name: how the page and the files describe the model (default: its ``cfg.model_name``).
        progress: progress bars (on stderr) over the steps and within the long ones (rank 0's).
        batch_size: pairs per batch (default: the whole task on one process, an even share of it per rank
            under ``torchrun``).
        share: without a ``size``, the share of the metric (faithfulness) the circuit must recover (default
            :data:`rs_interp.circuits.selection.RECOVERED_SHARE`, 0.8).

    Raises:
        ValueError: an unknown method, a size outside the graph, a task the model cannot read (ids
            outside its vocabulary, prompts longer than its context), the full and empty circuits
            giving the same metric (faithfulness undefined), a bad ``batch_size``.
        OSError: ``out`` is not a writable directory.
    """
    from .. import scale
    from .._progress import bar

    plan = _plan(model, task, method, out, size, share, batch_size, model_name)
    kw = dict(batch_size=plan["batch_size"], progress=progress)
    name = plan["name"]
    seconds: dict[str, float] = {}
    with bar(total=4, desc=f"circuit ({task.name}, {method})", enabled=progress and plan["lead"], unit="step") as bars:
        steps = _Steps(bars, seconds)
        t0 = steps.start("scoring edges")
        scores = _score(model, task, method, ig_steps, kw)
        steps.done("scores", t0)
        t0 = steps.start("faithfulness curve")
        curve = scale.faithfulness_curve(model, task, scores, **kw)
        steps.done("curve", t0)
        t0 = steps.start("the circuit")
        found = _choose(model, task, scores, curve, plan, kw)
        steps.done("circuit", t0)
        t0 = steps.start("writing files")
        files = {key: str(plan["out"] / f) for key, f in FILES}
        run = _record(task, method, scores, curve, found, files, seconds, plan)
        if not plan["lead"]:  # every rank holds the numbers; rank 0 writes them
            return run
        steps_used = ig_steps if "ig_steps" in COMMAND_METHODS[method].options else None
        settings = {"model": name, "task": task.name, "method": method, "ig_steps": steps_used,
                    "n_prompts": len(task), "seed": task.seed, "metric": task.kind}
        write_files(run, task, scores, curve, settings, found, plan["batch_size"], model)
        steps.done("files", t0)
    write_summary(run)  # after the last step: its timing included
    return run


class _Steps:
    """The run's bar of steps and each step's wall-clock seconds."""

    def __init__(self, bars: Any, seconds: dict[str, float]) -> None:
        self.bars, self.seconds = bars, seconds

    def start(self, label: str) -> float:
        self.bars.set_postfix_str(label)
        return time.perf_counter()

    def done(self, key: str, t0: float) -> None:
        self.seconds[key] = round(time.perf_counter() - t0, 3)
        self.bars.update(1)


def _plan(model: Any, task: Any, method: str, out: Any, size: Any, share: Any, batch_size: Any,
          model_name: str | None) -> dict:
    """The arguments checked before any pass: the method, the task against the model, the size, the share, the
    output directory (made by the rank that writes); the batch size (one batch per rank by default), the model's
    description."""
    import rs_interp as ri

    from .. import scale
    from ..circuits.selection import RECOVERED_SHARE

    if method not in COMMAND_METHODS:
        raise ValueError(f"method must be one of {', '.join(COMMAND_METHODS)}, got {method!r}")
    _check(model, task)
    layout = ri.edge_layout(model)
    n = None if size is None else _circuit_size(size, layout.n_edges)
    share = RECOVERED_SHARE if share is None else share
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
        raise ValueError(f"share must be a number in (0, 1], the part of the metric the circuit recovers, "
                         f"got {share!r}")
    me, world = scale.world()
    lead = me == 0  # the rank that writes the files and draws the bars
    if batch_size is None:
        batch_size = -(-len(task) // world)  # one batch per rank
    out = Path(out)
    if lead:
        out.mkdir(parents=True, exist_ok=True)
        if not os.access(out, os.W_OK):
            raise OSError(f"{out} is not a writable directory")
    return {"layout": layout, "n": n, "share": share, "size": size, "lead": lead, "batch_size": batch_size, "out": out,
            "name": model_name or _model_label(model.cfg)}


def _score(model: Any, task: Any, method: str, ig_steps: int, kw: dict) -> Any:
    """Every edge's score by the registry's entry of the command name ``method``, streamed over the task
    (:func:`rs_interp.scale.run_method`); ``ig_steps`` where the entry interpolates."""
    from .. import scale

    entry = COMMAND_METHODS[method]
    steps = {"ig_steps": ig_steps} if "ig_steps" in entry.options else {}
    return scale.run_method(model, task, entry.name, **steps, **kw)


def _choose(model: Any, task: Any, scores: Any, curve: Any, plan: dict, kw: dict) -> dict:
    """The circuit: the full and empty runs, then the size asked for (the top edges, pruned) or the smallest circuit
    on the curve recovering the share; its edges in the graph's order and its metric."""
    import rs_interp as ri

    from .. import scale
    from ..circuits.selection import mask, prune

    layout, n = plan["layout"], plan["n"]
    # the full circuit is the clean run, the empty one the corrupted run (resample ablation)
    runs = scale.metric_values(model, task, **kw)
    full, empty = runs.clean, runs.corrupted
    if full == empty:
        raise ValueError(f"the {task.name} metric is {full} on the clean and on the corrupted prompts: "
                         "faithfulness is undefined")
    bisection: tuple = ()
    if n is None:  # the smallest circuit on the curve that recovers the share
        n, kept, value, bisection = smallest_circuit(model, task, scores, curve, plan["share"], (full, empty), kw)
    else:
        # the top n edges, pruned to those on a path from the embedding to the logits (as MIB and the
        # faithfulness curve do): an edge into a component that reaches nothing carries nothing out
        kept = prune(layout, mask(layout, ri.top_edges(scores, n)))
        value = _on_the_curve(curve, scores, kept, n)  # the curve ran it when it is one of its circuits
    circuit = [e for e in layout.edges() if kept[layout.index(e)]]
    if value is None:
        value = scale.evaluate_circuit(model, task, circuit, **kw)
    return {"full": full, "empty": empty, "n": n, "value": value, "bisection": bisection, "circuit": circuit,
            "rank": {e: k for k, e in enumerate(layout.edges())}}


def _record(task: Any, method: str, scores: Any, curve: Any, found: dict, files: dict,
            seconds: dict, plan: dict) -> CircuitRun:
    """What the run found, as returned (its ``files`` and ``seconds`` live views: the last step's time included)."""
    import rs_interp as ri

    layout, circuit, rank = plan["layout"], found["circuit"], found["rank"]
    best = sorted(ri.top_edges(scores, min(10, layout.n_edges)), key=lambda e: (-abs(scores.edge(*e)), rank[e]))
    top = tuple(((s, r), scores.edge(s, r)) for s, r in best)
    full, empty, value = found["full"], found["empty"], found["value"]
    return CircuitRun(model=plan["name"], task=task.name, method=method, n_prompts=len(task), clean=full,
                      corrupted=empty,
                      n_edges=layout.n_edges, size=len(circuit), fraction=len(circuit) / layout.n_edges, value=value,
                      faithfulness=(value - empty) / (full - empty), **_areas(curve), top_edges=top,
                      files=MappingProxyType(files), seconds=MappingProxyType(seconds), requested=found["n"],
                      reaches_logits=bool(circuit), share=plan["share"] if plan["size"] is None else None,
                      bisection=found["bisection"], edges=tuple(circuit))
def _areas(curve: Any) -> dict[str, float]:
    """The curve's two areas (edges ranked by |score|: its area_from_1 is MIB's CMD)."""
    return {"area_under": curve.area_under, "area_from_1": curve.area_from_1}


def run_command(args: argparse.Namespace) -> list[str]:
    """Run ``rs-interp circuit`` with parsed ``args``; the summary's lines (the command line prints them). Under
    ``torchrun`` every rank runs it on its share of the pairs and rank 0 writes and reports (the other ranks
    return no lines) (``torchrun --nproc_per_node=N -m rs_interp.ui.cli circuit ...``).

    Raises:
        rs_interp.WeightsUnavailable, ValueError, OSError: with a message for one line (the CLI prints it).
    """
    check_arguments(args)  # before torch: a bad argument costs a second, not a model load
    from ..scale import rank_device, world

    me, _ = world()  # under torchrun: this rank (the process group joined); else 0
    model, tokenizer, what = load_command_model(args.model)
    device = rank_device()  # each rank's model on its own device: cuda:LOCAL_RANK where there is CUDA
    if device.type != "cpu":
        model = model.to(device, print_details=False)
    task = command_task(args, tokenizer, model)  # a refusal in the command line's terms
    run = run_circuit(model, task, method=args.method, out=args.out, size=args.size, ig_steps=args.ig_steps,
                      model_name=what, progress=not args.quiet, batch_size=getattr(args, "batch_size", None),
                      share=getattr(args, "share", None))
    if me != 0:  # rank 0 reports; every rank computed the same numbers
        return []
    lines = [f"{run.task} on {run.model}, {run.method}: metric {run.clean:.4g} clean, {run.corrupted:.4g} corrupted",
             f"curve: area under {run.area_under:.4f}, from 1 {run.area_from_1:.4f}; circuit of {run.size} edges "
             f"({100 * run.fraction:.3g}%; the top {run.requested} pruned to what reaches the logits): "
             f"faithfulness {run.faithfulness:.4f}"]
    if run.share is not None:
        refined = f"; the curve refined by bisection, {len(run.bisection)} more circuits" if run.bisection else ""
        lines.append(f"the circuit is the smallest on the faithfulness curve that recovers {run.share:.0%} of the "
                     f"metric (faithfulness >= {run.share:g}{refined}); --size N or F asks for another size")
    if not run.reaches_logits:
        lines.append(f"none of the top {run.requested} edges lies on a path from the embedding to the logits: the "
                     "circuit is empty; ask for a larger --size")
    return lines + [f"wrote {len(run.files)} files to {args.out}: "
                    f"{', '.join(Path(p).name for p in run.files.values())}"]
