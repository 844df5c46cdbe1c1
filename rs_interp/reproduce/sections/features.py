"""Feature circuits (issue 46): an attribution graph of ``code-2l`` completing a repeated identifier,
over its shipped transcoders, beside the head-level circuit EAP-IG finds for the same behaviour.

The prompt is the code section's first made-up identifier, written once and then cut before the last
token of its second occurrence; the graph's one logit node is that token. The section reports the
shipped transcoders' metrics, the graph's node and edge counts before and after pruning (0.8, 0.98),
its replacement and completeness scores, and checks it in float64: every row plus its bias is its
target's value, and doubling the most influential features in the frozen model moves every target by
exactly its graph entry. EAP-IG (m = 5) scores every edge of the model's head graph on the same prompt
against a reference whose first occurrence of the identifier is replaced by random tokens.

The model is always the shipped ``code-2l``: the transcoders were trained on its activations.
"""

from __future__ import annotations

import time

import torch

from ... import as_dtype, edge_attribution_patching, load_toy_model, next_token_loss
from ...features import attribution_graph, intervene, shipped_metrics, shipped_transcoders
from ...features.export import graph_files, graph_json
from ...features.figures import graph_figure
from ...models import SHIPPED_MODELS
from ..context import Context, Row, Section, banded
from .code import IDENTIFIERS

#: EAP-IG's number of points (the faithfulness section's m).
IG_STEPS = 5
#: Features doubled in the frozen-intervention check (the most influential).
N_CHECKED = 8
#: The graph's name in circuit-tracer's files, written beside report.html (``{GRAPH_SLUG}.json``).
GRAPH_SLUG = "code-2l-repeated-identifier"


def _prompt(tokenizer, ident: str) -> tuple[torch.Tensor, int, slice]:
    """The prompt's tokens, the completion, and the span of the identifier's first occurrence (the
    tokens it shares with the second occurrence, read backwards from the completion's first place)."""
    ids = tokenizer.encode(f"    def forward(self, x):\n        h = {ident}(x)\n        return {ident}").ids
    j = ids.index(ids[-1])
    k = 0
    while j - k - 1 >= 0 and ids[j - k - 1] == ids[len(ids) - 2 - k]:
        k += 1
    return torch.tensor(ids[:-1]), ids[-1], slice(j - k, j + 1)


def features_section(ctx: Context) -> Section:
    """The graph of one repeated identifier, its scores and exactness, and EAP-IG's edges beside it."""
    model = load_toy_model("code-2l")
    tokenizer = SHIPPED_MODELS["code-2l"].tokenizer()
    decode = lambda t: tokenizer.decode([int(t)])  # noqa: E731
    tcs = shipped_transcoders("code-2l")
    tokens, answer, span = _prompt(tokenizer, IDENTIFIERS[0])
    start = time.perf_counter()
    graph = attribution_graph(model, tcs, tokens, targets=[answer], progress=ctx.progress)
    seconds = time.perf_counter() - start
    pruned = graph.prune(0.8, 0.98)
    scores = graph.scores()
    counts = pruned.counts()
    exact = _exactness(ctx, model, tcs, tokens, answer, graph)
    eap = _eap_ig(ctx, model, tokens, answer, span)
    metrics = shipped_metrics("code-2l")
    p = float(graph.logit_probabilities[0])
    rows_out = _rows(graph, counts, scores, exact, metrics, len(tokens), p, seconds)
    results = {"transcoders": metrics["metrics"], "prompt": [decode(t) for t in tokens], "answer": decode(answer),
               "probability": p, "nodes": {"features": graph.n_features, "errors": graph.n_layers * graph.n_pos,
                                           "tokens": graph.n_pos, "logits": graph.n_logits},
               "edges": int((graph.adjacency != 0).sum()), "pruned": counts,
               "scores": {"replacement": scores.replacement, "completeness": scores.completeness},
               "row_identity_f64": exact["identity"], "frozen_intervention_gap_f64": exact["frozen_gap"],
               "live_gap_f64": exact["live"].gap, "top_edges": pruned.top(8, decode),
               "eap_ig_top_edges": [(" -> ".join(lab) if isinstance(lab, tuple) else str(lab), w)
                                    for lab, w in eap.top(8)], "seconds": seconds}
    fig = graph_figure(pruned, decode=decode, title=f"code-2l completing {IDENTIFIERS[0]!r}: attribution graph "
                                                     f"(replacement {scores.replacement:.2f}, completeness "
                                                     f"{scores.completeness:.2f})")
    paths = _influence(graph, pruned, span, decode)
    rows_out.insert(8, Row("influence on the logit by kind: features / error nodes / tokens",
                           " / ".join(f"{paths['by_kind'][k]:.3f}" for k in ("feature", "error", "token")), "-",
                           "report", None))
    rows_out.insert(9, Row(f"direct effect on the logit of the first occurrence's {decode(answer)!r} (position "
                           f"{span.stop - 1}), through layer 1's frozen attention: the induction path",
                           paths["induction"], "> 0", "report", None))
    results["influence_by_kind"] = paths["by_kind"]
    results["induction_token_effect"] = paths["induction"]
    eap_top = [(" -> ".join(lab) if isinstance(lab, tuple) else str(lab), w) for lab, w in eap.top(5)]
    labels, share, order, into = paths["labels"], paths["share"], paths["order"], paths["into"]
    results["top_nodes"] = [(labels[i], float(share[i])) for i in order]
    results["into_logit"] = into
    data = graph_json(graph, slug=GRAPH_SLUG, decode=decode, prompt=tokenizer.decode(tokens.tolist()))
    return Section("features", "Feature circuits: an attribution graph of code-2l completing a repeated identifier",
                   tuple(rows_out), results, figures=(fig,), notes=_notes(paths, eap_top, data),
                   files=graph_files(data))


