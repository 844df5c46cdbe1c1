"""What every section shares: the row and section records, the banded row, and the run context
(the models and the held-out batch, loaded or trained once per run)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import plotly.graph_objects as go

from .._backend import Model
from .._format import short
from ..models.data import InductionBatch
from ..models.registry import SHIPPED_MODELS, TrainingCache, held_out_batch, train_shipped
from .expected import EXPECTED, Expected

__all__ = ["Row", "Section", "Context", "banded"]


@dataclass(frozen=True)
class Row:
    """One measured quantity: its value, the theory's value and the accepted band.

    ``theory`` holds only a value the theory gives (a number, a bound, an exact ratio; ``-`` where it gives
    none); what stands beside the value otherwise (an estimate, a cost relative to EAP, what a band means in
    words) is the ``note``.
    """

    label: str
    value: float | int | str
    theory: str
    band: str
    ok: bool | None  # None: reported, no band
    per_seed: tuple[tuple[int, Any, bool | None, str], ...] = ()  # (seed, value, ok, label) with several seeds
    note: str = ""

    def formatted(self) -> str:
        v = self.value
        return short(v) if isinstance(v, float) else str(v)

    @property
    def within(self) -> tuple[int, int, int] | None:
        """(k, judged, N): of the N seeds, ``judged`` had a band that applied and ``k`` were within it
        (None for a reported row or a single seed)."""
        judged = [ok for _, _, ok, _ in self.per_seed if ok is not None]
        return (sum(judged), len(judged), len(self.per_seed)) if judged else None


@dataclass(frozen=True)
class Section:
    """One table of the report: its rows, the JSON for ``results.json``, figures and notes."""

    key: str
    title: str
    rows: tuple[Row, ...]
    results: dict[str, Any]
    figures: tuple[go.Figure, ...] = ()
    notes: str = ""
    part: str = ""  # the registry entry that built it (rs_interp.reproduce.SECTIONS)
    #: the registry entry's cost, ``{"cpu_seconds", "wall_seconds"}`` (set by :func:`rs_interp.reproduce.run_sections`;
    #: an entry that builds several tables gives each the same, the entry's)
    cost: dict[str, float] = field(default_factory=dict)
    #: files to write beside ``report.html``: name -> JSON data (the feature graph in circuit-tracer's format)
    files: dict[str, Any] = field(default_factory=dict)


def banded(key: str, label: str, value: float, *, lo: float | None = None, hi: float | None = None,
           theory: str | None = None, note: str | None = None) -> Row:
    """The row of quantity ``key`` of :data:`~rs_interp.reproduce.expected.EXPECTED`; ``lo``/``hi``
    replace a bound measured at run time (a baseline of the same run), ``theory`` a theory value that
    depends on the run, ``note`` what stands beside the value (e.g. the estimate beside an exact value)."""
    exp = EXPECTED[key]
    if lo is not None or hi is not None:
        exp = Expected(exp.theory, lo if lo is not None else exp.lo, hi if hi is not None else exp.hi, exp.note)
    return Row(label, float(value), theory or exp.theory, exp.band, exp.holds(float(value)),
               note=exp.note if note is None else note)


def exact_row(label: str, value: Any, expected: Any, theory: str | None = None, note: str = "") -> Row:
    """A row that must equal ``expected`` exactly (a count, a label, a flag)."""
    return Row(label, value, theory or str(expected), f"= {expected}", value == expected, note=note)


@dataclass
class Context:
    """What the sections share: the trained models and the test batch (loaded or trained once).

    ``retrain``: train every shipped model from its recipe with ``seed`` instead of loading it;
    ``cache``: a :class:`~rs_interp.models.registry.TrainingCache` that keeps every model trained in the run
    (the shipped ones and the finance study's) so another run reads it back instead of training again.
    """

    retrain: bool = False
    seed: int = 0
    progress: bool = True
    log: Callable[[str], None] = lambda _msg: None
    cache: TrainingCache | None = None
    _trained: dict[str, tuple[Model, Any]] = field(default_factory=dict)

    def _shipped(self, name: str) -> tuple[Model, Any]:
        if name not in self._trained:
            if self.retrain:
                self.log(f"training {name} (seed {self.seed})")
                t = train_shipped(name, self.seed, progress=self.progress, cache=self.cache)
                self._trained[name] = (t.model, t.tokenizer)
            else:
                entry = SHIPPED_MODELS[name]
                self._trained[name] = (entry.load(), entry.tokenizer())
        return self._trained[name]

    def model(self, name: str) -> Model:
        """The shipped model ``name``, or (``retrain``) trained from its recipe with this run's seed."""
        return self._shipped(name)[0]

    def code_model(self) -> tuple[Model, Any]:
        """``code-2l`` and its tokenizer: the shipped pair, or (``retrain``) trained from this run's seed."""
        return self._shipped("code-2l")

    @functools.cached_property
    def batch(self) -> InductionBatch:
        """The 1000 held-out test sequences."""
        return held_out_batch()
