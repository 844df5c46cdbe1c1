"""Issue 64: the certificate measured as far as it is read. ``require(model, helper)`` measures the identities the
helper needs (and, where it reads them, those it adapts to) that are not yet cached under the model's key, each
measurement once; a later helper measures only the rest; ``certify`` measures all. Each identity measured this way
is the one the whole certificate measures (the same verdict and gap, on working and broken models), and the run
from a layer costs one block per layer, not one run per layer."""

from __future__ import annotations

import pytest
import torch

import rs_interp as ri
from rs_interp.exact import _runs
from rs_interp.exact.certificate import ADAPTS, IDENTITIES, NEEDS, require
from tests.builders import make_variant
from tests.mutations import MUTATIONS

METRIC = lambda lg: lg[:, -1, 0].mean()  # noqa: E731


def _model(n_layers=2):
    return make_variant("LN", "standard", False, n_layers=n_layers, act_fn="relu")


def _tokens(seed=0):
    return torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(seed))


def _counting(monkeypatch, name):
    calls = []
    real = getattr(_runs, name)

    def counted(*args, **kwargs):
        calls.append(name)
        return real(*args, **kwargs)

    monkeypatch.setattr(_runs, name, counted)
    return calls


def test_every_identity_is_yielded_by_one_measurement():
    """A new identity needs a line in MEASUREMENTS (and its check); a new helper needs its NEEDS line only."""
    yielded = [n for names in _runs.MEASUREMENTS.values() for n in names]
    assert sorted(yielded) == sorted(set(IDENTITIES) - {"source"})


@pytest.mark.parametrize("helper", ["composition_scores", "attribution_patching", "logit_lens", "ablate_heads"])
def test_require_measures_what_the_helper_reads_and_no_more(helper):
    model = _model()
    cert = require(model, helper, adapts=helper != "attribution_patching")
    reads = set(NEEDS[helper]) | (set(ADAPTS.get(helper, {})) if helper != "attribution_patching" else set())
    measurements = {m for m, names in _runs.MEASUREMENTS.items() if reads & set(names)}
    free = {n for m in measurements if m != "clean run" for n in _runs.MEASUREMENTS[m]}  # a run's other identities
    assert reads <= set(cert.measured()) <= reads | free | {"source"}
    with pytest.raises(KeyError, match="not measured"):
        cert.holds(next(n for n in IDENTITIES if n not in cert.measured()))
    assert "not measured" in cert.table()


def test_a_later_helper_measures_only_the_rest(monkeypatch):
    model = _model()
    rows, gradient, moved = (_counting(monkeypatch, n) for n in ("_rows", "_gradient_run", "_moved_run"))
    first = require(model, "path_patching")  # stream, z, heads, readers; adapts: rows, start at layer
    assert (len(rows), len(gradient), len(moved)) == (1, 1, 1)
    again = require(model, "edge_attribution_patching", adapts=False)  # adds input, projections, gradients
    assert (len(rows), len(gradient), len(moved)) == (1, 1, 1)
    assert all(again[i.name] is i for i in first.identities)  # the cached verdicts, not measured again
    assert require(model, "ablate_heads") is again  # nothing new: the cached certificate itself
    full = ri.certify(model)
    assert full.measured() == tuple(IDENTITIES) and ri.certify(model) is full and len(rows) == 1


def test_the_qk_fix_reads_what_plain_attribution_patching_does_not():
    model = _model()
    tokens, reference = _tokens(0), _tokens(1)
    ri.attribution_patching(model, tokens, METRIC, reference=reference)
    assert "rows" not in require(model, "ablate_heads").measured()
    ri.attribution_patching(model, tokens, METRIC, reference=reference, which="k", qk_fix=True)
    assert {"rows", "scores", "start at layer"} <= set(require(model, "ablate_heads").measured())


#: Helpers whose requires, in this order, split every measurement over several calls.
_ORDER = ["composition_scores", "attribution_patching", "logit_lens", "path_patching"]


