"""`spectrace top` in a real terminal: tmux (a private server) runs it against a loopback /metrics page
whose counters move; the screen is captured, the window refreshes to the counters' gain, `q` quits with
exit 0; a 20x5 terminal is one line and exit 2. Needs tmux (`make test` installs Debian's)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_top import ACCEPTED, DRAFTED, LENGTHS, Pages, spectrace_page, vllm_page

pytestmark = pytest.mark.server

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def tmux():
    if shutil.which("tmux") is None:
        pytest.fail("tmux missing: run `make tmux` (Debian's tmux)")
    socket = f"spectrace-test-{os.getpid()}"

    def run(*args, check=True):
        return subprocess.run(["tmux", "-L", socket, "-f", "/dev/null", *args], capture_output=True, text=True,
                              check=check, timeout=10)

    yield run
    run("kill-server", check=False)


def _start(tmux, name, width, height, argv):
    env = f"env -u COLUMNS -u LINES PYTHONPATH={REPO} TERM=xterm-256color"  # (pytest sets COLUMNS and LINES)
    command = f"{env} {sys.executable} -m spectrace.cli top {' '.join(argv)}; echo EXIT=$?; sleep 60"
    tmux("new-session", "-d", "-s", name, "-x", str(width), "-y", str(height), command)


def _screen(tmux, name):
    return tmux("capture-pane", "-p", "-J", "-S", "-", "-t", name).stdout


def _wait(tmux, name, predicate, what, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        screen = _screen(tmux, name)
        if predicate(screen):
            return screen
        time.sleep(0.2)
    raise AssertionError(f"{what} did not show in {timeout:.0f} s; the screen:\n{_screen(tmux, name)}")


def test_live_view_refreshes_and_q_quits(tmux):
    pages = Pages()
    try:
        first = spectrace_page(DRAFTED, ACCEPTED, LENGTHS, findings=[("TAP_MISMATCH", "error", "draft")]) + vllm_page(400, ACCEPTED)
        later = spectrace_page([1400, 1300, 1200], [1120, 30, 10], {1: 280, 2: 1100, 3: 10, 4: 10},
                               findings=[("TAP_MISMATCH", "error", "draft")]) + vllm_page(1400, [1120, 30, 10])
        url = pages.serve("/metrics", first, later)
        _start(tmux, "live", 110, 45, [url, "--interval", "0.5", "--window", "0.1"])
        screen = _wait(tmux, "live", lambda s: "Acceptance by draft position" in s, "the first frame")
        # the window: what the counters gained between the first and a later scrape
        screen = _wait(tmux, "live", lambda s: "last " in s and "1,000" in s, "a windowed frame")
        rows = {line.split()[0]: line.split()[1:4] for line in screen.splitlines()
                if line.strip()[:1].isdigit() and len(line.split()) > 4}
        assert rows["0"] == ["1,000", "800", "80.0%"] and rows["1"] == ["900", "20", "2.2%"], screen
        assert "◀ cliff" in screen and "TAP_MISMATCH" in screen and "q quits" in screen
        tmux("send-keys", "-t", "live", "q")
        screen = _wait(tmux, "live", lambda s: "EXIT=" in s, "the exit")
        assert "EXIT=0" in screen and "Traceback" not in screen
    finally:
        pages.close()


def test_a_tiny_terminal_is_one_line_and_exit_2(tmux):
    pages = Pages()
    try:
        url = pages.serve("/metrics", spectrace_page(DRAFTED, ACCEPTED))
        _start(tmux, "tiny", 20, 5, [url])
        screen = _wait(tmux, "tiny", lambda s: "EXIT=" in s, "the exit")
        joined = "".join(screen.split("\n"))
        assert "EXIT=2" in joined and "spectrace: error: the terminal is 20x5; spectrace top needs at least 60x12" in joined, screen
        assert "Traceback" not in joined
    finally:
        pages.close()


def test_escape_sequences_in_a_pages_labels_never_reach_the_terminal(tmux):
    """The live view of a page whose labels carry an OSC that retitles the pane and a CSI that clears the screen:
    the pane keeps its title, and the sequences show as text."""
    from test_hardening_pages import hostile_page

    pages = Pages()
    try:
        url = pages.serve("/metrics", hostile_page())
        tmux("new-session", "-d", "-s", "hostile", "-x", "150", "-y", "50", "sleep 120")
        tmux("select-pane", "-t", "hostile", "-T", "before")
        env = f"env -u COLUMNS -u LINES PYTHONPATH={REPO} TERM=xterm-256color"
        tmux("respawn-pane", "-k", "-t", "hostile",
             f"{env} {sys.executable} -m spectrace.cli top {url} --interval 0.5; echo EXIT=$?; sleep 60")
        screen = _wait(tmux, "hostile", lambda s: "Findings" in s and "PWNED" in s, "the findings")
        assert "TAP\\x1b]2;PWNED" in screen.replace("\n", "") and "[red]x[/]" in screen
        assert tmux("display-message", "-p", "-t", "hostile", "#{pane_title}").stdout.strip() == "before"
        tmux("send-keys", "-t", "hostile", "q")
        screen = _wait(tmux, "hostile", lambda s: "EXIT=" in s, "the exit")
        assert "EXIT=0" in screen and "Traceback" not in screen
        assert tmux("display-message", "-p", "-t", "hostile", "#{pane_title}").stdout.strip() == "before"
    finally:
        pages.close()
