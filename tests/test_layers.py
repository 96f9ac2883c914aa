"""The package's shape holds: layers import downwards only, no cycles within a folder, the plan stays CUDA-free
(the contracts are in pyproject.toml, checked by import-linter), and no module grows past what a reader takes in."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 600


def test_import_contracts_hold():
    pytest.importorskip("importlinter", reason="import-linter is part of the test extra: pip install -e '.[test]'")
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    p = subprocess.run([exe, "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "0 broken" in p.stdout, p.stdout


def test_no_module_is_longer_than_a_reader_takes_in():
    long = {str(f.relative_to(ROOT)): n for f in (ROOT / "fastmm").rglob("*.py")
            if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these modules by concern (at most {MAX_LINES} lines each): {long}"


def test_the_product_path_never_imports_the_tools():
    code = ("import sys, numpy, fastmm, fastmm.linalg; fastmm.explain((64, 64), (64, 64)); "
            "print(sorted(m for m in sys.modules if m.startswith('fastmm._tools')))")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]", p.stdout
