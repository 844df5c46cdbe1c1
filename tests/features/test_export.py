"""Issue 53 item 3: circuit-tracer's conventions in the graph JSON (rs_interp.features.export)."""

import json
import re

import pytest
import torch

import rs_interp as ri
from rs_interp.features import attribution_graph
from rs_interp.features.export import graph_json, save_graph_json
from rs_interp.features.transcoders import shipped_transcoders


@pytest.fixture(scope="module")
def graph():
    model = ri.load_toy_model("code-2l")
    tokens = torch.tensor([5, 10, 10, 2047, 5, 10, 10, 2047])
    return attribution_graph(model, shipped_transcoders("code-2l"), tokens)


def _decode(t):  # whitespace in the tokens: a newline, a tab, a return and spaces
    return {5: "a\n", 10: " b", 2047: "\t\r"}.get(t, f"<{t}>")


@pytest.mark.parametrize("convention", ["circuit-tracer", "rs_interp"])
def test_error_ids_and_prompt_text(graph, convention, tmp_path):
    data = json.loads(save_graph_json(graph, tmp_path, slug="g", decode=_decode, convention=convention).read_text())
    errors = [n for n in data["nodes"] if n["feature_type"] == "mlp reconstruction error"]
    assert errors, "the pruned graph keeps some error nodes"
    features = {n["node_id"] for n in data["nodes"] if n["feature_type"] == "cross layer transcoder"}
    for n in errors:
        l, p = int(n["layer"]), n["ctx_idx"]
        if convention == "circuit-tracer":  # its Node.error_node: 0_l_p, unless a layer-0 feature written has that id
            ids = (f"{l}_-1_{p}", f"{l}_-1-{p}") if f"0_{l}_{p}" in features else (f"0_{l}_{p}", f"{l}_{p}-0")
            assert (n["node_id"], n["jsNodeId"], n["feature"]) == (*ids, -1)
        else:
            assert (n["node_id"], n["jsNodeId"]) == (f"err_{l}_{p}", f"{l}_{p}-0")
    ids = [n["node_id"] for n in data["nodes"]]
    assert len(ids) == len(set(ids))
    features = [n for n in data["nodes"] if n["feature_type"] == "cross layer transcoder"]
    assert all(re.fullmatch(r"\d+_\d+_\d+", n["node_id"]) for n in features)
    raw = [_decode(int(t)) for t in graph.tokens]
    marked = [t.replace("\n", "⏎").replace("\t", "→").replace("\r", "↵") for t in raw]
    # circuit-tracer writes the tokens as decoded (its frontend marks the whitespace); rs_interp's files mark it
    assert data["metadata"]["prompt_tokens"] == (raw if convention == "circuit-tracer" else marked)
    assert data["metadata"]["prompt"] == "".join(raw if convention == "circuit-tracer" else marked)
    given = graph_json(graph, decode=_decode, convention=convention, prompt="the text as the tokenizer decodes it")
    assert given["metadata"]["prompt"] == "the text as the tokenizer decodes it"


def test_refusal(graph):
    with pytest.raises(ValueError, match="convention must be"):
        graph_json(graph, convention="neuronpedia")
