"""``rs-interp circuit``'s work (rs_interp.ui.circuit_command): on code-2l with the induction task and on
GPT-2 small's random weights with IOI, every file written within a minute, each number in them the
one a direct computation gives, and the page drawn by headless Chromium (a screenshot beside the test)."""

from __future__ import annotations

import argparse
import html
import json
import os
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

import rs_interp as ri
from rs_interp import scale
from rs_interp.circuits import read_mib
from rs_interp.circuits.selection import RECOVERED_SHARE
from rs_interp.tasks import build_task
from rs_interp.ui.circuit_command import COMMAND_METHODS, add_arguments, load_command_model, run_circuit, run_command
from tests.browser import ALL_DRAWN, offline_page, remote
from tests.circuits.test_evaluation import _on_a_path

FILES = {"scores.safetensors", "scores.json", "importances_mib.json", "curve.json", "circuit.json", "diagram.json",
         "report.html", "summary.json"}


def _run(argv):
    parser = add_arguments(argparse.ArgumentParser(prog="rs-interp circuit"))
    start = time.perf_counter()
    assert run_command(parser.parse_args(argv))  # the summary's lines
    return time.perf_counter() - start


@pytest.fixture(scope="module")
def code_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("code2l")
    seconds = _run(["--model", "code-2l", "--task", "induction", "--method", "eap", "--out", str(out), "--n", "16",
                    "--size", "0.2", "--seed", "1", "--quiet"])
    return out, seconds


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpt2")
    seconds = _run(["--model", "gpt2-random", "--task", "ioi", "--out", str(out), "--n", "2", "--quiet"])
    return out, seconds


def _chromium_draws(page_path, screenshot):
    """Open the page offline in headless Chromium; every figure drawn, no request, no error."""
    with offline_page() as (page, requests, errors):
        page.goto(page_path.as_uri())
        page.wait_for_function(ALL_DRAWN.format(selector=".fig"), timeout=60_000)
        counts = page.evaluate("[...document.querySelectorAll('.fig')].map(d => d.querySelectorAll('.scatterlayer .trace').length)")
        paths = page.evaluate("document.querySelector('#diagram .scatterlayer').querySelectorAll('path.js-line').length")
        page.screenshot(path=str(screenshot), full_page=True)
    assert len(counts) == 2 and all(c > 0 for c in counts), counts
    assert paths > 0  # the diagram's edges are drawn
    assert remote(requests) == [], "the page made a network request"
    assert errors == [], errors
    assert screenshot.stat().st_size > 10_000


@pytest.mark.parametrize("which", ["code_run", "gpt2_run"])
def test_writes_every_file(request, which):
    out, seconds = request.getfixturevalue(which)
    assert {p.name for p in out.iterdir()} == FILES
    # A hang guard, not a speed test (speed goals live in benchmarks/): on a quiet 2-core machine each
    # run takes well under a minute (the durations CI prints); two suites side by side slow it.
    assert seconds < 180
    summary = json.loads((out / "summary.json").read_text())
    assert {os.path.basename(p) for p in summary["files"].values()} == FILES


@pytest.mark.parametrize("which", ["code_run", "gpt2_run"])
def test_page_draws_in_headless_chromium(request, which, tmp_path):
    out, _ = request.getfixturevalue(which)
    html = (out / "report.html").read_text()
    assert html.count("<script>") == 2 and "https://" not in html.split("<script>")[0]
    _chromium_draws(out / "report.html", tmp_path / f"{which}.png")


