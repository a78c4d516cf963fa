"""The import layering of pyproject.toml's [tool.importlinter] contracts, checked by lint-imports.

The contracts forbid import cycles in hamsterbunker/ and tui/, the stores importing
anything above the store interface, and any module outside hamsterbunker.stores (the
TUI included) importing a backend's module, the record layer or the chains module:
to open a store, or to check a store's type instead of asking it (``Store.chains``,
``Store.report``). The same check run on a copy of the code with one bad import
planted shows each contract can fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = (
    "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True))"
)


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    """Run lint-imports over the packages under tree, with tree's pyproject.toml."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(tree / "tui")])}
    return subprocess.run(
        [sys.executable, "-c", LINT],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_code_keeps_every_layering_contract() -> None:
    """lint-imports exits 0 on the code as it is: no cycle, no forbidden import."""
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def copy_of_the_code(tmp_path: Path) -> Path:
    for name in ("hamsterbunker", "pyproject.toml", "tui/hamsterbunker_tui"):
        source, target = ROOT / name, tmp_path / name
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, target)
    return tmp_path


PLANTED = {
    # The records, which the stores import, importing the store interface back.
    "cycle": (
        "hamsterbunker/records/cluster.py",
        "from ..stores import base as _planted  # noqa",
        "No import cycles",
    ),
    "stores-import-the-node": (
        "hamsterbunker/stores/base.py",
        "from .. import lease as _planted  # noqa",
        "The stores know nothing above the store interface",
    ),
    "tui-opens-a-backend": (
        "tui/hamsterbunker_tui/model.py",
        "from hamsterbunker.stores import backends as _planted  # noqa",
        "Only the stores package opens a backend",
    ),
    # Importing a store's type to check for it: callers read Store.chains and report().
    "tui-checks-for-a-syncdir-store": (
        "tui/hamsterbunker_tui/app.py",
        "from hamsterbunker.stores.syncdir import SyncDirStore as _planted  # noqa",
        "Only the stores package opens a backend",
    ),
    "status-imports-the-chains-module": (
        "hamsterbunker/ops/status.py",
        "from ..stores.chains import Chains as _planted  # noqa",
        "Only the stores package opens a backend",
    ),
    "node-opens-the-record-layer": (
        "hamsterbunker/node/runtime.py",
        "from ..stores.layer import RecordStore as _planted  # noqa",
        "Only the stores package opens a backend",
    ),
}


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_a_planted_bad_import_breaks_its_contract(copy_of_the_code: Path, case: str) -> None:
    """One bad import added to a copy of the code makes lint-imports fail, naming the contract."""
    module, line, contract = PLANTED[case]
    path = copy_of_the_code / module
    path.write_text(path.read_text() + f"\n{line}\n")
    result = lint_imports(copy_of_the_code)
    assert result.returncode == 1, result.stdout + result.stderr
    broken = result.stdout.split("Broken contracts", 1)[1]
    assert contract in broken, result.stdout
