"""``hb --version`` and a bare ``hb``, run as a real subprocess."""

from __future__ import annotations

import hamsterbunker
from tests.support.cli import run_hb


def test_version_prints_the_package_version_and_exits_0():
    """``hb --version`` prints ``hb <version>`` on stdout and exits 0."""
    result = run_hb(["--version"])
    assert (result.returncode, result.stdout, result.stderr) == (
        0,
        f"hb {hamsterbunker.__version__}\n",
        "",
    )


def test_bare_hb_prints_the_help_and_exits_2():
    """``hb`` alone prints the help (every command named) on stderr, not an argparse
    error, and exits 2: no command given is a usage mistake a script should notice."""
    result = run_hb([])
    assert result.returncode == 2, result
    assert result.stdout == ""
    assert result.stderr.startswith("usage: hb "), result.stderr
    assert "error" not in result.stderr.splitlines()[0]
    for command in ("run", "init", "status", "submit", "accept-loss", "demo"):
        assert f"    {command} " in result.stderr or f"    {command}\n" in result.stderr
    assert "--version" in result.stderr
    assert "Traceback" not in result.stderr
