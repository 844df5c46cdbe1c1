"""Circuits in the MIB circuit track's file formats: its graphs of edge scores and circuits.

**MIB's graphs** (``hannamw/MIB-circuit-track``, EAP-IG's ``Graph.to_json`` / ``to_pt``): nodes
``input``, ``a{l}.h{h}``, ``m{l}``, ``logits``; an edge ``parent->child``, with ``<q>``/``<k>``/``<v>``
after an attention child. rs_interp's labels map one to one (``embed`` <-> ``input``, ``L{l}H{h}``
<-> ``a{l}.h{h}``, ``MLP{l}`` <-> ``m{l}``, receiver ``L{l}H{h}.q`` <-> child ``a{l}.h{h}<q>``), except
under grouped-query attention: MIB's graph gives every query head its own key and value input, so
an rs_interp edge into ``L{l}KV{g}.k`` is written as one MIB edge per query head of group ``g``, each
with the same score and membership, and read back only where those copies agree.

A submission (MIB's README) is one folder per task and model, ``{task}_{model}`` (e.g.
``ioi_gpt2``), holding either one importance file (:func:`write_mib`, every edge scored) or
circuits at the nine sizes 0.1% ... 50% of the edges (:func:`write_mib_circuits`).

>>> import tempfile, rs_interp as ri
>>> model = ri.load_toy_model("induction-2l")
>>> layout = ri.edge_layout(model)
>>> scores = ri.EdgeEffects(layout, torch.where(layout.exists, torch.arange(5 * 13.).view(5, 13), torch.nan), float("nan"))
>>> path = write_mib(tempfile.mkdtemp() + "/importances.json", model, scores=scores)
>>> back = read_mib(path, model)
>>> bool(torch.equal(back.scores.effect.nan_to_num(-1), scores.effect.nan_to_num(-1))), len(back.circuit)
(True, 29)
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from .._backend import kv_groups

__all__ = ["MIBGraph", "write_mib", "read_mib", "write_mib_circuits", "mib_edge_names", "from_mib_edge", "MIB_SUBMISSION_FRACTIONS"]

#: The circuit sizes of a MIB submission of several circuits: at most these fractions of the edges.
MIB_SUBMISSION_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)


_SENDER = re.compile(r"^(?:input|a(\d+)\.h(\d+)|m(\d+))$")
_EDGE = re.compile(r"^(input|a\d+\.h\d+|m\d+)->(a\d+\.h\d+|m\d+|logits)(?:<([qkv])>)?$")


def _mib_node(label: str) -> str:
    """rs_interp's sender or receiver node (no .q/.k/.v) -> MIB's node name."""
    if label in ("embed", "logits"):
        return "input" if label == "embed" else "logits"
    if label.startswith("MLP"):
        return f"m{label[3:]}"
    layer, head = label[1:].split("H")
    return f"a{layer}.h{head}"


def mib_edge_names(edge: tuple[str, str], model_or_cfg: Any) -> list[str]:
    """MIB's names of an rs_interp edge: one, or one per query head of the group for a key or value
    input under grouped-query attention (module docstring).

    Example:
        >>> from rs_interp import make_attn_only
        >>> mib_edge_names(("embed", "L0H1.q"), make_attn_only(1)), mib_edge_names(("L0H0", "logits"), make_attn_only(1))
        (['input->a0.h1<q>'], ['a0.h0->logits'])
        >>> mib_edge_names(("embed", "L0KV0.k"), make_attn_only(1, n_heads=2, n_key_value_heads=1))
        ['input->a0.h0<k>', 'input->a0.h1<k>']
    """
    cfg = getattr(model_or_cfg, "cfg", model_or_cfg)
    sender, receiver = edge
    parent = _mib_node(sender)
    if receiver in ("logits",) or receiver.startswith("MLP"):
        return [f"{parent}->{_mib_node(receiver)}"]
    head, x = receiver.split(".")
    layer, index = head[1:].replace("KV", "H").split("H")
    if "KV" in head:
        per = cfg.n_heads // kv_groups(cfg)
        return [f"{parent}->a{layer}.h{h}<{x}>" for h in range(int(index) * per, (int(index) + 1) * per)]
    return [f"{parent}->a{layer}.h{index}<{x}>"]


def from_mib_edge(name: str, model_or_cfg: Any) -> tuple[str, str]:
    """The rs_interp edge of a MIB edge name (under grouped-query attention, the KV head's edge).

    Raises:
        ValueError: a name that is not a MIB edge, or not an edge of this model.

    Example:
        >>> import rs_interp as ri
        >>> from_mib_edge("a0.h1->a1.h0<k>", ri.load_toy_model("induction-2l"))
        ('L0H1', 'L1H0.k')
    """
    cfg = getattr(model_or_cfg, "cfg", model_or_cfg)
    m = _EDGE.match(name)
    if m is None:
        raise ValueError(f"{name!r} is not a MIB edge name (parent->child, '<q>'/'<k>'/'<v>' after an attention child)")
    parent, child, x = m.groups()
    if child.startswith("a") and x is None:
        raise ValueError(f"{name!r}: an edge into an attention head needs <q>, <k> or <v>")
    if not child.startswith("a") and x is not None:
        raise ValueError(f"{name!r}: only an attention child takes <{x}>")

    def label(node: str) -> str:
        if node in ("input", "logits"):
            return "embed" if node == "input" else "logits"
        if node.startswith("m"):
            return f"MLP{node[1:]}"
        layer, head = node[1:].split(".h")
        return f"L{layer}H{head}"

    sender, receiver = label(parent), label(child)
    if x is not None:
        layer, head = receiver[1:].split("H")
        if x != "q" and kv_groups(cfg) != cfg.n_heads:
            receiver = f"L{layer}KV{int(head) // (cfg.n_heads // kv_groups(cfg))}"
        receiver = f"{receiver}.{x}"
    _check_edge(sender, receiver, cfg)
    return sender, receiver


def _check_edge(sender: str, receiver: str, cfg: Any) -> None:
    """What :meth:`rs_interp.EdgeLayout.index` checks, from the config alone (no layout built per edge).

    Raises:
        ValueError: a label this model does not have, or a sender that is not upstream of the receiver.
    """
    L, H, G = cfg.n_layers, cfg.n_heads, kv_groups(cfg)
    parallel = bool(getattr(cfg, "parallel_attn_mlp", False))

    def depth(label: str, role: str) -> float:
        if label == ("embed" if role == "sender" else "logits"):
            return 0 if role == "sender" else math.inf
        m = re.fullmatch(r"L(\d+)(H|KV)(\d+)" + (r"\.([qkv])" if role == "receiver" else ""), label)
        if m and int(m.group(1)) < L and ((m.group(2) == "H" and int(m.group(3)) < H and (role == "sender" or m.group(4) == "q" or G == H))
                                           or (m.group(2) == "KV" and role == "receiver" and G != H and int(m.group(3)) < G and m.group(4) != "q")):
            return 2 * int(m.group(1)) + 1
        m = re.fullmatch(r"MLP(\d+)", label)
        if m and not cfg.attn_only and int(m.group(1)) < L:
            return 2 * int(m.group(1)) + (1 if parallel else 2)
        raise ValueError(f"{label!r} is not a {role} of this model")

    if not depth(sender, "sender") < depth(receiver, "receiver"):
        raise ValueError(f"({sender!r}, {receiver!r}) is not an edge: {sender} is not upstream of {receiver}")


@dataclass(frozen=True)
class MIBGraph:
    """A MIB graph file read onto a model's edge layout.

    Attributes:
        scores: every edge's score (an :class:`rs_interp.EdgeEffects`, ``clean`` NaN: a file holds no
            clean metric); the score 0 or 1 of a file that held memberships only is its ``score``.
        circuit: the edges the file marks ``in_graph``.
        cfg: the file's ``cfg`` (``n_layers``, ``n_heads``, ``parallel_attn_mlp``, ``d_model``).
    """

    scores: Any
    circuit: frozenset[tuple[str, str]]
    cfg: dict


def _edges(layout: Any) -> list[tuple[str, str]]:
    """``layout.edges()`` (row-major) from one ``nonzero``: a tenth of the time on GPT-2's 70k pairs."""
    return [(layout.senders[i], layout.receivers[j]) for i, j in layout.exists.nonzero().tolist()]


