"""The tracr programs' pair sets: rows of different lengths, never the BOS, drawn by a seed, every position or
one, only the changed reads, the kinds of pairs; refusals."""

from __future__ import annotations

import pytest

from rs_interp.variables import tracr_causal_model, tracr_pairs


def test_pair_sets():
    pairs = tracr_pairs("tracr-reverse", "length_5", n=12, seed=0)
    assert len(pairs.groups()) > 1 and bool((pairs.base_positions >= 1).all())  # lengths differ; never the BOS
    cm = tracr_causal_model("tracr-reverse")
    assert tracr_pairs("tracr-reverse", "length_5", n=12, seed=0).labels.tolist() == pairs.labels.tolist()
    every = tracr_pairs("tracr-sort", "target_pos_3", n=6, seed=0, every_position=True, changed_only=True)
    assert every.base_positions is None and bool((every.labels != every.base_labels).all())
    aligned = tracr_pairs("tracr-hist", "hist_1", n=4, seed=0, mix="aligned")
    assert not bool(aligned.several.any())
    with pytest.raises(ValueError, match="no variable"):
        tracr_pairs("tracr-hist", "nope")
    with pytest.raises(ValueError, match="aligned pairs"):
        tracr_pairs("tracr-reverse", "opp_idx_4", n=2, mix="aligned")  # opp_idx is its local parents' function
    assert cm.output == "reverse_1"
