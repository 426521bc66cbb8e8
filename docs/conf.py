"""Sphinx configuration: MyST Markdown pages, the Furo theme, and the project's own directives
(docs/_ext): generated references and checked shell examples. Built strictly by `make test`:
.venv/bin/python -m sphinx -W --keep-going -n -b html docs build/docs"""

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS.parent), str(DOCS / "_ext")]

project = "training-platform"
author = "the training-platform team"
copyright = "2026, the training-platform team"
extensions = ["myst_parser", "reference", "commands"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence", "deflist"]
# Headings get anchors, so [text](page.md#a-heading) links are checked too.
myst_heading_anchors = 3
html_theme = "furo"
html_title = "training-platform"
html_static_path = ["_static"]
html_css_files = ["commands.css"]
# Every cross-reference must resolve (-n); links to the web are not fetched.
nitpicky = True
