"""The documentation stays true: the site builds without warnings, links resolve, docstrings run.

- The Sphinx site (docs/) builds with warnings as errors, and its API reference and command-line pages cover
  every public name and subcommand (skipped, with the reason, where the `docs` extra is not installed).
- Every relative link in README.md and docs/ resolves to a file in the repository.
- No tracked file refers to a path outside the repository: relative paths that climb above its root, or the
  private locations of one development setup (listed below).
- The public docstrings have numpydoc's sections, and their examples that need no GPU run as doctests.
"""

from __future__ import annotations

import ast
import doctest
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
DOCS_EXTRA = ("sphinx", "numpydoc", "myst_parser", "pydata_sphinx_theme", "sphinx_copybutton")


def _require_docs_extra():
    for module in DOCS_EXTRA:
        pytest.importorskip(module, reason=f"the docs extra is not installed ({module} is missing): "
                                           "pip install -e '.[docs]'")


def tracked_files() -> list[Path]:
    """The files of the repository: where this is a clone, git's tracked files and the new files it does not
    ignore (so that a page added but not yet committed counts); else every file below the root."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, check=True).stdout
        return [ROOT / p for p in dict.fromkeys(out.decode().split("\0")) if p and (ROOT / p).is_file()]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", ".ci-venv", "__pycache__", ".pytest_cache", ".asv", "_build"}
        return [p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None  # images and other binary files


# ---------------------------------------------------------------------------------------------------------
# The site
# ---------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    _require_docs_extra()
    out = tmp_path_factory.mktemp("docs")
    # README's command, with the output and Sphinx's cache in a temporary folder; -W turns warnings into errors.
    p = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                        "-d", str(out / "doctrees"), str(DOCS), str(out / "html")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"the docs build failed or warned:\n{p.stdout}\n{p.stderr}"
    return out / "html"


def test_docs_build_without_warnings(built_site):
    for page in ("index", "api", "cli", "gpu-machine", "measuring", "kernels/index", "dispatch", "runtime",
                 "benchmarks"):
        assert (built_site / f"{page}.html").is_file(), f"{page} is not in the site"
    assert (built_site / "_images" / "bench.png").is_file(), "the bench figure is missing"


def test_api_reference_covers_every_public_name(built_site):
    import fastmm

    api = (built_site / "api.html").read_text(encoding="utf-8")
    linalg_names = ast.literal_eval(_module_all(ROOT / "fastmm" / "linalg.py"))
    dask_names = [f"dask.{n}" for n in ast.literal_eval(_module_all(ROOT / "fastmm" / "dask.py"))]
    missing = [n for n in [*fastmm.__all__, *linalg_names, *dask_names] if f'id="fastmm.{n}"' not in api]
    assert not missing, f"docs/api.rst documents no entry for {missing}"


def test_cli_page_shows_every_subcommand(built_site, capsys):
    from fastmm.__main__ import main

    with pytest.raises(SystemExit):
        main(["--help"])  # argparse prints the help, with the subcommands as {a,b,...}, and exits
    subcommands = re.search(r"\{([\w,-]+)\}", capsys.readouterr().out).group(1).split(",")
    assert {"info", "compile", "explain", "bench", "autotune"} <= set(subcommands)
    cli = (built_site / "cli.html").read_text(encoding="utf-8")
    for sub in subcommands:
        assert f"usage: python -m fastmm {sub}" in cli, f"docs/cli.md shows no --help for {sub!r}"


def _module_all(path: Path) -> str:
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return ast.unparse(node.value)
    raise AssertionError(f"{path} has no __all__")


# ---------------------------------------------------------------------------------------------------------
# Links and paths
# ---------------------------------------------------------------------------------------------------------

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_MD_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HTML_SRC = re.compile(r"""<(?:img|a)\s[^>]*(?:src|href)=["']([^"']+)["']""")
_RST_LINK = re.compile(r"`[^`<]*<([^>`]+)>`__?")
_RST_FILE = re.compile(r"^\s*\.\. (?:image|figure|include|literalinclude)::\s*(\S+)", re.M)
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def link_targets(path: Path) -> list[str]:
    """The targets of the links and images of a Markdown or reStructuredText page, code blocks left out."""
    text = _text(path) or ""
    if path.suffix == ".rst":
        prose = re.sub(r"^(\s*)\.\. code-block::.*?(?=^\S)", "", text, flags=re.S | re.M)
        return _RST_LINK.findall(prose) + _RST_FILE.findall(prose)
    prose = _CODE_SPAN.sub("", _FENCE.sub("", text))
    return _MD_LINK.findall(prose) + _HTML_SRC.findall(prose)


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(p for p in DOCS.rglob("*") if p.suffix in (".md", ".rst")
                                        and "_build" not in p.parts)]


def test_link_extraction_finds_links_and_leaves_out_code():
    # The checker checks something: a guard against a regular expression that silently matches nothing.
    targets = link_targets(ROOT / "README.md")
    assert "docs/kernels/index.md" in targets and "docs/index.md" in targets
    assert "bench.png" in link_targets(DOCS / "index.md")
    assert "measuring.md" in link_targets(DOCS / "benchmarks.md")


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_to_files_in_the_repository(page):
    files = {p.resolve() for p in tracked_files()}
    bad = []
    for target in link_targets(page):
        if _URL.match(target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        resolved = (page.parent / path).resolve()
        if not resolved.is_relative_to(ROOT):
            bad.append(f"{target} (outside the repository)")
        elif resolved not in files and not (resolved.is_dir() and any(f.is_relative_to(resolved) for f in files)):
            bad.append(f"{target} (no such file in the repository)")
    assert not bad, f"{page.relative_to(ROOT)} links to: {bad}"


# Private locations of one development setup, which a clone of fastmm does not have. Each is assembled from
# pieces so that this file does not contain the strings it looks for (it is scanned like every other file).
_SETUP_ONLY = {
    "a folder next to the checkout": re.escape(".." + "/shared"),
    "an output folder of a remote runner": r"\$\{?" + "OUT" + r"\b",
    "the development machine's work tree": re.escape("/" + "work/"),
    "a staging folder ignored by git": re.escape("." + "gpu/"),
    "the development setup's measuring notes": re.escape("PERF" + ".md"),
    "machines on loan to a session": r"\b" + "le" + "nt" + r"\b",
    "home and scratch folders": r"(?<![\w.~$}])/(?:" + "tmp|root|home" + r")/",
}
# Ignore patterns name what is kept out of the repository on purpose: they may name such folders.
_EXEMPT = {".gitignore"}
_CLIMB = re.compile(r"(?<![\w.])((?:\.\./)+)")


def test_no_file_refers_to_a_path_outside_the_repository():
    problems = []
    for path in tracked_files():
        rel = path.relative_to(ROOT)
        text = _text(path)
        if text is None or str(rel) in _EXEMPT:
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            for what, pattern in _SETUP_ONLY.items():
                if re.search(pattern, line):
                    problems.append(f"{rel}:{lineno}: {what}: {line.strip()[:120]}")
            for climb in _CLIMB.findall(line):
                if not (path.parent / climb).resolve().is_relative_to(ROOT):
                    problems.append(f"{rel}:{lineno}: climbs above the repository root: {line.strip()[:120]}")
    assert not problems, "paths outside the repository:\n" + "\n".join(problems)


def test_outside_path_patterns_catch_what_they_should():
    # The patterns above, against lines they must catch and lines they must let through.
    caught = ["run " + ".." + "/shared/x", "tee $" + "OUT/log", "cd /" + "work/main", "source ." + "gpu/env.sh",
              "see PERF" + ".md", "on the le" + "nt machine", "pip install --target /" + "tmp/site"]
    passed = ["an excellent, silent kernel", "~/.cache/fastmm", "docs/measuring.md", "$CUDA_HOME/bin/nvcc",
              "/usr/local/cuda/bin/nvcc", "OUTDIR", "a/tmp/b"]
    for line in caught:
        assert any(re.search(p, line) for p in _SETUP_ONLY.values()), line
    for line in passed:
        assert not any(re.search(p, line) for p in _SETUP_ONLY.values()), line
    assert _CLIMB.findall("x " + ".." + "/" + ".." + "/y") == [".." + "/" + ".." + "/"]


# ---------------------------------------------------------------------------------------------------------
# Docstrings
# ---------------------------------------------------------------------------------------------------------

# Modules whose docstrings hold examples; those marked True import CuPy at import time.
DOCTEST_MODULES = {"fastmm": False, **{f"fastmm._plan.{m}": False for m in ("problem", "tiles", "table", "precision",
                                                                             "forced", "tuned", "describe", "cublas_ahead")},
                   "fastmm._tools.bench": False, "fastmm._tools.autotune": False, "fastmm.__main__": False,
                   "fastmm._errors": False, "fastmm.linalg": True, "fastmm._array": True}


@pytest.mark.parametrize("name", DOCTEST_MODULES)
def test_docstring_examples_run(name):
    if DOCTEST_MODULES[name]:
        pytest.importorskip("cupy", reason=f"{name} imports CuPy (its examples need a GPU and are skipped anyway)")
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, name, globs={}):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (output above)"


# The public API's docstrings, read from the source (so that no CuPy is needed): (file, name, NumPy namesake).
PUBLIC_DOCSTRINGS = [
    *[("fastmm/linalg.py", n, f"numpy.{n}") for n in ("matmul", "dot", "inner", "vdot", "tensordot", "einsum",
                                                       "matvec", "vecmat", "vecdot")],
    ("fastmm/_array.py", "asarray", "numpy.asarray"),
    ("fastmm/_array.py", "asnumpy", None),
    ("fastmm/_array.py", "ndarray", None),
    ("fastmm/__init__.py", "explain", None),
    ("fastmm/_plan/forced.py", "use_kernel", None),
    ("fastmm/_plan/forced.py", "kernel_names", None),
    ("fastmm/_hooks/numpy_hook.py", "accelerate_numpy", None),
    ("fastmm/_hooks/numpy_hook.py", "restore_numpy", None),
    ("fastmm/_hooks/numpy_hook.py", "numpy_hook_status", None),
    ("fastmm/_hooks/host_model.py", "HostModel", None),
]


def _definition(path: str, name: str):
    for node in ast.walk(ast.parse((ROOT / path).read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return node
    raise AssertionError(f"{path} defines no {name}")


@pytest.mark.parametrize("path,name,namesake", PUBLIC_DOCSTRINGS, ids=[p[1] for p in PUBLIC_DOCSTRINGS])
def test_public_docstrings_have_numpydoc_sections(path, name, namesake):
    pytest.importorskip("numpydoc", reason="numpydoc is part of the docs extra: pip install -e '.[docs]'")
    from numpydoc.docscrape import NumpyDocString

    node = _definition(path, name)
    doc = NumpyDocString(ast.get_docstring(node) or "")
    assert doc["Summary"], f"{name}: no summary line"
    assert doc["See Also"], f"{name}: no See Also section"
    assert any(line.lstrip().startswith(">>>") for line in doc["Examples"]), f"{name}: no Examples"
    if isinstance(node, ast.FunctionDef):
        args = node.args
        wanted = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
        wanted += [f"*{args.vararg.arg}"] if args.vararg else []
        wanted += [f"**{args.kwarg.arg}"] if args.kwarg else []
        documented = [n.strip() for p in doc["Parameters"] for n in p.name.split(",")]
        assert sorted(documented) == sorted(wanted), f"{name}: Parameters {documented}, signature {wanted}"
        if name != "use_kernel":  # a context manager: it returns nothing a caller uses
            assert doc["Returns"], f"{name}: no Returns section"
    if namesake:
        # Each says how it differs from NumPy's function of the same name, and names it.
        see_also = [n for names, _ in doc["See Also"] for n, _ in names]
        assert namesake in see_also, f"{name}: See Also does not name {namesake}"
