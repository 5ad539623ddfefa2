"""Profile the store's ingest path with pyinstrument (``pip install pyinstrument``).

    .venv/bin/python -m bench.profile_ingest            # text profiles to stdout
    .venv/bin/python -m bench.profile_ingest --html DIR # also HTML files

Profiles (1) Pipeline.extend + flush (the store sink) of 500 k verify_steps rows and (2) the whole
background path, hot-path step tuples -> drain -> flush, for batch 64, k 5.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.common import SCRATCH


def main(argv=None) -> None:
    from pyinstrument import Profiler

    from bench import store

    parser = argparse.ArgumentParser()
    parser.add_argument("--html", type=Path)
    args = parser.parse_args(argv)
    rows = store.verify_step_rows(500_000)
    store.ingest_writer(rows[:20_000], SCRATCH / "profile-writer", 20_000)  # warm-up
    for name, job in [
        ("segment_writer", lambda: store.ingest_writer(rows, SCRATCH / "profile-writer", 100_000)),
        ("capture_to_segments", lambda: store.ingest_capture(500_000 // 64, 64, 5, SCRATCH / "profile-capture", 1562)),
    ]:
        profiler = Profiler(interval=0.0005)
        profiler.start()
        job()
        profiler.stop()
        print(f"==== {name}")
        print(profiler.output_text(unicode=True, color=False, show_all=False))
        if args.html:
            args.html.mkdir(parents=True, exist_ok=True)
            (args.html / f"{name}.html").write_text(profiler.output_html())


if __name__ == "__main__":
    main()
