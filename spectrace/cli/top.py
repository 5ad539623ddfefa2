"""``spectrace top``: a live terminal view of speculative decoding, from ``/metrics`` URLs or a store.

    spectrace top http://vllm-0:8000 http://vllm-1:8000     # several URLs summed (DP ranks, headless nodes)
    spectrace top --dir /var/lib/spectrace                  # a store: the latest run's last minute
    spectrace top URL --once                                # one frame and exit (plain text when piped)

Refreshes every ``--interval`` (2 s), ``q`` quits. Bad input (an unreachable URL, a page that is not
Prometheus text, a store without runs, a terminal under 60x12) is one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import sys

from spectrace.cli.args import default_dir, duration


def add_parser(sub) -> None:
    p = sub.add_parser("top", help="a live terminal view: acceptance per position, lengths, findings (q quits)",
                       description="A live terminal view of speculative decoding, from /metrics URLs or a store: "
                                   "acceptance per draft position over a window, lengths, findings. q quits.")
    p.add_argument("urls", nargs="*", metavar="URL",
                   help="a /metrics URL (http://host:port is enough; several are summed); none: read the store at --dir")
    p.add_argument("--dir", default=None, help=f"the store to read when no URL is given (default: {default_dir()})")
    p.add_argument("--run", help="with --dir: this run instead of the latest")
    p.add_argument("--window", type=duration, default=60.0, help="the window counts are shown over (default 60s)")
    p.add_argument("--interval", type=duration, default=2.0, help="seconds between refreshes (default 2s)")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.set_defaults(func=run)


def _source(args):
    from spectrace import top

    if args.urls and (args.dir or args.run):
        raise top.TopError("give URLs or --dir, not both")
    if args.urls:
        return top.MetricsSource(args.urls, args.window)
    return top.StoreSource(args.dir or default_dir(), args.window, args.run)


@contextlib.contextmanager
def _keys():
    """stdin in cbreak mode (a key at a time, no echo) while the view runs; nothing when it is not a terminal."""
    if not sys.stdin.isatty():
        yield None
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _quit_pressed(fd, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for a key; True for q (or Q, or Ctrl-D)."""
    if fd is None:
        select.select([], [], [], timeout)
        return False
    ready, _, _ = select.select([fd], [], [], timeout)
    if ready:
        key = os.read(fd, 32)
        return any(c in key for c in (b"q", b"Q", b"\x04"))
    return False


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    from spectrace import top

    if args.interval <= 0:
        raise top.TopError("--interval must be > 0")
    source = _source(args)
    interactive = sys.stdout.isatty() and not args.once
    console = Console()
    if sys.stdout.isatty():
        width, height = os.get_terminal_size(sys.stdout.fileno())  # the terminal's own size, not $COLUMNS
        if width < top.MIN_WIDTH or (interactive and height < top.MIN_HEIGHT):
            raise top.TopError(f"the terminal is {width}x{height}; spectrace top needs at least "
                               f"{top.MIN_WIDTH}x{top.MIN_HEIGHT} (or --once, or pipe it)")
    frame = source.frame()  # the first read: bad input ends here, one line
    if not interactive:
        width = console.size[0] if sys.stdout.isatty() else 120
        sys.stdout.write(top.plain(frame, width=width))
        if args.once:
            return 0
        while True:  # not a terminal: a plain frame every interval, until interrupted
            _quit_pressed(None, args.interval)
            frame, error = _next(source, frame)
            sys.stdout.write("\n" + top.plain(frame, error=error, width=width))
            sys.stdout.flush()
    with _keys() as fd, Live(top.render(frame, live=True, size=console.size), console=console, screen=True, auto_refresh=False) as live:
        while not _quit_pressed(fd, args.interval):
            frame, error = _next(source, frame)
            # fitted to the terminal's size now (a resize shows at the next refresh), a marker for what is cut
            live.update(top.render(frame, error=error, live=True, size=console.size), refresh=True)
    return 0


def _next(source, last):
    """The next frame; a failed scrape keeps the last frame on screen with the error above it."""
    from spectrace import top

    try:
        return source.frame(), None
    except top.TopError as exc:
        return last, str(exc)
