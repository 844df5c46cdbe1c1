"""The writers of ``rs-interp reproduce``: the text tables, ``results.json`` and a self-contained ``report.html``.

``report.html`` opens with what it reproduces (:data:`THEORY`, with a link to the documentation's map of the
theory's parts to the sections, where the documentation is at hand) and how to read a row and its band; each table
shows its banded rows, the rows reported without a band folded below them.
"""

from __future__ import annotations

import html
import json
import math
import textwrap
from pathlib import Path
from typing import Any

from plotly.offline import get_plotlyjs

from .._files import finite_json
from . import _mean
from .context import Row, Section
from .expected import UNBANDED

__all__ = ["format_table", "format_cost", "section_costs", "write_results", "write_report", "write_files", "THEORY",
           "docs_map_link"]

#: The theory the main job reproduces, and its GPT-2 module.
THEORY = "The Transformer Block and the Residual Stream"
THEORY_GPT2 = "The Full Block & the Residual Stream"
#: The documentation page that maps the theory's parts to the sections, and its anchor.
DOCS_MAP = ("capabilities/reproduction", "what-is-reproduced-and-where")


#: The widest each column of the text table gets (measure, ours, theory, band, within band): longer
#: cells wrap onto more lines, so a table fits 100 characters (a terminal, a log, the report's <pre>).
COLUMN_WIDTHS = (44, 10, 16, 14, 8)
#: The width of the notes under a table (and of the widest table).
WIDTH = 100