def test_files_hold_what_a_direct_computation_gives(code_run):
    """The scores are edge attribution patching's on the task; the circuit is their top edges by
    |score| and its metric and faithfulness are evaluate_circuit's; MIB's file holds the same scores."""
    out, _ = code_run
    model = ri.load_toy_model("code-2l")
    task = build_task("induction", n=16, seed=1, d_vocab=model.cfg.d_vocab, n_ctx=model.cfg.n_ctx)
    eap = ri.edge_attribution_patching(model, task.clean, task.metric(), reference=task.corrupted)
    tensors = load_file(str(out / "scores.safetensors"))
    layout = ri.edge_layout(model)
    assert torch.equal(tensors["exists"], layout.exists)
    assert torch.allclose(tensors["effect"].nan_to_num(0), eap.effect.double().nan_to_num(0), atol=1e-9, rtol=1e-6)
    meta = json.loads((out / "scores.json").read_text())
    assert tuple(meta["senders"]) == layout.senders and tuple(meta["receivers"]) == layout.receivers

    circuit = json.loads((out / "circuit.json").read_text())
    n = int(0.2 * layout.n_edges)
    flat = [(abs(float(tensors["effect"][i, j])), i * 1000 + j, (layout.senders[i], layout.receivers[j]))
            for i, j in layout.exists.nonzero().tolist()]
    top = set(_on_a_path(layout, [e for _, _, e in sorted(flat, key=lambda t: (-t[0], t[1]))[:n]]))  # pruned: MIB's rule
    assert circuit["requested"] == n and circuit["size"] == len(top) and {(s, r) for s, r, _ in circuit["edges"]} == top
    assert circuit["reaches_logits"] == bool(top)
    value = ri.evaluate_circuit(model, tokens=task.clean, metric=task.metric(), circuit=top, reference=task.corrupted)
    assert circuit["value"] == pytest.approx(value, abs=1e-9)
    curve = json.loads((out / "curve.json").read_text())
    with torch.no_grad():
        full, empty = float(task.metric()(model(task.clean))), float(task.metric()(model(task.corrupted)))
    assert circuit["full"] == pytest.approx(full, abs=1e-5) and circuit["empty"] == pytest.approx(empty, abs=1e-5)
    assert circuit["faithfulness"] == pytest.approx((value - empty) / (full - empty), abs=1e-6)
    assert curve["faithfulness"][-1] == pytest.approx(1.0, abs=1e-6)  # every edge kept: the clean run
    mib = read_mib(out / "importances_mib.json", model)
    B = mib.convention["batch_size"]  # MIB's convention: the loss's scores, -effect / B (the pairs per batch)
    assert mib.convention == {"convention": "mib", "higher_is_better": True, "batch_size": len(task)}
    assert torch.equal(mib.scores.effect.nan_to_num(0), (-tensors["effect"] / B).nan_to_num(0))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["faithfulness"] == circuit["faithfulness"] and summary["size"] == len(top) and summary["requested"] == n
    fig = json.loads((out / "diagram.json").read_text())
    drawn = next(t for t in fig["data"] if t.get("name") == "edges")["text"]
    assert {tuple(t.split(":")[0].split(" -> ")) for t in drawn} == top


@pytest.mark.parametrize("method", ["eap", "eap-ig", "exact", "relp"])
def test_each_method_scores_as_its_helper(tmp_path, method):
    model = ri.load_toy_model("induction-2l")
    task = build_task("induction", n=6, seed=2)
    run = run_circuit(model, task, method=method, out=tmp_path, size=5, ig_steps=3, progress=False)
    kw = dict(tokens=task.clean, metric=task.metric(), reference=task.corrupted)
    want = (ri.path_patching(model, **kw) if method == "exact" else ri.edge_relevance_patching(model, **kw) if method == "relp" else
            ri.edge_attribution_patching(model, ig_steps=3 if method == "eap-ig" else None, **kw))
    got = load_file(str(tmp_path / "scores.safetensors"))["effect"]
    assert torch.allclose(got.nan_to_num(0), want.effect.double().nan_to_num(0), atol=1e-9, rtol=1e-6)
    layout = ri.edge_layout(model)
    top5 = [e for e in layout.edges() if e in set(ri.top_edges(want, 5))]
    pruned = _on_a_path(layout, top5)
    assert run.method == method and run.requested == 5 and run.size == len(pruned)
    assert [tuple(e[:2]) for e in json.loads((tmp_path / "circuit.json").read_text())["edges"]] == pruned


