"""Supernodes: a graph's nodes grouped (by hand, or by a rule) into a reduced graph whose edges are the
exact sums of their members' edges.

With ``M`` the (node, group) membership matrix (each node in exactly one group: the groups given, and
every other node alone), the reduced adjacency is

    A_G[g, h] = sum_{t in g, s in h} A[t, s] = (M^T A M)[g, h]

so a supernode's inputs and outputs are exactly what its members receive and send (an edge inside a
group is a self-edge ``A_G[g, g]``, kept and shown). Its value, bias and unselected part are its
members' sums too: every reduced row still sums to its value, ``A_G.sum(1) + bias_G + unselected_G = values_G``.

The automatic rule :func:`same_feature_groups` groups the nodes of one transcoder feature (the same
layer and index) across the positions where it is active, circuit-tracer's users' most common grouping
(its issue #20); groups of one are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from jaxtyping import Float

from .graph import AttributionGraph

__all__ = ["SupernodeGraph", "supernodes", "same_feature_groups", "supernode_json"]


@dataclass(frozen=True)
class SupernodeGraph:
    """A graph reduced to groups of its nodes (module docstring).

    Attributes:
        graph: the full graph.
        groups: each reduced node's members (node indices of ``graph``), the given groups first.
        names: each reduced node's name (a singleton keeps its node's label).
        adjacency: (group, group) the summed direct effects, [target, source].
        values, bias, unselected: (group,) the members' sums.
        n_given: how many of the groups were given (the rest are single nodes).

    >>> import torch
    >>> from rs_interp import load_toy_model
    >>> from rs_interp.features import attribution_graph, mlp_transcoders
    >>> model = load_toy_model("tracr-sort")
    >>> g = attribution_graph(model, mlp_transcoders(model), torch.tensor([4, 3, 0, 2]))
    >>> s = supernodes(g, [[0, 1]], names=["first two"])
    >>> s.names[0], len(s.groups) == g.n_nodes - 1
    ('first two', True)
    """

    graph: AttributionGraph
    groups: tuple[tuple[int, ...], ...]
    names: tuple[str, ...]
    adjacency: Float[torch.Tensor, "group group"]
    values: Float[torch.Tensor, " group"]
    bias: Float[torch.Tensor, " group"]
    unselected: Float[torch.Tensor, " group"]
    n_given: int

    @property
    def n_groups(self) -> int:
        return len(self.groups)

    def membership(self) -> torch.Tensor:
        """(node, group) ``M[n, g] = 1`` where node ``n`` is in group ``g``."""
        M = torch.zeros(self.graph.n_nodes, self.n_groups, dtype=self.adjacency.dtype)
        for g, members in enumerate(self.groups):
            M[list(members), g] = 1.0
        return M

    def top(self, k: int = 5) -> list[tuple[tuple[str, str], float]]:
        """The ``k`` reduced edges with the largest ``|effect|``, each ``((source, target), effect)``."""
        from .._format import Top

        flat = self.adjacency.flatten()
        idx = flat.abs().topk(min(k, int((flat != 0).sum()))).indices
        n = self.n_groups
        return Top(((self.names[int(i) % n], self.names[int(i) // n]), float(flat[i])) for i in idx)


def same_feature_groups(graph: AttributionGraph, min_size: int = 2) -> list[list[int]]:
    """The feature nodes of each transcoder feature (same layer and index) at every position where it is
    a node, for the features that are nodes at ``min_size`` positions or more.

    >>> import torch
    >>> from rs_interp import load_toy_model
    >>> from rs_interp.features import attribution_graph, mlp_transcoders
    >>> model = load_toy_model("tracr-sort")
    >>> g = attribution_graph(model, mlp_transcoders(model), torch.tensor([4, 3, 0, 2]))
    >>> all(len({tuple(g.features[n, [0, 2]].tolist()) for n in grp}) == 1 for grp in same_feature_groups(g))
    True
    """
    by_feature: dict[tuple[int, int], list[int]] = {}
    for n, (l, _, i) in enumerate(graph.features.tolist()):
        by_feature.setdefault((l, i), []).append(n)
    return [members for members in by_feature.values() if len(members) >= min_size]


def supernodes(graph: AttributionGraph, groups: Sequence[Sequence[int]] | None = None, *,
               names: Sequence[str] | None = None) -> SupernodeGraph:
    """Group ``graph``'s nodes into supernodes (module docstring); default groups: :func:`same_feature_groups`.

    Args:
        groups: disjoint lists of node indices; every node in none is a group of its own.
        names: one per group given; default ``"L{l} F{i} (x{n})"`` for a feature across positions, else the
            members' labels joined.

    Raises:
        ValueError: a node out of range, in two groups, or an empty group; names of another length.
    """
    groups = same_feature_groups(graph) if groups is None else [list(map(int, g)) for g in groups]
    seen: set[int] = set()
    for g in groups:
        if not g:
            raise ValueError("supernodes: an empty group")
        for n in g:
            if not 0 <= n < graph.n_nodes:
                raise ValueError(f"supernodes: node {n} is not in the graph (0..{graph.n_nodes - 1})")
            if n in seen:
                raise ValueError(f"supernodes: node {n} is in two groups")
            seen.add(n)
    labels = graph.labels()
    if names is not None and len(names) != len(groups):
        raise ValueError(f"supernodes: {len(names)} names for {len(groups)} groups")
    if names is None:
        names = [_name(graph, g, labels) for g in groups]
    rest = [n for n in range(graph.n_nodes) if n not in seen]
    all_groups = tuple(tuple(g) for g in groups) + tuple((n,) for n in rest)
    all_names = tuple(names) + tuple(labels[n] for n in rest)
    group_of = torch.empty(graph.n_nodes, dtype=torch.long)
    for g, members in enumerate(all_groups):
        group_of[list(members)] = g
    G = len(all_groups)
    targets, rows = graph.target_nodes(), graph.rows()  # the adjacency's rows that can be nonzero, never a dense copy
    by_target = torch.zeros(G, rows.shape[1], dtype=rows.dtype).index_add_(0, group_of[targets], rows)
    reduced = torch.zeros(G, G, dtype=rows.dtype).index_add_(1, group_of[: rows.shape[1]], by_target)

    def summed(v: torch.Tensor) -> torch.Tensor:
        return torch.zeros(G, dtype=v.dtype).index_add_(0, group_of, v)

    return SupernodeGraph(graph, all_groups, all_names, reduced, summed(graph.values), summed(graph.bias),
                          summed(graph.unselected), len(groups))


def _name(graph: AttributionGraph, members: list[int], labels) -> str:
    kinds = graph.kinds()
    if all(kinds[n] == "feature" for n in members):
        keys = {(int(graph.features[n, 0]), int(graph.features[n, 2])) for n in members}
        if len(keys) == 1:
            (l, i), = keys
            return f"L{l} F{i} (x{len(members)})"
    return " + ".join(labels[n] for n in members[:3]) + (f" + {len(members) - 3} more" if len(members) > 3 else "")


def supernode_json(sg: SupernodeGraph, data: dict, node_id: Callable[[int], str | None] | None = None) -> dict:
    """``data`` (:func:`~rs_interp.features.export.graph_json` of ``sg.graph``) with the supernodes: in
    ``qParams.supernodes`` as circuit-tracer's frontend reads them (``[name, node_id, ...]`` over the
    nodes the JSON holds), and the reduced graph as an extra field ``supernode_graph`` (``nodes``: name
    and member ids; ``links``: ``source``, ``target``, ``weight``, the summed effects).

    >>> import torch
    >>> from rs_interp import load_toy_model
    >>> from rs_interp.features import attribution_graph, mlp_transcoders
    >>> from rs_interp.features.export import graph_json
    >>> model = load_toy_model("tracr-sort")
    >>> g = attribution_graph(model, mlp_transcoders(model), torch.tensor([4, 3, 0, 2]))
    >>> out = supernode_json(supernodes(g), graph_json(g))
    >>> listed = out["qParams"]["supernodes"]
    >>> sorted(out["supernode_graph"]), listed == [s for s in listed if len(s) > 1]
    (['links', 'nodes'], True)
    """
    data = dict(data)
    present = {}
    if node_id is None:  # the JSON's own ids, matched by position in the node order of the export
        ids = {d["node_id"] for d in data["nodes"]}
        node_id = _ids_of(sg.graph, ids)
    labels = sg.graph.labels()
    for g, members in enumerate(sg.groups):
        present[g] = [node_id(n) or labels[n] for n in members]
    qparams = dict(data.get("qParams", {}))
    listed = {d["node_id"] for d in data["nodes"]}
    qparams["supernodes"] = [[sg.names[g]] + [i for i in present[g] if i in listed] for g in range(sg.n_given)
                             if any(i in listed for i in present[g])]
    data["qParams"] = qparams
    t, s = sg.adjacency.nonzero(as_tuple=True)
    data["supernode_graph"] = {
        "nodes": [{"name": sg.names[g], "members": present[g], "value": float(sg.values[g])}
                  for g in range(sg.n_groups)],
        "links": [{"source": sg.names[int(b)], "target": sg.names[int(a)], "weight": float(sg.adjacency[a, b])}
                  for a, b in zip(t, s)],
    }
    return data


def _ids_of(graph: AttributionGraph, ids: set[str]) -> Callable[[int], str | None]:
    """A node's id in the export, by circuit-tracer's conventions as the export writes them (features
    ``l_i_p``, tokens ``E_t_p``, logits ``{L+1}_t_{position}``; error nodes as the export names them)."""
    L, P = graph.n_layers, graph.n_pos

    def of(n: int) -> str | None:
        kind = graph.kinds()[n]
        if kind == "feature":
            l, p, i = graph.features[n].tolist()
            cands = [f"{l}_{i}_{p}"]
        elif kind == "error":
            l, p = divmod(n - graph.n_features, P)
            cands = [f"err_{l}_{p}", f"{l}_-1_{p}", f"0_{l}_{p}"]  # l_-1_p first: where written, 0_l_p is a feature's
        elif kind == "token":
            p = n - graph.n_features - L * P
            cands = [f"E_{int(graph.tokens[p])}_{p}"]
        else:
            t = int(graph.logit_tokens[n - (graph.n_nodes - graph.n_logits)])
            cands = [f"{L + 1}_{t}_{graph.position}"]
        return next((c for c in cands if c in ids), None)

    return of