def _exactness(ctx: Context, model, tcs, tokens: torch.Tensor, answer: int, graph) -> dict:
    """The graph again in float64: its row identity, the frozen and live interventions, the float32 graph's gap."""
    m64, t64 = as_dtype(model, torch.float64), tcs.to(torch.float64)
    g64 = attribution_graph(m64, t64, tokens, targets=[answer], progress=ctx.progress)
    identity = float(g64.row_gaps().max())
    top = g64.influence()[: g64.n_features].topk(min(N_CHECKED, g64.n_features)).indices.tolist()
    frozen_gap = max(intervene(m64, t64, g64, [n], scale=2.0).gap for n in top)
    live = intervene(m64, t64, g64, top[:1], scale=2.0, frozen=False)
    f32_gap = float((graph.adjacency.double() - g64.adjacency).abs().max())
    return {"identity": identity, "top": top, "frozen_gap": frozen_gap, "live": live, "f32_gap": f32_gap}


def _eap_ig(ctx: Context, model, tokens: torch.Tensor, answer: int, span: slice):
    """EAP-IG on the same behaviour: the completion's loss, the first occurrence randomised in the reference."""
    g = torch.Generator().manual_seed(ctx.seed + 46)
    reference = tokens.clone()
    reference[span] = torch.randint(0, model.cfg.d_vocab, (span.stop - span.start,), generator=g)
    targets = torch.full((1, len(tokens)), -1)
    targets[0, -1] = answer
    return edge_attribution_patching(model, tokens[None], next_token_loss(targets), reference=reference[None],
                                     ig_steps=IG_STEPS)