def test_a_method_registered_with_a_command_name_is_a_command(tmp_path, capsys):
    """Issue 65: the command line's methods are the registry's (COMMAND_METHODS read from METHODS): a method
    registered with a command name is one for ``--method`` and ``run_circuit``, its scores the entry's helper's,
    streamed; once it is gone, its name is refused with the registry's list."""
    import dataclasses

    from rs_interp.circuits.methods import Method, registered

    def doubled(model, tokens, metric, *, reference, progress=False, per_example=False):
        eap = ri.edge_attribution_patching(model, tokens, metric, reference=reference, progress=progress)
        return dataclasses.replace(eap, effect=2 * eap.effect)

    doubled.__annotations__["return"] = "EdgeAttributionPatching"  # a known result: scale streams it
    doubled.helper, doubled.options = doubled, {}
    model, task = ri.load_toy_model("induction-2l"), build_task("induction", n=6, seed=2)
    assert list(COMMAND_METHODS)[:4] == ["eap", "eap-ig", "exact", "relp"] and "eap-x2" not in COMMAND_METHODS
    with registered(Method("EAP, doubled", "EAP-x2", "edge", doubled, command="eap-x2")):
        parser = add_arguments(argparse.ArgumentParser(prog="rs-interp circuit"))
        argv = ["--model", "induction-2l", "--task", "induction", "--out", str(tmp_path), "--method", "eap-x2"]
        assert parser.parse_args(argv).method == "eap-x2"
        run_circuit(model, task, method="eap-x2", out=tmp_path, size=5, progress=False)
        got = load_file(str(tmp_path / "scores.safetensors"))["effect"]
        eap = ri.edge_attribution_patching(model, task.clean, task.metric(), reference=task.corrupted)
        assert torch.allclose(got.nan_to_num(0), 2 * eap.effect.double().nan_to_num(0), atol=1e-9, rtol=1e-6)
    assert "eap-x2" not in COMMAND_METHODS
    with pytest.raises(SystemExit):
        add_arguments(argparse.ArgumentParser(prog="rs-interp circuit")).parse_args(argv)
    assert "invalid choice: 'eap-x2' (choose from eap, eap-ig, exact, relp" in capsys.readouterr().err
    with pytest.raises(ValueError, match="method must be one of eap, eap-ig, exact, relp"):
        run_circuit(model, task, method="eap-x2", out=tmp_path, progress=False)


def test_missing_weights_say_how_to_provide_them(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.delenv("RS_INTERP_GPT2_PATH", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))  # an empty cache
    start = time.perf_counter()
    with pytest.raises(ri.GPT2WeightsUnavailable, match="RS_INTERP_GPT2_PATH.*--model gpt2-random"):
        _run(["--model", "gpt2", "--task", "ioi", "--out", str(tmp_path / "out")])
    assert time.perf_counter() - start < 5  # no wait on a network
    assert not (tmp_path / "out").exists()


def test_refusals(tmp_path):
    model = ri.load_toy_model("induction-2l")
    task = build_task("induction", n=2)
    with pytest.raises(ValueError, match="method must be one of"):
        run_circuit(model, task, method="acdc", out=tmp_path)
    with pytest.raises(ValueError, match="between 1 and the graph's 29 edges"):
        run_circuit(model, task, method="eap", out=tmp_path, size=30)
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        run_circuit(model, task, method="eap", out=tmp_path, size=1.5)
    with pytest.raises(ValueError, match="outside this model's 256-token vocabulary"):
        run_circuit(model, build_task("induction", n=2, d_vocab=1000), method="eap", out=tmp_path)
    with pytest.raises(ValueError, match="is not gpt2, gpt2-random, a shipped model"):
        load_command_model("no-such-model")
    with pytest.raises(ValueError, match=r"--task ioi needs names .* \d+ of its \d+ are not"):  # code-2l's tokenizer cannot say them
        _run(["--model", "code-2l", "--task", "ioi", "--out", str(tmp_path)])
    assert list(tmp_path.iterdir()) == []


def test_a_circuit_that_cannot_reach_the_logits_is_said_so(tmp_path):
    """On code-2l, a size of 0.01 is one edge: pruned to what reaches the logits, and where nothing does,
    the circuit is empty (faithfulness 0) and the page and the files say so."""
    model = ri.load_toy_model("code-2l")
    task = build_task("induction", n=4, seed=0, d_vocab=model.cfg.d_vocab, n_ctx=model.cfg.n_ctx)
    run = run_circuit(model, task, method="eap", out=tmp_path, progress=False, size=0.01)
    eap = ri.edge_attribution_patching(model, task.clean, task.metric(), reference=task.corrupted)
    layout = ri.edge_layout(model)
    want = _on_a_path(layout, ri.top_edges(eap, run.requested))
    assert run.requested == max(1, int(0.01 * layout.n_edges)) and run.size == len(want) and run.reaches_logits == bool(want)
    page = (tmp_path / "report.html").read_text()
    if not want:
        # the empty circuit against the curve's empty run: two float32 passes of the same circuit (3e-8 apart on 3.x)
        assert run.faithfulness == pytest.approx(0.0, abs=1e-6) and "none of them reaches the logits" in page
    assert json.loads((tmp_path / "circuit.json").read_text())["reaches_logits"] == bool(want)


