"""Circuits in the MIB circuit track's file formats: its graphs of edge scores and circuits.

**MIB's graphs** (``hannamw/MIB-circuit-track``, EAP-IG's ``Graph.to_json`` / ``to_pt``): nodes
``input``, ``a{l}.h{h}``, ``m{l}``, ``logits``; an edge ``parent->child``, with ``<q>``/``<k>``/``<v>``
after an attention child. rs_interp's labels map one to one (``embed`` <-> ``input``, ``L{l}H{h}``
<-> ``a{l}.h{h}``, ``MLP{l}`` <-> ``m{l}``, receiver ``L{l}H{h}.q`` <-> child ``a{l}.h{h}<q>``), except
under grouped-query attention: MIB's graph gives every query head its own key and value input, so
an rs_interp edge into ``L{l}KV{g}.k`` is written as one MIB edge per query head of group ``g``, each
with the same score and membership, and read back only where those copies agree. MIB's own files
of a GQA model score each copy on its own: read them onto :func:`rs_interp.circuits.ungroup_gqa`'s copy of
the model, whose graph has those copies as edges.

**Whose scores.** MIB's harness attributes the *loss* of its metric (``mean=True, loss=True``: the
negated logit or probability difference, a mean over the examples, its gradient summed over the
batch and divided by the number of examples once more), so the score it writes for an edge is
``-effect / B``, ``effect`` the change of the (higher-is-better) metric when the edge is patched,
as rs_interp's methods report it, and ``B`` the batch size of MIB's data loader. :func:`write_mib`
writes that by default (``convention="mib"``, :func:`mib_importances`) and records the metric's
direction and ``B`` in the file (a top-level ``"rs_interp"`` entry, which EAP-IG's loaders ignore);
so MIB's ``evaluation.py``, ranking the largest scores first for its CPR, ranks the edges as
:func:`rs_interp.mib_scores` does by default for such a metric (its direction from the metric or the runs:
:func:`rs_interp.metrics.direction`). ``convention="as given"`` writes
the effects as they are (rs_interp's files before this convention). :meth:`MIBGraph.effects` turns
a file's scores back into effects of the metric.

A submission (MIB's README) is one folder per task and model, ``{task}_{model}`` (e.g.
``ioi_gpt2``), holding either one importance file (:func:`write_mib`, every edge scored) or
circuits at the nine sizes 0.1% ... 50% of the edges (:func:`write_mib_circuits`).

>>> import tempfile, rs_interp as ri
>>> model = ri.load_toy_model("induction-2l")
>>> layout = ri.edge_layout(model)
>>> effect = torch.where(layout.exists, torch.arange(5 * 13.).view(5, 13), torch.nan)
>>> scores = ri.circuits.EdgeEffects(layout, effect, float("nan"))
>>> path = write_mib(tempfile.mkdtemp() + "/importances.json", model, scores=scores, batch_size=4)
>>> back = read_mib(path, model)
>>> bool(torch.equal(back.effects().effect.nan_to_num(-1), scores.effect.nan_to_num(-1))), len(back.circuit)
(True, 29)
>>> back.scores.edge("embed", "L0H0.q"), back.convention
(-0.0, {'convention': 'mib', 'higher_is_better': True, 'batch_size': 4})
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal, Sequence

import torch

from .._files import FileError, need, parsing, read_json, read_torch
from .._messages import few
from ..exact.validate import check_int_range
from .graph import EdgeEffects, EdgeLayout, edge_layout
from .mib_names import _cfg_dict, _eap_index, _edges, _nodes, from_mib_edge, mib_edge_names

__all__ = ["MIBGraph", "write_mib", "read_mib", "write_mib_circuits", "mib_edge_names", "from_mib_edge",
           "mib_importances", "MIB_SUBMISSION_FRACTIONS", "Convention"]

#: How :func:`write_mib` writes scores: MIB's (the loss's, ``-effect / B``) or as given.
Convention = Literal["mib", "as given"]

#: The circuit sizes of a MIB submission of several circuits: at most these fractions of the edges.
MIB_SUBMISSION_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)


@dataclass(frozen=True)
class MIBGraph:
    """A MIB graph file read onto a model's edge layout.

    Attributes:
        scores: every edge's score (an :class:`rs_interp.circuits.EdgeEffects`, ``clean`` NaN: a file holds no
            clean metric); the score 0 or 1 of a file that held memberships only is its ``score``.
        circuit: the edges the file marks ``in_graph``.
        cfg: the file's ``cfg`` (``n_layers``, ``n_heads``, ``parallel_attn_mlp``, ``d_model``).
        convention: what the file records of its scores (:func:`write_mib`): ``{"convention": "mib",
            "higher_is_better": ..., "batch_size": ...}``, ``{"convention": "as given"}`` or
            ``{"convention": "memberships"}`` (a circuit without scores); empty for a file written
            elsewhere (MIB's own, scored as MIB scores).
        in_graph: MIB's names of the edges the file marks ``in_graph`` (per query head's copy under
            grouped-query attention).
        neurons: per node, which of its ``d_model`` neurons the file keeps (MIB's neuron-level
            circuits), or None where the file has no neuron masks.
    """

    scores: Any
    circuit: frozenset[tuple[str, str]]
    cfg: dict
    convention: dict = field(default_factory=dict)
    in_graph: frozenset[str] = frozenset()
    neurons: dict | None = None

    def effects(self, *, higher_is_better: bool | None = None, batch_size: int | None = None) -> Any:
        """The file's scores as rs_interp's effects: the change of the metric when an edge is patched.

        A file in MIB's convention holds ``s = -effect / B`` (higher-is-better metric) or
        ``effect / B`` (a metric where lower is better), so ``effect = -s B`` or ``s B``. The
        direction and ``B`` come from the file's record; for a file without one (MIB's own),
        ``higher_is_better`` defaults to True (MIB's metrics, logit and probability differences) and
        ``batch_size`` to 1 (the ranking, CPR and CMD do not depend on it). A file written
        ``"as given"`` (or a circuit's memberships, 1 inside and 0 outside) is returned as it is.

        Raises:
            ValueError: ``batch_size`` not a positive int.

        Example:
            >>> import tempfile, rs_interp as ri
            >>> cfg = ri.models.make_attn_only(1, n_heads=1).cfg
            >>> layout = ri.edge_layout(cfg)
            >>> e = ri.circuits.EdgeEffects(layout, torch.where(layout.exists, 2.0, torch.nan), float("nan"))
            >>> g = read_mib(write_mib(tempfile.mkdtemp() + "/i.json", cfg, scores=e, batch_size=2), cfg)
            >>> g.scores.edge("embed", "logits"), g.effects().edge("embed", "logits")
            (-1.0, 2.0)
        """
        if self.convention.get("convention") in ("as given", "memberships"):
            return self.scores
        hib = self.convention.get("higher_is_better", True) if higher_is_better is None else bool(higher_is_better)
        B = check_int_range("batch_size", self.convention.get("batch_size", 1) if batch_size is None else batch_size, 1)
        sign = -1.0 if hib else 1.0
        return EdgeEffects(self.scores.layout, sign * B * self.scores.effect, float("nan"))

    def weighted_edge_count(self) -> float:
        """MIB's size of the circuit (EAP-IG's ``Graph.weighted_edge_count``): the edges ``in_graph``,
        each weighted by the fraction of its parent's neurons kept where the file has neuron masks,

            sum over in-graph edges (p -> c) of |neurons kept of p| / d_model,

        and the count of in-graph edges otherwise (MIB's edges: per query head's copy).

        Example:
            >>> import tempfile, rs_interp as ri
            >>> cfg = ri.load_toy_model("induction-2l").cfg
            >>> g = read_mib(write_mib(tempfile.mkdtemp() + "/c.json", cfg, circuit=[("embed", "L0H1.v")]), cfg)
            >>> g.weighted_edge_count()
            1.0
        """
        if self.neurons is None:
            return float(len(self.in_graph))
        d_model = int(self.cfg["d_model"])
        kept = {node: int(torch.as_tensor(mask).sum()) for node, mask in self.neurons.items()}
        # EAP-IG: no mask, no neuron
        return float(sum(kept.get(name.split("->")[0], 0) for name in self.in_graph)) / d_model


def mib_importances(scores: Any, *, higher_is_better: bool = True, batch_size: int = 1) -> Any:
    """Edge scores in MIB's convention: the scores MIB's harness gives the *loss* of the metric,

        score = -effect / B   (a metric where higher is better: a logit or probability difference)
        score =  effect / B   (a metric where lower is better: a loss)

    ``effect`` the change of the metric (a mean over the examples) when the edge is patched from the
    reference, as rs_interp's methods report it; ``B`` the batch size of MIB's data loader (its
    attribution divides the gradient of the batch mean by the number of examples once more). MIB's
    CPR ranks the largest of these first, i.e. the edges whose patching hurts the metric most.

    Raises:
        ValueError: ``scores`` not an :class:`rs_interp.circuits.EdgeEffects`, ``batch_size`` not a positive int.

    Example:
        >>> import rs_interp as ri
        >>> layout = ri.edge_layout(ri.models.make_attn_only(1, n_heads=1))
        >>> e = ri.circuits.EdgeEffects(layout, torch.where(layout.exists, 3.0, torch.nan), 1.0)
        >>> a, b = mib_importances(e, batch_size=2), mib_importances(e, higher_is_better=False)
        >>> a.edge("embed", "logits"), b.edge("embed", "logits")
        (-1.5, 3.0)
    """
    if not isinstance(scores, EdgeEffects):
        raise ValueError(f"scores must be edge scores (an EdgeEffects), got {type(scores).__name__}")
    if not isinstance(higher_is_better, bool):
        raise ValueError(f"higher_is_better must be True or False, got {higher_is_better!r}")
    B = check_int_range("batch_size", batch_size, 1)
    sign = -1.0 if higher_is_better else 1.0
    return EdgeEffects(scores.layout, sign * scores.effect / B, sign * scores.clean)


def write_mib(path: str | Path, model_or_cfg: Any, *, scores: Any = None,
              circuit: Iterable[tuple[str, str]] | None = None, convention: Convention = "mib",
              higher_is_better: bool = True, batch_size: int = 1) -> Path:
    """Write a MIB graph file: ``.json`` (EAP-IG's ``to_json``) or ``.pt`` (``to_pt``), by suffix; its
    folder is made if needed.

    With ``scores`` alone: an importance file (every edge scored, the whole graph ``in_graph``),
    in MIB's convention by default (``convention="mib"``: :func:`mib_importances` of ``scores``,
    ``-effect / B`` for a metric where higher is better, so MIB's evaluation ranks the edges as
    rs_interp does; module docstring), or the effects as they are (``convention="as given"``). The
    file records which (``"rs_interp": {"convention", "higher_is_better", "batch_size"}``).
    Scores and circuits on EAP-IG's graph (``edge_layout(model, embedding="token")``) are written
    too: its ``tok_embed`` is MIB's ``input``.
    With ``circuit``: its edges ``in_graph``, the others not; each edge's score is taken from
    ``scores`` if given, else 1 inside and 0 outside (EAP-IG's loader reads a score for every edge,
    and a top-n of these gives the circuit back). A node is ``in_graph`` where an edge of the
    circuit touches it (``logits`` always, as in EAP-IG).

    Raises:
        ValueError: neither given; ``scores`` of another layout or with NaN on an edge; a circuit
            edge that is not an edge of this model; a suffix other than .json or .pt; an unknown
            convention.
    """
    cfg = getattr(model_or_cfg, "cfg", model_or_cfg)
    layout = edge_layout(cfg)
    path = Path(path)
    if path.suffix not in (".json", ".pt"):
        raise ValueError(f"{path}: a MIB graph file is .json or .pt")
    if scores is None and circuit is None:
        raise ValueError("give scores (an importance file), a circuit, or both")
    if convention not in ("mib", "as given"):
        raise ValueError(f"convention must be 'mib' or 'as given', got {convention!r}")
    edges = _edges(layout)
    record: dict = {"convention": "memberships"}
    if scores is not None:
        values, record = _written_scores(scores, layout, edges, convention, higher_is_better, batch_size)
    keep = (set(edges) if circuit is None
            else {("embed" if e[0] == "tok_embed" else e[0], e[1]) for e in map(tuple, circuit)})
    for e in keep - set(edges):
        layout.index(e)  # raises naming an unknown label or a non-edge
    if scores is None:
        values = [1.0 if e in keep else 0.0 for e in edges]
    edge_dict, touched = _edge_entries(edges, values, keep, cfg)
    nodes = {n: {"in_graph": n in touched} for n in _nodes(cfg)}
    path.parent.mkdir(parents=True, exist_ok=True)  # the folder made, as every writer here does
    if path.suffix == ".json":
        path.write_text(json.dumps({"cfg": _cfg_dict(cfg), "nodes": nodes, "edges": edge_dict, "rs_interp": record}))
    else:
        _write_pt(path, cfg, edge_dict, nodes, record)
    return path


def _written_scores(scores: Any, layout: Any, edges: list[tuple[str, str]], convention: Convention,
                    higher_is_better: bool, batch_size: int) -> tuple[list[float], dict]:
    """:func:`write_mib`'s scores, one per edge in ``edges``' order, in the file's convention, and its record."""
    if scores.layout.senders[:1] == ("tok_embed",) and scores.layout.senders[1:2] != ("pos_embed",):
        # EAP-IG's graph (edge_layout(model, embedding="token")): its input node is MIB's `input`
        scores = EdgeEffects(EdgeLayout(("embed",) + scores.layout.senders[1:], scores.layout.receivers,
                                        scores.layout.exists), scores.effect, scores.clean)
    if scores.layout.senders != layout.senders or scores.layout.receivers != layout.receivers:
        raise ValueError("scores belong to another model's edge layout (MIB's input node is the token embedding: "
                         "scores on edge_layout(model, embedding='sum') or 'token', not 'split')")
    if convention == "mib":
        scores = mib_importances(scores, higher_is_better=higher_is_better, batch_size=batch_size)
        record = {"convention": "mib", "higher_is_better": higher_is_better, "batch_size": batch_size}
    else:
        record = {"convention": "as given"}
    values = scores.effect[layout.exists].tolist()  # row-major, as edges() lists them
    bad = [f"{s} -> {r}" for (s, r), v in zip(edges, values) if math.isnan(v)]
    if bad:
        raise ValueError(f"{len(bad)} edges have no score (NaN), e.g. {few(bad, 2, show=str)}: MIB needs a score "
                         "for every edge")
    return values, record


def _edge_entries(edges: list[tuple[str, str]], values: list[float], keep: set, cfg: Any) -> tuple[dict, set[str]]:
    """Every MIB edge's ``{"score", "in_graph"}`` by its MIB name, and the nodes an edge in the graph touches."""
    edge_dict: dict[str, dict] = {}
    touched = {"logits"}
    for e, v in zip(edges, values):
        inside = e in keep
        for name in mib_edge_names(e, cfg):
            edge_dict[name] = {"score": float(v), "in_graph": inside}
            if inside:
                parent, child = name.split("->")
                touched |= {parent, child.split("<")[0]}
    return edge_dict, touched


def _write_pt(path: Path, cfg: Any, edge_dict: dict, nodes: dict, record: dict) -> None:
    """EAP-IG's ``to_pt`` file: its edge matrices (MLP slots even for attention-only models) and node lists."""
    H, L = cfg.n_heads, cfg.n_layers
    n_fwd, n_bwd = 1 + L * (H + 1), L * (3 * H + 1) + 1
    score_m, in_m = torch.zeros(n_fwd, n_bwd), torch.zeros(n_fwd, n_bwd, dtype=torch.bool)
    for name, d in edge_dict.items():
        i, j = _eap_index(name, cfg)
        score_m[i, j], in_m[i, j] = d["score"], d["in_graph"]
    src = ["input"] + [n for l in range(L) for n in [f"a{l}.h{h}" for h in range(H)] + [f"m{l}"]]
    dst = [n for l in range(L) for n in [f"a{l}.h{h}<{x}>" for x in "qkv" for h in range(H)] + [f"m{l}"]] + ["logits"]
    nodes_in = torch.tensor([nodes.get(n, {"in_graph": False})["in_graph"] for n in src])
    torch.save({"cfg": _cfg_dict(cfg), "src_nodes": src, "dst_nodes": dst, "edges_scores": score_m,
                "edges_in_graph": in_m, "nodes_in_graph": nodes_in, "rs_interp": record}, path)


def read_mib(path: str | Path, model_or_cfg: Any) -> MIBGraph:
    """Read a MIB graph file (``.json`` or ``.pt``) onto the model's edge layout.

    Raises:
        rs_interp.FileError: (a ``ValueError``) the file missing, truncated, not JSON or not a PyTorch file, or
            lacking a graph's fields (named).
        ValueError: a file of another shape (its ``cfg``), an unknown edge name, an edge this model
            does not have (e.g. into an MLP of an attention-only model), an edge of the model the
            file lacks, or, under grouped-query attention, copies of one KV edge that disagree.
    """
    cfg = getattr(model_or_cfg, "cfg", model_or_cfg)
    layout = edge_layout(cfg)
    path = Path(path)
    if path.suffix not in (".json", ".pt"):
        raise ValueError(f"{path}: a MIB graph file is .json or .pt")
    data, file_cfg, entries, neurons = _read_graph(path)
    mine = _cfg_dict(cfg)
    differ = {k: (file_cfg.get(k), v) for k, v in mine.items() if k != "d_model" and file_cfg.get(k) != v}
    if differ:
        raise ValueError(f"{path} is a graph of another model: (file, this model) {differ}")
    if entries is None:  # .pt: read this model's edges out of EAP-IG's matrices
        entries = _matrix_entries(path, data, layout, cfg)
    effect, member = _onto_layout(path, entries, layout, cfg)
    record = data.get("rs_interp") or {}
    return MIBGraph(EdgeEffects(layout, effect, float("nan")), frozenset(e for e, v in member.items() if v),
                    dict(file_cfg), dict(record), frozenset(n for n, (_, inside) in entries.items() if inside), neurons)


def _read_graph(path: Path) -> tuple[dict, dict, dict | None, dict | None]:
    """A MIB graph file, its ``cfg``, edges ``name -> (score, in_graph)`` (None in ``.pt``), neuron masks (or None)."""
    data = read_json(path, "MIB graph") if path.suffix == ".json" else read_torch(path, "MIB graph")
    if not isinstance(data, dict):
        raise FileError(f"MIB graph {path} holds a {type(data).__name__}, not a graph's dictionary.", path)
    with parsing(path, "MIB graph"):
        if path.suffix == ".json":
            need(data, ("cfg", "edges"), path, "MIB graph")
            file_cfg = data["cfg"]
            entries = {name: (float(d["score"]) if d.get("score") is not None else float("nan"), bool(d["in_graph"]))
                       for name, d in data["edges"].items()}
            neurons = {n: torch.tensor(d["neurons"], dtype=torch.bool) for n, d in data.get("nodes", {}).items()
                       if "neurons" in d} or None
        else:
            need(data, ("cfg", "src_nodes", "edges_scores", "edges_in_graph"), path, "MIB graph")
            file_cfg, entries, neurons = data["cfg"], None, None
            if data.get("neurons_in_graph") is not None:
                neurons = dict(zip(data["src_nodes"], data["neurons_in_graph"].bool()))
    if not isinstance(file_cfg, dict):
        raise FileError(f"MIB graph {path}: its cfg is a {type(file_cfg).__name__}, not a dictionary.", path)
    return data, file_cfg, entries, neurons


def _matrix_entries(path: Path, data: dict, layout: Any, cfg: Any) -> dict[str, tuple[float, bool]]:
    """This model's edges ``name -> (score, in_graph)`` read out of EAP-IG's matrices (a ``.pt`` file)."""
    names = [n for e in _edges(layout) for n in mib_edge_names(e, cfg)]
    scores_m, in_m = data["edges_scores"], data["edges_in_graph"]
    if tuple(in_m.shape) != (1 + cfg.n_layers * (cfg.n_heads + 1), cfg.n_layers * (3 * cfg.n_heads + 1) + 1):
        raise ValueError(f"{path}: edge matrices of shape {tuple(in_m.shape)} are not EAP-IG's for this cfg")
    rows, cols = (torch.tensor(ix) for ix in zip(*(_eap_index(n, cfg) for n in names)))
    entries = dict(zip(names, zip(scores_m[rows, cols].double().tolist(), in_m[rows, cols].tolist())))
    known = torch.zeros_like(in_m)
    known[rows, cols] = True
    if bool((in_m & ~known).any()):
        raise ValueError(f"{path} marks in_graph an entry that is not an edge of this model (e.g. into an MLP it "
                         "does not have)")
    return entries


def _onto_layout(path: Path, entries: dict[str, tuple[float, bool]], layout: Any,
                 cfg: Any) -> tuple[torch.Tensor, dict[tuple[str, str], bool]]:
    """The file's edges on the layout, each once (its GQA copies agreeing): its score (NaN off it) and membership."""
    effect = torch.full(layout.exists.shape, float("nan"), dtype=torch.float64)
    cell = {(layout.senders[i], layout.receivers[j]): (i, j) for i, j in layout.exists.nonzero().tolist()}
    lookup = {n: e for e in cell for n in mib_edge_names(e, cfg)}
    member: dict[tuple[str, str], bool] = {}
    for name, (score, inside) in entries.items():
        edge = lookup.get(name)
        if edge is None:
            from_mib_edge(name, cfg)  # raises: not a MIB name, or not an edge of this model
            raise ValueError(f"{path}: {name!r} is not an edge of this model")  # pragma: no cover (raised above)
        i, j = cell[edge]
        if edge in member and (member[edge] != inside or effect[i, j].item() != score):
            raise ValueError(f"{path}: {name} has (score {score}, in_graph {inside}) but another query head's copy of "
                             f"the same key/value edge {edge} has ({effect[i, j].item()}, {member[edge]}); rs_interp's "
                             "graph has one key and one value input per KV head: read it onto "
                             "rs_interp.circuits.ungroup_gqa(model), whose graph has one per query head, as MIB's")
        effect[i, j], member[edge] = score, inside
    absent = [e for e in cell if e not in member]
    if absent:
        raise ValueError(f"{path} lacks {len(absent)} edges of this model, e.g. {few(absent, 2)}.")
    return effect, member


def write_mib_circuits(folder: str | Path, model_or_cfg: Any, scores: Any, *,
                       fractions: Sequence[float] = MIB_SUBMISSION_FRACTIONS, suffix: str = ".json",
                       convention: Convention = "mib", higher_is_better: bool = True,
                       batch_size: int = 1) -> list[Path]:
    """One MIB circuit file per fraction ``f``: the top edges of ``scores`` by ``|score|`` (as
    :func:`rs_interp.top_edges` orders them) while MIB's edge count stays at most ``int(f * N)``
    (``N`` MIB's edges: per query head under grouped-query attention), as ``circuit_{f}{suffix}``;
    the scores written as :func:`write_mib` writes them (``convention``, ``higher_is_better``, ``batch_size``).

    Raises:
        ValueError: fractions outside (0, 1], and :func:`write_mib`'s errors.

    Example:
        >>> import tempfile, rs_interp as ri
        >>> model = ri.load_toy_model("induction-2l")
        >>> a, b = ri.induction_batch(4, seed=0).tokens, ri.induction_batch(4, seed=1).tokens
        >>> eap = ri.edge_attribution_patching(model, a, lambda x: x[:, -1, 0].mean(), reference=b)
        >>> paths = write_mib_circuits(tempfile.mkdtemp(), model, eap, fractions=(0.1, 0.5))
        >>> [p.name for p in paths], [len(read_mib(p, model).circuit) for p in paths]
        (['circuit_0.1.json', 'circuit_0.5.json'], [2, 14])
    """
    cfg = getattr(model_or_cfg, "cfg", model_or_cfg)
    if any(not 0 < f <= 1 for f in fractions):
        raise ValueError(f"fractions must lie in (0, 1], got {few(fractions, 10)}")
    layout = edge_layout(cfg)
    if scores.layout.senders != layout.senders or scores.layout.receivers != layout.receivers:
        raise ValueError("scores belong to another model's edge layout")
    edges = _edges(layout)
    values = scores.effect[layout.exists].abs().nan_to_num(-1.0).tolist()  # row-major, as edges() lists them
    order = sorted(range(len(edges)), key=lambda i: (-values[i], i))  # rs_interp.top_edges' order
    ranked = [edges[i] for i in order]
    copies = [len(mib_edge_names(e, cfg)) for e in ranked]
    total = sum(copies)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for f in fractions:
        budget, used, keep = int(f * total), 0, []
        for e, c in zip(ranked, copies):
            if used + c > budget:
                break
            keep.append(e)
            used += c
        out.append(write_mib(folder / f"circuit_{f:g}{suffix}", cfg, scores=scores, circuit=keep, convention=convention,
                             higher_is_better=higher_is_better, batch_size=batch_size))
    return out
