"""The reproduction of the theory: every table of ``rs-interp reproduce``, its expected values, its
report. The library (``rs_interp``) never imports this package; this package reads the library.

- :data:`SECTIONS`: the registry, the one list of sections (the CLI's ``--only`` choices, the report's
  order and the tests all read it). Adding a section is one builder in :mod:`.sections` plus one line here.
- :mod:`.expected`: the theory's values and the accepted bands (one line each).
- :mod:`.context`: rows, sections and the run context (the shipped models' recipes live in
  :mod:`rs_interp.models.registry`).
- :mod:`.gpt2_check`, :mod:`.gradients`: the GPT-2 analysis and conversion check, the gradient table.
- :mod:`.report`: the text table, ``results.json`` and ``report.html``.
- :mod:`.geometry`, :mod:`.finance`: the study code only the reproduction reads (the theory lab; the finance
  case study), answering as ``rs_interp.geometry`` and ``rs_interp.finance`` too.

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
from .._messages import few

if TYPE_CHECKING:
    from ..models.registry import TrainingCache
    from .context import Context, Section

# Context and Section load torch and plotly: imported on first use, so the command line's --help stays light.
__getattr__, __dir__ = attach(__name__, {"Context": ".context", "Section": ".context"}, globals())

__all__ = ["SECTIONS", "MEASURED_CPU_SECONDS", "builder", "run_sections", "run_seeds", "Context", "Section"]

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


#: Each entry's CPU seconds in a worker (one thread), as measured (2026-12-05, TransformerLens 4.3, a
#: shared 2-core machine; docs/project/benchmarks.md): only the order in which :func:`run_sections` hands
#: entries to its worker processes (the longest first, so the last to finish is a short one). An entry
#: missing here counts as 1 s.
MEASURED_CPU_SECONDS: dict[str, float] = {
    "induction": 0.2, "circuits": 1.2, "ablation": 2.4, "attribution_patching": 0.5, "faithfulness": 46.8,
    "ground_truth": 10.0, "paths": 3.3, "gpt2": 9.0, "geometry": 4.4, "finance": 16.3, "code": 29.3, "features": 2.9,
}


def run_sections(ctx: Context, only: Iterable[str] | None = None, *,
                 on_section: Callable[[list[Section]], None] | None = None, jobs: int = 1) -> list[Section]:
    """Compute the sections (all, or those named in ``only``) and return them in report order, logging
    "section k of N" as each starts (in one process) and "section k of N done" with its cost as each ends.

    Each section's :attr:`~rs_interp.reproduce.context.Section.cost` is the registry entry's
    ``{"cpu_seconds", "wall_seconds"}`` (``time.process_time`` of the process that ran it, every thread;
    ``time.perf_counter``). ``on_section(done)`` is called after each entry with every section finished
    so far, in report order (the command line writes ``results.json`` and ``report.html`` there, so a
    stopped run keeps what it did).

    ``jobs > 1``: the entries run in that many worker processes, one intra-op thread each (the sections'
    models are small: one process per core does more than two threads on one model, and on a shared
    machine far more), the longest first (:data:`MEASURED_CPU_SECONDS`). Each worker builds its own
    :class:`Context` from ``ctx``'s settings (``retrain``, ``seed``, ``cache``'s folder) and keeps its models
    for the entries it runs; ``jobs > 1`` with ``retrain`` is refused (two workers would train the same model).
    """
    wanted = set(only) if only else set(SECTIONS)
    unknown = wanted - set(SECTIONS)
    if unknown:
        raise ValueError(f"unknown sections {few(sorted(unknown))}; choose from {few(SECTIONS, 20, show=str)}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1, got {jobs!r}")
    if jobs > 1 and ctx.retrain:
        raise ValueError("jobs > 1 runs the shipped models; with retrain each worker would train the same models: "
                         "jobs=1")
    names = [name for name in SECTIONS if name in wanted]
    done: dict[str, list[Section]] = {}

    def finished(name: str, sections: list[Section], cost: dict[str, float]) -> None:
        done[name] = [dataclasses.replace(s, part=name, cost=cost) for s in sections]
        ctx.log(f"section {len(done)} of {len(names)} done: {name}, {cost['wall_seconds']:.1f} s wall, "
                f"{cost['cpu_seconds']:.1f} CPU s")
        if on_section is not None:
            on_section([s for n in names if n in done for s in done[n]])

    if jobs == 1 or len(names) == 1:
        for k, name in enumerate(names, 1):
            ctx.log(f"section {k} of {len(names)}: {name}")
            finished(name, *_timed(ctx, name))
    else:
        import multiprocessing
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

        settings = (ctx.seed, None if ctx.cache is None else str(ctx.cache.root))
        order = sorted(names, key=lambda n: -MEASURED_CPU_SECONDS.get(n, 1.0))
        ctx.log(f"{len(names)} sections in {jobs} worker processes, the longest first")
        # fork where there is one (the workers start with torch and TransformerLens imported, as PyTorch's
        # DataLoader workers do, one thread each); spawn elsewhere
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context(method),
                                 initializer=_worker_init, initargs=settings) as pool:
            pending = {pool.submit(_worker_run, name): name for name in order}
            while pending:
                ready, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in ready:
                    finished(pending.pop(future), *future.result())
    return [s for n in names for s in done[n]]


def _timed(ctx: Context, name: str) -> tuple[list[Section], dict[str, float]]:
    """Section ``name``'s tables and what building them cost."""
    cpu, wall = time.process_time(), time.perf_counter()
    result = builder(name)(ctx)
    cost = {"cpu_seconds": time.process_time() - cpu, "wall_seconds": time.perf_counter() - wall}
    return (result if isinstance(result, list) else [result]), cost