def test_the_default_circuit_is_the_smallest_that_recovers_80_percent(tmp_path):
    """Issue 61 item 3: with no --size, code-2l's induction circuit is the smallest on the faithfulness curve
    whose faithfulness reaches 0.8, said so on the command line, the page and in circuit.json; checked against
    every size's faithfulness computed apart (one circuit per edge budget, the curve's own choice of circuit):
    it recovers the share, and one edge fewer does not."""
    parser = add_arguments(argparse.ArgumentParser(prog="rs-interp circuit"))
    argv = ["--model", "code-2l", "--task", "induction", "--out", str(tmp_path), "--n", "16", "--seed", "1", "--quiet"]
    lines = run_command(parser.parse_args(argv))
    circuit = json.loads((tmp_path / "circuit.json").read_text())
    assert 0.5 < circuit["faithfulness"] and circuit["share"] == 0.8 and circuit["size"] < 46
    assert "the smallest on the faithfulness curve that recovers 80% of the metric" in lines[2]
    assert f"faithfulness {circuit['faithfulness']:.4f}" in lines[1]
    assert "the smallest circuit on the faithfulness curve that recovers 80% of the metric" in circuit["chosen"]
    assert circuit["chosen"] in html.unescape((tmp_path / "report.html").read_text())
    model = ri.load_toy_model("code-2l")
    task = build_task("induction", n=16, seed=1, d_vocab=model.cfg.d_vocab, n_ctx=model.cfg.n_ctx)
    scores = scale.edge_attribution_patching(model, task, batch_size=16, progress=False)
    n = scores.layout.n_edges
    every = scale.faithfulness_curve(model, task, scores, fractions=tuple((k + 0.5) / n for k in range(n)),
                                     batch_size=16, progress=False)
    faith = dict(zip(every.n_requested, every.faithfulness))
    k = circuit["requested"]
    assert faith[k] == pytest.approx(circuit["faithfulness"], abs=1e-5) and faith[k] >= 0.8 > faith[k - 1]
    assert k == min(j for j, f in faith.items() if f >= 0.8)  # on this task the first crossing is the only one
    assert circuit["size"] == every.n_edges[k]


