"""From "which edges carry this behaviour on my model?" to a verified circuit, in one call:
:func:`run_circuit` (and ``rs-interp circuit``, whose arguments :func:`add_arguments` declares and
:func:`run_command` runs).

The steps, each with a progress bar: score every edge of the model's graph on the task (EAP, EAP-IG
or exact path patching, the corrupted prompts as the reference run); the faithfulness curve of the
top edges at MIB's ten sizes; the circuit, evaluated: at the size asked for, or by default the smallest
circuit on the curve that recovers a share of the metric (80%: faithfulness 0.8 or more; the curve's
points refined by bisection between the last below and the first at or above it); then the files, in ``out``:

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
import html
import json
import math
import os
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, Mapping

from ..labels import edge_string
from ._circuit_args import COMMAND_METHODS, add_arguments, check_arguments, command_task, load_command_model
from ._circuit_choice import chosen, smallest_circuit

__all__ = ["CircuitRun", "run_circuit", "add_arguments", "check_arguments", "run_command", "load_command_model", "COMMAND_METHODS"]

#: The most edges the diagram draws (the top ones of a larger circuit; the page says so).
_DRAWN = 400
Method = Literal["eap", "eap-ig", "exact", "relp"]


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
        raise ValueError(f"the {task.name} task uses token id {top}, outside this model's {cfg.d_vocab}-token vocabulary "
                         "(was it built with another model's tokenizer?)")
    if task.clean.shape[1] > cfg.n_ctx:
        raise ValueError(f"the {task.name} task's prompts have {task.clean.shape[1]} tokens, more than the model's n_ctx {cfg.n_ctx}")


def _model_label(cfg: Any) -> str:
    """The model's ``cfg.model_name``, or its shape where that is the backend's placeholder (TransformerLens 3 calls a
    model built from a config ``"custom"``, 4's bridges ``"native"``)."""
    name = str(getattr(cfg, "model_name", "") or "")
    if name in ("", "custom", "native"):
        return f"a model of {cfg.n_layers} layers, {cfg.n_heads} heads, d_model {cfg.d_model}"
    return name


def run_circuit(model: Any, task: Any, *, method: Method, out: str | os.PathLike, size: int | float | None = None,
                ig_steps: int = 5, model_name: str | None = None, progress: bool = True,
                batch_size: int | None = None, share: float | None = None) -> CircuitRun:
    """Score, curve, circuit, files (module docstring).

    Every step streams over the task (:mod:`rs_interp.scale`): ``batch_size`` pairs at a time, and under
    ``torchrun`` the batches shared over the ranks, every rank computing the same numbers and rank 0
    alone writing the files (the others return the same :class:`CircuitRun`).

    Args:
        model: a TransformerLens model (``rs_interp.load_gpt2``, ``load_toy_model`` ...).
        task: a :class:`rs_interp.tasks.Task`; its corrupted prompts are the reference run.
        method: ``"eap"``, ``"eap-ig"`` (``ig_steps`` steps), ``"exact"`` (path patching: one
            forward pass per edge, feasible on small models) or ``"relp"`` (relevance patching,
            :func:`rs_interp.edge_relevance_patching`).
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
    import torch
    from safetensors.torch import save_file

    import rs_interp as ri

    from .. import scale
    from .._progress import bar
    from ..circuits.mib_files import write_mib
    from ..circuits.selection import RECOVERED_SHARE, mask, prune
    from .circuit_figure import circuit_figure
    from .plots import faithfulness_figure

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
    name = model_name or _model_label(model.cfg)
    kw = dict(batch_size=batch_size, progress=progress)
    seconds: dict[str, float] = {}
    with bar(total=4, desc=f"circuit ({task.name}, {method})", enabled=progress and lead, unit="step") as steps:

        def step(label: str):
            steps.set_postfix_str(label)
            return time.perf_counter()

        def done(key: str, t0: float) -> None:
            seconds[key] = round(time.perf_counter() - t0, 3)
            steps.update(1)

        t0 = step("scoring edges")
        if method == "exact":
            scores = scale.path_patching(model, task, **kw)
        elif method == "relp":
            scores = scale.edge_relevance_patching(model, task, **kw)
        else:
            scores = scale.edge_attribution_patching(model, task, ig_steps=ig_steps if method == "eap-ig" else None, **kw)
        done("scores", t0)

        t0 = step("faithfulness curve")
        curve = scale.faithfulness_curve(model, task, scores, **kw)
        done("curve", t0)

        t0 = step("the circuit")
        rank = {e: k for k, e in enumerate(layout.edges())}
        # the full circuit is the clean run, the empty one the corrupted run (resample ablation)
        runs = scale.metric_values(model, task, **kw)
        full, empty = runs.clean, runs.corrupted
        if full == empty:
            raise ValueError(f"the {task.name} metric is {full} on the clean and on the corrupted prompts: faithfulness is undefined")
        bisection: tuple = ()
        if n is None:  # the smallest circuit on the curve that recovers the share
            n, kept, value, bisection = smallest_circuit(model, task, scores, curve, share, (full, empty), kw)
        else:
            # the top n edges, pruned to those on a path from the embedding to the logits (as MIB and the
            # faithfulness curve do): an edge into a component that reaches nothing carries nothing out
            kept = prune(layout, mask(layout, ri.top_edges(scores, n)))
            value = _on_the_curve(curve, scores, kept, n)  # the curve ran it when it is one of its circuits
        circuit = [e for e in layout.edges() if kept[layout.index(e)]]
        if value is None:
            value = scale.evaluate_circuit(model, task, circuit, **kw)
        faith = (value - empty) / (full - empty)
        done("circuit", t0)

        t0 = step("writing files")
        files = {key: str(out / f) for key, f in (("scores", "scores.safetensors"), ("scores_json", "scores.json"),
                                                   ("mib", "importances_mib.json"), ("curve", "curve.json"),
                                                   ("circuit", "circuit.json"), ("diagram", "diagram.json"),
                                                   ("report", "report.html"), ("summary", "summary.json"))}
        best = sorted(ri.top_edges(scores, min(10, layout.n_edges)), key=lambda e: (-abs(scores.edge(*e)), rank[e]))
        top = tuple(((s, r), scores.edge(s, r)) for s, r in best)
        run = CircuitRun(model=name, task=task.name, method=method, n_prompts=len(task), clean=full, corrupted=empty,
                         n_edges=layout.n_edges, size=len(circuit), fraction=len(circuit) / layout.n_edges, value=value,
                         faithfulness=faith, **_areas(curve), top_edges=top, files=MappingProxyType(files),
                         seconds=MappingProxyType(seconds), requested=n, reaches_logits=bool(circuit),
                         share=share if size is None else None, bisection=bisection, edges=tuple(circuit))
        if not lead:  # every rank holds the numbers; rank 0 writes them
            return run
        save_file({"effect": scores.effect.to(torch.float64).contiguous(), "exists": layout.exists.contiguous()},
                  files["scores"], metadata={"method": method, "task": task.name, "model": name})
        settings = {"model": name, "task": task.name, "method": method, "ig_steps": ig_steps if method == "eap-ig" else None,
                    "n_prompts": len(task), "seed": task.seed, "metric": task.kind}
        _write_json(files["scores_json"], {**settings, "clean": scores.clean, "senders": list(layout.senders),
                                           "receivers": list(layout.receivers), "top_edges": [[list(e), v] for e, v in top],
                                           "tensors": "scores.safetensors: effect (sender, receiver) float64, NaN off "
                                                      "the graph; exists (sender, receiver) bool"})
        write_mib(files["mib"], model, scores=scores, higher_is_better=curve.higher_is_better, batch_size=batch_size)  # the task's
        _write_json(files["curve"], {**settings, **asdict(curve)})
        _write_json(files["circuit"], {**settings, "size": len(circuit), "requested": n, "reaches_logits": bool(circuit),
                                       "chosen": chosen(run), "share": run.share,
                                       "bisection": [list(b) for b in bisection],
                                       "fraction": len(circuit) / layout.n_edges, "value": value,
                                       "faithfulness": faith, "full": full, "empty": empty,
                                       "edges": [[s, r, scores.edge(s, r)] for s, r in circuit]})
        drawn = min(len(circuit), _DRAWN)
        shown = circuit if drawn == len(circuit) else sorted(circuit, key=lambda e: (-abs(scores.edge(*e)), rank[e]))[:drawn]
        diagram = circuit_figure(shown, layout, scores=scores, max_edges=_DRAWN,
                                 title=f"{task.name} circuit on {name} ({method}): {len(circuit)} edges"
                                       + (f", the top {drawn} drawn" if drawn < len(circuit) else "") + f"; faithfulness {faith:.3f}")
        Path(files["diagram"]).write_text(diagram.to_json(), encoding="utf-8")
        curve_fig = faithfulness_figure({method: curve}, title=f"Faithfulness of the top edges ({task.name}, {name})")
        _write_page(Path(files["report"]), run, task, diagram, curve_fig)
        done("files", t0)
    _write_json(Path(files["summary"]), _summary_dict(run))  # after the last step: its timing included
    return run


def _on_the_curve(curve: Any, scores: Any, kept: Any, n: int) -> float | None:
    """The curve's value of the circuit ``kept`` (a mask), if the curve ran it: its circuit at a fraction
    whose budget is ``n`` edges, chosen as the curve chooses (:func:`rs_interp.circuits.selection.circuit_at`,
    pruned), is the same mask, so the same run (the same ablated writes, the same edges cut) gave that
    value; else None. Saves the circuit's pass and its reference's record (the default size, 0.01, is MIB's)."""
    import torch

    from ..circuits.selection import circuit_at, prune

    for f, requested, value in zip(curve.fractions, curve.n_requested, curve.values):
        chosen = circuit_at(scores, f, ranking=curve.ranking, pruned=False, higher_is_better=bool(curve.higher_is_better))
        if requested == n and torch.equal(prune(scores.layout, chosen), kept):
            return value
    return None


def _areas(curve: Any) -> dict[str, float]:
    """The curve's two areas (edges ranked by |score|: its area_from_1 is MIB's CMD)."""
    return {"area_under": curve.area_under, "area_from_1": curve.area_from_1}


def _summary_dict(run: CircuitRun) -> dict:
    d = {f.name: getattr(run, f.name) for f in fields(run)}  # not asdict: it deep-copies, and a mappingproxy cannot be
    d["files"], d["seconds"] = dict(run.files), dict(run.seconds)
    return d


def _write_json(path: str | Path, data: dict) -> None:
    # NaN is not JSON: written as null (e.g. the curve's value where a circuit's metric was undefined)
    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    Path(path).write_text(json.dumps(clean(data), indent=1), encoding="utf-8")


_CSS = ("body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
        "td.num{text-align:right;font-variant-numeric:tabular-nums}.note{color:#555}code{background:#f4f4f4}")


def _write_page(path: Path, run: CircuitRun, task: Any, diagram: Any, curve_fig: Any) -> None:
    """One self-contained page: plotly's JavaScript once, the figures from inline JSON, no network request."""
    from plotly.offline import get_plotlyjs

    esc = html.escape
    rows = [("model", run.model), ("task", f"{run.task} ({run.n_prompts} prompt pairs, metric {task.kind})"),
            ("method", run.method), ("metric on the clean prompts", f"{run.clean:.6g}"),
            ("metric on the corrupted prompts", f"{run.corrupted:.6g}"), ("edges in the graph", f"{run.n_edges:,}"),
            ("circuit", f"{run.size:,} edges ({100 * run.fraction:.3g}%): {chosen(run)}"
                        + ("" if run.reaches_logits else "; none of them reaches the logits, so the circuit is empty "
                                                         "(faithfulness 0): ask for a larger --size")),
            ("circuit's metric", f"{run.value:.6g}"),
            ("circuit's faithfulness", f"{run.faithfulness:.4f}"),
            ("curve's area: under it / between it and 1", f"{run.area_under:.4f} / {run.area_from_1:.4f}")]
    table = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
    edges = "".join(f"<tr><td><code>{esc(edge_string(e))}</code></td><td class='num'>{v:.6g}</td></tr>" for e, v in run.top_edges)
    examples = ""
    if task.prompts is not None:
        pairs = list(zip(task.prompts, task.corrupted_prompts))[:3]
        examples = ("<h2>Prompts</h2><table><tr><th>clean</th><th>corrupted</th></tr>"
                    + "".join(f"<tr><td>{esc(c)}</td><td>{esc(x)}</td></tr>" for c, x in pairs) + "</table>")
    files = "".join(f"<li><code>{esc(Path(p).name)}</code></li>" for p in run.files.values())
    timing = ", ".join(f"{k} {v:.1f} s" for k, v in run.seconds.items())
    figs = {"diagram": diagram, "curve": curve_fig}
    scripts = "\n".join(f"Plotly.newPlot({json.dumps(fid)}, ...(function(s){{return [s.data, s.layout, "
                        f"{{responsive:true, displaylogo:false}}]}})({fig.to_json()}));" for fid, fig in figs.items())
    page = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{esc(run.task)} circuit</title>"
            f"<style>{_CSS}</style><script>{get_plotlyjs()}</script></head><body>"
            f"<h1>The {esc(run.task)} circuit of {esc(run.model)}</h1><table>{table}</table>"
            f"<p class='note'>Faithfulness: (circuit - empty) / (full - empty) with every edge outside the circuit "
            f"patched from the corrupted run. Steps: {esc(timing)}.</p>"
            f"<h2>The circuit</h2><div class='fig' id='diagram'></div>"
            f"<h2>Faithfulness of the top edges</h2><div class='fig' id='curve'></div>"
            f"<h2>The ten largest edges</h2><table><tr><th>edge</th><th>score</th></tr>{edges}</table>{examples}"
            f"<h2>Files</h2><ul>{files}</ul><script>{scripts}</script></body></html>")
    path.write_text(page, encoding="utf-8")


def run_command(args: argparse.Namespace) -> list[str]:
    """Run ``rs-interp circuit`` with parsed ``args``; the summary's lines (the command line prints them). Under ``torchrun``
    every rank runs it on its share of the pairs and rank 0 writes and reports (the other ranks return no lines)
    (``torchrun --nproc_per_node=N -m rs_interp.ui.cli circuit ...``).

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
             f"({100 * run.fraction:.3g}%; the top {run.requested} pruned to what reaches the logits): faithfulness {run.faithfulness:.4f}"]
    if run.share is not None:
        refined = f"; the curve refined by bisection, {len(run.bisection)} more circuits" if run.bisection else ""
        lines.append(f"the circuit is the smallest on the faithfulness curve that recovers {run.share:.0%} of the "
                     f"metric (faithfulness >= {run.share:g}{refined}); --size N or F asks for another size")
    if not run.reaches_logits:
        lines.append(f"none of the top {run.requested} edges lies on a path from the embedding to the logits: the circuit is "
                     "empty; ask for a larger --size")
    return lines + [f"wrote {len(run.files)} files to {args.out}: {', '.join(Path(p).name for p in run.files.values())}"]
