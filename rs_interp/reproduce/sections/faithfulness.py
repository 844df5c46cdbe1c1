"""Circuit discovery on the shipped models (issues 30 and 44): every edge scored by every edge method
of the registry (EAP, EAP-IG, the QK fix, AtP*, the Hessian correction, Gauss-Legendre EAP-IG,
ACDC, exact path patching), the faithfulness of each score's top edges at MIB's ten circuit sizes
with CPR and CMD, each method's cost beside EAP's (matmul FLOPs counted, in forward passes; seconds),
and, for the estimates with per-pair shares, how often their error bars hold the exact effect and
how stable their top edges are under a bootstrap over the pairs."""

from __future__ import annotations

import time

import torch

from ...circuits.evaluation import mib_scores
from ...circuits.ground_truth import counted_flops
from ...circuits.induction_truth import period_spans
from ...circuits.methods import METHODS
from ...circuits.positions import PositionSchema
from ...circuits.uncertainty import Z95, bootstrap
from ...metrics import next_token_loss
from ...models.code_model import repeated_tokens
from ...models.data import induction_batch
from ...ui.plots import faithfulness_figure
from ..context import Context, Section, banded
from .code import _repeat_targets

#: Clean/corrupt pairs per model.
N_PAIRS = 32
#: The models whose positional edges are patched exactly (one patched pass per edge and span): code-2l's, 46 edges in
#: two spans on 32 pairs of 64 tokens, would add a third of this section's time to the main job.
EXACT_POSITIONS = ("induction-2l",)
#: The bootstrap's resamples and the top set it compares.
BOOTSTRAP_RESAMPLES, BOOTSTRAP_TOP = 200, 10


def _cases(ctx: Context) -> dict[str, tuple]:
    """Per model: (model, tokens, reference, metric, spans), the metric the loss on what induction predicts, the spans
    those of the positional methods: a sequence's first period and its repeats (code-2l: its two halves)."""
    toy = ctx.model("induction-2l")
    tokens, targets = ctx.batch.tokens[:N_PAIRS], ctx.batch.targets[:N_PAIRS]
    cases = {"induction-2l": (toy, tokens, induction_batch(N_PAIRS, seed=ctx.seed + 13).tokens,
                              next_token_loss(targets),
                              period_spans(ctx.batch.periods[:N_PAIRS], tokens.shape[1]))}
    code, _ = ctx.code_model()
    half = code.cfg.n_ctx // 2
    clean = repeated_tokens(code.cfg.d_vocab, n=N_PAIRS, half=half, seed=ctx.seed + 41)
    corrupt = repeated_tokens(code.cfg.d_vocab, n=N_PAIRS, half=half, seed=ctx.seed + 42)
    second = (torch.arange(clean.shape[1]) >= half).long().expand_as(clean).clone()
    halves = PositionSchema(("first half", "second half"), second)
    cases["code-2l"] = (code, clean, corrupt, next_token_loss(_repeat_targets(clean, half)), halves)
    return cases


def _flops(fn) -> int:
    """The matmul FLOPs ``fn()`` runs (forward and backward passes alike), counted by PyTorch
    (:func:`rs_interp.circuits.ground_truth.counted_flops`: without module hooks, so the model is not certified
    again)."""
    return counted_flops(fn)[1]


def _run(ctx: Context, method, model, tokens, reference, metric, spans=None) -> tuple:
    """The method's scores (with per-pair shares where it has them), its seconds and its FLOPs."""
    kw = {"per_example": True} if method.shares else {}
    kw |= {"spans": spans} if method.level == "positional" else {}
    flops = _flops(lambda: method.run(model, tokens, metric, reference=reference, **kw))  # also the untimed warm-up
    start = time.perf_counter()
    scores = method.run(model, tokens, metric, reference=reference, progress=ctx.progress, **kw)
    return scores, time.perf_counter() - start, flops


def _error_bar(scores) -> torch.Tensor | None:
    """The result's error bar (± 1.96 standard errors over the pairs), None where it has none."""
    try:
        return scores.error_bar(Z95)
    except (AttributeError, ValueError):
        return None