def format_table(section: Section) -> str:
    """A plain-text table: measure, ours, theory, band, within band (``k of N`` over several seeds), each
    column at most :data:`COLUMN_WIDTHS` wide (a longer cell wraps onto the next lines).

    >>> from rs_interp.reproduce.context import Row, Section
    >>> label = "a measure whose description runs on well past the width of its column"
    >>> row = Row(label, -0.0, "0", "= 0 ± 1e-09", True)
    >>> print(format_table(Section("k", "A table", (row,), {})))
    == A table
    measure                                   ours  theory  band
    ----------------------------------------  ----  ------  -----------  --
    a measure whose description runs on well  0     0       = 0 ± 1e-09  ok
    past the width of its column
    """
    head = ("measure", "ours", "theory", "band", "")
    rows = [head] + [(r.label + (f" [{r.note}]" if r.note else ""), r.formatted(), r.theory, _band_cell(r, "-"),
                      _mark(r)) for r in section.rows]
    cells = [[textwrap.wrap(c, cap, break_on_hyphens=False) or [""] for c, cap in zip(r, COLUMN_WIDTHS)] for r in rows]
    widths = [max(len(line) for r in cells for line in r[i]) for i in range(len(head))]
    lines = [f"== {section.title}"]
    for i, r in enumerate(cells):
        for j in range(max(len(c) for c in r)):
            lines.append("  ".join((c[j] if j < len(c) else "").ljust(w) for c, w in zip(r, widths)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    for note in section.notes.splitlines():  # a long line of the notes wraps too; shorter ones keep their layout
        lines.extend(textwrap.wrap(note, WIDTH, break_on_hyphens=False,
                                   subsequent_indent=" " * (len(note) - len(note.lstrip())))
                     if len(note) > WIDTH else [note])
    return "\n".join(lines)


def _within_text(row: Row) -> str:
    k, judged, n = row.within
    return f"{k} of {n}" if judged == n else f"{k} of {judged} judged ({n - judged} of {n}: the band does not apply)"


def _band_cell(row: Row, none: str) -> str:
    """The band column: the band as :class:`~rs_interp.reproduce.expected.Expected` printed it, or
    ``none`` for a row reported without one (the last column then says "reported", once)."""
    return none if row.band == UNBANDED else row.band


def _mark(row: Row) -> str:
    if row.per_seed:
        return "reported" if row.within is None else _within_text(row) + ("" if row.ok else " OUTSIDE")
    return {True: "ok", False: "OUTSIDE", None: "reported"}[row.ok]


def _band_json(row: Row) -> dict[str, Any]:
    out = {"measure": row.label, "value": row.value, "theory": row.theory, "band": row.band, "ok": row.ok}
    if row.note:
        out["note"] = row.note
    if row.per_seed:
        out["per_seed"] = [{"seed": s, "value": v, "ok": ok} | ({"measure": label} if label != row.label else {})
                           for s, v, ok, label in row.per_seed]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for _, v, _, _ in row.per_seed):
            vals = [float(v) for _, v, _, _ in row.per_seed]
            out |= {"mean": _mean(vals), "min": min(vals), "max": max(vals)}
        if row.within is not None:
            out["within_band"] = _within_text(row)
    return out


def environment() -> dict[str, str]:
    """What the numbers were computed with: TransformerLens (3.x HookedTransformer or 4.x bridge), torch, Python."""
    import platform

    import torch

    from .._backend import TL_VERSION, Model

    return {"transformer_lens": TL_VERSION, "model_class": Model.__name__,
            "torch": torch.__version__, "python": platform.python_version()}


def describe_environment() -> str:
    """One line for the top of the text output and the report."""
    env = environment()
    return (f"TransformerLens {env['transformer_lens']} ({env['model_class']}), torch {env['torch']}, Python "
            f"{env['python']}")


def section_costs(sections: list[Section], elapsed: float | None = None) -> dict[str, dict[str, float]]:
    """Per registry entry, in report order, its ``{"cpu_seconds", "wall_seconds"}`` (an entry that
    builds several tables counted once), and ``"total"`` their sums, with ``elapsed_seconds`` (the
    whole run's wall time, where given: below the sum when the sections ran in parallel).

    >>> from rs_interp.reproduce.context import Section
    >>> a = Section("a", "A", (), {}, part="x", cost={"cpu_seconds": 1.0, "wall_seconds": 2.0})
    >>> b = Section("b", "B", (), {}, part="x", cost={"cpu_seconds": 1.0, "wall_seconds": 2.0})
    >>> section_costs([a, b])["total"]
    {'cpu_seconds': 1.0, 'wall_seconds': 2.0}
    """
    out: dict[str, dict[str, float]] = {}
    for s in sections:
        if s.cost and s.part not in out:
            out[s.part] = dict(s.cost)
    if out:
        out["total"] = {k: math.fsum(c[k] for c in out.values()) for k in ("cpu_seconds", "wall_seconds")}
        if elapsed is not None:
            out["total"]["elapsed_seconds"] = elapsed
    return out


def format_cost(sections: list[Section], elapsed: float | None = None) -> str:
    """The cost table: per registry entry, its CPU seconds and wall seconds, then the total (and the
    run's elapsed wall seconds, where given).

    >>> from rs_interp.reproduce.context import Section
    >>> print(format_cost([Section("a", "A", (), {}, part="x", cost={"cpu_seconds": 1.25, "wall_seconds": 2.5})]))
    == Cost per section (CPU seconds: every thread of the process; wall seconds)
    section  CPU s  wall s
    -------  -----  ------
    x        1.2    2.5
    total    1.2    2.5
    """
    costs = section_costs(sections, elapsed)
    rows = [("section", "CPU s", "wall s")] + [(k, f"{c['cpu_seconds']:.1f}", f"{c['wall_seconds']:.1f}")
                                               for k, c in costs.items()]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["== Cost per section (CPU seconds: every thread of the process; wall seconds)"]
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    if elapsed is not None:
        lines.append(f"the run: {elapsed:.1f} s wall, start to end (sections run in parallel overlap)")
    return "\n".join(lines)


def write_results(sections: list[Section], path: Path, *, elapsed: float | None = None) -> dict[str, Any]:
    """Write ``results.json``: one key per section, every row with its band check (``"bands"``),
    which registry entry built which sections (``"parts"``) and what each entry cost (``"cost"``,
    :func:`section_costs`)."""
    data: dict[str, Any] = {s.key: s.results for s in sections}
    data["parts"] = {}
    for s in sections:
        data["parts"].setdefault(s.part, []).append(s.key)
    data["cost"] = section_costs(sections, elapsed)
    data["bands"] = {s.key: [_band_json(r) for r in s.rows] for s in sections}
    data["environment"] = environment()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(finite_json(data), indent=2))
    return data


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1em}td,th{border-bottom:1px solid #ddd;padding:4px 10px;text-align:left}
th{background:#f4f4f4}.ok{color:#0a7a2f;font-weight:600}.out{color:#b00020;font-weight:700}
section{margin-bottom:2.5em}.fig{min-height:420px}.note{color:#555;font-size:0.9em}
#about{background:#f7f7fb;border:1px solid #e2e2ee;border-radius:6px;padding:0.5em 1.2em}
details{margin:0 0 1em}summary{cursor:pointer;color:#444}td.beside{color:#555}
.seed{display:inline-block;width:0.8em;height:0.8em;margin-right:2px;border-radius:2px}
"""


def _strip(row: Row) -> str:
    """The per-seed strip: one square per seed, green within band, red outside, grey reported."""
    colour = {True: "#0a7a2f", False: "#b00020", None: "#999"}
    cells = "".join(f'<span class="seed" style="background:{colour[ok]}" title="seed {s}: '
                    f'{html.escape(f"{v:.4g}" if isinstance(v, float) else str(v))} ({html.escape(label)})"></span>'
                    for s, v, ok, label in row.per_seed)
    return cells + (f" {html.escape(_within_text(row))} within band" if row.within else " reported")


_HEAD = "<tr><th>measure</th><th>ours</th><th>theory</th><th>band</th><th></th><th>beside it</th></tr>"


def _banded(row: Row) -> bool:
    """Whether a row is judged against a band (over several seeds: for at least one seed)."""
    return row.within is not None if row.per_seed else row.ok is not None


def _rows_html(rows: list[Row]) -> str:
    mark = {True: '<span class="ok">&#10003; within band</span>',
            False: '<span class="out">&#10007; outside band</span>', None: "reported"}
    return "".join(
        f"<tr><td>{html.escape(r.label)}</td><td>{html.escape(r.formatted())}</td><td>{html.escape(r.theory)}</td>"
        f"<td>{html.escape(_band_cell(r, '—'))}</td><td>{_strip(r) if r.per_seed else mark[r.ok]}</td>"
        f"<td class='beside'>{html.escape(r.note)}</td></tr>" for r in rows)


def _section_html(section: Section, fig_ids: list[str]) -> str:
    """A section: its banded rows, then the rows reported without a band folded (``<details>``), notes, figures."""
    banded = [r for r in section.rows if _banded(r)]
    reported = [r for r in section.rows if not _banded(r)]
    table = f"<table>{_HEAD}{_rows_html(banded)}</table>" if banded else ""
    if reported:
        table += (f"<details{'' if banded else ' open'}><summary>{len(reported)} row{'s' if len(reported) > 1 else ''} "
                  f"reported without a band</summary><table>{_HEAD}{_rows_html(reported)}</table></details>")
    figs = "".join(f'<div class="fig" id="{fid}"></div>' for fid in fig_ids)
    note = f'<p class="note">{html.escape(section.notes)}</p>' if section.notes else ""
    if section.files:
        links = ", ".join(f'<a href="{html.escape(name)}">{html.escape(name)}</a>' for name in section.files)
        note += f'<p class="note">Written beside this page: {links}.</p>'
    return f'<section id="{section.key}"><h2>{html.escape(section.title)}</h2>{table}{note}{figs}</section>'


def docs_map_link() -> str | None:
    """Where the documentation's map of the theory's parts to the sections is, as a link: the built site's page
    (``build/site/``, as ``scripts/build_docs.sh`` builds it) or else its Markdown source, in the clone rs_interp
    runs from; None for an install without the documentation (a wheel)."""
    root = Path(__file__).resolve().parents[2]
    page, anchor = DOCS_MAP
    built, source = root / "build" / "site" / f"{page}.html", root / "docs" / f"{page}.md"
    for candidate, suffix in ((built, f"#{anchor}"), (source, "")):
        if candidate.is_file():
            return candidate.as_uri() + suffix
    return None


def _about(docs_link: str | None) -> str:
    """The page's opening: what is reproduced, from which theory, and how to read a row and its band."""
    where = (f'<a href="{html.escape(docs_link)}">the map of its parts to these sections</a>' if docs_link
             else "the map of its parts to these sections (the documentation's page \"The theory, reproduced\")")
    return ('<section id="about"><p>This page reproduces, offline, the tables of <strong><em>'
            f"{html.escape(THEORY)}</em></strong> (the block and residual stream theory) and of its GPT-2 module "
            f"<em>{html.escape(THEORY_GPT2)}</em>: attention's contraction and the skip (Theorem 1, Proposition 2), "
            "LayerNorm's geometry (Proposition 3, Corollary 1), the identity path (Theorem 2), the path expansion "
            "(Theorem 3, Propositions 4 and 5), the induction-head experiments, the finance case study and GPT-2's "
            "parameter counts; beyond the theory, circuit discovery and its ground truth, and a GPT-2-shaped model "
            f"trained here. See {where}.</p><p><strong>How to read a row.</strong> <em>ours</em> is what rs_interp "
            "measured (on the shipped models, or those retrained with --retrain or --seeds); <em>theory</em> is the "
            "theory's own value where it gives one (from its NumPy reference implementation, with its own "
            "initialisation), - where it gives none; <em>band</em> is the range the row is held to (ours is judged, "
            "not the theory's digits): &#10003; within band, &#10007; outside. <em>Beside it</em> says what else "
            "stands beside the value (an estimate, a cost relative to EAP, what a band means in words). Rows without a "
            "band are reported, not judged: each table folds them below its banded rows.</p></section>")


def write_report(sections: list[Section], path: Path, *, title: str = f"{THEORY}: reproduced by rs_interp",
                 elapsed: float | None = None, docs_link: str | None = None) -> Path:
    """One self-contained HTML page: plotly's JavaScript embedded once, no network request.

    Figures are drawn from inline JSON with ``Plotly.newPlot``; the page references nothing
    outside itself (no CDN, no fonts, no MathJax). It opens with what is reproduced, from which theory,
    and how to read a band; ``docs_link`` is where the documentation's map of the theory's parts to the
    sections is (default: :func:`docs_map_link`).
    """
    body, scripts = [], []
    for section in sections:
        ids = []
        for i, fig in enumerate(section.figures):
            fid = f"fig-{section.key}-{i}"
            ids.append(fid)
            spec = fig.to_plotly_json()
            payload = json.dumps({"data": spec.get("data", []), "layout": spec.get("layout", {})},
                                 default=_json_default)
            scripts.append(f"Plotly.newPlot({json.dumps(fid)}, ...(function(s){{return [s.data, s.layout, "
                           f"{{responsive:true, displaylogo:false}}]}})({payload}));")
        body.append(_section_html(section, ids))
    costs = section_costs(sections, elapsed)
    if costs:
        cells = "".join(f"<tr><td>{html.escape(k)}</td><td>{c['cpu_seconds']:.1f}</td>"
                        f"<td>{c['wall_seconds']:.1f}</td></tr>" for k, c in costs.items())
        body.append('<section id="cost"><h2>Cost per section</h2><table><tr><th>section</th><th>CPU seconds</th>'
                    f'<th>wall seconds</th></tr>{cells}</table><p class="note">CPU seconds of the process (every '
                    'thread) '
                    "and wall seconds of each registry entry; the first entry to use a model pays for loading it"
                    + (f"; the whole run {elapsed:.1f} s wall" if elapsed is not None else "") + ".</p></section>")
    n_ok = sum(r.ok is True for s in sections for r in s.rows)
    n_out = sum(r.ok is False for s in sections for r in s.rows)
    seeds = max((len(r.per_seed) for s in sections for r in s.rows), default=0)
    over = (f" over {seeds} seeds (a row counts as within band when every seed is; the strip shows each seed)" if seeds
            else " with the shipped models (one seed; `rs-interp reproduce --seeds N` retrains over N seeds)")
    summary = (_about(docs_link or docs_map_link())
               + f"<p>{n_ok} rows within band, {n_out} outside{over}; theory values from the NumPy reference "
                 f"implementation.</p><p>Computed with {html.escape(describe_environment())}.</p>")
    page = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style><script>{get_plotlyjs()}</script></head><body><h1>{html.escape(title)}</h1>{summary}"
            + "".join(body) + "<script>" + "\n".join(scripts) + "</script></body></html>")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


def write_files(sections: list[Section], folder: Path) -> list[Path]:
    """Write every section's files (:attr:`Section.files`: name -> JSON data) into ``folder``, beside ``report.html``;
    their paths."""
    paths = []
    for section in sections:
        for name, content in section.files.items():
            path = folder / name
            path.write_text(json.dumps(finite_json(content), indent=1, ensure_ascii=False), encoding="utf-8")
            paths.append(path)
    return paths


def _json_default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
