"""Pure readers of vLLM objects: what a config, a built model or a step holds, as plain data.

The first stage of spectrace's flow (read vLLM → judge → record → export → query):
the live hooks (``spectrace.recorder``) and ``spectrace doctor`` call the same readers,
so a fact about vLLM (a layer's window, the taps a target feeds, which config is the
draft's) is read by one rule in one place. Nothing here records, exports or judges:
no runtime, no OpenTelemetry; the judgement is ``spectrace.audit``'s.

- ``configs``: declared ``config.json``, resolved configs as dicts, run info, roles.
- ``layers``: the attention layers of a built model and what each executes.
- ``taps``: which target layers feed the drafter, and how many its ``fc`` takes.
- ``steps``: vLLM's private per-step tuples, read by name.

vLLM is imported lazily, inside the readers that need it.
"""
