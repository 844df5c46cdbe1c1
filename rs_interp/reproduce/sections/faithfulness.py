"""Circuit discovery on the shipped models (issue 30): every edge scored by edge attribution
patching, by EAP-IG and exactly by path patching, and the faithfulness of each score's top edges at
MIB's ten circuit sizes, with CPR and CMD."""

from __future__ import annotations

from ...circuits.evaluation import mib_scores
from ...models.code_model import repeated_tokens
from ...models.data import induction_batch
from ...circuits.methods import METHODS
from ...metrics import next_token_loss
from ...plots import faithfulness_figure
from ..context import Context, Section, banded
from .code import _repeat_targets

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
        # every edge method of the registry (rs_interp.circuits.methods)
        scores = {name: m.run(model, tokens, metric, reference=reference, progress=ctx.progress)
                  for name, m in METHODS.items() if m.level == "edge"}
        exact_name = next(name for name, m in METHODS.items() if m.level == "edge" and m.exact)
        mib = {method: mib_scores(model, tokens, metric, s, reference=reference) for method, s in scores.items()}
        curves = {method: m.absolute for method, m in mib.items()}
        layout = scores[exact_name].layout
        exact = scores[exact_name].effect[layout.exists]
        for method, m in mib.items():
            rows.append(banded("faithfulness.cpr", f"{name}, {method}: CPR (area under the curve, edges by signed score)", m.cpr))
            rows.append(banded("faithfulness.cmd", f"{name}, {method}: CMD (area between 1 and the curve, edges by |score|)", m.cmd))
            if method != exact_name:
                estimate = scores[method].effect[layout.exists]
                err = float((estimate - exact).abs().max())
                rows.append(banded("faithfulness.estimate_error", f"{name}, {method}: largest |estimate - exact| over the edges", err))
        rows.append(banded("faithfulness.full_circuit", f"{name}: the circuit of every edge, faithfulness",
                           curves[exact_name].faithfulness[-1]))
        results[name] = {"n_edges": layout.n_edges, "clean": curves[exact_name].clean, "empty": curves[exact_name].empty,
                         "curves": {m: {"fractions": s.absolute.fractions, "faithfulness": s.absolute.faithfulness,
                                        "faithfulness_signed": s.signed.faithfulness, "n_edges": s.absolute.n_edges,
                                        "cpr": s.cpr, "cmd": s.cmd} for m, s in mib.items()},
                         "top_exact": [[list(e), v] for e, v in scores[exact_name].top(5)]}
        figures.append(faithfulness_figure(curves, title=f"{name}: faithfulness of the top edges ({N_PAIRS} pairs)"))
    notes = ("Faithfulness (m(circuit) - m(empty)) / (m(clean) - m(empty)) as MIB computes it (int(f N) edges at each fraction f, "
             "dangling edges pruned; CPR from the edges ranked by signed score, CMD by |score|; the figure: by |score|), "
             "the metric the loss on the induction targets; "
             "ablated edges carry the corrupt run's write (resample). The estimates are exact derivatives; where the "
             "metric is far from linear in a patch (a softmax in between) they miss the exact effect, and the "
             "rows 'largest |estimate - exact|' say by how much.")
    return Section("faithfulness", f"Circuit discovery: faithfulness of EAP, EAP-IG and exact path patching ({N_PAIRS} pairs)",
                   tuple(rows), results, figures=tuple(figures), notes=notes)

