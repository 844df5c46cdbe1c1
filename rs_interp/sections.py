"""The theory's tables, computed section by section for ``rs-interp reproduce``.

Each section function returns a :class:`Section`: rows side by side with the theory's value and
the band an issue accepts, the JSON for ``results.json``, and the figures for the report.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import plotly.graph_objects as go
import torch
from transformer_lens import HookedTransformer

from .ablation import run_with_key_input
from .composition import composition_scores
from .attribution_patching import attribution_patching
from .copying import copying_scores
from .data import induction_batch
from .head_ablation import ablate_heads, head_ablation_scan
from .finance import READERS, run_case_study
from .geometry import collapse_cloud, collapse_run
from .gpt2 import analyse_gpt2, conversion_check, find_pretrained_gpt2
from .gradients import gradient_scaling
from .heads import induction_scores, positional_scores, prev_token_scores
from .lens import logit_lens
from .models import as_dtype, load_toy_model, make_attn_only
from .params import count_parameters, gpt2_config
from .paths import path_expansion, path_logit_attribution
from .plots import (
    attention_figure,
    collapse_figure,
    composition_heatmaps,
    estimate_vs_exact_figure,
    finance_figure,
    head_scan_figure,
    layernorm_figure,
    logit_lens_figure,
    parameter_breakdown_figure,
    path_contributions_figure,
    period_sequence,
)
from .training import evaluate, score_logits, test_batch, toy_settings, train_induction_model

__all__ = [
    "Row",
    "Section",
    "Context",
    "induction_section",
    "circuits_section",
    "ablation_section",
    "attribution_patching_section",
    "paths_section",
    "gpt2_section",
    "geometry_section",
    "finance_section",
]


@dataclass(frozen=True)
class Row:
    """One measured quantity: its value, the theory's value and the accepted band."""

    label: str
    value: float | int | str
    theory: str
    band: str
    ok: bool | None  # None: reported, no band

    def formatted(self) -> str:
        v = self.value
        return f"{v:.4g}" if isinstance(v, float) else str(v)


@dataclass(frozen=True)
class Section:
    key: str
    title: str
    rows: tuple[Row, ...]
    results: dict[str, Any]
    figures: tuple[go.Figure, ...] = ()
    notes: str = ""


def band_row(label: str, value: float, theory: str, *, lo: float | None = None, hi: float | None = None) -> Row:
    """A row whose band is ``lo <= value <= hi`` (either bound optional)."""
    parts = []
    if lo is not None and lo == hi:
        parts.append(f"= {lo:g}")
    else:
        if lo is not None:
            parts.append(f">= {lo:g}")
        if hi is not None:
            parts.append(f"<= {hi:g}")
    ok = (lo is None or value >= lo) and (hi is None or value <= hi)
    return Row(label, float(value), theory, " and ".join(parts) or "report", ok if parts else None)


@dataclass
class Context:
    """What the sections share: the trained models and the test batch (loaded or trained once)."""

    retrain: bool = False
    seed: int = 0
    progress: bool = True
    log: Callable[[str], None] = lambda _msg: None
    _models: dict[str, HookedTransformer] = field(default_factory=dict)

    def model(self, name: str) -> HookedTransformer:
        if name not in self._models:
            if self.retrain:
                self.log(f"training {name} (seed {self.seed})")
                self._models[name] = train_induction_model(**toy_settings(name, seed=self.seed), progress=self.progress)
            else:
                self._models[name] = load_toy_model(name)
        return self._models[name]

    @functools.cached_property
    def batch(self):
        """The 1000 held-out test sequences."""
        return test_batch()


def induction_section(ctx: Context) -> Section:
    s2, s1 = evaluate(ctx.model("induction-2l"), ctx.batch), evaluate(ctx.model("induction-1l"), ctx.batch)
    rows = (
        band_row("two layers: loss (nats)", s2.loss, "0.157", hi=0.30),
        band_row("two layers: accuracy", s2.accuracy, "0.974", lo=0.95),
        band_row("one layer: loss (nats)", s1.loss, "4.280", lo=3.5),
        band_row("one layer: accuracy", s1.accuracy, "0.108", hi=0.20),
    )
    results = {"two_layers": {"loss": s2.loss, "accuracy": s2.accuracy},
               "one_layer": {"loss": s1.loss, "accuracy": s1.accuracy}}
    return Section("induction", "Induction: two layers vs one (1000 test sequences)", rows, results)


