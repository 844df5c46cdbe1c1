import json
import subprocess
import sys

import pytest

from rs_interp.models.registry import SHIPPED_MODELS
from rs_interp.reproduce.expected import EXPECTED
from rs_interp.ui.cli import main


def test_reproduce_writes_results(tmp_path, capsys):
    assert main(["reproduce", "--out", str(tmp_path), "--only", "induction", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "two layers: loss" in out and "0.157" in out  # printed beside the theory's value
    data = json.loads((tmp_path / "results.json").read_text())
    two, one = data["induction"]["two_layers"], data["induction"]["one_layer"]
    for key, value in (("two_layers_loss", two["loss"]), ("two_layers_accuracy", two["accuracy"]),
                       ("one_layer_loss", one["loss"]), ("one_layer_accuracy", one["accuracy"])):
        assert EXPECTED[f"induction.{key}"].holds(value), key
    assert all(row["ok"] for row in data["bands"]["induction"])
    assert (tmp_path / "report.html").is_file()


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_reproduce_logs_costs_and_writes_each_section_as_it_finishes(tmp_path, capsys, jobs):
    """Issue 50: the log says "section k of N", every section's CPU and wall seconds are in
    results.json and the report, and in one process or in workers the numbers are the same."""
    assert main(["reproduce", "--out", str(tmp_path), "--only", "induction", "attribution_patching", "--quiet", "--jobs", jobs]) == 0
    captured = capsys.readouterr()
    assert "section 1 of 2 done" in captured.err and "section 2 of 2 done" in captured.err
    assert "Cost per section" in captured.out
    data = json.loads((tmp_path / "results.json").read_text())
    assert set(data["cost"]) == {"induction", "attribution_patching", "total"}
    assert all(c["cpu_seconds"] >= 0 and c["wall_seconds"] > 0 for c in data["cost"].values())
    assert data["cost"]["total"]["elapsed_seconds"] > 0
    assert 'id="cost"' in (tmp_path / "report.html").read_text()
    assert all(r["ok"] is not False for rows in data["bands"].values() for r in rows)


def test_a_stopped_reproduction_keeps_the_sections_it_finished(tmp_path, monkeypatch):
    """Each finished section is written at once: a run stopped in its second section has the first in
    results.json and report.html."""
    import rs_interp.reproduce as rp

    real = rp.builder

    def stopping(name):
        if name == "attribution_patching":
            def stop(ctx):
                raise KeyboardInterrupt
            return stop
        return real(name)

    monkeypatch.setattr(rp, "builder", stopping)
    assert main(["reproduce", "--out", str(tmp_path), "--only", "induction", "attribution_patching", "--quiet", "--jobs", "1"]) == 130
    data = json.loads((tmp_path / "results.json").read_text())
    assert "induction" in data and "attribution_patching" not in data and set(data["cost"]) == {"induction", "total"}
    assert 'id="induction"' in (tmp_path / "report.html").read_text()


def test_help_and_bad_arguments(capsys):
    """In process (argparse exits with its code; a fresh interpreter costs ~5 s of imports per call):
    the installed entry point itself runs `rs-interp --help` in tests/integration/test_packaging.py."""
    with pytest.raises(SystemExit) as ok:
        main(["--help"])
    assert ok.value.code == 0 and "reproduce" in capsys.readouterr().out
    with pytest.raises(SystemExit) as bad:
        main(["reproduce", "--seed", "x"])
    err = capsys.readouterr().err
    assert bad.value.code == 2 and "Traceback" not in err and "--seed" in err


def test_hooks_is_not_a_global_package(tmp_path):
    """hooks/ installs as rs_interp.hooks only: from outside the repo, `import hooks` fails."""
    code = "import importlib.util, rs_interp.hooks; print(importlib.util.find_spec('hooks') is None)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr


def test_gpt2_without_weights_is_one_clean_line(tmp_path):
    env = {k: v for k, v in __import__("os").environ.items() if k != "RS_INTERP_GPT2_PATH"}
    env["HF_HOME"] = str(tmp_path)  # an empty cache
    r = subprocess.run([sys.executable, "-m", "rs_interp.ui.cli", "gpt2"], capture_output=True, text=True, env=env)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "RS_INTERP_GPT2_PATH" in r.stderr and "--weights random" in r.stderr


def test_a_task_refusal_is_one_short_line_in_the_command_lines_terms(tmp_path, capsys):
    """Issue 61 item 4's measured case: ``rs-interp circuit --model code-2l --task ioi`` printed one 2,408-character
    line listing all 99 names, advising ``names=`` (a keyword the command lacks) and ending mid-sentence. Now: one
    line within the limit, naming the options that change it, a few of the words, and a whole last sentence."""
    from rs_interp._messages import LIMIT

    assert main(["circuit", "--model", "code-2l", "--task", "ioi", "--out", str(tmp_path / "o"), "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    message = err.removeprefix("rs-interp: error: ")
    assert "\n" not in err and len(message) <= LIMIT, (len(message), message)
    assert "--task ioi" in message and "--model code-2l" in message and "99 of its 99" in message
    assert "' Michael' -> 5 tokens" in message and "names=" not in message and message.endswith(".")


@pytest.mark.slow
def test_reproduce_retrain_matches_the_shipped_models(tmp_path, train_cache):
    """--retrain rebuilds both toy models from the recorded seed: the table is the shipped one's, within
    the registry's tolerance (another processor rounds the training differently)."""
    assert main(["reproduce", "--out", str(tmp_path / "shipped"), "--only", "induction", "--quiet"]) == 0
    assert main(["reproduce", "--out", str(tmp_path / "retrained"), "--only", "induction", "--retrain", "--quiet",
                 "--cache", str(train_cache.root)]) == 0
    a = json.loads((tmp_path / "shipped" / "results.json").read_text())["induction"]
    b = json.loads((tmp_path / "retrained" / "results.json").read_text())["induction"]
    for model in ("two_layers", "one_layer"):
        for metric in ("loss", "accuracy"):
            assert b[model][metric] == pytest.approx(a[model][metric], abs=SHIPPED_MODELS["induction-2l"].tolerance[f"test_{metric}"])


@pytest.mark.parametrize("command,work", [(["train", "induction-1l"], "rs_interp.models.registry.train_shipped"),
                                          (["reproduce", "--only", "induction"], "rs_interp.reproduce.run_sections"),
                                          (["gpt2", "--weights", "random"], "rs_interp.models.gpt2.load_gpt2")])
def test_unwritable_out_fails_before_any_work(tmp_path, capsys, monkeypatch, command, work):
    """--out under a file: one line and a non-zero code before the long work is even started."""
    def never(*args, **kwargs):
        raise AssertionError("the long work started before --out was checked")

    monkeypatch.setattr(work, never)
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert main([*command, "--out", str(blocker / "sub")]) == 1
    err = capsys.readouterr().err
    assert "--out" in err and "not a writable directory" in err and len(err.strip().splitlines()) == 1


def test_negative_seed_is_refused_at_parse_time(capsys):
    with pytest.raises(SystemExit) as r:
        main(["reproduce", "--seed", "-1"])
    err = capsys.readouterr().err
    assert r.value.code == 2 and "seed" in err and "Traceback" not in err
