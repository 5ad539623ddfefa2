"""The run rules: pure functions over a run's counts, the judges' arithmetic (no vLLM, no I/O, no records written).

- ``acceptance``: acceptance arithmetic (context buckets, per-position counts, the collapse detector, the speed-up
  estimate)
- ``drift``: acceptance in time (a step change, a slow decay, each with its start and recovery), stratified by
  context range and draft position
- ``slices``: request slices (a request's parameters as banded dimensions) and the slice gap
- ``speedup``: what k pays (the expected length and the step cost at every k' from one run, by batch size)
- ``speedup_figure``: the one speed-up figure's words (what it compares, its window, its basis), a leaf
- ``active``: which findings are present and which were cleared (``ACCEPTANCE_RECOVERED`` ends a collapse,
  ``ACCEPTANCE_RESTORED`` a step change or decay), the one
  rule ``/metrics``, ``spectrace top`` (URL or store) and ``spectrace report`` read

Nothing is imported here: each rule is imported by its module name.
"""
