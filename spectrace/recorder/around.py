"""One factory for the hooks that bracket a call: work before it, after it, or when it raised.

The frontend, engine-core and worker hooks that open a span or record what a call resolved
(``create_engine_config``, ``get_config``, the engines' ``__init__``, ``_initialize_kv_caches``,
``load_model``) all have this shape; :func:`around` writes it once::

    Hook("worker.load_model", "...:Worker.load_model",
         around(before=start_span, after=[("worker.layout", record_layout), (None, end_span)], failed=end_span_failed))

Every step runs under :func:`spectrace.recorder.runtime.guard` (caught, counted under its hook
name, logged once): only the wrapped call stands outside, called once with the caller's
arguments; its result is returned and its exception re-raised unchanged.

- ``before(rt, *args, **kwargs) -> state``: before the call (``args[0]`` is ``self`` for a method);
- ``after``: ``(hook name or None for the hook's own, fn)`` pairs, each ``fn(rt, state, result, *args, **kwargs)``,
  in order, each under its own guard (one failing never skips the next);
- ``failed(rt, state, exc, *args, **kwargs)``: when the call raised, before the exception goes on.

``state`` is None when ``before`` did not run (tracing off, a fault injected) or raised.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from spectrace.recorder import runtime

After = tuple[str | None, Callable[..., None]]


def around(
    *,
    before: Callable[..., Any] | None = None,
    after: Sequence[After] = (),
    failed: Callable[..., None] | None = None,
) -> Callable[[Callable[..., Any], str], Callable[..., Any]]:
    def make(original: Callable[..., Any], hook: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            state = None
            if before is not None:
                with runtime.guard(hook) as rt:
                    if rt is not None:
                        state = before(rt, *args, **kwargs)
            try:
                result = original(*args, **kwargs)
            except BaseException as exc:
                if failed is not None:
                    with runtime.guard(hook) as rt:
                        if rt is not None:
                            failed(rt, state, exc, *args, **kwargs)
                raise
            for name, step in after:
                with runtime.guard(name or hook) as rt:
                    if rt is not None:
                        step(rt, state, result, *args, **kwargs)
            return result

        wrapper.__name__ = getattr(original, "__name__", "wrapper")
        wrapper.__qualname__ = getattr(original, "__qualname__", wrapper.__name__)
        return wrapper

    return make
