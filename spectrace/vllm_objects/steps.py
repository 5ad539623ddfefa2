"""vLLM's per-step outputs that are private tuples, read by field name.

``GPUModelRunner._bookkeeping_sync`` (V1 model runner, vLLM 0.32) returns a tuple
that ``execute_model`` unpacks by position; its fields, in order, are named here
once, and the worker hook reads them through :func:`bookkeeping_sampled`.
"""

from __future__ import annotations

from typing import Any

# v1/worker/gpu_model_runner.py, GPUModelRunner._bookkeeping_sync's return statement
BOOKKEEPING_FIELDS = (
    "num_nans_in_logits",
    "num_nans",
    "logprobs_lists",
    "valid_sampled_token_ids",
    "prompt_logprobs_dict",
    "req_ids_output_copy",
    "req_id_to_index_output_copy",
    "invalid_req_indices",
)
_VALID_SAMPLED = BOOKKEEPING_FIELDS.index("valid_sampled_token_ids")
_REQ_ID_TO_INDEX = BOOKKEEPING_FIELDS.index("req_id_to_index_output_copy")


def bookkeeping_sampled(result: tuple) -> tuple[Any, Any]:
    """(valid sampled token ids per row, request id -> row) of one ``_bookkeeping_sync`` result."""
    return result[_VALID_SAMPLED], result[_REQ_ID_TO_INDEX]
