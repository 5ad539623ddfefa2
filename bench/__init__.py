"""spectrace benchmarks: scripts, not timed tests. ``make bench`` runs them all (see BENCHMARKS.md: what tracing costs and how to reproduce it)."""
