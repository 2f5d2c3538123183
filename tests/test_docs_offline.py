"""The HTML docs load no script from the network: math renders from a local MathJax."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
SCRIPT = re.compile(r"<script\b[^>]*\bsrc=\"([^\"]+)\"", re.I)
STYLESHEET = re.compile(r"<link\b[^>]*\brel=\"stylesheet\"[^>]*\bhref=\"([^\"]+)\"", re.I)


@pytest.fixture(scope="module")
def html(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh HTML build of the docs (about 10 s on two cores)."""
    pytest.importorskip("sphinx")
    out = tmp_path_factory.mktemp("html")
    cmd = [sys.executable, "-m", "sphinx", "-q", "-b", "html", str(DOCS), str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return out


def test_every_script_and_stylesheet_is_local(html: Path) -> None:
    pages = sorted(html.glob("*.html"))
    assert len(pages) >= 8
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for src in SCRIPT.findall(text) + STYLESHEET.findall(text):
            assert "://" not in src and not src.startswith("//"), f"{page.name} loads {src}"
            assert (page.parent / src.split("?")[0]).is_file(), f"{page.name}: {src} is not in the build"


def test_math_pages_load_the_bundled_mathjax(html: Path) -> None:
    text = (html / "framework.html").read_text(encoding="utf-8")
    assert "_static/mathjax/tex-chtml.js" in SCRIPT.findall(text)
    assert r"\(" in text or r"\[" in text  # the TeX that MathJax typesets in the browser
    fonts = html / "_static" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2"
    assert any(fonts.glob("*.woff"))  # CommonHTML output loads its fonts beside the script
