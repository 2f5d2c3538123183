"""Measure, in a real browser, which example lines of the built HTML docs are wider than their box.

``python docs/_ext/overflow.py docs/_build/html`` (from the repository root, after
``sphinx-build -b html docs docs/_build/html``) opens every HTML page of the build in headless
Chromium at a desktop viewport (1280×800) and a laptop one (1024×768).  For every code block
(each ``pre`` inside a ``.highlight`` box, which is how Sphinx renders ``code-block``,
``doctest`` and the ``>>>`` blocks of docstrings, and any bare ``pre.doctest-block`` or
``pre.literal-block``) it checks whether the content is wider than the visible box
(``scrollWidth > clientWidth``) and measures each line with a DOM ``Range``, so that a line is
counted when its glyphs end past the box's content edge (the right padding is the margin).
It prints, per page and viewport, the number of overflowing lines and a total, then every
overflowing line (page, block, width, text) and how many monospace characters fit in the
narrowest and widest code box of the build.  The exit status is 1 when any line overflows at
1280 px (the laptop width is reported, not enforced), 0 otherwise.

Browser: Debian's Chromium (``apt-get install -y chromium``, ``/usr/bin/chromium``) driven by
the ``playwright`` package from PyPI (``pip install playwright``), whose own browser download
is not needed: it launches the given executable (``--chromium``, default ``/usr/bin/chromium``).
Pages are loaded from ``file://`` URLs with every network request refused, so the result does
not depend on a connection; what fits depends on the monospace font installed (Debian's
default is DejaVu Sans Mono).  Neither is needed by the test suite: ``tests/test_docs_layout.py``
checks line lengths against the character count this script measures.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

#: The viewports measured: (name, width, height).  The first one decides the exit status.
VIEWPORTS = (("desktop", 1280, 800), ("laptop", 1024, 768))

#: The code boxes measured: Pygments' ``pre`` and the bare blocks Sphinx writes unhighlighted.
SELECTOR = ".highlight pre, pre.doctest-block, pre.literal-block"

# Runs in the page: for every code box, its size, its font's character width and each line's width.
MEASURE = """
(selector) => {
  const probe = (pre) => {
    const s = document.createElement("span");
    s.textContent = "0".repeat(100);
    s.style.whiteSpace = "pre";
    s.style.visibility = "hidden";
    s.style.position = "absolute";
    pre.appendChild(s);
    const w = s.getBoundingClientRect().width / 100;
    s.remove();
    return w;
  };
  const lines = (pre) => {
    // Walk the text nodes once, cutting a Range at every newline.
    const walker = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
    const out = [];
    let start = null, text = "";
    const close = (node, offset) => {
      if (start === null) { out.push({text: text, width: 0}); text = ""; return; }
      const r = document.createRange();
      r.setStart(start[0], start[1]);
      r.setEnd(node, offset);
      out.push({text: text, width: r.getBoundingClientRect().width});
      start = null; text = "";
    };
    let node, last = null;
    while ((node = walker.nextNode())) {
      const t = node.nodeValue;
      for (let i = 0; i < t.length; i++) {
        if (t[i] === "\\n") { close(node, i); continue; }
        if (start === null) start = [node, i];
        text += t[i];
      }
      last = node;
    }
    if (text.length && last) close(last, last.nodeValue.length);
    return out;
  };
  const seen = new Set();
  return Array.from(document.querySelectorAll(selector)).filter((pre) => {
    if (seen.has(pre)) return false;
    seen.add(pre);
    return pre.getClientRects().length > 0;  // skip hidden ones (none today)
  }).map((pre) => {
    const cs = getComputedStyle(pre);
    const inner = pre.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
    return {
      scrollWidth: pre.scrollWidth,
      clientWidth: pre.clientWidth,
      inner: inner,
      charWidth: probe(pre),
      fontSize: cs.fontSize,
      lines: lines(pre),
    };
  });
}
"""


@dataclass
class Block:
    """One code box of one page at one viewport."""

    page: str
    index: int
    scroll_width: int
    client_width: int
    inner: float
    char_width: float
    font_size: str
    lines: list[dict[str, object]]

    @property
    def overflows(self) -> bool:
        return self.scroll_width > self.client_width

    @property
    def fits(self) -> int:
        """Monospace characters that fit on one line of this box."""
        return int(self.inner / self.char_width + 1e-6)

    def long_lines(self) -> list[tuple[float, str]]:
        """(width in px, text) of each line whose glyphs end past the box's content edge."""
        widths = [(float(str(ln["width"])), str(ln["text"])) for ln in self.lines]
        return [(w, t) for w, t in widths if w > self.inner + 0.5]


