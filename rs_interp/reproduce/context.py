"""What every section shares: the row and section records, the banded row, and the run context
(the models and the held-out batch, loaded or trained once per run)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import plotly.graph_objects as go
from .._backend import Model

from ..data import InductionBatch
from ..models import load_toy_model, toy_model_path
from ..training import train_induction_model
from .expected import EXPECTED, Expected
from .recipes import held_out_batch, toy_settings

__all__ = ["Row", "Section", "Context", "banded"]


@dataclass(frozen=True)
class Row:
    """One measured quantity: its value, the theory's value and the accepted band."""

    label: str
    value: float | int | str
    theory: str
    band: str
    ok: bool | None  # None: reported, no band
    per_seed: tuple[tuple[int, Any, bool | None, str], ...] = ()  # (seed, value, ok, label) with several seeds

    def formatted(self) -> str:
        v = self.value
        return f"{v:.4g}" if isinstance(v, float) else str(v)

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


def banded(key: str, label: str, value: float, *, lo: float | None = None, hi: float | None = None,
           theory: str | None = None) -> Row:
    """The row of quantity ``key`` of :data:`~rs_interp.reproduce.expected.EXPECTED`; ``lo``/``hi``
    replace a bound measured at run time (a baseline of the same run), ``theory`` a value that
    depends on the run (e.g. the estimate beside an exact value)."""
    exp = EXPECTED[key]
    if lo is not None or hi is not None:
        exp = Expected(exp.theory, lo if lo is not None else exp.lo, hi if hi is not None else exp.hi)
    return Row(label, float(value), theory or exp.theory, exp.band, exp.holds(float(value)))


def exact_row(label: str, value: Any, expected: Any, theory: str | None = None) -> Row:
    """A row that must equal ``expected`` exactly (a count, a label, a flag)."""
    return Row(label, value, theory or str(expected), f"= {expected}", value == expected)


@dataclass
class Context:
    """What the sections share: the trained models and the test batch (loaded or trained once)."""

    retrain: bool = False
    seed: int = 0
    progress: bool = True
    log: Callable[[str], None] = lambda _msg: None
    _models: dict[str, Model] = field(default_factory=dict)
    _code_tokenizer: Any = None

    def model(self, name: str) -> Model:
        if name not in self._models:
            if self.retrain:
                self.log(f"training {name} (seed {self.seed})")
                self._models[name] = train_induction_model(**toy_settings(name, seed=self.seed), progress=self.progress)
            else:
                self._models[name] = load_toy_model(name)
        return self._models[name]

    def code_model(self) -> tuple[Model, Any]:
        """``code-2l`` and its tokenizer: the shipped pair, or (``retrain``) trained from this run's seed."""
        if "code-2l" not in self._models:
            from ..code_model import load_code_tokenizer, train_code_model

            if self.retrain:
                self.log(f"training code-2l (seed {self.seed})")
                model, self._code_tokenizer, _ = train_code_model(seed=self.seed, progress=self.progress)
            else:
                model, self._code_tokenizer = load_toy_model("code-2l"), load_code_tokenizer(toy_model_path("code-2l"))
            self._models["code-2l"] = model
        return self._models["code-2l"], self._code_tokenizer

    @functools.cached_property
    def batch(self) -> InductionBatch:
        """The 1000 held-out test sequences."""
        return held_out_batch()
