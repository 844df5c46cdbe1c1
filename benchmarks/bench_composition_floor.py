"""How fast an exact K, Q and V composition of every head pair can be on this machine (issue 64), in one process.

Measures, on GPT-2 small's shape (``ri.load_gpt2("random")``) and the threads the environment gives:

- the float32 and float64 matmul rates (a large square product, and one of ``composition_scores``' own shape);
- the multiply-adds of the per-pair products ``composition_scores`` does (each earlier/later pair's
  ``d_head x d_model x d_head`` product, K, Q and V of the full circuit) and the least time they take at that rate;
- ``composition_scores`` itself (warm), the Gram form ``<X^T X, Y Y^T>`` (packed upper triangles, float32 and
  float64) and TransformerLens's ``all_composition_scores``: the ratio the floor allows against the 30x issue 64
  asks for;
- the Gram form's error where the score is 0 (a source head writing exactly where the later head does not read),
  against the product's: why it is not adopted in float32.

Usage: OMP_NUM_THREADS=2 python benchmarks/bench_composition_floor.py
"""

from __future__ import annotations

import torch
from _child import best_of

import rs_interp as ri
from rs_interp._backend import attn_weight
from rs_interp.heads.composition import _left_factors, _right_factors


def _rates() -> float:
    rate = 0.0
    for dt in (torch.float32, torch.float64):
        a, b = torch.randn(3072, 3072, dtype=dt), torch.randn(3072, 3072, dtype=dt)
        s, _ = best_of(lambda: a @ b, 3)
        c, d = torch.randn(768, 768, dtype=dt), torch.randn(768, 11 * 768, dtype=dt)
        s2, _ = best_of(lambda: c @ d, 3)
        print(f"matmul {dt}: 3072^3 {2 * 3072**3 / s / 1e9:.1f} GFLOP/s; 768 x 768 x 8448 "
              f"{2 * 768 * 768 * 8448 / s2 / 1e9:.1f} GFLOP/s")
        rate = rate or 2 * 3072**3 / s
    return rate


def _gram_form(left, rights, dt):
    """Every pair's score as ``sqrt(<L^T L, R R^T>) / (||L|| ||R||)`` over the packed upper triangles."""
    n, d_head, d_model = left.shape[0] * left.shape[1], left.shape[-2], left.shape[-1]
    iu = torch.triu_indices(d_model, d_model)
    weight = torch.where(iu[0] == iu[1], 1.0, 2.0).to(dt)
    flat = iu[0] * d_model + iu[1]
    lf = left.to(dt).reshape(n, d_head, d_model)
    grams = (lf.transpose(1, 2) @ lf).reshape(n, -1)[:, flat] * weight
    out = {}
    for k, right in rights.items():
        rf = right.to(dt).reshape(n, d_model, -1)
        num = (grams @ (rf @ rf.transpose(1, 2)).reshape(n, -1)[:, flat].T).clamp_min(0).sqrt()
        out[k] = num / lf.pow(2).sum((1, 2)).sqrt()[:, None] / rf.pow(2).sum((1, 2)).sqrt()[None]
    return out


def _zero_scores() -> None:
    torch.manual_seed(0)
    d_model, d_head = 768, 64
    basis = torch.linalg.qr(torch.randn(d_model, d_model, dtype=torch.float64))[0]
    for _ in range(3):  # the left factor in one half of a random basis, the right factor in the other: L R = 0
        lf = torch.randn(d_head, d_model // 2, dtype=torch.float64) @ basis[:, : d_model // 2].T
        rf = basis[:, d_model // 2 :] @ torch.randn(d_model // 2, d_head, dtype=torch.float64)
        l32, r32 = lf.float(), rf.float()
        product = float((l32 @ r32).norm() / (l32.norm() * r32.norm()))
        square = float(((l32.T @ l32) * (r32 @ r32.T)).sum()) / float(l32.norm() ** 2 * r32.norm() ** 2)
        square64 = float(((lf.T @ lf) * (rf @ rf.T)).sum()) / float(lf.norm() ** 2 * rf.norm() ** 2)
        print(f"a score of 0: the product (float32) {product:.1e}; the Gram form (float32) {abs(square) ** 0.5:.1e} "
              f"(its square {square:+.1e}); the Gram form (float64) {abs(square64) ** 0.5:.1e}")


def main() -> None:
    torch.set_grad_enabled(False)
    print(f"torch threads = {torch.get_num_threads()}")
    rate = _rates()
    model = ri.load_gpt2("random")
    L, H = model.cfg.n_layers, model.cfg.n_heads
    W = {n: attn_weight(model, n, H).float() for n in ("W_Q", "W_K", "W_V", "W_O")}
    left = _left_factors(W["W_V"], W["W_O"])
    rights = {k: _right_factors(W["W_Q"], W["W_K"], W["W_V"], W["W_O"], k, True) for k in "kqv"}
    d_head, d_model = left.shape[-2], left.shape[-1]
    macs = sum(H * d_head * d_model * (L - s - 1) * H * rights[k].shape[-1] for k in "kqv" for s in range(L - 1))
    floor = 2 * macs / rate
    print(f"the per-pair products, K + Q + V: {macs / 1e9:.2f} G multiply-adds; at the large matmul's rate {floor:.2f} s")
    ri.composition_scores(model, "k", full_circuit=True)  # the certificate measured: warm calls below
    ours, ref = best_of(lambda: [ri.composition_scores(model, k, full_circuit=True).scores for k in "kqv"], 3)
    print(f"composition_scores, K + Q + V (warm): {ours:.3f} s")
    for dt in (torch.float32, torch.float64):
        s, g = best_of(lambda: _gram_form(left, rights, dt), 2)
        diff = max(float(((g[k].reshape(L, H, L, H) - ref[i].to(dt)) / ref[i].to(dt)).abs().nan_to_num(0).max())
                   for i, k in enumerate("kqv"))
        print(f"the Gram form, {dt}: {s:.3f} s (largest relative difference from composition_scores {diff:.1e})")
    theirs, _ = best_of(lambda: [model.all_composition_scores(k) for k in "KQV"], 1)
    print(f"TransformerLens all_composition_scores, K + Q + V: {theirs:.2f} s; the floor allows at most "
          f"{theirs / floor:.1f}x, composition_scores measures {theirs / ours:.1f}x (issue 64 asks 30x)")
    _zero_scores()


if __name__ == "__main__":
    main()