def _cfg_dict(cfg: Any) -> dict:
    return {"n_layers": int(cfg.n_layers), "n_heads": int(cfg.n_heads),
            "parallel_attn_mlp": bool(getattr(cfg, "parallel_attn_mlp", False)), "d_model": int(cfg.d_model)}


def _nodes(cfg: Any) -> list[str]:
    names = ["input"]
    for l in range(cfg.n_layers):
        names += [f"a{l}.h{h}" for h in range(cfg.n_heads)] + ([] if cfg.attn_only else [f"m{l}"])
    return names + ["logits"]


def _eap_index(name: str, cfg: Any) -> tuple[int, int]:
    """(forward, backward) index of a MIB edge in EAP-IG's ``Graph`` matrices (``to_pt``)."""
    parent, child, x = _EDGE.match(name).groups()
    H = cfg.n_heads
    m = _SENDER.match(parent)
    if parent == "input":
        fwd = 0
    elif m.group(3) is not None:
        fwd = 1 + int(m.group(3)) * (H + 1) + H
    else:
        fwd = 1 + int(m.group(1)) * (H + 1) + int(m.group(2))
    if child == "logits":
        bwd = cfg.n_layers * (3 * H + 1)
    elif child.startswith("m"):
        bwd = int(child[1:]) * (3 * H + 1) + 3 * H
    else:
        layer, head = child[1:].split(".h")
        bwd = int(layer) * (3 * H + 1) + "qkv".index(x) * H + int(head)
    return fwd, bwd


