"""Each script's --help prints its header comment and exits at once, before it builds, installs,
downloads or takes --help for an argument (run.sh, which lists `k3moe run`'s options after a build,
is left out; usage.sh and bench_output.sh are sourced, not run)."""

import pathlib
import subprocess

import pytest

SCRIPTS = pathlib.Path(__file__).resolve().parents[2] / "scripts"
SHELL_SCRIPTS = sorted(p for p in SCRIPTS.glob("*.sh") if p.name not in ("run.sh", "usage.sh", "bench_output.sh"))


def header_first_line(script):
    return script.read_text().splitlines()[1].removeprefix("# ")


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: p.name)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_the_header_and_exits(script, flag, tmp_path):
    result = subprocess.run(["bash", str(script), flag], capture_output=True, text=True, timeout=10, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(header_first_line(script)), result.stdout
    assert list(tmp_path.iterdir()) == [], "--help wrote files"