def circuits_section(ctx: Context) -> list[Section]:
    """Key ablation, head roles and composition scores on the two-layer model (three sections)."""
    model, batch = ctx.model("induction-2l"), ctx.batch
    prev = prev_token_scores(model, batch.tokens)
    ph = int(prev[0].argmax())  # the previous-token head: found from the scores, never by index
    other = [h for h in range(model.cfg.n_heads) if h != ph]
    other_label = " + ".join(f"(0,{h})" for h in other)
    ablations = {
        "keys_from_x0": score_logits(run_with_key_input(model, batch.tokens, layer=1), batch),
        "keys_x0_plus_prev_token_head": score_logits(run_with_key_input(model, batch.tokens, layer=1, keep=[(0, ph)]), batch),
        "keys_x0_plus_other_head": score_logits(run_with_key_input(model, batch.tokens, layer=1, keep=[(0, h) for h in other]), batch),
    }
    a = ablations
    abl_rows = (
        band_row("layer 1's keys read from x_0: loss", a["keys_from_x0"].loss, "6.135", lo=5.0),
        band_row("layer 1's keys read from x_0: accuracy", a["keys_from_x0"].accuracy, "0.075", hi=0.15),
        band_row(f"keys = x_0 + prev-token head (0,{ph}): accuracy", a["keys_x0_plus_prev_token_head"].accuracy, "0.969", lo=0.93),
        band_row(f"keys = x_0 + prev-token head (0,{ph}): loss", a["keys_x0_plus_prev_token_head"].loss, "0.228"),
        band_row(f"keys = x_0 + other head {other_label}: accuracy", a["keys_x0_plus_other_head"].accuracy, "0.084", hi=0.20),
        band_row(f"keys = x_0 + other head {other_label}: loss", a["keys_x0_plus_other_head"].loss, "5.391"),
    )
    key_ablation = Section("key_ablation", "Per-head key ablation (layer 1's key input)", abl_rows,
                           {k: {"loss": v.loss, "accuracy": v.accuracy} for k, v in ablations.items()} | {"prev_token_head": [0, ph]})

    ind = induction_scores(model, batch)
    pos = positional_scores(model, 0, max_offset=model.cfg.n_ctx - 1)
    head_rows = [band_row(f"prev-token head (0,{ph}): weight on i-1", float(prev[0, ph]), "0.887", lo=0.80)]
    for h in range(model.cfg.n_heads):
        head_rows.append(band_row(f"head (1,{h}): weight on i-p+1", float(ind.target[1, h]), ("0.593", "0.594")[h % 2], lo=0.45))
        head_rows.append(band_row(f"head (1,{h}): weight after any earlier occurrence", float(ind.after_occurrence[1, h]), ("0.943", "0.940")[h % 2]))
    head_rows.append(band_row(f"prev-token head (0,{ph}): content-free score at offset 1", float(pos[ph, 1]), "7.783"))
    head_rows.append(band_row(f"prev-token head (0,{ph}): content-free score at offset 0", float(pos[ph, 0]), "6.709"))
    heads = Section("heads", "Head roles on the two-layer model", tuple(head_rows), {
        "prev_token": prev.tolist(), "induction_target": ind.target.tolist(), "after_occurrence": ind.after_occurrence.tolist(),
        "prev_token_head": [0, ph], "positional_score_prev_head": pos[ph].tolist()})

    comp = {k: composition_scores(model, k) for k in "KQV"}
    init = make_attn_only(2, seed=toy_settings("induction-2l", seed=ctx.seed if ctx.retrain else None)["seed"])
    init_k = float(composition_scores(init, "K")[0, :, 1, :].max())
    k_prev = comp["K"][0, ph, 1, :]
    qv_max = float(torch.maximum(comp["Q"][0, ph, 1, :], comp["V"][0, ph, 1, :]).max())
    comp_rows = [band_row(f"K: prev-token head (0,{ph}) -> (1,{h})", float(k_prev[h]), "0.245-0.272", lo=max(qv_max, init_k))
                 for h in range(model.cfg.n_heads)]
    comp_rows.append(band_row(f"max Q and V score of the same pairs", qv_max, "0.036-0.076"))
    comp_rows.append(band_row("max K score at initialisation", init_k, "0.188"))
    composition = Section("composition", "Composition scores (theory's definition)", tuple(comp_rows), {
        k: v[0, :, 1, :].tolist() for k, v in comp.items()} | {"init_max_K": init_k, "prev_token_head": [0, ph]},
        figures=(composition_heatmaps(model),),
        notes="Band of the K rows: above every Q and V score of the same pairs and above the largest K score at initialisation.")
    induction_head = (1, int(ind.target[1].argmax()))
    heads = dataclasses.replace(heads, figures=(attention_figure(model, period_sequence(11, seed=ctx.seed), [(0, ph), induction_head], period=11),))
    return [key_ablation, heads, composition]


