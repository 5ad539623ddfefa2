"""`spectrace probe`: measured answers to what configs cannot settle.

Doctor names a suspicion (a dropped window, taps guessed or declared in an unknown convention, a RoPE base that
differs); the probe serves the pair with the real vLLM under each candidate reading on the same prompts and says
which one the drafter was trained for.

- ``candidates``: the readings, from doctor's report (pure);
- ``stats``: acceptance per reading with its interval, the paired difference, the verdict (pure);
- ``child``: the engine process (one vLLM engine per candidate, one after another);
- ``run``: the plan, scratch copies, the child, the records (``probes``, ``PROBE_BETTER_READING``).

Importing this package imports no vLLM.
"""