_WORKER: dict[str, Context] = {}


def _worker_init(seed: int, cache: str | None) -> None:
    """A worker process of :func:`run_sections`: one intra-op thread, its own context (models kept)."""
    import torch

    from .context import Context

    torch.set_num_threads(1)
    if cache is not None:
        from ..models.registry import TrainingCache

        cache = TrainingCache(cache)
    _WORKER["ctx"] = Context(seed=seed, progress=False, cache=cache)


def _worker_run(name: str) -> tuple[list[Section], dict[str, float]]:
    return _timed(_WORKER["ctx"], name)


def run_seeds(seed: int = 0, n: int = 1, only: Iterable[str] | None = None, *, retrain: bool = False,
              progress: bool = True, log: Callable[[str], None] = lambda _msg: None, cache: TrainingCache | None = None,
              on_section: Callable[[list[Section]], None] | None = None, jobs: int = 1) -> list[Section]:
    """Every table over the seeds ``seed, seed + 1, ..., seed + n - 1``.

    ``n = 1`` is the fast path on the shipped models (``retrain=True``: retrained from ``seed``). ``n > 1`` retrains
    every seeded piece for each seed (the toy models, the finance corpus and models, the collapse cloud, the
    gradient draws; through ``cache`` where given) and returns the first seed's tables with every row holding
    its per-seed values (:attr:`Row.per_seed`); a numeric row's value is then the mean over seeds.
    ``on_section(done)``: as in :func:`run_sections` with one seed; with several, after each seed with the
    seeds done so far merged (a section's cost is then summed over them). ``jobs``: as in
    :func:`run_sections`, with one seed and the shipped models (else one process).
    """
    from .context import Context

    if n < 1:
        raise ValueError(f"n (the number of seeds) must be >= 1, got {n}")
    if n == 1:
        return run_sections(Context(retrain=retrain, seed=seed, progress=progress, log=log, cache=cache), only,
                            on_section=on_section, jobs=1 if retrain else jobs)
    runs = []
    for i, s in enumerate(range(seed, seed + n)):
        log(f"seed {s} ({i + 1} of {n})")
        runs.append(run_sections(Context(retrain=True, seed=s, progress=progress,
                                         log=lambda m, s=s: log(f"[seed {s}] {m}"), cache=cache), only))
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
