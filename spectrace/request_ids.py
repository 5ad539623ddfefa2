"""The ids a client saw for a request vLLM finished: its response id and its choice index.

vLLM 0.32's OpenAI completions endpoint hands the engine one request per prompt, ``<response id>-<prompt index>``
(``cmpl-894f…-0``), and ``n>1`` fans each out into child requests that share that id (``ParentRequest``, the
child's ``request_index``). The client sees the response id (``cmpl-894f…``) and one choice per child,
``index = prompt index × n + request_index`` (``serving.py``'s ``output.index + prompt_idx * num_choices``).
Other endpoints (chat, ``LLM.generate``) pass their id through unchanged; their choice is the child's index.
"""

from __future__ import annotations

import re

# serving.py: request_id = f"cmpl-{base}", request_id_item = f"{request_id}-{i}"
_COMPLETION_ITEM = re.compile(r"^(cmpl-.+)-(\d+)$")


def client_ids(external_req_id: str, request_index: int | None = 0, n: int | None = 1) -> tuple[str, int]:
    """``(response id, choice index)`` the client saw for the engine request whose external id (vLLM's
    ``RequestState.external_req_id``) is ``external_req_id``, its index among ``n`` choices ``request_index``."""
    index, n = int(request_index or 0), max(int(n or 1), 1)
    match = _COMPLETION_ITEM.match(external_req_id)
    if match is None:
        return external_req_id, index
    return match.group(1), int(match.group(2)) * n + index
