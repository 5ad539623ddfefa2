"""The one speed-up figure's words: what it compares, over which steps, on what basis (issue #57).

A leaf (imports nothing): ``acceptance`` (its arithmetic), the audit (SPECULATION_NOT_PAYING's message), ``report``
and ``top`` print the same figure with the same words beside it.
"""

# The one speed-up figure (docs/speedup.md, "Does speculation pay?"): what it compares, over which steps, on what basis.
# ``spectrace report`` (and the view ``speculation_cost``), SPECULATION_NOT_PAYING, ``spectrace top`` and the gauge
# ``spectrace_speculation_speedup_estimate`` all print this figure, with its window and its basis beside it.
SPEEDUP_DEFINITION = ("the target's time per token without drafts over its time per token at the k in force "
                      "(mean acceptance length x step time without drafts / step time, worker clock)")
SPEEDUP_WINDOW = "the run so far"  # every worker step of the run that verified drafts, per rank
SPEEDUP_BASIS = "fit"  # the step time without drafts fitted from the run's own steps, not measured
SPEEDUP_UNMEASURED = "estimate: step time without drafts fitted from this run, not measured"
