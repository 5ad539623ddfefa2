"""Request slices: the parameters that change what the target verifies, and the rule that
finds a slice accepting far below the rest of its run. Pure: plain dicts and ints in.

A drafter proposes from its own, unpenalized logits; the target verifies after the request's
penalties, logit bias, bad words, allowed tokens, min-p, its temperature and top-p/top-k, a
grammar, a LoRA adapter. Each such parameter is one slice *dimension*; a request's value in it,
banded so a run has few values (``request_slice``), is its slice. ``slice_gap`` compares one
slice's acceptance with the rest of the same run.

Confidence: drafted tokens of one request-step are not independent trials (a rejection ends the
step), so the Wilson interval counts a request-step's ``k`` drafts as one trial
(``n = drafted / k``): wider than the token count would give, never narrower than it should be.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from spectrace.audit.rules.acceptance import context_bucket

# slice dimensions, in the order a finding lists them
DIMENSIONS = (
    "repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias", "bad_words", "allowed_token_ids",
    "min_p", "temperature", "top_p", "top_k", "structured_output", "lora_adapter", "prefix_cache", "prompt_len",
    "thinking_mode",
)
PENALTIES = ("repetition_penalty", "presence_penalty", "frequency_penalty")

MIN_DRAFTED = 100  # drafted tokens on each side of a comparison
MIN_REQUESTS = 2  # requests on each side
FAR_BELOW = 0.75  # the slice accepts under this share of the rest's rate
Z = 1.96  # 95 % two-sided


def temperature_band(temperature: float | None) -> str:
    if temperature is None:
        return "unknown"
    if temperature < 1e-5:  # vLLM's _SAMPLING_EPS: greedy
        return "greedy"
    return "(0, 0.5]" if temperature <= 0.5 else "(0.5, 1]" if temperature <= 1.0 else "> 1"


def _number(value: float | int | None, neutral: float | int) -> str:
    if value is None or value == neutral:
        return "off"
    return f"{value:g}"


def request_slice(params: dict[str, Any]) -> dict[str, str]:
    """One request's value in every slice dimension (``spectrace.vllm_objects.requests.request_parameters``)."""
    cached = params.get("cached_tokens")
    prompt = params.get("prompt_tokens")
    return {
        "repetition_penalty": _number(params.get("repetition_penalty"), 1.0),
        "presence_penalty": _number(params.get("presence_penalty"), 0.0),
        "frequency_penalty": _number(params.get("frequency_penalty"), 0.0),
        "logit_bias": "set" if params.get("logit_bias_tokens") else "off",
        "bad_words": "set" if params.get("bad_words") else "off",
        "allowed_token_ids": "set" if params.get("allowed_tokens") else "off",
        "min_p": _number(params.get("min_p"), 0.0),
        "temperature": temperature_band(params.get("temperature")),
        "top_p": _number(params.get("top_p"), 1.0),
        "top_k": _number(params.get("top_k") if (params.get("top_k") or 0) > 0 else None, 0),
        "structured_output": params.get("structured_output") or "off",
        "lora_adapter": params.get("lora_adapter") or "off",
        "prefix_cache": "unknown" if cached is None or not prompt else "hit" if cached > 0 else "miss",
        "prompt_len": context_bucket(prompt) if prompt else "unknown",
        "thinking_mode": params.get("thinking_mode") or "unknown",  # spectrace.audit.rules.thinking
    }


def wilson(accepted: int, drafted: int, k: int) -> tuple[float, float]:
    """95 % Wilson interval of accepted / drafted, a request-step's ``k`` drafts counted as one trial."""
    if drafted <= 0:
        return 0.0, 1.0
    n = drafted / max(k, 1)
    p = accepted / drafted
    centre = (p + Z * Z / (2 * n)) / (1 + Z * Z / n)
    half = Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n)) / (1 + Z * Z / n)
    return max(centre - half, 0.0), min(centre + half, 1.0)


@dataclass
class SliceGap:
    """One slice that accepts far below the rest of its run."""

    dimension: str
    value: str
    requests: int
    drafted: int
    accepted: int
    rest_requests: int
    rest_drafted: int
    rest_accepted: int
    interval: tuple[float, float]  # the slice's rate, 95 %
    rest_interval: tuple[float, float]

    @property
    def rate(self) -> float:
        return self.accepted / self.drafted

    @property
    def rest_rate(self) -> float:
        return self.rest_accepted / self.rest_drafted

    def as_dict(self) -> dict[str, Any]:
        return {
            "dimension": self.dimension, "value": self.value,
            "slice": {"requests": self.requests, "drafted": self.drafted, "accepted": self.accepted,
                      "rate": round(self.rate, 4), "interval_95": [round(x, 4) for x in self.interval]},
            "rest": {"requests": self.rest_requests, "drafted": self.rest_drafted, "accepted": self.rest_accepted,
                     "rate": round(self.rest_rate, 4), "interval_95": [round(x, 4) for x in self.rest_interval]},
        }


def slice_gap(dimension: str, value: str, counts: tuple[int, int, int], run: tuple[int, int, int], k: int) -> SliceGap | None:
    """``counts`` (requests, drafted, accepted) of one slice against ``run``'s totals: a ``SliceGap`` when the
    slice's rate is under ``FAR_BELOW`` of the rest's and its 95 % interval lies wholly below the rest's."""
    requests, drafted, accepted = counts
    rest = (run[0] - requests, run[1] - drafted, run[2] - accepted)
    if min(requests, rest[0]) < MIN_REQUESTS or min(drafted, rest[1]) < MIN_DRAFTED:
        return None
    rate, rest_rate = accepted / drafted, rest[2] / rest[1]
    if rest_rate <= 0 or rate >= FAR_BELOW * rest_rate:
        return None
    low_high, rest_low_high = wilson(accepted, drafted, k), wilson(rest[2], rest[1], k)
    if low_high[1] >= rest_low_high[0]:
        return None
    return SliceGap(dimension, value, requests, drafted, accepted, *rest, low_high, rest_low_high)


def slice_gaps(by_slice: dict[tuple[str, str], tuple[int, int, int]], run: tuple[int, int, int], k: int) -> list[SliceGap]:
    """The worst gap per dimension (``by_slice``: (dimension, value) -> (requests, drafted, accepted)), in
    ``DIMENSIONS`` order; a dimension whose requests all share one value compares nothing."""
    worst: dict[str, SliceGap] = {}
    for (dimension, value), counts in by_slice.items():
        if value == "unknown":
            continue
        gap = slice_gap(dimension, value, counts, run, k)
        if gap is not None and (dimension not in worst or gap.rate < worst[dimension].rate):
            worst[dimension] = gap
    return [worst[d] for d in DIMENSIONS if d in worst]