def write_mib(path: str | Path, model_or_cfg: Any, *, scores: Any = None,
              circuit: Iterable[tuple[str, str]] | None = None) -> Path:
    """Write a MIB graph file: ``.json`` (EAP-IG's ``to_json``) or ``.pt`` (``to_pt``), by suffix; its
    folder is made if needed.

    With ``scores`` alone: an importance file (every edge scored, the whole graph ``in_graph``).
    With ``circuit``: its edges ``in_graph``, the others not; each edge's score is taken from
    ``scores`` if given, else 1 inside and 0 outside (EAP-IG's loader reads a score for every edge,
    and a top-n of these gives the circuit back). A node is ``in_graph`` where an edge of the
    circuit touches it (``logits`` always, as in EAP-IG).

    Raises:
        ValueError: neither given; ``scores`` of another layout or with NaN on an edge; a circuit
            edge that is not an edge of this model; a suffix other than .json or .pt.
    """
    from ..circuits.graph import edge_layout

    cfg = getattr(model_or_cfg, "cfg", model_or_cfg)
    layout = edge_layout(cfg)
    path = Path(path)
    if path.suffix not in (".json", ".pt"):
        raise ValueError(f"{path}: a MIB graph file is .json or .pt")
    if scores is None and circuit is None:
        raise ValueError("give scores (an importance file), a circuit, or both")
    edges = _edges(layout)
    if scores is not None:
        if scores.layout.senders != layout.senders or scores.layout.receivers != layout.receivers:
            raise ValueError("scores belong to another model's edge layout")
        values = scores.effect[layout.exists].tolist()  # row-major, as edges() lists them
        bad = [f"{s} -> {r}" for (s, r), v in zip(edges, values) if math.isnan(v)]
        if bad:
            raise ValueError(f"{len(bad)} edges have no score (NaN), e.g. {bad[:3]}: MIB needs a score for every edge")
    keep = set(edges) if circuit is None else {tuple(e) for e in circuit}
    for e in keep - set(edges):
        layout.index(e)  # raises naming an unknown label or a non-edge
    if scores is None:
        values = [1.0 if e in keep else 0.0 for e in edges]
    edge_dict: dict[str, dict] = {}
    touched = {"logits"}
    for e, v in zip(edges, values):
        inside = e in keep
        for name in mib_edge_names(e, cfg):
            edge_dict[name] = {"score": float(v), "in_graph": inside}
            if inside:
                parent, child = name.split("->")
                touched |= {parent, child.split("<")[0]}
    nodes = {n: {"in_graph": n in touched} for n in _nodes(cfg)}
    path.parent.mkdir(parents=True, exist_ok=True)  # the folder made, as every writer here does
    if path.suffix == ".json":
        path.write_text(json.dumps({"cfg": _cfg_dict(cfg), "nodes": nodes, "edges": edge_dict}))
        return path
    H, L = cfg.n_heads, cfg.n_layers
    n_fwd, n_bwd = 1 + L * (H + 1), L * (3 * H + 1) + 1  # EAP-IG's shapes: MLP slots even for attention-only models
    score_m, in_m = torch.zeros(n_fwd, n_bwd), torch.zeros(n_fwd, n_bwd, dtype=torch.bool)
    for name, d in edge_dict.items():
        i, j = _eap_index(name, cfg)
        score_m[i, j], in_m[i, j] = d["score"], d["in_graph"]
    src = ["input"] + [n for l in range(L) for n in [f"a{l}.h{h}" for h in range(H)] + [f"m{l}"]]
    dst = [n for l in range(L) for n in [f"a{l}.h{h}<{x}>" for x in "qkv" for h in range(H)] + [f"m{l}"]] + ["logits"]
    torch.save({"cfg": _cfg_dict(cfg), "src_nodes": src, "dst_nodes": dst, "edges_scores": score_m, "edges_in_graph": in_m,
                "nodes_in_graph": torch.tensor([nodes.get(n, {"in_graph": False})["in_graph"] for n in src])}, path)
    return path


