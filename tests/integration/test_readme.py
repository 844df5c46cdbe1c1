"""The README's example runs as written, its two set-up commands are the scripts CI uses, and the
examples that moved from the README to the documentation run as written there (under both
TransformerLens versions: the docs build, which runs every page's examples, runs in one pass only)."""

import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"


def _block(text: str, heading: str, where: str) -> str:
    """The first Python block after ``heading`` (an executed ```` ```python exec ```` block counts)."""
    match = re.search(heading + r".*?```python(?: exec)?\n(.*?)```", text, re.S)
    assert match, f"no Python block after {heading!r} in {where}"
    return match.group(1)


def test_notebook_example_runs_as_written(capsys):
    block = _block(README, r"## In a notebook\s+", "README.md")
    assert len(block.strip().splitlines()) <= 12, "the README's example is the short one; longer ones live in docs/"
    exec(compile(block, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "Score(" in out and "L0H" in out


def _own_prompts(heading: str) -> str:
    """The README's block after ``heading`` in "In a notebook": a drawn, evaluated circuit from your own prompts."""
    section = README.split("## In a notebook", 1)[1].split("\n## ", 1)[0]
    block = _block(section, heading, "README.md")
    assert len([line for line in block.splitlines() if line.strip()]) <= 10, "prompts to a circuit in at most 10 lines"
    return block


def _run_own_prompts(block: str, where: str, out: str, tmp_path, monkeypatch, capsys) -> dict:
    monkeypatch.chdir(tmp_path)  # the example writes its folder where the user stands
    ns: dict = {}
    exec(compile(block, where, "exec"), ns)
    printed = capsys.readouterr().out
    run = ns["run"]
    assert f"{run.size} of {run.n_edges} edges, faithfulness {run.faithfulness:.3f}" in printed
    assert run.share == 0.8 and run.faithfulness >= 0.8 and (tmp_path / out / "report.html").is_file()
    assert type(run.diagram()).__name__ == "Figure"
    return ns


def test_own_prompts_to_a_circuit_on_code2l_runs_as_written(tmp_path, monkeypatch, capsys):
    """Issue 61: the README's prompts-to-circuit example on code-2l, as written: the numbers its comment gives."""
    block = _own_prompts(r"Your own prompts, to a drawn and evaluated circuit")
    run = _run_own_prompts(block, "README.md", "my_circuit", tmp_path, monkeypatch, capsys)["run"]
    assert (run.size, run.n_edges) == (9, 46) and abs(run.faithfulness - 0.906) < 5e-4, (run.size, run.faithfulness)
    assert f"# {run.size} of 46 edges, faithfulness {run.faithfulness:.3f}" in block
    # the files name the model by its shape, not the backend's placeholder ("custom" on 3.x, "native" on 4.x)
    assert json.loads((tmp_path / "my_circuit" / "circuit.json").read_text())["model"].startswith("a model of 2 layers")


@pytest.mark.slow
def test_own_prompts_to_a_circuit_on_gpt2s_shape_runs_as_written(tmp_path, monkeypatch, capsys):
    """The same on GPT-2 small's shape (random weights) with IOI prompts of one's own: about half a minute."""
    block = _own_prompts(r"On GPT-2 small's shape with IOI prompts of your own")
    ns = _run_own_prompts(block, "README.md", "ioi_circuit", tmp_path, monkeypatch, capsys)
    assert ns["run"].n_edges == 32491 and ns["task"].clean.shape[0] == 3


def test_own_task_page_runs_as_written(capsys):
    """docs/capabilities/own-task.md's executed blocks, in order, in one namespace (as the docs build runs them, in
    one pass only): the refusals it prints name the pair and the word; the circuit is the one its text gives."""
    page = (DOCS / "capabilities" / "own-task.md").read_text()
    ns: dict = {}
    for block in re.findall(r"```python exec\n(.*?)```", page, re.S):
        exec(compile(block, "docs/capabilities/own-task.md", "exec"), ns)
    out = capsys.readouterr().out
    assert "the correct answer ' Mary' is 2 tokens, ' M' + 'ary'" in out and "the clean prompt is 22 tokens" in out
    run = ns["run"]
    assert f"it is {run.size} of `code-2l`'s 46 edges, faithfulness {run.faithfulness:.3f}" in " ".join(page.split())
    assert int(ns["keep"].sum()) > 0 and abs(ns["curve"].faithfulness[-1] - 1.0) < 1e-6


def test_first_session_example_runs_as_written(capsys):
    """README's former notebook example, now docs/getting-started.md's first session."""
    page = (DOCS / "getting-started.md").read_text()
    exec(compile(_block(page, r"## A first session\s+", "docs/getting-started.md"), "docs/getting-started.md", "exec"), {})
    out = capsys.readouterr().out
    assert "Score(" in out and "L0H" in out


def test_circuits_example_runs_as_written(capsys):
    page = (DOCS / "capabilities" / "circuits.md").read_text()
    exec(compile(_block(page, r"## Every edge, estimated", "docs/capabilities/circuits.md"), "circuits.md", "exec"), {})
    out = capsys.readouterr().out
    assert "EAP-IG" in out and re.search(r"\('[\w.]+', '[\w.]+'\)", out), out  # edges print as (sender, receiver)


def test_two_setup_commands_and_ci():
    commands = re.search(r"## Set-up: two commands.*?```bash\n(.*?)```", README, re.S).group(1).strip().splitlines()
    assert [c.split("#")[0].split()[:2] for c in commands] == [["bash", "scripts/reproduce.sh"], ["bash", "scripts/test.sh"]]
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    assert "-m ruff check ." in (ROOT / "scripts" / "test.sh").read_text()  # lint and import order, in the test command


def test_the_test_command_says_how_far_its_logged_pass_is(tmp_path):
    """Issue 61: scripts/test.sh's 3.x pass writes to a log printed at the end; while it runs, a line on stderr each
    minute (here each second) says how far it is, from pytest's progress in the log, and stops with the pass."""
    import subprocess
    import time

    log = tmp_path / "tl3.log"
    log.write_text("tests/circuits/test_acdc.py ....F. [ 10%]\ntests/heads/test_roles.py ..s.E [ 20%]\n")

    def watch(seconds: float, every: int) -> tuple[list[str], float]:
        script = (f'source "{ROOT / "scripts" / "_progress.sh"}"; sleep {seconds} & '
                  f'pass_progress $! "{log}" 3.x {every}; echo done >&2')
        start = time.perf_counter()
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
        return done.stderr.strip().splitlines(), time.perf_counter() - start

    lines, _ = watch(2.5, 1)
    line = r"== the 3\.x pass, \d+ s: 20% of its tests done \(now in tests/heads/test_roles\.py\), 2 failed so far"
    assert lines[-1] == "done" and lines[:-1] and all(re.fullmatch(line, x) for x in lines[:-1]), lines
    lines, seconds = watch(1, 60)  # the pass ends before a minute: nothing said, and the watcher ends with it
    assert lines == ["done"] and seconds < 30, (lines, seconds)
    text = (ROOT / "scripts" / "test.sh").read_text()
    assert 'source scripts/_progress.sh' in text and 'pass_progress "$pid3" "$logs/tl3.log" 3.x &' in text


def test_the_main_job_writes_where_the_user_stands(tmp_path):
    """Issue 61: ``bash scripts/reproduce.sh --out DIR`` from another folder writes DIR there, not inside the clone:
    the script sets up its venv in the clone and runs the job from the caller's folder. Run with a stand-in venv
    (RS_INTERP_VENV): its python passes pip calls by and runs the rest with this interpreter; its rs-interp records
    where it ran and with what."""
    import os
    import stat
    import subprocess
    import sys

    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    stubs = {"python": f'#!/bin/sh\n[ "$1 $2" = "-m pip" ] && exit 0\nexec "{sys.executable}" "$@"\n',
             "rs-interp": f'#!/bin/sh\npwd > "{tmp_path}/ran"\necho "$@" >> "{tmp_path}/ran"\n'}
    for name, text in stubs.items():
        (venv / name).write_text(text)
        (venv / name).chmod((venv / name).stat().st_mode | stat.S_IEXEC)
    user = tmp_path / "elsewhere"
    user.mkdir()
    env = {**os.environ, "RS_INTERP_VENV": str(venv.parent)}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "reproduce.sh"), "--out", "mine"], cwd=user, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ran").read_text().splitlines() == [str(user), "reproduce --out mine"]


def test_the_readme_points_to_the_docs_not_outside_the_repository():
    assert "scripts/build_docs.sh" in README and (ROOT / "scripts" / "build_docs.sh").is_file()
    assert "../shared" not in README and "The Transformer Block and the Residual Stream" in README
    for path in re.findall(r"`((?:docs|scripts)/[\w./-]+)`", README):
        assert (ROOT / path).exists(), f"README names {path}, which does not exist"


def test_the_readme_says_how_to_install_into_your_own_kernel():
    """Issue 42: the README's two commands make their own venvs; it also says, inline (not a third set-up
    command), how to install the clone into the user's own environment (tests/integration/test_packaging.py
    installs the wheel that way, non-editably, and imports it from the clone's root and notebooks/)."""
    section = README.split("## In your own kernel", 1)[1].split("\n## ", 1)[0]
    assert "pip install torch==2.13.0" in section and "pip install /path/to/this/clone" in section and "%pip install" in section
    assert "```" not in section
