"""Head ablation scans, copying scores, and attribution patching against the exact scan."""

from __future__ import annotations

import dataclasses

import torch

from ...circuits.node_attribution import attribution_patching
from ...heads.copying import copying_scores
from ...heads.head_ablation import ablate_heads, head_ablation_scan
from ...heads.roles import prev_token_scores
from ...labels import head_label, head_labels
from ...metrics import next_token_loss
from ...models.data import induction_batch
from ...ui.plots import estimate_vs_exact_figure, head_scan_figure
from ..context import Context, Row, Section, banded, exact_row
from ..expected import PREV_TOKEN_HEAD


def _single_prev_head_row(rise: float, ph: int, other_prev: float) -> Row:
    """Ablating the previous-token head costs the circuit only when no other layer-0 head is one too;
    with two (as in some seeds) the other stands in, and the row is reported, not judged."""
    row = banded("ablation.prev_head_rise", f"prev-token head {head_label(0, ph)} mean-ablated: loss rise", rise)
    if other_prev >= PREV_TOKEN_HEAD:
        return dataclasses.replace(row,
                                   label=row.label + " (another layer-0 head is a previous-token head too: "
                                                     f"{other_prev:.2f}; "
                                   "it stands in, the claim does not apply)", band="n/a", ok=None)
    return row


def ablation_section(ctx: Context) -> Section:
    """Mean ablation of every head, one at a time (a scan), the induction heads together, copying scores."""
    model, batch = ctx.model("induction-2l"), ctx.batch
    tokens = batch.tokens
    loss = next_token_loss(batch.targets)

    prev = prev_token_scores(model, tokens)
    ph = int(prev[0].argmax())
    induction = [(1, h) for h in range(model.cfg.n_heads)]
    scan = head_ablation_scan(model, tokens, loss, ablation="mean", progress=ctx.progress)
    both = float(loss(ablate_heads(model, tokens, induction, ablation="mean"))) - scan.clean
    copying = copying_scores(model)
    top_label, _ = scan.top(1)[0]
    rows = [
        banded("ablation.clean_loss", "clean loss (nats)", scan.clean),
        _single_prev_head_row(float(scan.effect[0, ph]), ph,
                              float(prev[0, [h for h in range(model.cfg.n_heads) if h != ph]].max())),
        exact_row("the costliest single head", top_label, head_label(0, ph), theory="-",
                  note="the theory: the previous-token head"),
    ]
    rows += [banded("ablation.other_layer0_rise", f"head {head_label(0, h)} mean-ablated: loss rise",
                    float(scan.effect[0, h]))
             for h in range(model.cfg.n_heads) if h != ph]
    rows += [banded("ablation.induction_head_rise", f"induction head {head_label(1, h)} mean-ablated alone: loss rise",
                    float(scan.effect[1, h]))
             for h in range(model.cfg.n_heads)]
    rows.append(banded("ablation.both_induction_rise", "both layer-1 heads mean-ablated: loss rise", both))
    rows += [banded("ablation.copying_induction", f"copying score, induction head {head_label(1, h)}",
                    float(copying[1, h])) for h in range(model.cfg.n_heads)]
    rows += [banded("ablation.copying_layer0", f"copying score, head {head_label(0, h)}",
                    float(copying[0, h])) for h in range(model.cfg.n_heads)]
    results = {"clean_loss": scan.clean, "effect": scan.effect.tolist(), "both_induction_heads": both,
               "copying_scores": copying.tolist(), "prev_token_head": [0, ph], "method": scan.ablation}
    figures = (head_scan_figure(scan.effect,
                                title="Mean ablation of each head: rise of the loss at scored positions (nats)",
                                colorbar="nats"),
               head_scan_figure(copying, title="Copying scores of the full OV circuits", colorbar="score"))
    notes = ("Each induction head alone costs little: the two layer-1 heads are redundant, so the pair is the row with "
             "a band. Copying score: sum(eig)/sum(|eig|) of W_E W_V W_O W_U (1 = pure copying).")
    return Section("ablation", "Head ablation: a scan of every head, and copying scores", tuple(rows), results,
                   figures=figures, notes=notes)


def _spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ra, rb = (x.flatten().argsort().argsort().double() for x in (a, b))
    return float(torch.corrcoef(torch.stack([ra, rb]))[0, 1])


def estimate_vs_exact(model, tokens: torch.Tensor, reference: torch.Tensor, metrics: dict, *,
                      title: str) -> tuple[list[Row], dict, list]:
    """For each named metric: the exact resample scan and attribution patching, their rank correlation
    (a row), every head's pair (rows) and a scatter figure. Returns (rows, results by metric, figures)."""
    labels = head_labels(model.cfg.n_layers, model.cfg.n_heads)
    rows, results, figures = [], {}, []
    for name, metric in metrics.items():
        exact = head_ablation_scan(model, tokens, metric, ablation="resample", reference=reference).effect
        estimate = attribution_patching(model, tokens, metric, reference=reference).effect
        rho = _spearman(exact, estimate)
        results[name] = {"exact": exact.tolist(), "estimate": estimate.tolist(), "spearman": rho}
        rows.append(banded("attribution_patching.spearman",
                           f"{name}: rank correlation, estimate vs exact ({len(labels)} heads)", rho))
        rows += [banded("attribution_patching.head", f"{name}: head {lab} exact / estimate", float(e),
                        note=f"estimate {float(s):.3g}")
                 for lab, e, s in zip(labels, exact.flatten(), estimate.flatten())]
        figures.append(estimate_vs_exact_figure(labels, exact.flatten().tolist(), estimate.flatten().tolist(),
                                                title=f"{title}: {name}"))
    return rows, results, figures


def attribution_patching_section(ctx: Context) -> Section:
    """Attribution patching (one backward pass) against the exact resample scan, on the trained toy."""
    model, batch = ctx.model("induction-2l"), ctx.batch
    tokens, scored = batch.tokens[:200], batch.scored[:200]
    reference = induction_batch(200, seed=ctx.seed + 12).tokens  # other random sequences, same periods' statistics
    targets = tokens[:, 1:][scored]

    def correct_logit(logits: torch.Tensor) -> torch.Tensor:
        x = logits[:, :-1][scored].float()
        return (x.gather(-1, targets[:, None])[:, 0] - x.mean(-1)).mean()

    loss = next_token_loss(batch.targets[:200])

    rows, results, figures = estimate_vs_exact(model, tokens, reference,
                                               {"centered logit": correct_logit, "loss": loss},
                                               title="Attribution patching vs the exact resample scan")
    c = results["centered logit"]
    gap = float((torch.tensor(c["exact"])[1] - torch.tensor(c["estimate"])[1]).abs().max())
    rows.insert(1,
                banded("attribution_patching.layer1_gap",
                       "centered logit: layer-1 heads, |estimate - exact| (linear: they write to the logits)", gap))
    notes = ("Where the estimate fails and why: with the loss the clean run sits at the loss's minimum (softmax "
             "saturated, accuracy ~0.97), so every gradient is near 0 whatever the patch does. With the centered logit "
             "the layer-1 heads write straight to the logits, so the estimate is exact; the layer-0 heads act through "
             "layer 1's attention patterns (a softmax), and the first-order estimate misses most of their effect.")
    return Section("attribution_patching", "Attribution patching against the exact scan (trained toy, 200 sequences)",
                   tuple(rows), results,
                   figures=tuple(figures), notes=notes)