def _positional(ctx: Context, name: str, case: tuple, scores: dict, eap_run: tuple) -> tuple[list, dict]:
    """The positional methods of the registry on one model (``case``: :func:`_cases`' tuple): MIB's curves of their
    positional edges (CPR, CMD), their cost beside EAP's, and, for the first-order ones, their positional edges summed
    against the same estimate without positions (the identity of :mod:`rs_interp.circuits.positions`)."""
    model, tokens, reference, metric, spans = case
    methods = {n: m for n, m in METHODS.items() if m.level == "positional" and (not m.exact or name in EXACT_POSITIONS)}
    runs = {n: _run(ctx, m, model, tokens, reference, metric, spans) for n, m in methods.items()}
    mib = mib_scores(model, tokens, metric, {n: r[0] for n, r in runs.items()}, reference=reference,
                     progress=ctx.progress)
    plain = {m.key: n for n, m in METHODS.items() if m.level == "edge"}
    rows, out = [], {}
    what = " / ".join(spans.names)
    for method, m in mib.items():
        flops, seconds = runs[method][2], runs[method][1]
        rows.append(banded("faithfulness.cpr", f"{name}, {method}: CPR (positional edges, spans {what})", m.cpr))
        rows.append(banded("faithfulness.cmd", f"{name}, {method}: CMD (positional edges, spans {what})", m.cmd))
        rows.append(banded("faithfulness.cost_passes", f"{name}, {method}: cost (matmul FLOPs) beside EAP's",
                           flops / eap_run[2], note=f"{flops / eap_run[2]:.2f} x EAP's"))
        out[method] = {"cpr": m.cpr, "cmd": m.cmd, "flops_vs_eap": flops / eap_run[2], "seconds": seconds,
                       "faithfulness": m.absolute.faithfulness, "n_edges": m.absolute.n_edges,
                       "spans": list(spans.names)}
        twin = plain.get(METHODS[method].key.removesuffix("-pos"))
        if twin is not None and not METHODS[method].exact:
            whole = scores[twin].effect.nan_to_num(0)
            summed = runs[method][0].total().effect.nan_to_num(0)
            gap = float((summed - whole).abs().max()) / max(float(whole.abs().max()), 1e-300)
            rows.append(banded("faithfulness.positions_sum", f"{name}, {method}: its positional edges summed over the "
                               f"spans against {twin} (largest gap, relative to its largest edge)", gap, theory="0",
                               note="a sum over positions"))
            out[method]["sum_gap"] = gap
    return rows, out


def faithfulness_section(ctx: Context) -> Section:
    """Every edge method of the registry on the induction toy and code-2l: faithfulness curves, cost, error bars."""
    rows, results, figures = [], {}, []
    for name, case in _cases(ctx).items():
        model_rows, results[name], figure = _model(ctx, name, case)
        rows += model_rows
        figures.append(figure)
    notes = ("Faithfulness (m(circuit) - m(empty)) / (m(clean) - m(empty)) as MIB computes it (int(f N) edges at each "
             "fraction f, dangling edges pruned; CPR from the edges ranked by signed score, CMD by |score|; the "
             "figure: by |score|), the metric the loss on the induction targets; ablated edges carry the corrupt run's "
             "write (resample). Cost: the matmul FLOPs PyTorch counts over the whole call (forward, backward and "
             "double-backward passes), in forward passes over the batch, and the seconds of one call on a shared "
             "machine (noisy), each beside EAP's. The estimates are exact derivatives (or exact patches for the QK "
             "fix's pattern, ACDC and path patching); where the metric is far from linear in a patch (here the loss "
             "sits near its minimum on the clean run, and a patch moves it by nats) they miss the exact effect, and "
             "the rows 'largest |estimate - exact|' say by how much. Error bars: ± 1.96 standard errors over the "
             "pairs, from each pair's share of the estimate in the same passes; they measure the sampling spread, not "
             "the linearisation error, so they hold the exact effect only where the estimate is unbiased: the rows say "
             f"how often. Bootstrap: {BOOTSTRAP_RESAMPLES} resamples of the pairs from the shares, the top "
             f"{BOOTSTRAP_TOP} edges against the full sample's.")
    return Section("faithfulness", f"Circuit discovery: faithfulness, cost and error bars of every edge method "
                   f"({N_PAIRS} pairs)", tuple(rows), results, figures=tuple(figures), notes=notes)


#: The method every cost is set beside.
BASE = "EAP"


