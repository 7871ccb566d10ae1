"""README's two set-up commands exist and CI runs the second one verbatim."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _setup_commands() -> list[str]:
    lines = (ROOT / "README.md").read_text().splitlines()
    cmds = []
    for i, line in enumerate(lines):
        if (
            line.strip() == "```bash"
            and i > 0
            and "set-up" in "".join(lines[max(0, i - 3) : i]).lower()
        ):
            cmds.append(lines[i + 1].strip())
    return cmds


def test_readme_has_exactly_two_setup_commands_and_ci_runs_the_second():
    cmds = _setup_commands()
    assert len(cmds) == 2, cmds
    assert "dpaudit train dp-rvfl --eps 2" in cmds[0]
    assert "pytest" in cmds[1]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert cmds[1] in [line.strip() for line in ci]
