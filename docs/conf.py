"""Sphinx configuration for fastmm's documentation site.

Build it from the repository root (the `docs` extra installs Sphinx and its extensions):

    python -m sphinx -W -b html docs docs/_build/html

The build needs no GPU and no CuPy: CuPy and PyCUDA are mocked while the API reference imports fastmm, so the
site builds the same on a laptop, in CI and on a GPU machine.
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))        # fastmm_cli: the command line's --help texts
sys.path.insert(0, str(DOCS.parent))          # fastmm itself, also when it is not installed

import fastmm  # noqa: E402

project = "fastmm"
author = "fastmm developers"
copyright = "fastmm developers"
release = version = fastmm.__version__

extensions = [
    "sphinx.ext.autodoc",
    "numpydoc",
    "myst_parser",
    "sphinx_copybutton",
    "fastmm_cli",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# fastmm.ndarray subclasses cupy.ndarray and fastmm/_array.py imports CuPy at import time: a mock stands in for
# CuPy (and PyCUDA) so that the reference builds where neither is installed, and reads the same where they are.
# Single backquotes in docstrings name Python objects (numpydoc's convention): links where fastmm documents the
# object, code where it does not (parameter names, NumPy's functions: no intersphinx, see below).
default_role = "py:obj"

autodoc_mock_imports = ["cupy", "pycuda", "dask", "distributed"]  # fastmm.dask's extra: Dask and distributed
autodoc_typehints = "none"            # the numpydoc Parameters sections carry the types
autodoc_member_order = "bysource"

numpydoc_show_class_members = False   # classes list no inherited CuPy members (they are CuPy's, and mocked here)
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3              # so that links to a section (page.md#section) resolve

# No intersphinx: the build must not need the network (GPU hosts and CI runners may have none).
html_theme = "pydata_sphinx_theme"
html_title = f"fastmm {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "navbar_center": [],              # the sidebar lists the pages; no second copy in the header
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": [],
}
templates_path = ["_templates"]
html_sidebars = {"**": ["sidebar-pages"]}  # docs/_templates/sidebar-pages.html: every page, always
html_show_sourcelink = False


def _cupy_base(app, name, obj, options, bases):
    # Under the mock, fastmm.ndarray's base would show as a bare "ndarray": name it, CuPy's array.
    if name == "fastmm.ndarray":
        bases[:] = [":class:`cupy.ndarray`"]


def setup(app):
    app.connect("autodoc-process-bases", _cupy_base)
