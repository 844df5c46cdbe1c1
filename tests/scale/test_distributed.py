"""Issue #45, items 3 and 4: the streamed analyses under ``torchrun --standalone --nproc_per_node=2`` and ``=3``
(Gloo on the loopback interface, CPU) shard the 37 pairs' five batches over the ranks (3 + 2, and
2 + 2 + 1: uneven), each rank's shard disjoint and together covering every pair once, reduce once, and
return on every rank the single-process result: EAP, EAP-IG, the resample scan, path patching (the edges
into the last layer's first head and into the logits) and the faithfulness curve (three fractions), on
code-2l and the 4-layer model with MLPs in float64 (1e-10) and on code-2l in float32 (1e-6 relative to
the largest number of each result). (Streamed over every edge and MIB's ten fractions in one process:
tests/scale/test_scale.py; the ranks' sums are reduced alike whatever the analysis.) And ``rs-interp circuit`` (the command
line's own entry, ``rs_interp.ui.cli.main``) runs unchanged in the 2 ranks: rank 0 writes the files, and
their numbers are the single-process command's.

Both launches run at once, beside the single-process computations (one call on every pair, shared
with tests/scale/test_scale.py); the ranks import rs_interp from this file (``torchrun
tests/scale/test_distributed.py OUT``, the ``__main__`` block) and save what they return. Skipped, saying
why, where Gloo cannot bind the loopback interface."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

#: the command run by the 2 ranks and by one process (code-2l in float32, EAP-IG, 16 pairs in batches of 5, 5, 5 and 1)
COMMAND = ["circuit", "--model", "code-2l", "--task", "induction", "--method", "eap-ig", "--ig-steps", "2", "--n", "16",
           "--seed", "1", "--size", "0.2", "--batch-size", "5", "--quiet"]
#: (model, dtype, analyses): the analyses are tests/scale/test_scale.py's
ANALYSES = ("eap", "eap_ig", "scan_resample", "path_patching_some", "curve_3")
CASES = [("code-2l", torch.float64, ANALYSES), ("4l", torch.float64, ANALYSES), ("code-2l", torch.float32, ANALYSES)]
WORLDS = (2, 3)
BATCH = 8


def _key(name: str, dtype: torch.dtype, analysis: str) -> str:
    return f"{name}/{str(dtype).removeprefix('torch.')}/{analysis}"


def _few():
    from rs_interp.tasks import induction_task

    return induction_task(12, seed=5, d_vocab=50, seq_len=12, min_period=3, max_period=6)


def _worker(out: Path) -> None:
    """One rank: every case and analysis streamed over this rank's batches, the results saved."""
    import torch.distributed as dist

    from rs_interp import scale
    from tests.scale.test_scale import STREAMED, case, numbers

    start = time.perf_counter()
    rank, world = scale.world()
    results = {}
    for name, dtype, analyses in CASES:
        model, task = case(name, dtype)
        for analysis in analyses:
            results[_key(name, dtype, analysis)] = numbers(STREAMED[analysis](model, task, batch_size=BATCH, progress=False), analysis)
    rows = [list(b.rows) for b in scale.batches(case("code-2l")[1], BATCH, rank=rank, world=world)]
    model, task = case("4l")
    # two batches: under 3 ranks, rank 2 reads none and still takes part in the reduction
    few = numbers(STREAMED["eap"](model, _few(), batch_size=BATCH, progress=False), "eap")
    # each rank's own resume file, written, then read back without running a batch
    resumed = [numbers(scale.edge_attribution_patching(model, task, batch_size=BATCH, resume=out / "eap.safetensors",
                                                       progress=False), "eap") for _ in range(2)]
    if world == 2:
        from rs_interp.ui.cli import main

        assert main(COMMAND + ["--out", str(out / "circuit")]) == 0
    torch.save({"results": results, "rows": rows, "few": few, "resumed": resumed, "rank": rank, "world": world, "initialised": dist.is_initialized(),
                "backend": dist.get_backend(), "seconds": time.perf_counter() - start}, out / f"rank{rank}.pt")


if __name__ == "__main__":
    torch.set_num_threads(1)
    # torchrun puts only this file's folder on sys.path; the ranks import tests.scale.test_scale from the clone's root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    _worker(Path(sys.argv[1]))
    sys.exit(0)

import pytest  # noqa: E402  (the ranks above need none of the test machinery)

import rs_interp as ri  # noqa: E402
from tests.scale.test_scale import case, numbers, one_call  # noqa: E402


