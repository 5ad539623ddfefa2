"""`spectrace top` in a real terminal: tmux (a private server) runs it against a loopback /metrics page
whose counters move; the screen is captured, the window refreshes to the counters' gain, `q` quits with
exit 0; a 20x5 terminal is one line and exit 2. Needs tmux (`make test` installs Debian's)."""

from __future__ import annotations

import itertools
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


_SOCKETS = itertools.count()


@pytest.fixture
def tmux():
    if shutil.which("tmux") is None:
        pytest.fail("tmux missing: run `make tmux` (Debian's tmux)")
    # a server of its own per test: the last test's server may still be exiting under the same name
    socket = f"spectrace-test-{os.getpid()}-{next(_SOCKETS)}"

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


def _full_page() -> str:
    """Every section of the view: positions, lengths, the speed-up, what k pays, findings, slices and ranks."""
    return spectrace_page(
        [1000, 900, 800, 700], [800, 500, 300, 100], {1: 100, 2: 200, 3: 150, 4: 80, 5: 40}, k=4,
        findings=[("TAP_MISMATCH", "error", "draft"), ("ACCEPTANCE_COLLAPSE", "error", "draft"),
                  ("METHOD_INFERRED", "info", "draft")],
        slices={("temperature", "0"): [400, 300], ("temperature", "0.7-1"): [300, 100],
                ("repetition_penalty", "1.5"): [200, 20], ("repetition_penalty", "off"): [500, 400],
                ("max_tokens", "1-64"): [300, 200], ("max_tokens", "257-1k"): [400, 150]},
        ranks={0: (1000, 700), 1: (1000, 690)}, speedup=0.92, by_k={1: 1.0, 2: 1.1, 3: 1.05, 4: 0.92, 5: 0.9})


# each section's first line on screen, and the name the marker gives it when it is hidden
SECTIONS = [("Accepted length per request-step (accepted + 1)", "lengths"), ("Findings", "3 findings"),
            ("Request slices, worst first", "6 slices"), ("Per rank / source", "2 ranks")]


@pytest.mark.parametrize("width, height", [(80, 24), (120, 45)])
def test_a_pane_too_small_says_what_is_hidden_and_titles_fit(tmux, width, height):
    """The live view in a pane smaller than the frame: it fills the pane, its last line says how many lines are
    hidden and names the sections they hold (and only those); every title is one line; nothing dangles."""
    pages = Pages()
    try:
        # counters from zero, then every section's: the window (the default 60 s) holds all of them
        url = pages.serve("/metrics", spectrace_page([0], [0]), _full_page())
        _start(tmux, "small", width, height, [url, "--interval", "0.5"])
        screen = _wait(tmux, "small", lambda s: "lines hidden: " in s and "last " in s, "the truncation marker")
        lines = tmux("capture-pane", "-p", "-t", "small").stdout.split("\n")[:height]  # the pane, not the history
        assert len(lines) == height and all(len(line) <= width for line in lines)
        marker = lines[-1]
        assert marker.startswith("▼ ") and " lines hidden: " in marker, screen
        shown = "\n".join(lines[:-1])
        assert "Acceptance by draft position" in shown and "speed-up 0.92x" in shown
        # the same view in a pane tall enough for all of it: the small pane shows its top, the marker counts the rest
        pages.serve("/tall", spectrace_page([0], [0]), _full_page())
        _start(tmux, "tall", width, 120, [url.replace("/metrics", "/tall"), "--interval", "0.5"])
        _wait(tmux, "tall", lambda s: "Per rank / source" in s and "last " in s, "the whole frame")
        tall = tmux("capture-pane", "-p", "-t", "tall").stdout.split("\n")[:120]
        while tall and not tall[-1].strip():
            tall.pop()
        assert "lines hidden" not in "\n".join(tall)
        assert [x.rstrip() for x in lines[1:-1]] == [x.rstrip() for x in tall[1:height - 1]]  # below the header
        hidden = int(marker.split()[1])
        assert len(tall) - (height - 1) <= hidden <= len(tall) - (height - 1) + 1, (hidden, len(tall))  # + its last blank
        names = marker.split(" hidden: ", 1)[1]
        for title, name in SECTIONS:
            on_screen = any(line.strip() == title for line in lines[:-1])
            if on_screen:
                assert name not in names or f"rest of {name}" in names, (title, marker)
            else:
                assert name in names and f"rest of {name}" not in names, (title, marker)
        assert "Findings" not in names or "3 findings" in names
        # titles whole on one line, never wrapped at a table's width; no line starts with a dangling separator
        assert not any(line.strip() in ("(accepted +", "1)") for line in lines)
        assert not any(line.lstrip().startswith("·") for line in lines), shown
        tmux("send-keys", "-t", "small", "q")
        assert "EXIT=0" in _wait(tmux, "small", lambda s: "EXIT=" in s, "the exit")
    finally:
        pages.close()


def test_a_pane_that_holds_the_frame_has_no_marker(tmux):
    pages = Pages()
    try:
        url = pages.serve("/metrics", spectrace_page(DRAFTED, ACCEPTED, LENGTHS))
        _start(tmux, "roomy", 120, 45, [url, "--interval", "0.5"])
        screen = _wait(tmux, "roomy", lambda s: "Accepted length per request-step (accepted + 1)" in s, "the frame")
        assert "hidden: " not in screen
        tmux("send-keys", "-t", "roomy", "q")
        assert "EXIT=0" in _wait(tmux, "roomy", lambda s: "EXIT=" in s, "the exit")
    finally:
        pages.close()
