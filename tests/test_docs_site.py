"""The docs site as a newcomer opens it (issue #57): `mkdocs build --strict` of this checkout, then the pages
they open first (the index, getting started, the metrics reference) in headless Chromium (Debian's `chromium`,
`make chromium`) at 1280 px wide. In each page a small script measures the laid-out page: nothing wider than
the window, no code block that scrolls sideways (its comments clipped), no table wider than its column, and no
name in a table broken inside a word (a break only after a dot, an underscore, a comma or a space); the
results come back in the DOM (`--dump-dom`). A screenshot of each page is taken too."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.server

REPO = Path(__file__).resolve().parents[1]
PAGES = ["index.html", "getting-started/index.html", "reference/metrics/index.html"]
WIDTH = 1280
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         f"--window-size={WIDTH},1000"]

# What the page reports, once laid out (fonts and the theme's own script included): JSON in body[data-layout].
PROBE = r"""
<script>
window.addEventListener("load", () => setTimeout(() => {
  const root = document.documentElement, out = {page: [root.scrollWidth, root.clientWidth], code: [], tables: [],
    breaks: [], blocks: 0, names: 0};
  for (const code of document.querySelectorAll(".md-content pre > code")) {
    out.blocks += 1;
    if (code.scrollWidth > code.clientWidth + 1 || code.parentElement.scrollWidth > code.parentElement.clientWidth + 1)
      out.code.push(code.textContent.slice(0, 80));
  }
  for (const table of document.querySelectorAll(".md-content table")) {
    for (let box = table; box && !box.classList.contains("md-content__inner"); box = box.parentElement)
      if (box.scrollWidth > box.clientWidth + 1) { out.tables.push([table.rows[0].textContent.slice(0, 60),
        box.className || box.tagName, box.scrollWidth, box.clientWidth]); break; }
  }
  for (const code of document.querySelectorAll(".md-content td code")) {
    out.names += 1;
    const text = code.textContent, walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
    let top = null, before = "";
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (let i = 0; i < node.length; i++) {
        const range = document.createRange(); range.setStart(node, i); range.setEnd(node, i + 1);
        const rect = range.getClientRects()[0];
        if (!rect) continue;
        if (top !== null && rect.top > top + 2 && !/[._, ]/.test(before)) out.breaks.push(text);
        top = rect.top; before = node.data[i];
      }
    }
  }
  document.body.setAttribute("data-layout", JSON.stringify(out));
}, 300));
</script>
"""


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium missing: run `make chromium` (Debian's chromium)")
    return found


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    for page in PAGES:
        path = out / page
        path.write_text(path.read_text().replace("</body>", PROBE + "</body>"))
    return out


def _run(site: Path, page: str, *args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    profile.mkdir()
    return subprocess.run([_chromium(), *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=5000", *args,
                           (site / page).as_uri()], capture_output=True, text=True, timeout=120, cwd=tmp_path)


@pytest.mark.parametrize("page", PAGES)
def test_a_newcomers_page_fits_the_window_at_1280_px(site, page, tmp_path):
    done = _run(site, page, "--dump-dom", tmp_path=tmp_path)
    match = re.search(r'data-layout="([^"]*)"', done.stdout)
    assert match, (done.returncode, done.stderr[-2000:], done.stdout[-500:])
    layout = json.loads(match[1].replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))
    scroll, client = layout["page"]
    assert client == WIDTH and scroll <= client, layout  # nothing wider than the window
    assert layout["code"] == [], layout["code"]  # no code block scrolls sideways: its comments are in view
    assert layout["tables"] == [], layout["tables"]  # no table wider than the content column
    assert layout["breaks"] == [], layout["breaks"]  # no name broken inside a word
    if page.startswith("reference/metrics"):
        assert layout["names"] >= 50  # the instruments' and series' names were measured
    else:
        assert layout["blocks"] >= 1  # the install-and-enable (and quickstart) blocks were measured


def test_a_screenshot_of_each_page_is_the_windows_width(site, tmp_path):
    for page in PAGES:
        shot = tmp_path / (page.replace("/", "-") + ".png")
        done = _run(site, page, f"--screenshot={shot}", tmp_path=tmp_path)
        assert shot.exists(), (page, done.stderr[-2000:])
        data = shot.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", data[16:24])
        assert (width, height) == (WIDTH, 1000) and len(data) > 20_000, (page, width, height, len(data))
