"""Sphinx configuration for structconv."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "_ext"))  # the project's own directives

project = "structconv"
author = "structconv developers"
copyright = "2026, structconv developers"
extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    # Ships MathJax 3 and points mathjax_path at the copy in _static/: math renders offline.
    "sphinx-mathjax-offline",
    "sphinx.ext.doctest",
    "gpu_sessions",  # .. gpu-sessions::, .. gpu-bench::, .. bench-record::, .. host-record::: records as tables
]
autodoc_member_order = "bysource"
autodoc_typehints = "none"
napoleon_numpy_docstring = True
napoleon_google_docstring = False
napoleon_use_rtype = False
napoleon_custom_sections = ["Shapes"]  # the layers state input and output shapes, as PyG does
exclude_patterns = ["_build", "peers/*"]  # fragments, included by peers.rst
# Furo, with a wider content column and larger code than its defaults (_static/custom.css), so
# that the examples fit: `python docs/_ext/overflow.py docs/_build/html` measures it in Chromium.
html_theme = "furo"
html_title = "structconv"
# Only the stylesheet is static: the figures and downloads under _static/ are copied by the
# directives that use them.
html_static_path = ["_static/custom.css"]
html_css_files = ["custom.css"]
nitpicky = False
