"""The files ``rs-interp circuit`` writes (private; :mod:`rs_interp.ui.circuit_command` runs it): the scores, MIB's
importance file, the curve, the circuit, its diagram, one offline HTML page and the summary, each written from
what the run found (:func:`write_files`); nothing here computes a number.
"""

from __future__ import annotations

import html
import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from .._files import finite_json
from ..labels import edge_string
from ._circuit_choice import chosen

__all__ = ["FILES", "write_files", "write_summary", "write_json"]

#: The files, by key, in the order written (``summary.json`` last: :func:`write_summary`).
FILES = (("scores", "scores.safetensors"), ("scores_json", "scores.json"), ("mib", "importances_mib.json"),
         ("curve", "curve.json"), ("circuit", "circuit.json"), ("diagram", "diagram.json"), ("report", "report.html"),
         ("summary", "summary.json"))
#: The most edges the diagram draws (the top ones of a larger circuit; the page says so).
DRAWN = 400


def write_files(run: Any, task: Any, scores: Any, curve: Any, settings: dict, found: dict, batch_size: int,
                model: Any) -> None:
    """Every file of ``run.files`` but the summary: the tensors and JSON documents, then the figures and the page.
    ``found`` holds the circuit's choice (``full``, ``empty``, ``rank``, ``bisection``)."""
    import torch
    from safetensors.torch import save_file

    from ..circuits.mib_files import write_mib

    layout, files, circuit = scores.layout, run.files, list(run.edges)
    save_file({"effect": scores.effect.to(torch.float64).contiguous(), "exists": layout.exists.contiguous()},
              files["scores"], metadata={"method": run.method, "task": task.name, "model": run.model})
    write_json(files["scores_json"], {
        **settings, "clean": scores.clean, "senders": list(layout.senders), "receivers": list(layout.receivers),
        "top_edges": [[list(e), v] for e, v in run.top_edges],
        "tensors": "scores.safetensors: effect (sender, receiver) float64, NaN off the graph; "
                   "exists (sender, receiver) bool"})
    # the task's importances, in MIB's convention
    write_mib(files["mib"], model, scores=scores, higher_is_better=curve.higher_is_better, batch_size=batch_size)
    write_json(files["curve"], {**settings, **asdict(curve)})
    write_json(files["circuit"], {
        **settings, "size": run.size, "requested": run.requested, "reaches_logits": run.reaches_logits,
        "chosen": chosen(run), "share": run.share, "bisection": [list(b) for b in found["bisection"]],
        "fraction": run.fraction, "value": run.value, "faithfulness": run.faithfulness, "full": found["full"],
        "empty": found["empty"], "edges": [[s, r, scores.edge(s, r)] for s, r in circuit]})
    diagram = _diagram(run, scores, found["rank"])
    Path(files["diagram"]).write_text(diagram.to_json(), encoding="utf-8")
    _write_page(Path(files["report"]), run, task, diagram, _curve_figure(run, curve))


def _diagram(run: Any, scores: Any, rank: dict) -> Any:
    """The circuit diagram: its top :data:`DRAWN` edges by ``|score|`` (ties in the graph's order)."""
    from .circuit_figure import circuit_figure

    circuit = list(run.edges)
    drawn = min(len(circuit), DRAWN)
    by_size = sorted(circuit, key=lambda e: (-abs(scores.edge(*e)), rank[e])) if drawn < len(circuit) else circuit
    shown = by_size[:drawn]
    title = (f"{run.task} circuit on {run.model} ({run.method}): {len(circuit)} edges"
             + (f", the top {drawn} drawn" if drawn < len(circuit) else "") + f"; faithfulness {run.faithfulness:.3f}")
    return circuit_figure(shown, scores.layout, scores=scores, max_edges=DRAWN, title=title)


def _curve_figure(run: Any, curve: Any) -> Any:
    from .plots import faithfulness_figure

    return faithfulness_figure({run.method: curve}, title=f"Faithfulness of the top edges ({run.task}, {run.model})")


def write_summary(run: Any) -> None:
    """``summary.json``: the run's every field (written after the last step: its timing included)."""
    d = {f.name: getattr(run, f.name) for f in fields(run)}  # not asdict: it deep-copies, and a mappingproxy cannot be
    d["files"], d["seconds"] = dict(run.files), dict(run.seconds)
    write_json(Path(run.files["summary"]), d)


def write_json(path: str | Path, data: dict) -> None:
    """``data`` as indented JSON; NaN and the infinities (not JSON) as null (e.g. the curve's value where a
    circuit's metric was undefined: :func:`rs_interp._files.finite_json`)."""
    Path(path).write_text(json.dumps(finite_json(data), indent=1), encoding="utf-8")


_CSS = ("body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
        "td.num{text-align:right;font-variant-numeric:tabular-nums}.note{color:#555}code{background:#f4f4f4}")


def _rows(run: Any, task: Any) -> list[tuple[str, str]]:
    """The page's table of numbers: (what, value)."""
    empty = ("" if run.reaches_logits else
             "; none of them reaches the logits, so the circuit is empty (faithfulness 0): ask for a larger --size")
    return [("model", run.model), ("task", f"{run.task} ({run.n_prompts} prompt pairs, metric {task.kind})"),
            ("method", run.method), ("metric on the clean prompts", f"{run.clean:.6g}"),
            ("metric on the corrupted prompts", f"{run.corrupted:.6g}"), ("edges in the graph", f"{run.n_edges:,}"),
            ("circuit", f"{run.size:,} edges ({100 * run.fraction:.3g}%): {chosen(run)}" + empty),
            ("circuit's metric", f"{run.value:.6g}"),
            ("circuit's faithfulness", f"{run.faithfulness:.4f}"),
            ("curve's area: under it / between it and 1", f"{run.area_under:.4f} / {run.area_from_1:.4f}")]


def _write_page(path: Path, run: Any, task: Any, diagram: Any, curve_fig: Any) -> None:
    """One self-contained page: plotly's JavaScript once, the figures from inline JSON, no network request."""
    from plotly.offline import get_plotlyjs

    esc = html.escape
    table = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in _rows(run, task))
    edges = "".join(f"<tr><td><code>{esc(edge_string(e))}</code></td><td class='num'>{v:.6g}</td></tr>"
                    for e, v in run.top_edges)
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