def ablation_section(ctx: Context) -> Section:
    """Mean ablation of every head, one at a time (a scan), the induction heads together, copying scores."""
    model, batch = ctx.model("induction-2l"), ctx.batch
    tokens, scored = batch.tokens, batch.scored

    def loss(logits: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits[:, :-1][scored].float(), tokens[:, 1:][scored])

    prev = prev_token_scores(model, tokens)
    ph = int(prev[0].argmax())
    induction = [(1, h) for h in range(model.cfg.n_heads)]
    scan = head_ablation_scan(model, tokens, loss, method="mean", progress=ctx.progress)
    both = float(loss(ablate_heads(model, tokens, induction, method="mean"))) - scan.clean
    copying = copying_scores(model)
    top_label, _ = scan.top(1)[0]
    rows = [
        band_row("clean loss (nats)", scan.clean, "0.157"),
        band_row(f"prev-token head (0,{ph}) mean-ablated: loss rise", float(scan.effect[0, ph]), "-", lo=2.0),
        Row("the costliest single head", top_label, "the prev-token head", f"= L0H{ph}", top_label == f"L0H{ph}"),
    ]
    rows += [band_row(f"head (0,{h}) mean-ablated: loss rise", float(scan.effect[0, h]), "-") for h in range(model.cfg.n_heads) if h != ph]
    rows += [band_row(f"induction head (1,{h}) mean-ablated alone: loss rise", float(scan.effect[1, h]), "-") for h in range(model.cfg.n_heads)]
    rows.append(band_row("both layer-1 heads mean-ablated: loss rise", both, "-", lo=3.0))
    rows += [band_row(f"copying score, induction head (1,{h})", float(copying[1, h]), "-", lo=0.9) for h in range(model.cfg.n_heads)]
    rows += [band_row(f"copying score, head (0,{h})", float(copying[0, h]), "-") for h in range(model.cfg.n_heads)]
    results = {"clean_loss": scan.clean, "effect": scan.effect.tolist(), "both_induction_heads": both,
               "copying_scores": copying.tolist(), "prev_token_head": [0, ph], "method": scan.method}
    figures = (head_scan_figure(scan.effect, title="Mean ablation of each head: rise of the loss at scored positions (nats)", colorbar="nats"),
               head_scan_figure(copying, title="Copying scores of the full OV circuits", colorbar="score"))
    notes = ("Each induction head alone costs little: the two layer-1 heads are redundant, so the pair is the row with a band. "
             "Copying score: sum(eig)/sum(|eig|) of W_E W_V W_O W_U (1 = pure copying).")
    return Section("ablation", "Head ablation: a scan of every head, and copying scores", tuple(rows), results, figures=figures, notes=notes)


def _spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ra, rb = (x.flatten().argsort().argsort().double() for x in (a, b))
    return float(torch.corrcoef(torch.stack([ra, rb]))[0, 1])


def attribution_patching_section(ctx: Context) -> Section:
    """Attribution patching (one backward pass) against the exact resample scan, on the trained toy."""
    model, batch = ctx.model("induction-2l"), ctx.batch
    tokens, scored = batch.tokens[:200], batch.scored[:200]
    reference = induction_batch(200, seed=ctx.seed + 12).tokens  # other random sequences, same periods' statistics
    targets = tokens[:, 1:][scored]

    def correct_logit(logits: torch.Tensor) -> torch.Tensor:
        x = logits[:, :-1][scored].float()
        return (x.gather(-1, targets[:, None])[:, 0] - x.mean(-1)).mean()

    def loss(logits: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits[:, :-1][scored].float(), targets)

    rows, results, figures = [], {}, []
    for name, metric in (("centered logit", correct_logit), ("loss", loss)):
        exact = head_ablation_scan(model, tokens, metric, method="resample", reference=reference).effect
        estimate = attribution_patching(model, tokens, metric, reference=reference).values
        rho = _spearman(exact, estimate)
        results[name] = {"exact": exact.tolist(), "estimate": estimate.tolist(), "spearman": rho}
        rows.append(band_row(f"{name}: rank correlation, estimate vs exact (4 heads)", rho, "-"))
        if name == "centered logit":
            gap = float((exact[1] - estimate[1]).abs().max())
            rows.append(band_row("centered logit: layer-1 heads, |estimate - exact| (linear: they write to the logits)", gap, "0", hi=1e-3))
        for l in range(model.cfg.n_layers):
            for h in range(model.cfg.n_heads):
                rows.append(band_row(f"{name}: head ({l},{h}) exact / estimate", float(exact[l, h]), f"{float(estimate[l, h]):.3g} (estimate)"))
        labels = [f"L{l}H{h}" for l in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]
        figures.append(estimate_vs_exact_figure(labels, exact.flatten().tolist(), estimate.flatten().tolist(),
                                                title=f"Attribution patching vs the exact resample scan: {name}"))
    notes = ("Where the estimate fails and why: with the loss the clean run sits at the loss's minimum (softmax saturated, "
             "accuracy ~0.97), so every gradient is near 0 whatever the patch does. With the centered logit the layer-1 heads "
             "write straight to the logits, so the estimate is exact; the layer-0 heads act through layer 1's attention "
             "patterns (a softmax), and the first-order estimate misses most of their effect.")
    return Section("attribution_patching", "Attribution patching against the exact scan (trained toy, 200 sequences)", tuple(rows), results,
                   figures=tuple(figures), notes=notes)


