"""Sphinx directive ``fastmm-help``: the ``--help`` text of ``python -m fastmm`` or of one subcommand.

The command line page shows what the parser itself prints, taken at build time, so the page cannot drift from
the code. Usage in Markdown (MyST)::

    ```{fastmm-help} bench
    ```

With no argument it shows the top-level help.
"""

from __future__ import annotations

import contextlib
import io
import os

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

# argparse wraps to $COLUMNS: fix the width so that the page does not depend on the terminal that built it.
_WIDTH = "100"


def help_text(subcommand: str | None = None) -> str:
    from fastmm.__main__ import main

    argv = ([subcommand] if subcommand else []) + ["--help"]
    out = io.StringIO()
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = _WIDTH
    try:
        with contextlib.redirect_stdout(out):
            try:
                main(argv)
            except SystemExit as e:  # argparse exits after printing the help
                if e.code not in (0, None):
                    raise RuntimeError(f"python -m fastmm {' '.join(argv)} exited with {e.code}") from None
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved
    return out.getvalue().rstrip()


class FastmmHelp(SphinxDirective):
    optional_arguments = 1
    has_content = False

    def run(self):
        sub = self.arguments[0] if self.arguments else None
        text = help_text(sub)
        block = nodes.literal_block(text, text)
        block["language"] = "text"
        return [block]


def setup(app):
    app.add_directive("fastmm-help", FastmmHelp)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