def _model(ctx: Context, name: str, case: tuple) -> tuple[list, dict, object]:
    """One model: every edge method's curves, cost and errors, then the positional methods; its rows, its entry of
    results.json and its figure."""
    model, tokens, reference, metric, spans = case
    edge_methods = {method: m for method, m in METHODS.items() if m.level == "edge"}
    exact_name = next(method for method, m in edge_methods.items() if m.exact)
    runs = {method: _run(ctx, m, model, tokens, reference, metric) for method, m in edge_methods.items()}
    scores = {method: r[0] for method, r in runs.items()}
    forward = _flops(lambda: model(tokens, return_type="logits"))
    # every method's two curves together: each distinct circuit run once (rs_interp.mib_scores)
    mib = mib_scores(model, tokens, metric, scores, reference=reference, progress=ctx.progress)
    curves = {method: m.absolute for method, m in mib.items()}
    layout = scores[exact_name].layout
    exact = scores[exact_name].effect[layout.exists]
    rows, extra = [], {}
    for method, m in mib.items():
        cost_rows, extra[method] = _cost(name, method, m, runs, forward)
        rows += cost_rows
        if method != exact_name:
            rows += _estimate_rows(ctx, name, method, runs[method][0], layout, exact, extra[method])
    rows.append(banded("faithfulness.full_circuit", f"{name}: the circuit of every edge, faithfulness",
                       curves[exact_name].faithfulness[-1]))
    pos_rows, positional = _positional(ctx, name, case, scores, runs[BASE])
    rows += pos_rows
    result = {"n_edges": layout.n_edges, "clean": curves[exact_name].clean, "empty": curves[exact_name].empty,
              "forward_flops": forward,
              "curves": {m: {"fractions": s.absolute.fractions, "faithfulness": s.absolute.faithfulness,
                             "faithfulness_signed": s.signed.faithfulness, "n_edges": s.absolute.n_edges,
                             "cpr": s.cpr, "cmd": s.cmd} | extra[m] for m, s in mib.items()},
              "top_exact": [[list(e), v] for e, v in scores[exact_name].top(5)], "positional": positional}
    return rows, result, faithfulness_figure(curves, title=f"{name}: faithfulness of the top edges ({N_PAIRS} pairs)")


def _cost(name: str, method: str, m, runs: dict, forward: int) -> tuple[list, dict]:
    """A method's CPR and CMD rows and its cost (forward passes, seconds) beside EAP's."""
    seconds, flops = runs[method][1], runs[method][2]
    passes = flops / forward
    rows = [
        banded("faithfulness.cpr", f"{name}, {method}: CPR (area under the curve, edges by signed score)", m.cpr),
        banded("faithfulness.cmd", f"{name}, {method}: CMD (area between 1 and the curve, edges by |score|)", m.cmd),
        banded("faithfulness.cost_passes", f"{name}, {method}: cost in forward passes (matmul FLOPs / one forward's)",
               passes, note=f"{passes / (runs[BASE][2] / forward):.2f} x EAP's"),
        banded("faithfulness.cost_seconds", f"{name}, {method}: seconds", seconds,
               note=f"{seconds / runs[BASE][1]:.2f} x EAP's"),
    ]
    return rows, {"passes": passes, "flops": flops, "seconds": seconds, "flops_vs_eap": flops / runs[BASE][2],
                  "seconds_vs_eap": seconds / runs[BASE][1]}


def _estimate_rows(ctx: Context, name: str, method: str, s, layout, exact: torch.Tensor, extra: dict) -> list:
    """An estimate against the exact effects: its largest error, how often its error bar holds the exact effect, its
    top edges' stability under a bootstrap, the edges it flags unreliable (each recorded in ``extra`` too)."""
    estimate = s.effect[layout.exists]
    err = float((estimate - exact).abs().max())
    rows = [banded("faithfulness.estimate_error", f"{name}, {method}: largest |estimate - exact| over the edges", err)]
    bar = _error_bar(s)
    if bar is not None:
        held = float(((estimate - exact).abs() <= bar[layout.exists]).double().mean())
        rows.append(banded("faithfulness.calibration", f"{name}, {method}: edges whose exact effect lies within the "
                           f"error bar (± {Z95:.2f} SE over the pairs)", held))
        extra["calibration"] = held
    if getattr(s, "per_example", None) is not None:
        boot = bootstrap(s, n_resamples=BOOTSTRAP_RESAMPLES, k=BOOTSTRAP_TOP, seed=ctx.seed)
        rows.append(banded("faithfulness.bootstrap_jaccard", f"{name}, {method}: top-{BOOTSTRAP_TOP} Jaccard index of "
                           f"{BOOTSTRAP_RESAMPLES} bootstrap resamples of the pairs with the full sample's (mean)",
                           boot.mean_jaccard))
        inclusion = boot.inclusion[layout.exists].tolist()
        extra |= {"bootstrap_jaccard": boot.mean_jaccard,
                  "inclusion": {f"{e[0]} -> {e[1]}": v for e, v in zip(layout.edges(), inclusion)}}
    if getattr(s, "first_order", None) is not None:
        flagged = float((s.reliability()[layout.exists] < 0.5).double().mean())
        rows.append(banded("faithfulness.unreliable", f"{name}, {method}: edges flagged unreliable (reliability < 1/2: "
                           "the second-order term outweighs the first)", flagged))
        extra["unreliable"] = flagged
    return rows