def _rows(graph, counts: dict, scores, exact: dict, metrics: dict, n_tokens: int, p: float,
          seconds: float) -> list[Row]:
    """The section's rows but the two of :func:`_influence` (inserted at 8 and 9)."""
    m, settings = metrics["metrics"], metrics["settings"]
    return [
        Row(f"shipped transcoders ({settings['d_transcoder']} {settings['activation']} features a layer): "
            "FVU per layer on held-out windows", ", ".join(f"{v:.3f}" for v in m["fvu"]), "-", "report", None,
            note="lower is better"),
        Row("L0 (active features a token) / dead fraction, per layer",
            ", ".join(f"{a:.1f} / {d:.3f}" for a, d in zip(m["l0"], m["dead_fraction"])), "-", "report", None),
        Row(f"replacement model: KL(model || replacement) a token; loss {m['loss']:.3f} -> "
            f"{m['replacement_loss']:.3f} nats", m["kl"], "-", "report", None, note="0 for a perfect replacement"),
        Row(f"graph of {IDENTIFIERS[0]!r} ({n_tokens} tokens, P(completion) = {p:.3f}): feature / error / token / "
            "logit nodes",
            f"{graph.n_features} / {graph.n_layers * graph.n_pos} / {graph.n_pos} / {graph.n_logits}", "-", "report",
            None),
        Row("edges (nonzero) before pruning", int((graph.adjacency != 0).sum()), "-", "report", None),
        Row("after pruning (0.8, 0.98): feature / error / token / logit nodes, edges",
            f"{counts['feature']} / {counts['error']} / {counts['token']} / {counts['logit']}, {counts['edges']}", "-",
            "report", None),
        banded("features.replacement_score", "replacement score (tokens' share of token + error influence)",
               scores.replacement),
        banded("features.completeness_score", "completeness score (influence-weighted non-error input)",
               scores.completeness),
        banded("features.row_identity", "float64: largest |row + bias - value| over feature and logit rows",
               exact["identity"]),
        banded("features.frozen_intervention", f"float64: doubling each of the {len(exact['top'])} most influential "
               "features in the frozen model, largest |change - graph entry|", exact["frozen_gap"]),
        Row("live model (nothing frozen): the top feature doubled, largest |change - graph entry| (indirect effects)",
            exact["live"].gap, "> 0", "report", None),
        Row("float32 graph against float64, largest |entry difference|", exact["f32_gap"], "-", "report", None,
            note="float32 rounding"),
        Row(f"time of the float32 graph ({n_tokens} tokens)", round(seconds, 2), "-", "report", None),
    ]


def _influence(graph, pruned, span: slice, decode) -> dict:
    """Who drives the completion: the influence by kind, the induction path's direct effect, the top nodes, the
    largest kept edges into the logit."""
    infl = graph.influence()
    share = infl / infl.sum()
    labels = graph.labels(decode)
    kinds = graph.kinds()
    by_kind = {k: float(sum(share[i] for i in range(graph.n_nodes) if kinds[i] == k))
               for k in ("feature", "error", "token")}
    earlier = graph.token_node(span.stop - 1)  # the completion's token where the identifier was first written
    induction = float(graph.adjacency[graph.n_nodes - 1, earlier])
    order = [int(i) for i in infl.argsort(descending=True) if graph.kinds()[int(i)] in ("feature", "error")][:6]
    logit = graph.n_nodes - 1
    into = [(labels[int(s)], float(graph.adjacency[logit, s]))
            for s in (graph.adjacency[logit] * pruned.edges[logit]).abs().topk(5).indices]
    return {"share": share, "labels": labels, "by_kind": by_kind, "induction": induction, "order": order, "into": into}


def _notes(paths: dict, eap_top: list, data: dict) -> str:
    labels, share = paths["labels"], paths["share"]
    return ("The most influential feature and error nodes (share of the total influence): "
            + "; ".join(f"{labels[i]} ({float(share[i]):.3f})" for i in paths["order"])
            + ". The largest kept edges into the completion's logit: "
            + "; ".join(f"{lab} {w:+.3f}" for lab, w in paths["into"])
            + f". EAP-IG (m = {IG_STEPS}) on the same prompt, loss on the completion, reference with the first "
            "occurrence randomised, its largest edges: " + "; ".join(f"{lab} {w:+.3f}" for lab, w in eap_top)
            + ". The graph's edges are exact direct effects in the frozen model (attention patterns and norm scales "
            "fixed, features in place of the MLPs); EAP-IG's estimate what patching an edge does in the live model: "
            "two views of one behaviour, features inside the MLPs against heads and edges between components."
            f" The pruned graph, {len(data['nodes'])} nodes and {len(data['links'])} links, is beside this page as "
            "circuit-tracer's graph JSON "
            f"({GRAPH_SLUG}.json and its index graph-metadata.json): circuit-tracer's viewer opens it "
            "(circuit_tracer.frontend.local_server.serve(data_dir=the output folder)).")
