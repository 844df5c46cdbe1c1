import pytest
import torch

import rs_interp as ri
from rs_interp.reproduce.expected import EXPECTED


@pytest.fixture(scope="module")
def prev_head(toy2, test_set):
    layer, head = ri.find_prev_token_head(toy2, test_set.tokens[:200])
    assert layer == 0
    return head


def test_keys_from_x0_break_the_circuit(toy2, test_set):
    s = ri.score_logits(ri.run_with_key_input(toy2, test_set.tokens, layer=1), test_set.targets)
    assert EXPECTED["key_ablation.x0_loss"].holds(s.loss) and EXPECTED["key_ablation.x0_accuracy"].holds(s.accuracy)


def test_keeping_the_prev_token_head_restores_it(toy2, test_set, prev_head):
    s = ri.score_logits(ri.run_with_key_input(toy2, test_set.tokens, layer=1, keep=[(0, prev_head)]), test_set.targets)
    assert EXPECTED["key_ablation.prev_head_accuracy"].holds(s.accuracy)


def test_keeping_the_other_head_does_not(toy2, test_set, prev_head):
    other = 1 - prev_head
    s = ri.score_logits(ri.run_with_key_input(toy2, test_set.tokens, layer=1, keep=[(0, other)]), test_set.targets)
    assert EXPECTED["key_ablation.other_head_accuracy"].holds(s.accuracy)


def test_keeping_every_earlier_head_is_the_clean_run(toy2_f64, small_batch):
    """x_0 plus every layer-0 head's write (b_O is zero) is exactly x_1: the run is unchanged."""
    clean = toy2_f64(small_batch.tokens)
    for fn in (ri.run_with_key_input, ri.run_with_query_input):
        patched = fn(toy2_f64, small_batch.tokens, layer=1, keep=[(0, 0), (0, 1)])
        assert (patched - clean).abs().max() < 1e-10


def test_layer0_keys_from_x0_change_nothing(toy2_f64, small_batch):
    patched = ri.run_with_key_input(toy2_f64, small_batch.tokens, layer=0)
    assert (patched - toy2_f64(small_batch.tokens)).abs().max() < 1e-10


def test_query_ablation_moves_the_output(toy2, small_batch):
    patched = ri.run_with_query_input(toy2, small_batch.tokens, layer=1)
    assert (patched - toy2(small_batch.tokens)).abs().max() > 1.0


def test_single_head_ablation(toy2_f64, small_batch):
    """Only the chosen head's key input is replaced: the other head's pattern is untouched."""
    box = {}
    # The certificate runs the hooked model on its probe batch too (hooks are part of the model
    # certified): record this batch's runs only.
    n = small_batch.tokens.shape
    store = lambda t, hook: box.__setitem__(len(box), t) if t.shape[-1] == n[1] and t.shape[0] == n[0] else None  # noqa: E731
    with toy2_f64.hooks(fwd_hooks=[("blocks.1.attn.hook_pattern", store)]):
        toy2_f64(small_batch.tokens)
        ri.run_with_key_input(toy2_f64, small_batch.tokens, layer=1, heads=[(1, 0)])
    clean, patched = box[0], box[1]
    assert (clean[:, 1] - patched[:, 1]).abs().max() < 1e-12
    assert (clean[:, 0] - patched[:, 0]).abs().max() > 0.1


@pytest.mark.parametrize(
    "kwargs,arg",
    [
        (dict(layer=2), "layer"),
        (dict(layer=-1), "layer"),
        (dict(layer=1, keep=[(1, 0)]), "keep"),
        (dict(layer=1, keep=[(0, 2)]), "keep"),
        (dict(layer=1, keep=[(0,)]), "keep"),
        (dict(layer=1, heads=[(1, 5)]), "heads"),
        (dict(layer=1, heads=[(0, 1)]), "not in layer 1"),
        (dict(layer=1, heads=[5]), "heads"),
    ],
)
def test_bad_arguments(toy2, small_batch, kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        ri.run_with_key_input(toy2, small_batch.tokens, **kwargs)
    assert not toy2.cfg.use_split_qkv_input
    assert all(not hp.fwd_hooks for hp in toy2.hook_dict.values())


@pytest.mark.parametrize("fn", [ri.run_with_key_input, ri.run_with_query_input])
@pytest.mark.parametrize("layer", [1, 2])
def test_identity_holds_with_its_condition(random3x3, small_batch, fn, layer):
    """Keeping every earlier head reproduces the clean run only with the layers' b_O kept too
    (random3x3 has every bias nonzero); without them it does not."""
    toks = small_batch.tokens[:4]
    clean = random3x3(toks)
    every = [(l, h) for l in range(layer) for h in range(3)]
    assert (fn(random3x3, toks, layer=layer, keep=every, keep_biases=True) - clean).abs().max() < 1e-10
    assert (fn(random3x3, toks, layer=layer, keep=every) - clean).abs().max() > 1e-3


def test_head_list_meaning(toy2_f64, small_batch):
    """heads and keep are both (layer, head) pairs; a bare pair is one head; numpy and 0-d tensor
    integers work where an int does."""
    import numpy as np

    toks = small_batch.tokens[:4]
    want = ri.run_with_key_input(toy2_f64, toks, layer=1, keep=[(0, 1)], heads=[(1, 0)])
    for keep, heads, layer in [((0, 1), (1, 0), 1), ([(np.int64(0), np.int32(1))], [(np.int64(1), np.int64(0))], np.int64(1)),
                               ([(torch.tensor(0), torch.tensor(1))], [(torch.tensor(1), torch.tensor(0))], torch.tensor(1))]:
        got = ri.run_with_key_input(toy2_f64, toks, layer=layer, keep=keep, heads=heads)
        assert torch.equal(got, want)


@pytest.mark.parametrize("kwargs,message", [
    (dict(keep=[(0, 0), (0, 0)]), "twice"),
    (dict(keep=[(0.5, 0)]), "must be an int"),
    (dict(keep=[(True, 0)]), "must be an int"),
    (dict(keep="00"), "list of"),
    (dict(keep=[(0, 1)], heads=[(1, 0), (1, 0)]), "twice"),
    (dict(heads=[]), "empty"),
    (dict(heads=[(1, 1.0)]), "must be an int"),
    (dict(heads=[0, 1, 0]), "pairs"),
])
def test_head_lists_refuse_ambiguity(toy2, small_batch, kwargs, message):
    with pytest.raises(ValueError, match=message):
        ri.run_with_key_input(toy2, small_batch.tokens[:2], layer=1, **kwargs)
