"""spectrace: observability for speculative decoding in vLLM.

Importing this package is cheap: the vLLM hooks live in ``spectrace.recorder`` and
are only imported by the plugin when ``SPECTRACE=1``.
"""

__version__ = "0.1.0"