def paths_section(ctx: Context) -> list[Section]:
    model, batch = ctx.model("induction-2l"), ctx.batch
    m64 = as_dtype(model, torch.float64)
    err = 0.0
    for chunk in batch.tokens.split(100):  # (path, 100, pos, d_vocab) in float64 is ~90 MB; all 1000 would be ~0.9 GB
        pe = path_expansion(m64, chunk)
        with torch.no_grad():
            err = max(err, float((pe.total() - m64(chunk)).abs().max()))
    att = path_logit_attribution(model, batch)
    share = float(att.share_ending_in(model.cfg.n_layers - 1).median())
    seq = period_sequence(11, seed=ctx.seed)
    pos = seq.shape[1] - 2  # the last position with a next token
    one = path_expansion(model, seq, targets=seq.roll(-1, 1))
    fig = path_contributions_figure(one.labels, one.contributions[:, 0, pos].tolist(),
                                    title=f"The correct token's logit at position {pos} (period 11), split into its {len(one.labels)} paths")
    paths = Section("paths", "Theorem 3: the path expansion", (
        Row("number of paths", len(pe.labels), "9", "= 9", len(pe.labels) == 9),
        band_row("max |path sum - logits| (float64)", err, "2e-14", hi=1e-10),
        band_row("median share of layer-1-ending paths", share, "> 0.90", lo=0.80),
        band_row("direct + layer-0 paths rank correct first", att.top1_without_last_layer, "< 0.05", hi=0.10),
    ), {"n_paths": len(pe.labels), "max_abs_error": err, "layer1_share_median": share,
        "direct_or_layer0_top1_rate": att.top1_without_last_layer, "labels": list(pe.labels)}, figures=(fig,))
    targets = torch.cat([batch.tokens[:, 1:], torch.full_like(batch.tokens[:, :1], -1)], 1)
    lens = logit_lens(model, batch.tokens, targets=targets, batch_chunk=250, row_chunk=4096)
    mask = torch.cat([batch.scored, torch.zeros_like(batch.scored[:, :1])], 1)
    p = [float(lens.target_probs[i][mask].mean()) for i in range(len(lens.labels))]
    theory, bands = ("0.004", "0.004", "0.958"), (dict(hi=0.01), dict(hi=0.01), dict(lo=0.90))
    names = ("after the embedding", "after layer 0", "after layer 1")
    lens_rows = tuple(band_row(f"P(correct) {n}", v, t, **b) for n, v, t, b in zip(names, p, theory, bands))
    lens_fig = logit_lens_figure(lens.labels, {"P(correct), mean over scored positions": p}, chance=1 / model.cfg.d_vocab,
                                 title="Logit lens on the two-layer model: the answer exists only after layer 1")
    return [paths, Section("logit_lens", "The logit lens on the two-layer model", lens_rows, {"p_correct": p, "labels": list(lens.labels)},
                           figures=(lens_fig,))]


