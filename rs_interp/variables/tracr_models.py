"""The shipped tracr programs as high-level causal models, and where tracr put each variable.

tracr compiles every RASP variable into residual dimensions of its own, labelled ``"name:value"`` (one
per value of a categorical variable) or ``"name"`` (a numerical one): the shipped checkpoints keep the
labels in order (``rs_interp.circuits.tracr.metadata(name).residual_labels``: label ``i`` is residual
dimension ``i``), with the residual labels each component writes and reads. So the answer to "where is
the variable" is known in advance, and an interchange on those dimensions, at the stream right after the
component that writes them, must give the counterfactual of the program with that variable taken from
another input: the ground truth of :mod:`rs_interp.variables`.

Each program (:func:`tracr_causal_model`) is written here in plain Python from tracr's library, variable by
variable, under tracr's labels (``length_5``, ``opp_idx_4``, ...). Its per-position values are indexed from 0 over
the input (model position ``p + 1``: position 0 is the BOS). A categorical ``Aggregate`` that selects nothing, or
several different values, has no defined output (``None``): pair sets (:mod:`rs_interp.variables.tracr_pair_sets`)
leave out the rows where the counterfactual is undefined. The selector-width helpers'
``*_selector_width_attn_output`` dimensions are tracr's implementation of ``SelectorWidth`` (an attention output
its MLP reads), not RASP variables, and ``one`` is the constant direction.

:func:`tracr_variables` gives, per variable, where it is written (the :class:`~rs_interp.variables.Site`
after its writer, and the one before it), its dimensions, which of them take a value on some input and
are read by some later component (:attr:`TracrVariable.dims`), and the rank an interchange can identify:
a categorical variable's one-hot values all have the same coordinate along the mean of their dimensions,
so no interchange moves it; its identifiable subspace is the differences of its values
(:attr:`TracrVariable.rank` = dims - 1), unless one of its values is written on dimensions no one reads.

>>> cm = tracr_causal_model("tracr-reverse")
>>> cm.run((1, 2, 3))["reverse_1"], cm.counterfactual((1, 2, 3), (3, 1, 2), "opp_idx-1_3", at=(0, 2))
((3, 2, 1), (1, 2, 1))
>>> v = tracr_variables("tracr-reverse")["opp_idx_4"]
>>> v.writer, v.site.hook, v.before.hook, v.rank
('MLP1', 'blocks.1.hook_resid_post', 'blocks.1.hook_resid_mid', 4)
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

import torch
from jaxtyping import Float

from .._backend import Model
from .._messages import few
from ..circuits.tracr import PROGRAMS, metadata, program_name
from ..exact.validate import as_int
from ..labels import parse
from ._runs import check_pairs, chunks, inputs, record
from .bases import neuron_basis, orthonormal_basis
from .causal import CausalModel, Variable
from .kernel import ProjectionKernel, projection_kernel
from .pairs import PairSet
from .sites import Site

__all__ = ["tracr_causal_model", "TracrVariable", "tracr_variables", "tracr_inputs"]

Value = Any
Seq = tuple


# --- RASP's primitives, on whole sequences ------------------------------------------------------------

def _select(keys: Seq, queries: Seq, predicate: Callable[[Any, Any], bool]) -> list[list[int]]:
    """tracr's ``Select(keys, queries, predicate)``: for each query, the keys ``k`` with
    ``predicate(keys[k], query)``."""
    return [[k for k, key in enumerate(keys) if predicate(key, q)] for q in queries]


def _width(keys: Seq, queries: Seq, predicate: Callable[[Any, Any], bool]) -> Seq:
    """``SelectorWidth``: how many keys each query selects."""
    return tuple(len(s) for s in _select(keys, queries, predicate))


def _aggregate(keys: Seq, queries: Seq, predicate: Callable[[Any, Any], bool], values: Seq) -> Seq:
    """A categorical ``Aggregate``: the value selected (None where nothing is selected or the values differ)."""
    out = []
    for selected in _select(keys, queries, predicate):
        found = {values[k] for k in selected}
        out.append(found.pop() if len(found) == 1 else None)
    return tuple(out)


def _mean(keys: Seq, queries: Seq, predicate: Callable[[Any, Any], bool], values: Seq) -> Seq:
    """A numerical ``Aggregate``: the mean of the values selected (0 where nothing is, tracr's default)."""
    return tuple(sum(values[k] for k in s) / len(s) if s else 0 for s in _select(keys, queries, predicate))


def _map(f: Callable[[Any], Any]) -> Callable[[Seq], Seq]:
    return lambda xs: tuple(None if x is None else f(x) for x in xs)


def _zip(f: Callable[[Any, Any], Any]) -> Callable[[Seq, Seq], Seq]:
    return lambda xs, ys: tuple(None if x is None or y is None else f(x, y) for x, y in zip(xs, ys))


def _true(key: Any, query: Any) -> bool:
    return True


def _eq(key: Any, query: Any) -> bool:
    return key == query


def _lt(key: Any, query: Any) -> bool:
    return key < query


def _leq(key: Any, query: Any) -> bool:
    return key <= query


def _inputs() -> tuple[Variable, Variable]:
    return (Variable("tokens", ("input",), tuple, True, "the input tokens"),
            Variable("indices", ("input",), lambda x: tuple(range(len(x))), True, "the positions, from 0"))


def _frac(bools: str, name: str) -> Variable:
    return Variable(name, ("indices", bools), lambda i, b: _mean(i, i, _leq, b), True,
                    f"numerical Aggregate(Select(indices, indices, LEQ), {bools}): the mean up to each position")


def _programs(max_seq_len: int) -> dict[str, tuple[Variable, ...]]:
    """Each shipped program's variables, as tracr's library builds it (scripts/compile_tracr.py)."""
    is_x = _map(lambda t: 1 if t == "x" else 0)
    return {
        "reverse": (*_inputs(),
                    Variable("length_5", ("tokens",), lambda t: _width(t, t, _true), True,
                             "SelectorWidth(Select(tokens, tokens, TRUE)): the length"),
                    Variable("opp_idx_4", ("length_5", "indices"), _zip(lambda n, i: n - i), True, "length - indices"),
                    Variable("opp_idx-1_3", ("opp_idx_4",), _map(lambda x: x - 1), True, "opp_idx - 1"),
                    Variable("reverse_1", ("indices", "opp_idx-1_3", "tokens"),
                             lambda i, o, t: _aggregate(i, o, _eq, t), True,
                             "Aggregate(Select(indices, opp_idx-1, EQ), tokens)")),
        "sort": (*_inputs(),
                 Variable("sequence_map_5", ("tokens", "indices"), _zip(lambda x, i: x + 1 * i / max_seq_len), True,
                          "tokens + indices / max_seq_len: keys made unique"),
                 Variable("target_pos_3", ("sequence_map_5",), lambda k: _width(k, k, _lt), True,
                          "SelectorWidth(Select(keys, keys, LT)): how many keys are smaller"),
                 Variable("sort_1", ("target_pos_3", "indices", "tokens"), lambda p, i, t: _aggregate(p, i, _eq, t),
                          True, "Aggregate(Select(target_pos, indices, EQ), tokens)")),
        "hist": (*_inputs(),
                 Variable("hist_1", ("tokens",), lambda t: _width(t, t, _eq), True,
                          "SelectorWidth(Select(tokens, tokens, EQ)): each token's count")),
        "frac_prevs": (*_inputs(),
                       Variable("map_3", ("tokens",), is_x, True, "numerical tokens == 'x'"),
                       _frac("map_3", "frac_prevs_1")),
        "at_least_half": (*_inputs(),
                          Variable("map_4", ("tokens",), is_x, True, "numerical tokens == 'x'"),
                          _frac("map_4", "frac_prevs_2"),
                          Variable("at_least_half_1", ("frac_prevs_2",), _map(lambda f: 1.0 if f >= 0.5 else 0.0), True,
                                   "numerical Map(f >= 1/2)")),
    }


def tracr_causal_model(name: str) -> CausalModel:
    """The shipped compiled program ``name`` (``"tracr-reverse"`` or ``"reverse"``) as a :class:`CausalModel`:
    its RASP variables under tracr's labels, the last one the output.

    >>> tracr_causal_model("hist").names
    ('tokens', 'indices', 'hist_1')
    """
    return _causal_model(program_name(name))


@functools.lru_cache(maxsize=None)
def _causal_model(program: str) -> CausalModel:
    variables = _programs(PROGRAMS[program].max_seq_len)[program]
    return CausalModel(f"tracr-{program}", variables, output=variables[-1].name)


def tracr_inputs(name: str, lengths: Sequence[int] | None = None) -> list[tuple[Value, ...]]:
    """Every input of the program's vocabulary of the given lengths (default 1 to ``max_seq_len``).

    >>> len(tracr_inputs("hist", [2]))
    9
    """
    spec = PROGRAMS[program_name(name)]
    lengths = range(1, spec.max_seq_len + 1) if lengths is None else lengths
    out = []
    for n in lengths:
        if not 1 <= as_int("length", n) <= spec.max_seq_len:
            raise ValueError(f"lengths must lie in [1, {spec.max_seq_len}], got {n}")
        out += list(itertools.product(spec.vocab, repeat=n))
    return out


# --- where tracr put each variable ---------------------------------------------------------------------

@dataclass(frozen=True)
class TracrVariable:
    """One RASP variable of a compiled program and where tracr put it.

    Attributes:
        name: tracr's label (``"opp_idx_4"``).
        kind: ``"categorical"`` (one dimension per value) or ``"numerical"`` (one dimension).
        writer: the component that writes it (``"embed"``, ``"L{l}H{h}"``, ``"MLP{l}"``).
        site: the residual stream right after the writer (``hook_resid_pre`` of block 0 for the embedding,
            ``hook_resid_mid`` after an attention, ``hook_resid_post`` after an MLP).
        before: the stream right before the writer (None for the embedding's variables).
        dims: the residual dimensions of its values that some input gives it and some later component reads.
        labels: those dimensions' labels.
        unread: labels of its dimensions no later component reads.
        unused: labels of its dimensions no input gives it (the value is never taken).
        rank: the dimension of what an interchange can move (module docstring).
        seen: the residual dimensions some component after :attr:`site` reads (every variable's): what
            any later computation can see of the stream there.
        description: what it computes.
    """

    name: str
    kind: Literal["categorical", "numerical"]
    writer: str
    site: Site
    before: Site | None
    dims: tuple[int, ...]
    labels: tuple[str, ...]
    unread: tuple[str, ...]
    unused: tuple[str, ...]
    rank: int
    seen: tuple[int, ...] = ()
    description: str = ""

    def basis(self, d_model: int, dtype: torch.dtype = torch.float32) -> Float[torch.Tensor, "d_model dims"]:
        """The coordinate basis of :attr:`dims`.

        Raises:
            ValueError: no later component reads the variable (:attr:`dims` is empty).
        """
        if not self.dims:
            raise ValueError(f"no later component reads {self.name}: it has no dimension an interchange can move")
        return neuron_basis(d_model, list(self.dims), dtype=dtype)

    def identifiable(self, d_model: int, dtype: torch.dtype = torch.float64) -> Float[torch.Tensor, "d_model rank"]:
        """An orthonormal basis of the identifiable subspace (:attr:`rank` directions in :attr:`dims`' span):
        for a categorical variable whose every value is read, the span orthogonal to the mean of its dimensions."""
        basis = self.basis(d_model, dtype)
        if self.rank == len(self.dims):
            return basis
        centred = torch.eye(len(self.dims), dtype=dtype) - 1.0 / len(self.dims)
        return torch.linalg.svd(basis @ centred, full_matrices=False)[0][:, : self.rank]

    def identified(self, model: Model, pairs: PairSet, *, rtol: float = 1e-6) -> Float[torch.Tensor, "d_model k"]:
        """The part of :meth:`identifiable` that ``pairs`` can identify: an orthonormal basis (float64) of the
        span of the moves ``h_source - h_base`` at :attr:`site`, projected on it, over every pair's intervened
        positions (singular values below ``rtol`` of the largest dropped). An interchange acts on those moves
        alone, so no loss on these pairs sees a direction of the variable they never move: sort's
        ``sequence_map_5`` interchanged at every position of two inputs as long never moves which position a
        value belongs to (15 of its 19 directions; one position at a time, all 19). DAS on ``pairs`` can be
        asked for this many directions, not more.

        Raises:
            ValueError: no later component reads the variable, or ``pairs`` the model cannot run.

        >>> import rs_interp as ri
        >>> from rs_interp.variables import tracr_pairs
        >>> v = tracr_variables("tracr-sort")["sequence_map_5"]
        >>> pairs = tracr_pairs("tracr-sort", v.name, n=60, seed=0, lengths=[5], every_position=True)
        >>> v.rank, v.identified(ri.load_toy_model("tracr-sort"), pairs).shape[1]
        (19, 15)
        """
        ident = self.identifiable(model.cfg.d_model)
        check_pairs(model, pairs)
        moves = []
        with torch.no_grad():
            for rows in chunks(pairs, 64):
                base = record(model, self.site, *inputs(pairs, rows, "base"))
                source = record(model, self.site, *inputs(pairs, rows, "source"))
                moves.append((source - base).reshape(-1, base.shape[-1]).to(torch.float64) @ ident)
        left, values, _ = torch.linalg.svd(torch.cat(moves).T, full_matrices=False)
        return ident @ left[:, values > rtol * values[0]]

    def kernel(self, basis: Float[torch.Tensor, "d_model r"], of: torch.Tensor | None = None) -> ProjectionKernel:
        """The projection kernel of :meth:`identifiable` (or ``of``: :meth:`identified`) with what later
        components see of ``basis``'s span
        (its part on :attr:`seen`, re-orthonormalised, in float64): a direction of an unread dimension moves
        nothing a later component reads, so only the part on :attr:`seen` is compared (tracr leaves every
        variable in the stream, and a value that is a function of another one, as ``map_3`` of ``tokens``, may
        be read off either; the interchange is exact either way).

        >>> v = tracr_variables("tracr-hist")["hist_1"]
        >>> round(float(v.kernel(v.basis(18)).score), 6)
        4.0
        """
        d_model = basis.shape[0]
        seen = torch.zeros(d_model, 1, dtype=torch.float64)
        seen[list(self.seen)] = 1.0
        part = orthonormal_basis(basis.detach().to(torch.float64) * seen)
        return projection_kernel(part, self.identifiable(d_model) if of is None else of.to(torch.float64))


def _site_after(writer: str) -> tuple[Site, Site | None]:
    c = parse(writer)
    if c.kind == "embed":
        return Site("blocks.0.hook_resid_pre"), None
    layer = c.layer
    if c.kind == "mlp":
        return Site(f"blocks.{layer}.hook_resid_post"), Site(f"blocks.{layer}.hook_resid_mid")
    return Site(f"blocks.{layer}.hook_resid_mid"), Site(f"blocks.{layer}.hook_resid_pre")


def _label(name: str, value: Value, kind: str) -> str:
    return name if kind == "numerical" else f"{name}:{value}"


def tracr_variables(name: str) -> dict[str, TracrVariable]:
    """Every RASP variable of the shipped program ``name``, the inputs ``tokens`` and ``indices`` included,
    by tracr's label (module docstring).

    >>> {k: (v.writer, len(v.dims), v.rank) for k, v in tracr_variables("tracr-hist").items()}
    {'tokens': ('embed', 3, 2), 'indices': ('embed', 0, 0), 'hist_1': ('MLP0', 5, 4)}
    """
    return dict(_variables(program_name(name)))


@functools.lru_cache(maxsize=None)
def _variables(program: str) -> tuple[tuple[str, TracrVariable], ...]:
    meta, cm = metadata(program), _causal_model(program)
    labels = list(meta.residual_labels)
    read = set().union(*meta.reads.values())
    taken: dict[str, set] = {v.name: set() for v in cm.variables}
    for x in tracr_inputs(program):
        for v_name, value in cm.run(x).items():
            if v_name != "input":
                taken[v_name] |= {e for e in value if e is not None}
    out = []
    for v in cm.variables:
        own = [lab for lab in labels if lab.split(":")[0] == v.name]
        kind = "numerical" if own == [v.name] else "categorical"
        writers = [s for s, w in meta.writes.items() if s in _senders(meta) and set(w) & set(own)]
        if len(writers) != 1:
            raise AssertionError(f"tracr-{program}: {v.name} is written by {few(writers)}, not one component")
        used = {_label(v.name, value, kind) for value in taken[v.name]}
        missing = used - set(own)
        if missing:
            raise AssertionError(f"tracr-{program}: values {few(sorted(missing))} of {v.name} have no residual "
                                 f"dimension")
        dims = tuple(labels.index(lab) for lab in own if lab in used and lab in read)
        rank = 0 if not dims else 1 if kind == "numerical" else len(dims) - (1 if used <= read else 0)
        site, before = _site_after(writers[0])
        out.append((v.name, TracrVariable(
            name=v.name, kind=kind, writer=writers[0], site=site, before=before, dims=dims,
            labels=tuple(labels[i] for i in dims), unread=tuple(lab for lab in own if lab not in read),
            unused=tuple(lab for lab in own if lab not in used), rank=rank,
            seen=_seen(meta.reads, labels, site), description=v.description)))
    return tuple(out)


def _seen(reads: dict, labels: list[str], site: Site) -> tuple[int, ...]:
    """The residual dimensions some receiver after ``site`` reads."""
    layer, point = site.layer, site.hook.rsplit("_", 1)[-1]

    def after(receiver: str) -> bool:
        c = parse(receiver)
        if c.kind == "logits":
            return True
        return c.layer > layer or (c.layer == layer and (point == "pre" or (point == "mid" and c.kind == "mlp")))

    seen = set().union(*(labs for r, labs in reads.items() if after(r)))
    return tuple(i for i, lab in enumerate(labels) if lab in seen)


def _senders(meta) -> set[str]:
    return {s for s in meta.writes if s not in ("embed.tokens", "embed.pos")}