def _cannot_bind() -> str | None:
    """Why Gloo cannot run here, or None."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        return f"this torch build ({torch.__version__}) has no Gloo backend"
    try:
        socket.if_nametoindex("lo")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            s.listen(1)
    except OSError as err:
        return f"Gloo cannot bind the loopback interface here: {err}"
    if not (Path(sys.executable).parent / "torchrun").exists():
        return f"no torchrun beside {sys.executable}"
    return None


def _launch(n: int, out: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # scripts/test.sh's reason: cached bytecode
    env |= {"MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [str(Path(sys.executable).parent / "torchrun"), "--standalone", f"--nproc_per_node={n}", "--max-restarts=0",
           "--rdzv-conf=timeout=120", __file__, str(out)]
    return subprocess.Popen(cmd, env=env, cwd=Path(__file__).resolve().parents[2] / "tests", stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Both launches, started together, and the single-process results computed while they run."""
    reason = _cannot_bind()
    if reason:
        pytest.skip(reason)
    outs = {n: tmp_path_factory.mktemp(f"world{n}") for n in WORLDS}
    start = time.perf_counter()
    procs = {n: _launch(n, outs[n]) for n in WORLDS}
    try:
        from rs_interp.ui.cli import main

        single = tmp_path_factory.mktemp("single")
        assert main(COMMAND + ["--out", str(single)]) == 0
        refs = {_key(name, dtype, a): numbers(one_call(name, a, dtype), a) for name, dtype, analyses in CASES for a in analyses}
        model, few = case("4l")[0], _few()
        refs["few"] = numbers(ri.edge_attribution_patching(model, few.clean, few.metric(), reference=few.corrupted), "eap")
        refs_done = time.perf_counter() - start
        logs = {}
        for n, p in procs.items():
            logs[n], _ = p.communicate(timeout=max(10, 300 - (time.perf_counter() - start)))
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    for n, p in procs.items():
        if p.returncode != 0:
            tail = "\n".join(logs[n].splitlines()[-40:])
            if "Gloo" in tail and ("bind" in tail or "connect" in tail.lower()):
                pytest.skip(f"Gloo could not connect the ranks here: {tail.splitlines()[-1]}")
            pytest.fail(f"torchrun --nproc_per_node={n} exited with {p.returncode}:\n{tail}")
    ranks = {n: [torch.load(outs[n] / f"rank{r}.pt") for r in range(n)] for n in WORLDS}
    seconds = time.perf_counter() - start
    print(f"launches {seconds:.1f} s; single-process results {refs_done:.1f} s; ranks' work (after import): "
          + ", ".join(f"{n} ranks " + "/".join(f"{r['seconds']:.1f}" for r in ranks[n]) + " s" for n in WORLDS))
    return ranks, refs, seconds, outs, single


def _gap(got: dict, want: dict, relative: bool) -> float:
    worst = 0.0
    for k in want:
        a, b = (torch.as_tensor(x, dtype=torch.float64).nan_to_num(0.0) for x in (got[k], want[k]))
        scale = float(b.abs().max()) if relative else 1.0
        worst = max(worst, float((a - b).abs().max()) / (scale or 1.0))
    return worst


@pytest.mark.parametrize("world", WORLDS)
def test_every_rank_returns_the_single_process_result(launched, world):
    ranks, refs, *_ = launched
    worst = {"float64": 0.0, "float32": 0.0}
    for r in ranks[world]:
        assert (r["world"], r["initialised"], r["backend"]) == (world, True, "gloo")
        for key, want in refs.items():
            if key == "few":
                continue  # test_a_rank_without_batches_and_each_ranks_resume_file
            dtype = key.split("/")[1]
            gap = _gap(r["results"][key], want, relative=dtype == "float32")
            assert gap < (1e-6 if dtype == "float32" else 1e-10), (world, r["rank"], key, gap)
            worst[dtype] = max(worst[dtype], gap)
    print(f"{world} ranks: largest gap {worst['float64']:.1e} (float64), {worst['float32']:.1e} relative (float32)")
    first = ranks[world][0]["results"]
    for r in ranks[world][1:]:  # one all_reduce: the very same numbers on every rank (NaN off the graph)
        for k in first:
            for f in first[k]:
                torch.testing.assert_close(torch.as_tensor(r["results"][k][f]), torch.as_tensor(first[k][f]), rtol=0, atol=0,
                                           equal_nan=True)


@pytest.mark.parametrize("world", WORLDS)
def test_a_rank_without_batches_and_each_ranks_resume_file(launched, world):
    ranks, refs, _, outs, _ = launched
    for r in ranks[world]:
        assert _gap(r["few"], refs["few"], relative=False) < 1e-10  # 2 batches: rank 2 of 3 had none
        assert _gap(r["resumed"][1], r["resumed"][0], relative=False) == 0.0
        assert _gap(r["resumed"][0], refs[_key("4l", torch.float64, "eap")], relative=False) < 1e-10
    assert sorted(p.name for p in outs[world].glob("eap.*")) == [f"eap.rank{r}-of-{world}.safetensors" for r in range(world)]


@pytest.mark.parametrize("world", WORLDS)
def test_shards_are_disjoint_and_cover_every_pair_once(launched, world):
    ranks, *_ = launched
    shards = [[i for rows in r["rows"] for i in rows] for r in ranks[world]]
    assert sorted(i for s in shards for i in s) == list(range(37))
    assert [len(r["rows"]) for r in ranks[world]] == ([3, 2] if world == 2 else [2, 2, 1])  # five batches, uneven shards


def test_the_command_runs_under_torchrun_unchanged(launched, world=2):
    import json

    from safetensors.torch import load_file

    *_, outs, single = launched
    got, want = outs[world] / "circuit", single
    assert sorted(p.name for p in got.iterdir()) == sorted(p.name for p in want.iterdir())  # rank 0 wrote every file
    a, b = load_file(str(got / "scores.safetensors"))["effect"], load_file(str(want / "scores.safetensors"))["effect"]
    assert float((a - b).nan_to_num(0).abs().max()) < 1e-6 * float(b.nan_to_num(0).abs().max())  # float32 model
    x, y = (json.loads((d / "summary.json").read_text()) for d in (got, want))
    for k in ("clean", "corrupted", "value", "faithfulness", "area_under", "area_from_1"):
        assert x[k] == pytest.approx(y[k], rel=1e-5, abs=1e-6), k
    assert (x["size"], x["n_prompts"], [e for e, _ in x["top_edges"]]) == (y["size"], y["n_prompts"], [e for e, _ in y["top_edges"]])


def test_the_launches_finish(launched):
    """Both launches, from the first process started to the last rank's file read (the single-process
    results computed meanwhile), on this 2-core machine."""
    _, _, seconds, *_ = launched
    # A hang guard, not a speed test (benchmarks/bench_streaming.py times the launches): 44 s on a quiet
    # 2-core machine; the suites of both TransformerLens versions side by side slow it.
    assert seconds < 180, f"the torchrun launches took {seconds:.0f} s"
