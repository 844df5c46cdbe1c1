"""An attribution graph in circuit-tracer's JSON, which its frontend (and Neuronpedia's) opens.

The file is one object with ``metadata`` (``slug``, ``scan``, ``transcoder_list``, ``prompt_tokens``,
``prompt``, ``node_threshold``, ``schema_version``), ``qParams`` (the frontend's view state: no pinned
node, no supernode), ``nodes`` and ``links`` (``source``, ``target``, ``weight``: the kept edges of the
pruned graph). Each node carries circuit-tracer's fields (``node_id``, ``feature``, ``layer``,
``ctx_idx``, ``feature_type``, ``token_prob``, ``is_target_logit``, ``run_idx``, ``reverse_ctx_idx``,
``jsNodeId``, ``clerp``, ``influence``, ``activation``) with its conventions: a feature of layer ``l``,
index ``i`` at position ``p`` is ``"l_i_p"`` with ``feature`` the Cantor pairing of ``(l, i)``; token
nodes sit in layer ``"E"``, logits in layer ``n_layers + 1``.

``convention="circuit-tracer"`` (the default) writes what circuit-tracer's ``create_graph_files`` writes
(its ``Node.error_node``, 0.4.1): the error node of layer ``l`` at ``p`` is ``"0_l_p"`` with ``jsNodeId``
``"l_p-0"`` and ``feature`` -1; ``prompt_tokens`` and the logits' ``clerp`` hold the tokens' text as
decoded (its frontend shows newlines, tabs and returns as marks itself) and ``prompt`` the whole prompt's
text (``prompt=``: the tokenizer's decoding of the ids, as circuit-tracer writes it; default the tokens'
texts joined). One exception: an error node's ``"0_l_p"`` is also feature ``l`` of layer 0 at ``p``, and
where both are written circuit-tracer's file holds two nodes under one id (its frontend joins links by id,
so some links go to the wrong node): there the error node is ``"l_-1_p"`` (jsNodeId ``"l_-1-p"``), no
feature's id. ``convention="rs_interp"`` writes rs_interp's earlier files: error nodes ``"err_l_p"``
(jsNodeId ``"l_p-0"``), the tokens with newlines, tabs and returns as visible marks, joined as the prompt.

The graph written is the one :func:`rs_interp.features.attribution_graph` computed: circuit-tracer's
``zero_positions``, BOS and node order are options there (``convention="circuit-tracer"``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Literal

from .._files import parsing, read_json
from .graph import AttributionGraph

__all__ = ["graph_json", "save_graph_json", "graph_files", "ExportConvention"]

#: Whose node ids and prompt text :func:`graph_json` writes (module docstring).
ExportConvention = Literal["circuit-tracer", "rs_interp"]


def _text(token: str) -> str:
    """A prompt token as circuit-tracer's frontend shows it (newlines, tabs, returns made visible)."""
    return token.replace("\n", "⏎").replace("\t", "→").replace("\r", "↵")


def _node(node_id: str, feature: int, layer: str, pos: int, kind: str, js: str, **extra) -> dict:
    return {"node_id": node_id, "feature": feature, "layer": layer, "ctx_idx": pos, "feature_type": kind,
            "token_prob": 0.0, "is_target_logit": False, "run_idx": 0, "reverse_ctx_idx": 0, "jsNodeId": js,
            "clerp": "", "influence": None, "activation": None} | extra


def graph_json(graph: AttributionGraph, *, slug: str = "rs-interp-graph", node_threshold: float = 0.8,
               edge_threshold: float = 0.98, decode: Callable[[int], str] | None = None,
               convention: ExportConvention = "circuit-tracer", prompt: str | None = None) -> dict:
    """The pruned graph (:meth:`~rs_interp.features.AttributionGraph.prune` at the two thresholds) as
    circuit-tracer's graph JSON (module docstring). ``decode`` (token id -> text) names the prompt's
    tokens and the logits; without it they show as ids. ``convention``: circuit-tracer's error-node
    ids and prompt text (the default), or rs_interp's (module docstring). ``prompt``: the metadata's
    prompt text (circuit-tracer's: the tokenizer's decoding of the whole prompt); default the tokens' texts joined.

    Raises:
        ValueError: an unknown ``convention``.

    >>> import torch
    >>> from rs_interp import load_toy_model
    >>> from rs_interp.features import attribution_graph, mlp_transcoders
    >>> model = load_toy_model("tracr-sort")
    >>> data = graph_json(attribution_graph(model, mlp_transcoders(model), torch.tensor([4, 3, 0, 2])))
    >>> sorted(data), data["metadata"]["prompt_tokens"]
    (['links', 'metadata', 'nodes', 'qParams'], ['4', '3', '0', '2'])
    """
    if convention not in ("circuit-tracer", "rs_interp"):
        raise ValueError(f"convention must be 'circuit-tracer' or 'rs_interp', got {convention!r}")
    ct = convention == "circuit-tracer"
    show = decode if decode is not None else (lambda t: str(t))
    text = (lambda t: show(t)) if ct else (lambda t: _text(show(t)))
    pruned = graph.prune(node_threshold, edge_threshold)
    kinds, L, P = graph.kinds(), graph.n_layers, graph.n_pos
    influence = pruned.cumulative.tolist()
    nodes: dict[int, dict] = {}
    for n in pruned.nodes.nonzero()[:, 0].tolist():
        kind = kinds[n]
        if kind == "feature":
            l, p, i = graph.features[n].tolist()
            nodes[n] = _node(f"{l}_{i}_{p}", (l + i) * (l + i + 1) // 2 + i, str(l), p, "cross layer transcoder",
                             f"{l}_{i}-0", influence=influence[n], activation=float(graph.activations[n]))
        elif kind == "error":
            l, p = divmod(n - graph.n_features, P)
            ids = (f"0_{l}_{p}", f"{l}_{p}-0") if ct else (f"err_{l}_{p}", f"{l}_{p}-0")
            nodes[n] = _node(ids[0], -1, str(l), p, "mlp reconstruction error", ids[1], influence=influence[n])
        elif kind == "token":
            p = n - graph.n_features - L * P
            t = int(graph.tokens[p])
            nodes[n] = _node(f"E_{t}_{p}", p, "E", p, "embedding", f"E_{t}-{p}", influence=influence[n])
        else:
            i = n - (graph.n_nodes - graph.n_logits)
            t, prob = int(graph.logit_tokens[i]), float(graph.logit_probabilities[i])
            nodes[n] = _node(f"{L + 1}_{t}_{graph.position}", t, str(L + 1), graph.position, "logit",
                             f"L_{t}-{graph.position}", token_prob=prob, is_target_logit=i == 0,
                             clerp=f'Output "{text(t)}" (p={prob:.3f})')
    if ct:
        _unique_error_ids(nodes)
    targets, sources = pruned.edges.nonzero(as_tuple=True)
    weights = graph.adjacency[targets, sources].tolist()
    links = [{"source": nodes[s]["node_id"], "target": nodes[t]["node_id"], "weight": w}
             for t, s, w in zip(targets.tolist(), sources.tolist(), weights) if s in nodes and t in nodes]
    linked = {x for link in links for x in (link["source"], link["target"])}
    kept = [d for d in nodes.values() if d["node_id"] in linked or d["feature_type"] in ("embedding", "logit")]
    tokens = [text(int(t)) for t in graph.tokens]
    prompt = prompt if prompt is not None else "".join(tokens)
    metadata = {"slug": slug, "scan": graph.scan, "transcoder_list": [], "prompt_tokens": tokens, "prompt": prompt,
                "node_threshold": node_threshold, "schema_version": 1}
    qparams = {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""}
    data = {"metadata": metadata, "qParams": qparams, "nodes": kept, "links": links}
    if graph.qk:  # an extra field (the frontend reads the four above): the attached QK attributions
        from .qk import qk_json

        data["qk"] = qk_json(graph, lambda n: nodes[n]["node_id"] if n in nodes else None)
    return data


