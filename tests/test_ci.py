"""CI runs what the README tells a user to run."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    """The commands of the README's first code block, comments left out."""
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    return [line.strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_ci_runs_the_readme_test_command_once():
    commands = readme_commands()
    assert len(commands) == 2, commands          # set up + main job; set up + tests
    test_command = commands[1]
    assert test_command.endswith("-m pytest")
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ci_lines.count(test_command) == 1
    assert sum("pip install" in line for line in ci_lines) == 1   # one venv, one install
