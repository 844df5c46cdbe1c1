"""The reproduction of the theory: every table of ``rs-interp reproduce``, its expected values, its
report. The library (``rs_interp``) never imports this package; this package reads the library.

- :data:`SECTIONS`: the registry, the one list of sections (the CLI's ``--only`` choices, the report's
  order and the tests all read it). Adding a section is one builder in :mod:`.sections` plus one line here.
- :mod:`.expected`: the theory's values and the accepted bands (one line each).
- :mod:`.context`: rows, sections and the run context (the shipped models' recipes live in
  :mod:`rs_interp.models.registry`).
- :mod:`.gpt2_check`, :mod:`.gradients`: the GPT-2 analysis and conversion check, the gradient table.
- :mod:`.report`: the text table, ``results.json`` and ``report.html``.

Each registry entry's cost is measured as it runs (:func:`run_sections`: CPU seconds of the process, all
threads, and wall seconds; the first entry to use a model pays for loading it) and kept in
:attr:`Section.cost`; ``results.json`` and the report give it per entry.

>>> list(SECTIONS)[:3]
['induction', 'circuits', 'ablation']
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import time
from typing import TYPE_CHECKING, Callable, Iterable

from .._lazy import attach

if TYPE_CHECKING:
    from ..models.registry import TrainingCache
    from .context import Context, Section

# Context and Section load torch and plotly: imported on first use, so the command line's --help stays light.
__getattr__, __dir__ = attach(__name__, {"Context": ".context", "Section": ".context"}, globals())

__all__ = ["SECTIONS", "builder", "run_sections", "run_seeds", "Context", "Section"]

#: name -> ``module:function`` of its builder under :mod:`rs_interp.reproduce.sections`, in report order.
#: A builder returns one :class:`Section` or a list of them (``circuits`` gives three tables).
SECTIONS: dict[str, str] = {
    "induction": "induction:induction_section",
    "circuits": "induction:circuits_section",
    "ablation": "ablation:ablation_section",
    "attribution_patching": "ablation:attribution_patching_section",
    "faithfulness": "faithfulness:faithfulness_section",
    "ground_truth": "ground_truth:ground_truth_section",
    "paths": "theorem3:paths_section",
    "gpt2": "gpt2:gpt2_section",
    "geometry": "geometry:geometry_section",
    "finance": "finance:finance_section",
    "code": "code:code_section",
    "features": "features:features_section",
}


def builder(name: str) -> Callable[[Context], Section | list[Section]]:
    """The builder of section ``name`` (imported on demand: the CLI's ``--help`` stays light)."""
    if name not in SECTIONS:
        raise ValueError(f"unknown section {name!r}; one of {list(SECTIONS)}")
    module, function = SECTIONS[name].split(":")
    return getattr(importlib.import_module(f"{__name__}.sections.{module}"), function)


def run_sections(ctx: Context, only: Iterable[str] | None = None, *,
                 on_section: Callable[[list[Section]], None] | None = None) -> list[Section]:
    """Compute the sections (all, or those named in ``only``), in report order, logging "section k of N"
    as each starts and its cost as it ends.

    Each section's :attr:`~rs_interp.reproduce.context.Section.cost` is the registry entry's
    ``{"cpu_seconds", "wall_seconds"}`` (``time.process_time``: every thread of the process; ``time.perf_counter``).
    ``on_section(done)`` is called after each entry with every section finished so far (the command
    line writes ``results.json`` and ``report.html`` there, so a stopped run keeps what it did).
    """
    wanted = set(only) if only else set(SECTIONS)
    unknown = wanted - set(SECTIONS)
    if unknown:
        raise ValueError(f"unknown sections {sorted(unknown)}; choose from {list(SECTIONS)}")
    names = [name for name in SECTIONS if name in wanted]
    out: list[Section] = []
    for k, name in enumerate(names, 1):
        ctx.log(f"section {k} of {len(names)}: {name}")
        cpu, wall = time.process_time(), time.perf_counter()
        result = builder(name)(ctx)
        cost = {"cpu_seconds": time.process_time() - cpu, "wall_seconds": time.perf_counter() - wall}
        ctx.log(f"section {k} of {len(names)}: {name} done, {cost['wall_seconds']:.1f} s wall, {cost['cpu_seconds']:.1f} CPU s")
        out.extend(dataclasses.replace(s, part=name, cost=cost) for s in (result if isinstance(result, list) else [result]))
        if on_section is not None:
            on_section(list(out))
    return out


def run_seeds(seed: int = 0, n: int = 1, only: Iterable[str] | None = None, *, retrain: bool = False, progress: bool = True,
              log: Callable[[str], None] = lambda _msg: None, cache: TrainingCache | None = None,
              on_section: Callable[[list[Section]], None] | None = None) -> list[Section]:
    """Every table over the seeds ``seed, seed + 1, ..., seed + n - 1``.

    ``n = 1`` is the fast path on the shipped models (``retrain=True``: retrained from ``seed``). ``n > 1`` retrains every seeded piece for each
    seed (the toy models, the finance corpus and models, the collapse cloud, the gradient draws; through ``cache``
    where given) and returns the first seed's tables with every row holding
    its per-seed values (:attr:`Row.per_seed`); a numeric row's value is then the mean over seeds.
    ``on_section(done)``: as in :func:`run_sections` with one seed; with several, after each seed with the
    seeds done so far merged (a section's cost is then summed over them).
    """
    from .context import Context

    if n < 1:
        raise ValueError(f"n (the number of seeds) must be >= 1, got {n}")
    if n == 1:
        return run_sections(Context(retrain=retrain, seed=seed, progress=progress, log=log, cache=cache), only, on_section=on_section)
    runs = []
    for i, s in enumerate(range(seed, seed + n)):
        log(f"seed {s} ({i + 1} of {n})")
        runs.append(run_sections(Context(retrain=True, seed=s, progress=progress, log=lambda m, s=s: log(f"[seed {s}] {m}"), cache=cache),
                                 only))
        if on_section is not None and i + 1 < n:
            on_section([_merge(sections, seed) for sections in zip(*runs)])
    return [_merge(sections, seed) for sections in zip(*runs)]


def _mean(values: list[float]) -> float:
    """The mean, kept within [min, max]: summing rounds, and three equal values must average to themselves."""
    return min(max(math.fsum(values) / len(values), min(values)), max(values))


def _merge(per_seed: tuple[Section, ...], seed: int) -> Section:
    """One section from the same section of every seed: rows matched by position (the builders emit
    the same rows in the same order for any seed)."""
    first = per_seed[0]
    if any(len(s.rows) != len(first.rows) for s in per_seed):
        raise RuntimeError(f"section {first.key!r} has a different number of rows across seeds")
    rows = []
    for j, row in enumerate(first.rows):
        values = tuple((seed + i, s.rows[j].value, s.rows[j].ok, s.rows[j].label) for i, s in enumerate(per_seed))
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for _, v, _, _ in values)
        mean = _mean([float(v) for _, v, _, _ in values]) if numeric else row.value
        judged = [ok for _, _, ok, _ in values if ok is not None]
        rows.append(dataclasses.replace(row, value=mean, per_seed=values, ok=all(judged) if judged else None))
    cost = {k: math.fsum(s.cost.get(k, 0.0) for s in per_seed) for k in first.cost}
    return dataclasses.replace(first, rows=tuple(rows), cost=cost)