def _unique_error_ids(nodes: dict[int, dict]) -> None:
    """circuit-tracer's error id ``0_l_p`` is also layer-0 feature ``l``'s at ``p``: where both are written, the error
    node becomes ``l_-1_p`` (jsNodeId ``l_-1-p``), no feature's id (its frontend joins links by id only)."""
    features = {d["node_id"] for d in nodes.values() if d["feature_type"] != "mlp reconstruction error"}
    for d in nodes.values():
        if d["feature_type"] == "mlp reconstruction error" and d["node_id"] in features:
            l, p = d["layer"], d["ctx_idx"]
            d["node_id"], d["jsNodeId"] = f"{l}_-1_{p}", f"{l}_-1-{p}"


def save_graph_json(graph: AttributionGraph, folder: str | Path, *, slug: str = "rs-interp-graph",
                    node_threshold: float = 0.8, edge_threshold: float = 0.98,
                    decode: Callable[[int], str] | None = None, convention: ExportConvention = "circuit-tracer",
                    prompt: str | None = None) -> Path:
    """Write ``folder/{slug}.json`` (:func:`graph_json`) and list it in ``folder/graph-metadata.json``,
    the index circuit-tracer's local server reads (``circuit_tracer.frontend.local_server.serve(data_dir=folder)``).

    >>> import tempfile, torch
    >>> from rs_interp import load_toy_model
    >>> from rs_interp.features import attribution_graph, mlp_transcoders
    >>> model = load_toy_model("tracr-sort")
    >>> graph = attribution_graph(model, mlp_transcoders(model), torch.tensor([4, 3, 0, 2]))
    >>> path = save_graph_json(graph, tempfile.mkdtemp(), slug="sort")
    >>> path.name, sorted(p.name for p in path.parent.iterdir())
    ('sort.json', ['graph-metadata.json', 'sort.json'])
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = graph_json(graph, slug=slug, node_threshold=node_threshold, edge_threshold=edge_threshold, decode=decode,
                      convention=convention, prompt=prompt)
    for name, content in graph_files(data, folder).items():
        (folder / name).write_text(json.dumps(content, indent=1, ensure_ascii=False))
    return folder / f"{slug}.json"


def graph_files(data: dict, folder: str | Path | None = None) -> dict[str, dict]:
    """The files circuit-tracer's local server reads for the graph ``data`` (:func:`graph_json`): ``{slug}.json``
    and ``graph-metadata.json``, its index (``{"graphs": [metadata, ...]}``, the one in ``folder`` with this slug's
    entry replaced, as circuit-tracer's ``add_graph_metadata`` does). Name -> JSON data; nothing written.

    Raises:
        rs_interp.FileError: ``folder``'s index is not a graph index (the message names it).

    >>> files = graph_files({"metadata": {"slug": "g"}, "qParams": {}, "nodes": [], "links": []})
    >>> sorted(files), files["graph-metadata.json"]
    (['g.json', 'graph-metadata.json'], {'graphs': [{'slug': 'g'}]})
    """
    slug = data["metadata"]["slug"]
    index = Path(folder) / "graph-metadata.json" if folder is not None else None
    listed = read_json(index, "graph index") if index is not None and index.is_file() else {"graphs": []}
    with parsing(index or "graph-metadata.json", "graph index"):  # circuit-tracer's index: {"graphs": [...]}
        listed["graphs"] = [g for g in listed["graphs"] if g.get("slug") != slug] + [data["metadata"]]
    return {f"{slug}.json": data, "graph-metadata.json": listed}