def gpt2_section(ctx: Context) -> Section:
    """GPT-2 small: the exact parameter count, the offline conversion check, and (with real weights) Paris."""
    pc = count_parameters(gpt2_config("small"))
    expected = {"token_embedding": 38_597_376, "positional_embedding": 786_432, "attention": 28_348_416,
                "mlp": 56_669_184, "layernorm": 38_400}
    rows = [Row(f"parameters: {k}", v, f"{expected[k]:,}", "exact", v == expected[k]) for k, v in pc.by_category.items()]
    rows.append(Row("parameters: total", pc.total, "124,439,808", "exact", pc.total == 124_439_808))
    ctx.log("GPT-2: converting a random-weight Hugging Face checkpoint")
    diff = conversion_check(seed=ctx.seed)
    rows.append(band_row("conversion: max |centered logit diff| vs Hugging Face", diff, "-", hi=1e-4))
    ctx.log("GPT-2: looking for pretrained weights")
    model, why = find_pretrained_gpt2()
    results: dict[str, Any] = {"parameters": dict(pc.by_category, total=pc.total, per_layer=pc.per_layer,
                                                  unembed_bias_not_in_checkpoint=pc.unembed_bias),
                               "conversion_max_abs_diff": diff, "weights": "pretrained" if model is not None else "random",
                               "weights_note": why}
    if model is not None:
        a = analyse_gpt2(model, weights="pretrained", source=why, seed=ctx.seed)
        rows.append(Row("top prediction for 'The Eiffel Tower is in the city of'", repr(a.final_top_token), "' Paris'",
                        "= ' Paris'", a.final_top_token == " Paris"))
        results |= {"lens_p_paris": dict(zip(a.lens_labels, a.lens_p_answer)), "top_induction": list(a.top_induction),
                    "top_prev_token": list(a.top_prev_token)}
    notes = f"Weights: {results['weights']} ({why})"
    figures = [parameter_breakdown_figure(pc.by_category)]
    if model is not None:
        figures.append(logit_lens_figure(a.lens_labels, {"P(' Paris')": a.lens_p_answer}, title="GPT-2 small: logit lens on 'The Eiffel Tower is in the city of'"))
    return Section("gpt2", "GPT-2 small: parameters, conversion, weights", tuple(rows), results, figures=tuple(figures), notes=notes)


def geometry_section(ctx: Context) -> Section:
    """Collapse and the skip, and the pre-LN vs post-LN gradient table."""
    X0 = collapse_cloud(ctx.seed)
    betas = (0.25, 0.5, 1.0, 2.0, 4.0)
    runs = [collapse_run(X0, b, skip=s) for b in betas for s in (False, True)]
    pure = {r.beta: r for r in runs if not r.skip}
    skip = {r.beta: r for r in runs if r.skip}
    theory_tau = dict(zip(betas, ("0.188", "0.369", "0.667", "0.940", "0.999")))
    rows = [band_row(f"β = {b:g}: τ of the first layer", float(pure[b].tau[0]), theory_tau[b]) for b in betas]
    bound_ok = all(bool((r.diameter <= r.bound + 1e-12).all()) for r in pure.values())
    rows.append(Row("pure stack: diameter under the Theorem 1 bound at every layer", str(bound_ok), "holds", "True", bound_ok))
    never = all(bool((r.diameter[1:] >= r.diameter[:-1] - 1e-12).all()) for r in skip.values())
    rows.append(Row("with the skip: the diameter never shrinks", str(never), "holds", "True", never))
    for b in betas:
        rows.append(band_row(f"β = {b:g}: pure stack, diameter at layer 12", float(pure[b].diameter[-1]), "1.997" if b == 4 else "< 1e-10"))
    for b in betas:
        rows.append(band_row(f"β = {b:g}: with the skip, diam(X_12) / diam(X_0)", float(skip[b].diameter[-1] / skip[b].diameter[0]),
                             "3.58" if b == 0.25 else "-", lo=1.0))
    rows.append(band_row("β = 0.25: with the skip, relative spread at layer 12", float(skip[0.25].relative_spread[-1]), "0.0016"))
    ctx.log("geometry: pre-LN vs post-LN gradients (3 depths x 8 draws)")
    grads = gradient_scaling((6, 12, 24), n_draws=8, seed=ctx.seed)
    r6, r12, r24 = grads
    posts = [r.post_ln_last for r in grads]
    prods = [r.pre_ln_last * r.pre_ln_stream_norm for r in grads]
    theory_pre, theory_post, theory_norm = ("10.169", "7.673", "5.218"), ("22.019", "23.416", "22.718"), ("24.659", "33.641", "49.281")
    for r, tp, tq, tn in zip(grads, theory_pre, theory_post, theory_norm):
        rows.append(band_row(f"L = {r.depth}: pre-LN last ||dL/dW_2||_F", r.pre_ln_last, tp))
        rows.append(band_row(f"L = {r.depth}: post-LN last ||dL/dW_2||_F", r.post_ln_last, tq))
        rows.append(band_row(f"L = {r.depth}: pre-LN ||x_L||", r.pre_ln_stream_norm, tn))
    rows += [
        band_row("pre-LN fall from L = 6 to 24", r6.pre_ln_last / r24.pre_ln_last, "1.95", lo=1.5, hi=2.5),
        band_row("post-LN max/min across depths", max(posts) / min(posts), "flat", hi=1.25),
        band_row("post-LN / pre-LN at L = 24", r24.post_ln_last / r24.pre_ln_last, "4.35", lo=2.5),
        band_row("(pre-LN gradient) x ||x_L||: max/min across depths", max(prods) / min(prods), "257/251 = 1.02", hi=1.15),
        band_row("first block's gradient, L = 24 / L = 6", r24.pre_ln_first / r6.pre_ln_first, "23.904/23.403 = 1.02", lo=1.0),
    ]
    results = {
        "gradient_table": [{"depth": r.depth, "pre_ln_last": r.pre_ln_last, "post_ln_last": r.post_ln_last,
                            "pre_ln_first": r.pre_ln_first, "pre_ln_stream_norm": r.pre_ln_stream_norm} for r in grads],
        "tau_first_layer": {str(b): float(pure[b].tau[0]) for b in betas},
        "collapse_diameter_layer12": {str(b): {"pure": float(pure[b].diameter[-1]), "skip": float(skip[b].diameter[-1])} for b in betas},
        "relative_spread_layer12_skip": {str(b): float(skip[b].relative_spread[-1]) for b in betas},
        "cloud": {"seed": ctx.seed, "diameter": float(pure[0.25].diameter[0])},
    }
    notes = (f"Cloud: ten tokens in the plane, torch.randn(10, 2) seeded with {ctx.seed} (diameter "
             f"{float(pure[0.25].diameter[0]):.3f}; the theory's cloud is not published, its numbers are not targets). "
             "Gradients: d = 64, 4 heads, ReLU MLP of width 256, RMS over 8 draws, float64.")
    return Section("geometry", "Residual-stream geometry: collapse, the skip, pre-LN vs post-LN", tuple(rows), results,
                   figures=(collapse_figure(runs), layernorm_figure()), notes=notes)


