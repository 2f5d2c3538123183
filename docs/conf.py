"""Sphinx configuration for structconv."""

project = "structconv"
author = "structconv developers"
copyright = "2026, structconv developers"
extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.doctest",
]
autodoc_member_order = "bysource"
autodoc_typehints = "none"
napoleon_numpy_docstring = True
napoleon_google_docstring = False
napoleon_use_rtype = False
exclude_patterns = ["_build", "peers/*"]  # fragments, included by peers.rst
html_theme = "alabaster"
nitpicky = False
