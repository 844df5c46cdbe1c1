"""The default circuit of a faithfulness curve (issue 61 item 3): :func:`smallest_recovering` picks the fewest edges
reaching the share, and :func:`circuit_at` without a fraction is the curve's own circuit there, in its ranking and its
metric's direction (other choices of edge are tested with the curve, in tests/circuits/test_evaluation.py)."""

from types import SimpleNamespace

import pytest
import torch

import rs_interp as ri
from rs_interp.circuits.selection import circuit_at, prune, smallest_recovering


def _curve(faithfulness, n_edges, fractions=None):
    fractions = fractions or tuple((k + 1) / len(n_edges) for k in range(len(n_edges)))
    return SimpleNamespace(faithfulness=tuple(faithfulness), n_edges=tuple(n_edges), fractions=fractions,
                           ranking="absolute", higher_is_better=None)


@pytest.mark.parametrize("faith, edges, want", [
    ((0.1, 0.85, 0.7, 1.0), (2, 5, 9, 20), 1),                  # the first crossing
    ((0.1, 0.7, 0.95, 0.9), (2, 9, 5, 20), 2),                   # the fewest edges, not the first fraction
    ((float("nan"), 0.3, 0.8, 1.0), (1, 4, 6, 20), 2),           # NaN never reaches; exactly the share does
    ((0.2, 0.9, 0.9, 1.0), (2, 7, 7, 20), 1),                    # equal sizes: the smaller fraction
])
def test_the_smallest_circuit_reaching_the_share(faith, edges, want):
    assert smallest_recovering(_curve(faith, edges)) == want


def test_refusals():
    with pytest.raises(ValueError, match=r"No circuit on this faithfulness curve recovers 80% .*the best: 0.700"):
        smallest_recovering(_curve((0.1, 0.7, float("nan")), (1, 2, 3)))
    for share in (0, 1.5, True, "0.8"):
        with pytest.raises(ValueError, match=r"share must be a number in \(0, 1\]"):
            smallest_recovering(_curve((1.0,), (1,)), share)
    model = ri.models.make_attn_only(1, n_heads=1, d_model=8, d_head=8, d_vocab=10, n_ctx=4)
    scores = ri.circuits.EdgeEffects(ri.edge_layout(model), torch.zeros(ri.edge_layout(model).exists.shape), 0.0)
    with pytest.raises(ValueError, match="circuit_at needs a fraction of the edges, or curve="):
        circuit_at(scores)


@pytest.fixture(scope="module")
def signed_curve():
    """induction-2l's EAP scores of the negative loss (higher is better) and their curve ranked by signed score."""
    model = ri.load_toy_model("induction-2l")
    a, b = ri.induction_batch(16, seed=0), ri.induction_batch(16, seed=1)

    loss = ri.next_token_loss(a.targets)
    metric = lambda logits: -loss(logits)  # noqa: E731  (higher is better)

    eap = ri.edge_attribution_patching(model, a.tokens, metric, reference=b.tokens)
    curve = ri.faithfulness_curve(model, a.tokens, metric, eap, reference=b.tokens, ranking="signed",
                                  higher_is_better=True, fractions=tuple(k / 10 for k in range(1, 11)))
    return eap, curve


def test_the_default_is_the_curve_s_own_circuit_in_its_direction(signed_curve):
    """Without a fraction, circuit_at is the curve's circuit at its smallest point recovering 80%, in the curve's
    ranking and direction: the curve's pruned size, and the selection made apart by rank (the edges by -effect, the
    largest first, while the budget holds, then pruned). It took the caller's default direction (a loss) before,
    another circuit on a signed curve."""
    eap, curve = signed_curve
    k = smallest_recovering(curve)
    keep = circuit_at(eap, curve=curve)
    assert curve.faithfulness[k] >= 0.8 and int(keep.sum()) == curve.n_edges[k]
    layout = eap.layout
    rows, cols = layout.exists.nonzero(as_tuple=True)
    effect = eap.effect[rows, cols].tolist()
    order = sorted(range(len(effect)), key=lambda i: (effect[i], i))  # best first: the smallest effect
    budget = int(curve.fractions[k] * float(ri.circuits.selection.mib_weights(layout)[layout.exists].sum()))
    weights, taken, total = ri.circuits.selection.mib_weights(layout)[layout.exists].tolist(), [], 0.0
    for i in order:
        if total + weights[i] > budget:
            break
        taken.append(i)
        total += weights[i]
    apart = torch.zeros_like(layout.exists)
    apart[rows[taken], cols[taken]] = True
    assert torch.equal(keep, prune(layout, apart))
    # what makes this a test of the direction: here the other direction's circuit at that fraction is another
    assert k < len(curve.fractions) - 1
    assert not torch.equal(keep, circuit_at(eap, curve.fractions[k], ranking="signed", higher_is_better=False))
    with pytest.raises(ValueError, match="higher_is_better=False disagrees with the curve's signed ranking"):
        circuit_at(eap, curve=curve, higher_is_better=False)