def read_mib(path: str | Path, model_or_cfg: Any) -> MIBGraph:
    """Read a MIB graph file (``.json`` or ``.pt``) onto the model's edge layout.

    Raises:
        ValueError: a file of another shape (its ``cfg``), an unknown edge name, an edge this model
            does not have (e.g. into an MLP of an attention-only model), an edge of the model the
            file lacks, or, under grouped-query attention, copies of one KV edge that disagree.
    """
    from ..circuits.graph import EdgeEffects, edge_layout

    cfg = getattr(model_or_cfg, "cfg", model_or_cfg)
    layout = edge_layout(cfg)
    path = Path(path)
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        if not {"cfg", "edges"} <= set(data):
            raise ValueError(f"{path}: a MIB graph JSON has 'cfg', 'nodes' and 'edges'")
        file_cfg = data["cfg"]
        entries = {name: (float(d["score"]) if d.get("score") is not None else float("nan"), bool(d["in_graph"]))
                   for name, d in data["edges"].items()}
    elif path.suffix == ".pt":
        data = torch.load(path, weights_only=True)
        file_cfg = data["cfg"]
        entries = None
    else:
        raise ValueError(f"{path}: a MIB graph file is .json or .pt")
    mine = _cfg_dict(cfg)
    differ = {k: (file_cfg.get(k), v) for k, v in mine.items() if k != "d_model" and file_cfg.get(k) != v}
    if differ:
        raise ValueError(f"{path} is a graph of another model: (file, this model) {differ}")
    if entries is None:  # .pt: read this model's edges out of EAP-IG's matrices
        names = [n for e in _edges(layout) for n in mib_edge_names(e, cfg)]
        scores_m, in_m = data["edges_scores"], data["edges_in_graph"]
        if tuple(in_m.shape) != (1 + cfg.n_layers * (cfg.n_heads + 1), cfg.n_layers * (3 * cfg.n_heads + 1) + 1):
            raise ValueError(f"{path}: edge matrices of shape {tuple(in_m.shape)} are not EAP-IG's for this cfg")
        rows, cols = (torch.tensor(ix) for ix in zip(*(_eap_index(n, cfg) for n in names)))
        entries = dict(zip(names, zip(scores_m[rows, cols].double().tolist(), in_m[rows, cols].tolist())))
        known = torch.zeros_like(in_m)
        known[rows, cols] = True
        if bool((in_m & ~known).any()):
            raise ValueError(f"{path} marks in_graph an entry that is not an edge of this model (e.g. into an MLP it does not have)")
    effect = torch.full(layout.exists.shape, float("nan"), dtype=torch.float64)
    cell = {(layout.senders[i], layout.receivers[j]): (i, j) for i, j in layout.exists.nonzero().tolist()}
    lookup = {n: e for e in cell for n in mib_edge_names(e, cfg)}
    member: dict[tuple[str, str], bool] = {}
    for name, (score, inside) in entries.items():
        edge = lookup.get(name)
        if edge is None:
            from_mib_edge(name, cfg)  # raises: not a MIB name, or not an edge of this model
            raise ValueError(f"{path}: {name!r} is not an edge of this model")  # pragma: no cover (from_mib_edge raised)
        i, j = cell[edge]
        if edge in member and (member[edge] != inside or effect[i, j].item() != score):
            raise ValueError(f"{path}: {name} has (score {score}, in_graph {inside}) but another query head's copy of the "
                             f"same key/value edge {edge} has ({effect[i, j].item()}, {member[edge]}); rs_interp's graph has "
                             "one key and one value input per KV head")
        effect[i, j], member[edge] = score, inside
    absent = [e for e in cell if e not in member]
    if absent:
        raise ValueError(f"{path} lacks {len(absent)} edges of this model, e.g. {absent[:3]}")
    return MIBGraph(EdgeEffects(layout, effect, float("nan")), frozenset(e for e, v in member.items() if v), dict(file_cfg))


def write_mib_circuits(folder: str | Path, model_or_cfg: Any, scores: Any, *,
                       fractions: Sequence[float] = MIB_SUBMISSION_FRACTIONS, suffix: str = ".json") -> list[Path]:
    """One MIB circuit file per fraction ``f``: the top edges of ``scores`` by ``|score|`` (as
    :func:`rs_interp.top_edges` orders them) while MIB's edge count stays at most ``int(f * N)``
    (``N`` MIB's edges: per query head under grouped-query attention), as ``circuit_{f}{suffix}``.

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
    from ..circuits.graph import edge_layout

    cfg = getattr(model_or_cfg, "cfg", model_or_cfg)
    if any(not 0 < f <= 1 for f in fractions):
        raise ValueError(f"fractions must lie in (0, 1], got {tuple(fractions)}")
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
        out.append(write_mib(folder / f"circuit_{f:g}{suffix}", cfg, scores=scores, circuit=keep))
    return out
