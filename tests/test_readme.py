"""The README's notebook example runs as written, and its two set-up commands are the scripts CI uses."""

import pathlib
import re

ROOT = pathlib.Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def test_notebook_example_runs_as_written(capsys):
    block = re.search(r"## In a notebook\s+```python\n(.*?)```", README, re.S).group(1)
    exec(compile(block, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "Score(" in out


def test_circuits_example_runs_as_written(capsys):
    block = re.search(r"## Circuits.*?```python\n(.*?)```", README, re.S).group(1)
    exec(compile(block, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "EAP-IG" in out and " -> " in out


def test_two_setup_commands_and_ci():
    commands = re.search(r"## Set-up: two commands.*?```bash\n(.*?)```", README, re.S).group(1).strip().splitlines()
    assert [c.split("#")[0].split()[:2] for c in commands] == [["bash", "scripts/reproduce.sh"], ["bash", "scripts/test.sh"]]
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