@pytest.mark.parametrize("mutation", [None, "heads", "z", "readers", "rows", "start at layer", "mlp weights"])
def test_an_identity_measured_piecewise_is_the_whole_certificates(mutation):
    model = _model()
    if mutation is not None:
        MUTATIONS[mutation](model)
    for helper in _ORDER:
        try:
            require(model, helper)
        except ValueError:
            pass  # a refusal: what it measured is cached all the same
    piecewise = {i.name: i for i in ri.certify(model).identities}
    whole = {i.name: i for i in ri.certify(model, refresh=True).identities}
    assert {n: (i.holds, i.why) for n, i in piecewise.items()} == {n: (i.holds, i.why) for n, i in whole.items()}
    for name, identity in whole.items():
        assert identity.gap == pytest.approx(piecewise[name].gap, rel=1e-6, nan_ok=True), name


def test_the_run_from_a_layer_runs_each_block_once():
    """The clean run and ``start at layer`` together run each block twice (before: once, then once per run from
    every later layer too: L (L + 1) / 2 more), and the run to the logits happens once, from the last layer."""
    model = _model(n_layers=4)
    calls = []
    for block in model.blocks:
        block.register_forward_pre_hook(lambda mod, args, kwargs: calls.append(mod), with_kwargs=True)
    require(model, "ablate_heads")  # the clean run and the z runs: cached, and counted out below
    calls.clear()
    from rs_interp._state import preserve_state
    from rs_interp.exact.stream import mlp_flags

    with preserve_state(model, **mlp_flags(model)):
        measured = _runs.measure(model, 1e-10, ("start at layer",))
    assert measured["start at layer"].holds and len(calls) == 2 * model.cfg.n_layers


@pytest.mark.parametrize("row", range(5))
def test_rows_sees_a_hook_on_any_one_row_index(row):
    """``rows`` reads the clean run's logits and two runs of its own (the probe's rows repeated in another order, 5
    rows; one row alone): a hook that edits row ``row`` of any batch that has it moves a compared row, whichever
    index it is up to the stacked run's last."""
    model = _model()

    def edit(t, hook):
        if t.shape[0] <= row:
            return t
        t = t.clone()
        t[row, -1] += torch.linspace(-1.0, 1.0, t.shape[-1], dtype=t.dtype)
        return t

    from rs_interp._state import preserve_state
    from rs_interp.exact.stream import mlp_flags

    model.add_hook("blocks.0.hook_resid_post", edit)
    with preserve_state(model, **mlp_flags(model)):
        measured = _runs.measure(model, 1e-10, ("rows",))
    assert measured["rows"].holds is False and "rows" in measured["rows"].why


@pytest.mark.parametrize("feature", [None, "gqa"])
def test_head_inputs_sees_a_query_read_across_the_heads_of_one_kv_group(feature, monkeypatch):
    """``head inputs`` moves the first head's q, k and v inputs in one pass; where the keys and values are grouped
    that pass cannot compare the first group's other heads, so a second pass moves the queries alone: a hook that
    lets head 1 read head 0's query (both in KV group 0 with one KV head) is seen either way, in one pass without
    grouping (``calls``)."""
    model = make_variant("RMS", "rotary", False, feature, n_heads=4, d_model=32, act_fn="relu")
    from rs_interp._state import preserve_state
    from rs_interp.exact import _layer_runs
    from rs_interp.exact.stream import mlp_flags

    def mix(t, hook):
        t = t.clone()
        t[:, :, 1] = t[:, :, 1] + 0.5 * t[:, :, 0]
        return t

    calls = []
    real = _layer_runs._head_input_pass
    monkeypatch.setattr(_layer_runs, "_head_input_pass", lambda *a: calls.append(a[3]) or real(*a))
    with preserve_state(model, **mlp_flags(model)):
        clean = _runs.measure(model, 1e-10, ("head inputs",))["head inputs"]
        model.add_hook("blocks.1.attn.hook_q", mix)
        mixed = _runs.measure(model, 1e-10, ("head inputs",))["head inputs"]
    assert clean.holds and mixed.holds is False and "layer 1's" in mixed.why
    assert calls == (["qkv", "q"] * 2 if feature == "gqa" else ["qkv"] * 2)