def finance_section(ctx: Context) -> Section:
    """The five readers on seen and unseen companies, and the demo filing."""
    ctx.log("finance: generating the corpus and training the filing model")
    res = run_case_study(seed=ctx.seed, induction_1l=ctx.model("induction-1l"), induction_2l=ctx.model("induction-2l"),
                         progress=ctx.progress)
    theory = {"bigram table": ("0.576", "0.000"), "filing-trained model, direct path": ("0.717", "0.000"),
              "filing-trained model": ("0.814", "0.000"), "induction model, one layer": ("0.056", "0.071"),
              "induction model, two layers": ("0.710", "0.768")}
    bands = {"bigram table": (dict(lo=0.40), dict(lo=0.0, hi=0.0)), "filing-trained model, direct path": ({}, dict(hi=0.05)),
             "filing-trained model": (dict(lo=0.60), dict(hi=0.05)), "induction model, one layer": (dict(hi=0.20), dict(hi=0.20)),
             "induction model, two layers": (dict(lo=0.55), dict(lo=0.60))}
    rows = []
    for r in READERS:
        rows.append(band_row(f"{r}: seen companies", res.seen[r], theory[r][0], **bands[r][0]))
        rows.append(band_row(f"{r}: unseen companies", res.unseen[r], theory[r][1], **bands[r][1]))
    rows.append(Row("queries: seen / unseen", f"{res.n_queries['seen']} / {res.n_queries['unseen']}", "269 / 336", "report", None))
    demo = {r: f"{sum(v)} of {len(v)}" for r, v in res.demo.items()}
    for r in READERS:
        rows.append(Row(f"demo filing: {r}", demo[r], "11 of 12" if r == "induction model, two layers" else "0", "report", None))
    results = {"seen": res.seen, "unseen": res.unseen, "n_queries": res.n_queries,
               "demo": {"queries": list(res.demo_queries), "completed": {r: v for r, v in res.demo.items()}}}
    return Section("finance", "Finance case study: completing company names by induction", tuple(rows), results,
                   figures=(finance_figure(res.seen, res.unseen),),
                   notes="Synthetic filings (seeded, generated in-process); words hashed to 256 symbols by CRC-32.")
