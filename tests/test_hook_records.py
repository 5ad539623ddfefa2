"""Records are let go of on vLLM's threads: what the per-step hooks kept of a step (the draft dict and its lists, the
cached requests' data, the proposals' lists, the frontend's outputs) lives until the shipper has sent it or the drain
has counted it, and is then freed by the next per-step hook call, on the thread vLLM calls it from, not by the shipper
or the flush thread; counted as before, in either pipeline shape (no vLLM: the hooks' real wrappers around stand-ins
for vLLM's functions and objects)."""

from __future__ import annotations

import json
import weakref
from types import SimpleNamespace

import pytest

import spectrace.store
from spectrace.settings import Settings
from spectrace.testing import fresh_run_env
from spectrace.recorder import runtime, verify
from spectrace.recorder.verify import hooks
from spectrace.vllm_objects.steps import BOOKKEEPING_FIELDS

RUN = "held-run"


class Held(list):
    """A list a weak reference can watch (a plain list takes none)."""


class Obj:
    """A vLLM object a weak reference can watch (``CachedRequestData``, ``SchedulerOutput``, ``EngineCoreOutput``)."""

    def __init__(self, **fields) -> None:
        self.__dict__.update(fields)


@pytest.fixture(params=["thread", "process"])
def rt(request, tmp_path):
    settings = Settings(enabled=True, dir=tmp_path / "store", metrics_dir=tmp_path / "metrics", exporters=("duckdb",),
                        pipeline=request.param, span_every_steps=0, record_tokens=True)
    with fresh_run_env():
        rt = runtime.start(settings, hooks=[], make_capture=verify.VerifyCapture)
        rt.set_run(runtime.Run(run_id=RUN, traceparent=""))
        rt.enter_role("engine_core")
        try:
            yield rt
        finally:
            runtime.stop()


def _engine_step(hook, watch: list) -> None:
    """One engine step through the real ``update_from_output`` wrapper: "a" drafts 3 and has all 3 accepted, "b"
    drafts 3 and has none; the objects vLLM made for the step are watched, and let go of on return."""
    drafts = {"a": Held([11, 12, 13]), "b": Held([21, 22, 23])}
    cached = Obj(req_ids=["a", "b"], num_computed_tokens=[40, 7], new_block_ids=Held([None, None]))
    scheduler_output = Obj(scheduled_spec_decode_tokens=drafts, scheduled_cached_reqs=cached,
                           num_invalid_spec_tokens=None)
    runner_output = Obj(sampled_token_ids=[[11, 12, 13, 14], [5]], req_ids=["a", "b"])
    watch += [*map(weakref.ref, drafts.values()), weakref.ref(cached)]
    scheduler = SimpleNamespace(num_sampled_tokens_per_step=1, finished_req_ids=set())
    assert hook(scheduler, scheduler_output, runner_output) == "vllm's result"


def _alive(watch: list) -> int:
    return sum(ref() is not None for ref in watch)


def _record(watch: list):
    """Two steps through the real per-step hooks (engine core, proposals, frontend, worker); returns the frontend's."""
    engine_hook = hooks.wrap_update_from_output(lambda *a, **kw: "vllm's result", "engine_core.verify")
    for _ in range(2):
        _engine_step(engine_hook, watch)
    proposal_hook = hooks.wrap_update_draft_token_ids(lambda *a, **kw: None, "engine_core.proposals")
    lists = [Held([1, 2, 3]), Held([4, 5])]
    proposal_hook(SimpleNamespace(), SimpleNamespace(draft_token_ids=lists))
    frontend_hook = hooks.wrap_process_outputs(lambda *a, **kw: None, "frontend.process_outputs")
    outputs = [Obj(new_token_ids=Held([1, 2, 3, 4])), Obj(new_token_ids=Held([9]))]
    frontend_hook(SimpleNamespace(), outputs, 7.0)
    worker_hook = hooks.wrap_bookkeeping_sync(lambda *a, **kw: book, "worker.verify")
    book = [None] * len(BOOKKEEPING_FIELDS)
    book[BOOKKEEPING_FIELDS.index("valid_sampled_token_ids")] = [[11, 12, 13, 14], [5]]
    book[BOOKKEEPING_FIELDS.index("req_id_to_index_output_copy")] = {"a": 0, "b": 1}
    for _ in range(2):  # the worker's side of the two steps
        drafts = {"a": Held([11, 12, 13]), "b": Held([21, 22, 23])}
        worker_hook(SimpleNamespace(), Obj(scheduled_spec_decode_tokens=drafts))
        watch += map(weakref.ref, drafts.values())
    watch += [*map(weakref.ref, lists), *map(weakref.ref, outputs)]
    return frontend_hook


def test_records_are_freed_by_the_next_hook_call_once_sent_or_counted(rt):
    capture = rt.verify
    watch: list = []
    # the background shipper or flush thread waits while the steps are recorded: whichever takes them takes them all
    with rt.pipeline.shipper._ship_lock if rt.shipping else rt.drain._lock:
        frontend_hook = _record(watch)
    assert _alive(watch) == len(watch)  # the records wait for the flush or the shipper, and hold them

    rt.flush()  # thread: drained on this thread; process: collected and sent from here, counted there
    assert _alive(watch) == len(watch)  # sent or counted, not freed there: waiting for vLLM's thread
    records = len(capture.release)
    assert records == 8  # two engine steps, their two host steps, a proposal, a frontend step, two worker steps
    alive = [_alive(watch)]
    for _ in range(records):  # the next per-step calls (here the frontend's, with no outputs): a record each
        frontend_hook(SimpleNamespace(), [], 8.0)
        alive.append(_alive(watch))
    assert alive[1] == len(watch) - 3  # the first engine step's: its two draft lists, its cached requests' data
    assert alive == sorted(alive, reverse=True) and alive[-1] == 0 and len(capture.release) == 0

    con = spectrace.store.open(rt.settings.dir)
    rows = con.execute("select source, sum(drafted), sum(accepted) from verify_counts where run_id = ? "
                       "group by source order by source", [RUN]).fetchall()
    assert rows == [("engine_core", 12, 6), ("worker", 12, 6)]
    steps = con.execute("select request_id, num_drafted, num_accepted, context_len, draft_token_ids from verify_steps "
                        "where run_id = ? order by step, request_id", [RUN]).fetchall()
    assert [(r, d, a, c, json.loads(t)) for r, d, a, c, t in steps] == [
        ("a", 3, 3, 40, [11, 12, 13]), ("b", 3, 0, 7, [21, 22, 23])] * 2
    assert con.execute("select sum(proposed) from draft_budget where run_id = ?", [RUN]).fetchone() == (5,)


def test_a_hook_lets_go_of_one_record_a_call_and_an_idle_engine_keeps_one_batch():
    capture = verify.VerifyCapture()
    capture.let_go([object()] * 3, [], [object()] * 5)
    assert len(capture.release) == 8
    capture.release_one()
    assert len(capture.release) == 7
    capture.let_go([], [])  # a message or a drain without records: what waits stays
    assert len(capture.release) == 7
    capture.let_go([object()])  # new records: what no step took is freed by the caller
    assert len(capture.release) == 1
    capture.release_one()
    capture.release_one()  # nothing waiting
    assert len(capture.release) == 0
    capture.release = None  # a pipeline process
    capture.let_go([object()])
    capture.release_one()
