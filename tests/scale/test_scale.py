"""Issue #45, items 1 and 2: every dataset-level analysis streamed over batches equals one call on the
concatenated batch (float64, 1e-10), on code-2l and on a 4-layer model with MLPs, 37 pairs in batches
of 8 (the last one 5): node and edge attribution patching, EAP-IG and the trust options that stream
(the QK fix, the Hessian correction, key nodes), the zero and resample scans, exact path patching,
a circuit's metric, faithfulness curves and MIB's scores, DLA, the logit lens and the lenses' KL.
Uneven batches weigh by their metric's units, never a mean of means; a run killed mid-way resumes
from its file to the uninterrupted run's result, bit for bit; what cannot be combined exactly is
refused by name; torch.distributed is never initialised outside torchrun.

The one-call results are cached per case (:func:`one_call`): tests/scale/test_distributed.py compares the
ranks' results with the same ones."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

import rs_interp as ri
from rs_interp import scale
from rs_interp.scale.pairs import _from_task
from rs_interp.scale.summaries import _targets
from rs_interp.tasks import induction_task
from tests.builders import make_variant

N, BATCH = 37, 8


@functools.lru_cache(maxsize=None)
def case(name: str, dtype: torch.dtype = torch.float64):
    """(model, task): code-2l (GPT-2's architecture, trained) or a random 4-layer LN model with MLPs, 37 pairs."""
    if name == "code-2l":
        model = ri.as_dtype(ri.load_toy_model("code-2l"), dtype)
        return model, induction_task(N, seed=0, d_vocab=model.cfg.d_vocab, seq_len=16, min_period=3, max_period=7)
    model = make_variant("LN", "standard", False, n_layers=4, seed=3, dtype=dtype)
    return model, induction_task(N, seed=1, d_vocab=model.cfg.d_vocab, seq_len=12, min_period=3, max_period=6)


#: analysis -> (streamed call's options, one call on the concatenated batch)
def _eap(model, task, **kw):
    return ri.edge_attribution_patching(model, task.clean, task.metric(), reference=task.corrupted, **kw)


ONE_CALL = {
    "atp": lambda m, t: ri.attribution_patching(m, t.clean, t.metric(), reference=t.corrupted),
    "eap": lambda m, t: _eap(m, t),
    "eap_ig": lambda m, t: _eap(m, t, ig_steps=3),
    "eap_qk_fix": lambda m, t: _eap(m, t, qk_fix=True),
    "eap_hessian": lambda m, t: _eap(m, t, ig_steps=2, ig_rule="right", correction="hessian"),
    "relp": lambda m, t: ri.edge_relevance_patching(m, t.clean, t.metric(), reference=t.corrupted),
    "atp_k_qk_fix": lambda m, t: ri.attribution_patching(m, t.clean, t.metric(), reference=t.corrupted, which="k", qk_fix=True),
    "scan_zero": lambda m, t: ri.head_ablation_scan(m, t.clean, t.metric(), ablation="zero"),
    "scan_resample": lambda m, t: ri.head_ablation_scan(m, t.clean, t.metric(), ablation="resample", reference=t.corrupted),
    "path_patching": lambda m, t: ri.path_patching(m, t.clean, t.metric(), reference=t.corrupted),
    "path_patching_some": lambda m, t: ri.path_patching(m, t.clean, t.metric(), reference=t.corrupted, edges=_some_edges(m)),
    "curve": lambda m, t: ri.faithfulness_curve(m, t.clean, t.metric(), one_call(_name(m), "eap", m.cfg.dtype), reference=t.corrupted),
    "curve_3": lambda m, t: ri.faithfulness_curve(m, t.clean, t.metric(), one_call(_name(m), "eap", m.cfg.dtype), reference=t.corrupted,
                                                  fractions=(0.05, 0.5, 1.0)),
    "mib": lambda m, t: ri.mib_scores(m, t.clean, t.metric(), one_call(_name(m), "eap", m.cfg.dtype), reference=t.corrupted,
                                      fractions=(0.05, 0.5, 1.0)),
    "circuit": lambda m, t: ri.evaluate_circuit(m, t.clean, t.metric(), _circuit(m), reference=t.corrupted),
    "dla": lambda m, t: ri.direct_logit_attribution(m, t.clean, **dict(zip(("targets", "contrast"), _targets(_from_task(t), True)))),
    "lens": lambda m, t: _lens_numbers(ri.logit_lens(m, t.clean, targets=_targets(_from_task(t), False)[0]), t),
    "lens_kl": lambda m, t: ri.lens_kl(m, t.clean),
}

STREAMED = {
    "atp": lambda m, t, **kw: scale.attribution_patching(m, t, **kw),
    "eap": lambda m, t, **kw: scale.edge_attribution_patching(m, t, **kw),
    "eap_ig": lambda m, t, **kw: scale.edge_attribution_patching(m, t, ig_steps=3, **kw),
    "eap_qk_fix": lambda m, t, **kw: scale.edge_attribution_patching(m, t, qk_fix=True, **kw),
    "eap_hessian": lambda m, t, **kw: scale.edge_attribution_patching(m, t, ig_steps=2, ig_rule="right", correction="hessian", **kw),
    "relp": lambda m, t, **kw: scale.edge_relevance_patching(m, t, **kw),
    "atp_k_qk_fix": lambda m, t, **kw: scale.attribution_patching(m, t, which="k", qk_fix=True, **kw),
    "scan_zero": lambda m, t, **kw: scale.head_ablation_scan(m, t, ablation="zero", **kw),
    "scan_resample": lambda m, t, **kw: scale.head_ablation_scan(m, t, ablation="resample", **kw),
    "path_patching": lambda m, t, **kw: scale.path_patching(m, t, **kw),
    "path_patching_some": lambda m, t, **kw: scale.path_patching(m, t, edges=_some_edges(m), **kw),
    "curve": lambda m, t, **kw: scale.faithfulness_curve(m, t, one_call(_name(m), "eap", m.cfg.dtype), **kw),
    "curve_3": lambda m, t, **kw: scale.faithfulness_curve(m, t, one_call(_name(m), "eap", m.cfg.dtype), fractions=(0.05, 0.5, 1.0), **kw),
    "mib": lambda m, t, **kw: scale.mib_scores(m, t, one_call(_name(m), "eap", m.cfg.dtype), fractions=(0.05, 0.5, 1.0), **kw),
    "circuit": lambda m, t, **kw: scale.evaluate_circuit(m, t, _circuit(m), **kw),
    "dla": lambda m, t, **kw: scale.direct_logit_attribution(m, t, **kw),
    "lens": lambda m, t, **kw: scale.logit_lens(m, t, **kw),
    "lens_kl": lambda m, t, **kw: scale.lens_kl(m, t, **kw),
}


def _name(model) -> str:
    return "code-2l" if model.cfg.d_vocab == 2048 else "4l"


def _some_edges(model):
    """Every edge into the last layer's first head and into the logits: exact path patching on fewer passes."""
    last = model.cfg.n_layers - 1
    return [e for e in ri.edge_layout(model).edges() if e[1] in ("logits", f"L{last}H0.q", f"L{last}H0.k", f"L{last}H0.v")]


def _circuit(model):
    return ri.top_edges(one_call(_name(model), "eap", model.cfg.dtype), 12)


@functools.lru_cache(maxsize=None)
def one_call(name: str, analysis: str, dtype: torch.dtype = torch.float64):
    model, task = case(name, dtype)
    return ONE_CALL[analysis](model, task)


def numbers(result, analysis: str) -> dict[str, torch.Tensor]:
    """The numbers of a result, float64, NaN as 0 (edges off the graph): what the comparisons read."""
    if analysis == "dla":
        if isinstance(result, ri.readouts.DirectLogitAttribution):
            return {"mean": result.mean(), "clean": result.clean}
        return {"mean": result.mean, "clean": result.clean}
    if isinstance(result, dict):
        return result
    if analysis == "lens":
        return {"entropy": result.entropy, "target_prob": result.target_prob, "accuracy": result.accuracy}
    if analysis == "mib":
        return {"cpr": result.cpr, "cmd": result.cmd, **{f"s.{k}": v for k, v in numbers(result.signed, "curve").items()},
                **{f"a.{k}": v for k, v in numbers(result.absolute, "curve").items()}}
    if isinstance(result, (float, torch.Tensor)):
        return {"value": result}
    out = {}
    for f in dataclasses.fields(result):
        v = getattr(result, f.name)
        if isinstance(v, (float, torch.Tensor)) or (isinstance(v, tuple) and v and isinstance(v[0], float)):
            out[f.name] = v
    return out


def _lens_numbers(readings, task) -> dict[str, torch.Tensor]:
    """What the lens summary reads, from one call's readings: the mean entropy over every position,
    the target's mean probability and how often it is the top token, over the read positions."""
    rows = torch.arange(len(task))
    probs, top = readings.target_probs[:, rows, task.positions], readings.top_tokens[:, rows, task.positions, 0]
    return {"entropy": readings.entropy.double().mean((1, 2)), "target_prob": probs.double().mean(-1),
            "accuracy": (top == task.answers[:, 0]).double().mean(-1)}


def gap(a, b) -> float:
    """The largest absolute difference between two results' numbers (the same keys, NaN as 0)."""
    assert a.keys() == b.keys()
    t = lambda v: torch.as_tensor(v, dtype=torch.float64).nan_to_num(0.0)  # noqa: E731
    return max(float((t(a[k]) - t(b[k])).abs().max()) for k in a)


#: checked on one model only: MIB's scores (two faithfulness curves, at three fractions); the options
#: of the estimates (QK fix, Hessian correction, key nodes) on the 4-layer model;
#: on the 4-layer model, path patching of the edges into L3H0 and the logits and the curve at three
#: fractions (every edge and MIB's ten fractions on code-2l)
ONE_MODEL = {"mib": "code-2l", "eap_qk_fix": "4l", "eap_hessian": "4l", "atp_k_qk_fix": "4l",
             "path_patching": "code-2l", "curve": "code-2l", "path_patching_some": "4l", "curve_3": "4l"}


@pytest.mark.parametrize("analysis,name", [(a, n) for a in ONE_CALL for n in ("code-2l", "4l") if ONE_MODEL.get(a, n) == n])
def test_streamed_equals_one_call_on_the_concatenated_batch(name, analysis):
    model, task = case(name)
    streamed = STREAMED[analysis](model, task, batch_size=BATCH, progress=False)
    want, got = numbers(one_call(name, analysis), analysis), numbers(streamed, analysis)
    assert gap(got, want) < 1e-10, (analysis, gap(got, want))


def test_batches_share_every_row_once():
    for n, size in ((37, 8), (5, 2), (16, 16)):
        task = induction_task(n, seed=0, seq_len=12, min_period=3, max_period=5)
        for world in (1, 2, 3, 4):
            shards = [[b.rows for b in scale.batches(task, size, rank=r, world=world)] for r in range(world)]
            rows = sorted(i for shard in shards for rng in shard for i in rng)
            assert rows == list(range(n))  # disjoint, and every row once
            assert sum(map(len, shards)) == scale.n_batches(task, size) == -(-n // size)
            for r, shard in enumerate(shards):  # batch k on rank k mod world
                assert [rng.start // size for rng in shard] == list(range(r, scale.n_batches(task, size), world))
    items = [scale.Batch(torch.full((1, 3), k)) for k in range(7)]
    seen = [[int(b.tokens[0, 0]) for b in scale.batches(items, rank=r, world=3)] for r in range(3)]
    assert seen == [[0, 3, 6], [1, 4], [2, 5]]


def test_uneven_batches_weigh_by_their_units_not_a_mean_of_means():
    """Batches whose next-token losses average over 3, 20 and 1 positions; and per-row scores."""
    model, task = case("4l")
    g = torch.Generator().manual_seed(0)
    tokens = task.clean[:9]
    targets = torch.randint(0, model.cfg.d_vocab, tokens.shape, generator=g)
    keep = torch.zeros_like(targets, dtype=torch.bool)
    keep[0:3, 5], keep[3:8, 2:6], keep[8, 11] = True, True, True
    targets = targets.masked_fill(~keep, -1)
    spans = [(0, 3), (3, 8), (8, 9)]
    data = [scale.Batch(tokens[a:b], task.corrupted[a:b], targets=targets[a:b]) for a, b in spans]
    assert [b.weight for b in data] == [3.0, 20.0, 1.0]
    streamed = scale.edge_attribution_patching(model, data, progress=False)
    one = ri.edge_attribution_patching(model, tokens, ri.next_token_loss(targets), reference=task.corrupted[:9])
    assert gap(numbers(streamed, "eap"), numbers(one, "eap")) < 1e-10
    parts = [ri.edge_attribution_patching(model, b.tokens, b.metric, reference=b.reference) for b in data]
    mean_of_means = {"effect": sum(p.effect for p in parts) / 3, "clean": sum(p.clean for p in parts) / 3}
    assert gap(mean_of_means, numbers(one, "eap")) > 1e-3  # what the hand-written loop gets wrong

    score = lambda logits: logits[:, -1].log_softmax(-1)[:, 7]  # noqa: E731  (one score per row)
    rows = [scale.Batch(tokens[a:b], task.corrupted[a:b], scores=score) for a, b in spans]
    streamed = scale.path_patching(model, rows, progress=False, edges=[("embed", "logits"), ("L2H1", "L3H0.q")])
    one = ri.path_patching(model, tokens, lambda lg: score(lg).mean(), reference=task.corrupted[:9],
                           edges=[("embed", "logits"), ("L2H1", "L3H0.q")])
    assert gap(numbers(streamed, "pp"), numbers(one, "pp")) < 1e-10


class _Killed(Exception):
    pass


def _batches(task, size, *, kill_at=None, log=None):
    """The task as a list of Batch, whose metric records each batch run and raises at ``kill_at``."""
    out = []
    for k, start in enumerate(range(0, len(task), size)):
        b = _from_task(task, range(start, min(start + size, len(task))))

        def metric(logits, k=k, inner=b.metric):
            if k == kill_at:
                raise _Killed(f"killed at batch {k}")
            if log is not None:
                log.add(k)
            return inner(logits)

        out.append(scale.Batch(b.tokens, b.reference, metric=metric, weight=b.weight, rows=b.rows))
    return out


def test_a_killed_run_resumes_to_the_uninterrupted_result(tmp_path):
    model, task = case("4l")
    path = tmp_path / "eap_ig.safetensors"
    whole = scale.edge_attribution_patching(model, _batches(task, BATCH), ig_steps=2, progress=False)
    with pytest.raises(_Killed):  # killed during batch 3 (of 0..4); the file was written after batches 0-1
        scale.edge_attribution_patching(model, _batches(task, BATCH, kill_at=3), ig_steps=2, resume=path, save_every=2, progress=False)
    assert path.exists()
    ran: set = set()
    resumed = scale.edge_attribution_patching(model, _batches(task, BATCH, log=ran), ig_steps=2, resume=path, save_every=2, progress=False)
    assert ran == {2, 3, 4}  # at most one interval (batch 2) lost and run again; batches 0-1 read from the file
    assert torch.equal(resumed.effect.nan_to_num(0), whole.effect.nan_to_num(0)) and resumed.clean == whole.clean
    ran.clear()
    again = scale.edge_attribution_patching(model, _batches(task, BATCH, log=ran), ig_steps=2, resume=path, progress=False)
    assert ran == set() and torch.equal(again.effect.nan_to_num(0), whole.effect.nan_to_num(0))  # finished: read back

    # A Task resumes the same way, and the file refuses another run, naming what differs.
    tpath = tmp_path / "scan.safetensors"
    scan = scale.head_ablation_scan(model, task, batch_size=BATCH, ablation="resample", resume=tpath, progress=False)
    assert gap(numbers(scan, "scan"), numbers(one_call("4l", "scan_resample"), "scan")) < 1e-10
    with pytest.raises(ValueError, match="options"):
        scale.head_ablation_scan(model, task, batch_size=BATCH, ablation="zero", resume=tpath, progress=False)
    with pytest.raises(ValueError, match="data"):
        scale.head_ablation_scan(model, induction_task(N, seed=9, d_vocab=50, seq_len=12, min_period=3, max_period=6),
                                 batch_size=BATCH, ablation="resample", resume=tpath, progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        scale.head_ablation_scan(model, task, batch_size=5, ablation="resample", resume=tpath, progress=False)
    other = list(_batches(task, BATCH))
    other[0] = _batches(case("4l")[1], 4)[1]
    with pytest.raises(ValueError, match="not the ones the interrupted run read"):
        scale.edge_attribution_patching(model, other, ig_steps=2, resume=path, progress=False)


def test_a_batch_on_which_faithfulness_is_undefined_still_adds_up():
    """A batch whose metric does not move (clean and empty circuit equal on it alone) among others
    that do: its values still count, measured circuit by circuit."""
    model, task = case("4l")
    diff = lambda lg: (lg[:, -1, 3] - lg[:, -1, 4]).mean()  # noqa: E731
    flat = lambda lg: lg[:, -1, 0].sum() * 0.0 + 1.0  # noqa: E731  (a constant: the same on every circuit)
    data = [scale.Batch(task.clean[:8], task.corrupted[:8], metric=diff, weight=8),
            scale.Batch(task.clean[8:16], task.corrupted[8:16], metric=flat, weight=8)]
    eap, fr = one_call("4l", "eap"), (0.1, 0.5, 1.0)
    with pytest.raises(ValueError, match="faithfulness is undefined"):  # on the second batch alone
        ri.faithfulness_curve(model, data[1].tokens, flat, eap, reference=data[1].reference, fractions=fr)
    streamed = scale.faithfulness_curve(model, data, eap, fractions=fr, progress=False)
    whole = lambda lg: (8 * diff(lg[:8]) + 8 * flat(lg[8:])) / 16  # noqa: E731  (the concatenated batch's metric)
    one = ri.faithfulness_curve(model, task.clean[:16], whole, eap, reference=task.corrupted[:16], fractions=fr)
    assert gap(numbers(streamed, "curve"), numbers(one, "curve")) < 1e-10 and streamed.n_edges == one.n_edges


def test_the_metrics_direction_over_a_dataset():
    """Issue 61 item 5 over a dataset: a task's batches declare their direction (the curve says "metric"); a
    bare batch metric takes the dataset's clean and empty totals for an absolute ranking (as one call on the
    concatenated batch reads its own), and the signed ranking, which chooses its circuits in every batch,
    asks for it rather than let each batch decide."""
    model, task = case("4l")
    eap, fr = one_call("4l", "eap"), (0.1, 0.5, 1.0)
    from_task = scale.faithfulness_curve(model, task, eap, fractions=fr, batch_size=BATCH, progress=False)
    assert (from_task.higher_is_better, from_task.direction_from) == (True, "metric")
    diff = lambda lg: (lg[:, -1, 3] - lg[:, -1, 4]).mean()  # noqa: E731
    data = [scale.Batch(task.clean[i:i + 8], task.corrupted[i:i + 8], metric=diff, weight=8) for i in (0, 8)]
    streamed = scale.faithfulness_curve(model, data, eap, fractions=fr, progress=False)
    one = ri.faithfulness_curve(model, task.clean[:16], diff, eap, reference=task.corrupted[:16], fractions=fr)
    assert (streamed.higher_is_better, streamed.direction_from) == (one.higher_is_better, one.direction_from)
    assert one.direction_from == "clean and empty"
    with pytest.raises(ValueError, match="signed ranking needs the metric's direction"):
        scale.mib_scores(model, data, eap, fractions=fr, progress=False)
    given = scale.mib_scores(model, data, eap, fractions=fr, higher_is_better=one.higher_is_better, progress=False)
    mine = ri.mib_scores(model, task.clean[:16], diff, eap, reference=task.corrupted[:16], fractions=fr, progress=False)
    assert given.cpr == pytest.approx(mine.cpr, abs=1e-9) and given.signed.direction_from == "argument"


def test_refusals_name_their_reason(monkeypatch):
    model, task = case("4l")
    with pytest.raises(ValueError, match="no metric=.*does not say what it averages over"):
        scale.edge_attribution_patching(model, task, batch_size=BATCH, metric=task.metric())
    for method in ("mean", "position_mean"):
        with pytest.raises(ValueError, match="each batch's own mean, not the dataset's"):
            scale.head_ablation_scan(model, task, batch_size=BATCH, ablation=method)
        with pytest.raises(ValueError, match="each batch's own mean"):
            scale.faithfulness_curve(model, task, one_call("4l", "eap"), batch_size=BATCH, ablation=method)
    with pytest.raises(ValueError, match=r"\|a \+ b\| is not \|a\| \+ \|b\|"):
        scale.edge_attribution_patching(model, task, batch_size=BATCH, grad_drop=True)
    with pytest.raises(ValueError, match="as large as the dataset"):
        scale.attribution_patching(model, task, batch_size=BATCH, per_example=True)
    with pytest.raises(ValueError, match="pass batch_size=None"):
        scale.edge_attribution_patching(model, [scale.Batch(task.clean, targets=task.clean)], batch_size=8)
    with pytest.raises(ValueError, match="needs its weight"):
        scale.Batch(task.clean, task.corrupted, metric=task.metric())
    with pytest.raises(ValueError, match="positive int"):
        scale.edge_attribution_patching(model, task, batch_size=0)
    short = [scale.Batch(task.clean[:4], task.corrupted[:4], scores=lambda lg: lg[:, -1, 0]),
             scale.Batch(task.clean[4:8, :10], task.corrupted[4:8, :10], scores=lambda lg: lg[:, -1, 0])]
    with pytest.raises(ValueError, match="effect_per_position: shape"):
        scale.attribution_patching(model, short, progress=False)
    with pytest.raises(ValueError, match="measures a metric, and this batch has none"):
        scale.edge_attribution_patching(model, [scale.Batch(task.clean, task.corrupted)], progress=False)

    # A field the streaming does not know (say, error bars added to a helper) is refused, not averaged.
    @dataclasses.dataclass(frozen=True)
    class WithErrorBars(ri.circuits.AttributionPatching):
        stderr: torch.Tensor | None = None

    real = ri.circuits.attribution_patching
    monkeypatch.setattr(ri.circuits, "attribution_patching",
                        lambda *a, **k: WithErrorBars(**dataclasses.asdict(real(*a, **k)) | {"stderr": torch.ones(4, 2)}))
    with pytest.raises(ValueError, match="WithErrorBars.stderr.*does not know how this field combines"):
        scale.attribution_patching(model, task, batch_size=BATCH, progress=False)
    monkeypatch.setattr(ri.circuits, "attribution_patching", lambda *a, **k: WithErrorBars(**dataclasses.asdict(real(*a, **k))))
    at_default = scale.attribution_patching(model, task, batch_size=BATCH, progress=False)  # the field at its default: streams
    assert gap(numbers(at_default, "atp"), numbers(one_call("4l", "atp"), "atp")) < 1e-10


def test_outside_torchrun_torch_distributed_is_never_initialised(monkeypatch):
    import torch.distributed as dist

    model, task = case("4l")
    for size in (None, "1"):
        if size is None:
            monkeypatch.delenv("WORLD_SIZE", raising=False)
        else:
            monkeypatch.setenv("WORLD_SIZE", size)
        assert scale.world() == (0, 1)
        scale.metric_values(model, task, batch_size=BATCH, progress=False)
        assert not dist.is_initialized()


def _doubled_eap(model, tokens, metric, *, reference, progress=False, per_example=False):
    """A new edge method: EAP's scores doubled (a helper no scale wrapper knows, returning a known result)."""
    eap = ri.edge_attribution_patching(model, tokens, metric, reference=reference, progress=progress)
    return dataclasses.replace(eap, effect=2 * eap.effect)


_doubled_eap.__annotations__["return"] = "EdgeAttributionPatching"


def test_every_registry_method_that_streams_is_its_one_call():
    """Issue 65: scale.run_method streams a registry entry (its helper with its options) to what the entry's own
    run gives on the concatenated batch, a method registered later included (its helper unknown to scale, its
    result a known class); an entry that is not one helper's call (ACDC, the patched screens) is refused by name,
    and one whose options do not stream (GradDrop) by its reason."""
    from rs_interp.circuits.methods import METHODS, Method, registered

    model = make_variant("LN", "standard", False, seed=5)
    task = induction_task(6, seed=2, d_vocab=model.cfg.d_vocab, seq_len=10, min_period=3, max_period=5)
    run = _doubled_eap
    run.helper, run.options = _doubled_eap, {}
    with registered(Method("EAP, doubled", "EAP-x2", "edge", run)):
        streamed = [n for n, m in METHODS.items() if m.helper is not None and not m.options.get("grad_drop")]
        assert {"EAP", "exact path patching", "RelP", "ablation scan (heads)", "EAP, doubled"} <= set(streamed)
        for name in streamed:
            got = scale.run_method(model, task, name, batch_size=4, progress=False)
            want = METHODS[name].run(model, task.clean, task.metric(), reference=task.corrupted, progress=False)
            assert type(got) is type(want) and gap(numbers(got, name), numbers(want, name)) < 1e-10, name
    with pytest.raises(ValueError, match="not a registry method that streams.*EAP"):
        scale.run_method(model, task, next(n for n, m in METHODS.items() if m.key == "ACDC"))
    with pytest.raises(ValueError, match="grad_drop"):
        scale.run_method(model, task, next(n for n, m in METHODS.items() if m.key == "AtP*"), progress=False)
