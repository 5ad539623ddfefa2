"""The collector: finished records in, judged rows, findings and instruments out. It hooks nothing.

- ``collector``: the flush wherever it runs (the traced process's thread, or a pipeline process): drain, pipeline,
  sinks, telemetry;
- ``drain``: a source's per-step records to rows, counts, value records, each batch to the run judge;
- ``columns``: a flush's steps counted as NumPy columns; ``timings``: the worker's step times, what k pays;
- ``inbox``: a pipeline process's shipped records, waiting for the drain;
- ``process``: the pipeline process itself (``python -m spectrace.collector.process``).
"""