@pytest.mark.parametrize("form", ["folder", "path", "json file"])
def test_model_takes_an_rs_interp_checkpoint(tmp_path, form):
    """Issue 61: --model takes rs_interp's own checkpoints (save_model's PATH.json + PATH.safetensors, as
    rs-interp train writes them, its tokenizer beside them) as well as Hugging Face folders: named by the folder,
    the PATH, or a file; the model is the one saved, its tokenizer the one saved beside it."""
    model = ri.load_toy_model("code-2l")
    saved = ri.models.save_model(model, tmp_path / "ckpt" / "code")
    ri.models.SHIPPED_MODELS["code-2l"].tokenizer().save(str(tmp_path / "ckpt" / "code.tokenizer.json"))
    spec = {"folder": tmp_path / "ckpt", "path": saved, "json file": saved.with_name("code.json")}[form]
    loaded, tokenizer, what = load_command_model(str(spec))
    assert what == f"rs_interp checkpoint {saved}" and tokenizer.encode("self").ids == [286]
    tokens = torch.randint(0, 2048, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(loaded(tokens), model(tokens))
    if form == "folder":
        out = tmp_path / "out"
        argv = ["--model", str(spec), "--task", "induction", "--out", str(out), "--n", "4", "--size", "6", "--quiet"]
        assert run_command(add_arguments(argparse.ArgumentParser(prog="rs-interp circuit")).parse_args(argv))
        assert json.loads((out / "summary.json").read_text())["model"] == what


_REFUSE = """
import json, sys, time
start = time.perf_counter()
from rs_interp.ui.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as stop:
    code = stop.code
print(json.dumps({"code": code, "seconds": time.perf_counter() - start, "torch": "torch" in sys.modules,
                  "transformer_lens": "transformer_lens" in sys.modules}))
"""


@pytest.mark.parametrize("bad", [["--model", "gpt3"], ["--size", "2.5"], ["--size", "0"], ["--n", "0"], ["--ig-steps", "-1"],
                                 ["--seed", "x"], ["--out", "UNWRITABLE"]], ids=lambda b: " ".join(b))
def test_a_bad_argument_is_refused_before_torch_loads(tmp_path, bad):
    """Issue 50: a bad argument costs a second, not a model load: in a fresh interpreter, refused with a
    non-zero code and one line, with neither torch nor TransformerLens imported. (The bound is loose
    on purpose: the refusal takes ~0.1 s; torch alone takes seconds to import.)"""
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    argv = {"--model": "code-2l", "--task": "induction", "--out": str(tmp_path / "out")}
    argv[bad[0]] = str(blocker / "sub") if bad[1] == "UNWRITABLE" else bad[1]
    args = ["circuit", *(x for kv in argv.items() for x in kv)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _REFUSE, *args], capture_output=True, text=True, env=env, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(ri.__file__))))
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["code"] in (1, 2), done.stderr
    assert not result["torch"] and not result["transformer_lens"]
    assert result["seconds"] < 1.0, result
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_help_lists_every_default(capsys):
    from rs_interp.ui.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["circuit", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for default in ("(default: eap)", "(default: 32)", "(default: 0)", "(default: 5)", "(default: the whole task",
                    f"(default: {RECOVERED_SHARE}, rs_interp.circuits.selection.RECOVERED_SHARE)",
                    "(default: the smallest circuit on the faithfulness curve that recovers --share"):
        assert default in text, default
    for required in ("--model", "--task", "--out"):
        assert f"{required}" in text
    assert text.count("required:") == 3


def test_writers_make_their_folder(tmp_path):
    """write_mib, write_mib_circuits and write_eap_csv into a folder that does not exist yet."""
    from rs_interp.circuits import write_mib, write_mib_circuits
    from rs_interp.tasks import greater_than_task, write_eap_csv
    from rs_interp.tokenizers import gpt2_tokenizer

    model = ri.load_toy_model("induction-2l")
    a, b = ri.induction_batch(2, seed=0).tokens, ri.induction_batch(2, seed=1).tokens
    eap = ri.edge_attribution_patching(model, a, lambda x: x[:, -1, 0].mean(), reference=b, progress=False)
    for suffix in (".json", ".pt"):
        path = write_mib(tmp_path / f"new{suffix}" / "deeper" / f"scores{suffix}", model, scores=eap)
        assert read_mib(path, model).scores is not None
    assert len(write_mib_circuits(tmp_path / "circuits" / "here", model, eap, fractions=(0.5,))) == 1
    assert write_eap_csv(greater_than_task(gpt2_tokenizer(), 2, seed=0), tmp_path / "csv" / "gt.csv").exists()


@pytest.mark.parametrize("size", [0.5, 3])  # of 29 edges: 14 (a fraction the curve runs), 3 (none of its budgets)
def test_a_circuit_on_the_curve_takes_its_value_from_it(tmp_path, size):
    """The circuit at a size the curve runs (MIB's fractions: the default 0.01 is one) takes the curve's
    value, the same run's number (issue 50: one pass less); at any size, over several batches, the
    circuit's metric is the scale helper's to the bit."""
    from rs_interp import scale
    from rs_interp.circuits.selection import mask, prune
    from rs_interp.ui.circuit_command import _on_the_curve

    model = ri.load_toy_model("induction-2l")
    task = build_task("induction", n=6, seed=2)
    run = run_circuit(model, task, method="eap", out=tmp_path, size=size, progress=False, batch_size=4)
    edges = [tuple(e[:2]) for e in json.loads((tmp_path / "circuit.json").read_text())["edges"]]
    assert run.value == scale.evaluate_circuit(model, task, edges, batch_size=4, progress=False)
    scores = scale.edge_attribution_patching(model, task, batch_size=4, progress=False)
    curve = scale.faithfulness_curve(model, task, scores, batch_size=4, progress=False)
    layout = ri.edge_layout(model)
    found = _on_the_curve(curve, scores, prune(layout, mask(layout, ri.top_edges(scores, run.requested))), run.requested)
    assert (found is not None) == isinstance(size, float) and found in (None, run.value)