def measure(root: Path, chromium: str) -> dict[str, list[Block]]:
    """Every code box of every page under ``root``, per viewport name."""
    from playwright.sync_api import sync_playwright  # only this script needs it

    pages = sorted(p for p in root.rglob("*.html") if "_static" not in p.parts and "_sources" not in p.parts)
    if not pages:
        raise SystemExit(f"no HTML pages under {root}: build the docs first")
    result: dict[str, list[Block]] = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        for name, width, height in VIEWPORTS:
            context = browser.new_context(viewport={"width": width, "height": height})
            context.route("http://*/**", lambda route: route.abort())
            context.route("https://*/**", lambda route: route.abort())
            tab = context.new_page()
            blocks: list[Block] = []
            for page in pages:
                tab.goto(page.resolve().as_uri(), wait_until="load")
                tab.evaluate("document.fonts.ready")
                rel = page.relative_to(root).as_posix()
                for i, b in enumerate(tab.evaluate(MEASURE, SELECTOR)):
                    sizes = (b["scrollWidth"], b["clientWidth"], b["inner"], b["charWidth"])
                    blocks.append(Block(rel, i, *sizes, b["fontSize"], b["lines"]))
            result[name] = blocks
            context.close()
        browser.close()
    return result


def report(result: dict[str, list[Block]], verbose: bool) -> int:
    """Print the counts; return the number of overflowing lines at the first viewport."""
    names = [v[0] for v in VIEWPORTS]
    pages = sorted({b.page for blocks in result.values() for b in blocks})
    lines = {n: defaultdict(int) for n in names}  # page -> overflowing lines
    fits = {n: {} for n in names}  # page -> characters that fit in its narrowest code box
    for n in names:
        for b in result[n]:
            lines[n][b.page] += len(b.long_lines())
            fits[n][b.page] = min(fits[n].get(b.page, b.fits), b.fits)
    head = "".join(f"{f'{n} {w}px: lines (fit)':>28}" for n, w, _ in VIEWPORTS)
    print(f"{'page':<24}{'blocks':>7}{head}")
    for page in pages:
        n_blocks = sum(1 for b in result[names[0]] if b.page == page)
        cells = "".join(f"{lines[n][page]:>22} ({fits[n][page]:>3})" for n in names)
        print(f"{page:<24}{n_blocks:>7}{cells}")
    totals = {n: sum(lines[n].values()) for n in names}
    print(f"{'total':<31}" + "".join(f"{totals[n]:>22}{'':6}" for n in names))
    print("(fit: monospace characters per line in the page's narrowest code box)")
    for n, w, _ in VIEWPORTS:
        blocks = result[n]
        boxes = sum(1 for b in blocks if b.overflows)
        sizes = ", ".join(sorted({b.font_size for b in blocks}))
        print(f"{n} {w}px: {len(blocks)} code boxes, {boxes} with scrollWidth > clientWidth; code font {sizes}")
    for n, w, _ in VIEWPORTS:
        if n != names[0] and not verbose:
            continue
        for b in result[n]:
            for width, text in b.long_lines():
                print(f"{n} {w}px  {b.page} #{b.index}: {width:.0f}px > {b.inner:.0f}px ({len(text)} chars): {text}")
    return totals[names[0]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("html", type=Path, help="the HTML build folder (docs/_build/html)")
    parser.add_argument("--chromium", default="/usr/bin/chromium", help="the Chromium executable")
    parser.add_argument("-v", "--verbose", action="store_true", help="also list the lines at the laptop width")
    args = parser.parse_args(argv)
    overflowing = report(measure(args.html, args.chromium), args.verbose)
    return 1 if overflowing else 0


if __name__ == "__main__":
    sys.exit(main())
