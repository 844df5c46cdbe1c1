"""Circuit discovery on the shipped models (issue 30): every edge scored by edge attribution
patching, by EAP-IG and exactly by path patching, and the faithfulness of each score's top edges at
MIB's ten circuit sizes, with CPR and CMD."""

from __future__ import annotations

from ...circuits import faithfulness_curve
from ...code_model import repeated_tokens
from ...data import induction_batch
from ...edge_attribution import edge_attribution_patching
from ...metrics import next_token_loss
from ...path_patching import path_patching
from ...plots import faithfulness_figure
from ..context import Context, Section, banded
from .code import _repeat_targets

#: EAP-IG's number of points (the issue's m = 5).
IG_STEPS = 5
#: Clean/corrupt pairs per model.
N_PAIRS = 32


def _cases(ctx: Context) -> dict[str, tuple]:
    """Per model: (model, tokens, reference, metric), the metric the loss on what induction predicts."""
    toy = ctx.model("induction-2l")
    tokens, targets = ctx.batch.tokens[:N_PAIRS], ctx.batch.targets[:N_PAIRS]
    cases = {"induction-2l": (toy, tokens, induction_batch(N_PAIRS, seed=ctx.seed + 13).tokens, next_token_loss(targets))}
    code, _ = ctx.code_model()
    half = code.cfg.n_ctx // 2
    clean = repeated_tokens(code.cfg.d_vocab, n=N_PAIRS, half=half, seed=ctx.seed + 41)
    corrupt = repeated_tokens(code.cfg.d_vocab, n=N_PAIRS, half=half, seed=ctx.seed + 42)
    cases["code-2l"] = (code, clean, corrupt, next_token_loss(_repeat_targets(clean, half)))
    return cases


def faithfulness_section(ctx: Context) -> Section:
    """EAP, EAP-IG and exact path patching on the induction toy and code-2l, and their faithfulness curves."""
    rows, results, figures = [], {}, []
    for name, (model, tokens, reference, metric) in _cases(ctx).items():
        scores = {
            "EAP": edge_attribution_patching(model, tokens, metric, reference=reference),
            f"EAP-IG (m = {IG_STEPS})": edge_attribution_patching(model, tokens, metric, reference=reference, ig_steps=IG_STEPS),
            "exact path patching": path_patching(model, tokens, metric, reference=reference, progress=ctx.progress),
        }
        curves = {method: faithfulness_curve(model, s, tokens, metric, reference=reference) for method, s in scores.items()}
        exact = scores["exact path patching"].effect[scores["EAP"].layout.exists]
        for method, c in curves.items():
            rows.append(banded("faithfulness.cpr", f"{name}, {method}: CPR (area under the faithfulness curve)", c.cpr))
            rows.append(banded("faithfulness.cmd", f"{name}, {method}: CMD (area between the curve and 1)", c.cmd))
            if method != "exact path patching":
                estimate = scores[method].effect[scores[method].layout.exists]
                err = float((estimate - exact).abs().max())
                rows.append(banded("faithfulness.estimate_error", f"{name}, {method}: largest |estimate - exact| over the edges", err))
        rows.append(banded("faithfulness.full_circuit", f"{name}: the circuit of every edge, faithfulness",
                           curves["exact path patching"].faithfulness[-1]))
        results[name] = {"n_edges": scores["EAP"].layout.n_edges, "full": curves["EAP"].full, "empty": curves["EAP"].empty,
                         "curves": {m: {"fractions": c.fractions, "faithfulness": c.faithfulness, "cpr": c.cpr, "cmd": c.cmd}
                                    for m, c in curves.items()},
                         "top_exact": scores["exact path patching"].top(5)}
        figures.append(faithfulness_figure(curves, title=f"{name}: faithfulness of the top edges ({N_PAIRS} pairs)"))
    notes = ("Faithfulness (m(circuit) - m(empty)) / (m(full) - m(empty)), the metric the loss on the induction targets; "
             "ablated edges carry the corrupt run's write (resample). The estimates are exact derivatives; where the "
             "metric is far from linear in a patch (a softmax in between) they miss the exact effect, and the "
             "rows 'largest |estimate - exact|' say by how much.")
    return Section("faithfulness", f"Circuit discovery: faithfulness of EAP, EAP-IG and exact path patching ({N_PAIRS} pairs)",
                   tuple(rows), results, figures=tuple(figures), notes=notes)

