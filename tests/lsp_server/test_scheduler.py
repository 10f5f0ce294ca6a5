"""The scheduler's supersede, cancel, debounce and budget logic, with plain callables for jobs."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
import weakref

import pytest

from speculative_complete.lsp_server import request_log
from speculative_complete.lsp_server.scheduler import Scheduler

GUARD_S = 10.0  # hang guard, not a speed claim


class SpinJob:
    """A job that works in small steps until told to stop, like the engine between target passes."""

    def __init__(self, steps: int = 1_000_000, step_s: float = 0.001) -> None:
        self.steps, self.step_s = steps, step_s
        self.started = threading.Event()
        self.stopped_early = threading.Event()
        self.thread: threading.Thread | None = None
        self.calls = 0
        self.done_steps = 0

    def __call__(self, should_stop) -> int:
        self.calls += 1
        self.thread = threading.current_thread()
        self.started.set()
        for _ in range(self.steps):
            if should_stop():
                self.stopped_early.set()
                break
            time.sleep(self.step_s)
            self.done_steps += 1
        return self.done_steps


async def wait_started(job: SpinJob) -> None:
    assert await asyncio.to_thread(job.started.wait, GUARD_S)


@pytest.fixture
async def scheduler():
    sched = Scheduler()
    yield sched
    sched.close()


async def test_a_job_runs_on_the_worker_thread_and_returns_its_value(scheduler):
    job = SpinJob(steps=3)
    outcome = await asyncio.wait_for(scheduler.run("doc", job), GUARD_S)
    assert outcome.status == "done" and outcome.value == 3
    assert job.thread is not threading.current_thread() and job.thread.daemon
    assert not outcome.budget_exhausted and outcome.run_ms >= 0


async def test_a_newer_request_supersedes_the_running_one_at_once(scheduler):
    old = SpinJob()
    first = asyncio.ensure_future(scheduler.run("doc", old))
    await wait_started(old)
    new = SpinJob(steps=2)
    second = asyncio.ensure_future(scheduler.run("doc", new))
    outcome = await asyncio.wait_for(first, GUARD_S)
    assert outcome.status == "superseded" and outcome.value is None
    assert await asyncio.to_thread(old.stopped_early.wait, GUARD_S)  # the decode itself stopped
    assert (await asyncio.wait_for(second, GUARD_S)).status == "done"
    assert not scheduler._active  # nothing of either job is kept


async def test_each_request_job_that_runs_records_its_wait_and_background_work_does_not(scheduler):
    """``waits_ms`` (the server's ``queued_ms``): the time each request job waited for the worker,
    a superseded one's too (its answer went out before its job ended, so no answer's phases hold
    it); the replay's measure of a keystroke's wait behind the work it superseded. Background work
    is no request."""
    old = SpinJob()
    first = asyncio.ensure_future(scheduler.run("doc", old))
    await wait_started(old)
    second = asyncio.ensure_future(scheduler.run("doc", SpinJob(steps=2)))
    assert (await asyncio.wait_for(first, GUARD_S)).status == "superseded"
    assert (await asyncio.wait_for(second, GUARD_S)).status == "done"
    assert (await asyncio.wait_for(scheduler.run_background(SpinJob(steps=2)), GUARD_S)).status == "done"
    assert len(scheduler.waits_ms) == 2 and min(scheduler.waits_ms) >= 0


async def test_jobs_on_different_documents_do_not_supersede_each_other(scheduler):
    jobs = [SpinJob(steps=5), SpinJob(steps=5)]
    outcomes = await asyncio.wait_for(
        asyncio.gather(scheduler.run("a", jobs[0]), scheduler.run("b", jobs[1])), GUARD_S
    )
    assert [o.status for o in outcomes] == ["done", "done"]
    assert [o.value for o in outcomes] == [5, 5]


async def test_cancelling_the_awaiting_task_stops_the_job_and_frees_the_worker(scheduler):
    job = SpinJob()
    task = asyncio.ensure_future(scheduler.run("doc", job))
    await wait_started(job)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(job.stopped_early.wait, GUARD_S)
    follow_up = await asyncio.wait_for(scheduler.run("doc", SpinJob(steps=1)), GUARD_S)
    assert follow_up.status == "done"


async def test_superseded_during_the_debounce_never_runs(scheduler):
    old, new = SpinJob(steps=1), SpinJob(steps=1)
    first = asyncio.ensure_future(scheduler.run("doc", old, debounce_s=5.0))
    await asyncio.sleep(0.05)
    second = asyncio.ensure_future(scheduler.run("doc", new, debounce_s=0.0))
    assert (await asyncio.wait_for(first, GUARD_S)).status == "superseded"
    assert (await asyncio.wait_for(second, GUARD_S)).status == "done"
    assert old.calls == 0 and new.calls == 1


async def test_cancelled_during_the_debounce_never_runs(scheduler):
    job = SpinJob(steps=1)
    task = asyncio.ensure_future(scheduler.run("doc", job, debounce_s=5.0))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(scheduler.run("other", SpinJob(steps=1)), GUARD_S)  # the worker is idle
    assert job.calls == 0


async def test_a_queued_job_that_was_superseded_is_skipped_by_the_worker(scheduler):
    blocker = SpinJob()
    running = asyncio.ensure_future(scheduler.run("a", blocker))
    await wait_started(blocker)
    queued = SpinJob(steps=1)
    waiting = asyncio.ensure_future(scheduler.run("b", queued))
    await asyncio.sleep(0.05)
    newest = asyncio.ensure_future(scheduler.run("b", SpinJob(steps=1)))
    assert (await asyncio.wait_for(waiting, GUARD_S)).status == "superseded"
    scheduler.supersede("a")
    assert (await asyncio.wait_for(running, GUARD_S)).status == "superseded"
    assert (await asyncio.wait_for(newest, GUARD_S)).status == "done"
    assert queued.calls == 0


async def test_a_job_given_up_on_while_queued_is_released_at_once_not_when_the_worker_reaches_it(
    scheduler,
):
    """A queued decode holds its document's text (6 MB in the soak): typing on while the worker is
    busy must not pile those up in the queue until the worker gets to them."""
    blocker = SpinJob()
    running = asyncio.ensure_future(scheduler.run("a", blocker))
    await wait_started(blocker)
    superseded, cancelled = SpinJob(steps=1), SpinJob(steps=1)
    refs = [weakref.ref(superseded), weakref.ref(cancelled)]
    first = asyncio.ensure_future(scheduler.run("b", superseded))
    second = asyncio.ensure_future(scheduler.run("c", cancelled))
    await asyncio.sleep(0.05)  # both queued behind the blocker
    newest = asyncio.ensure_future(scheduler.run("b", SpinJob(steps=1)))
    assert (await asyncio.wait_for(first, GUARD_S)).status == "superseded"
    second.cancel()
    await asyncio.wait([second])
    assert second.cancelled()
    del superseded, cancelled, second  # the task's traceback holds its frames (and so the job)
    gc.collect()
    assert [ref() for ref in refs] == [None, None] and not running.done()
    scheduler.supersede("a")
    assert (await asyncio.wait_for(newest, GUARD_S)).status == "done"


async def test_the_time_budget_stops_the_job_and_keeps_its_partial_value(scheduler):
    job = SpinJob(step_s=0.002)
    outcome = await asyncio.wait_for(scheduler.run("doc", job, budget_s=0.2), GUARD_S)
    assert outcome.status == "done" and outcome.budget_exhausted
    assert job.stopped_early.is_set() and outcome.value == job.done_steps > 0


async def test_a_job_still_queued_at_its_deadline_is_answered_then_and_never_runs(scheduler):
    blocker = SpinJob()  # another document's decode, with no budget of its own
    running = asyncio.ensure_future(scheduler.run("a", blocker))
    await wait_started(blocker)
    queued = SpinJob(steps=1)
    outcome = await asyncio.wait_for(scheduler.run("b", queued, budget_s=0.1), GUARD_S)
    assert outcome.status == "expired" and outcome.budget_exhausted and outcome.value is None
    assert outcome.queued_ms >= 100 and not running.done()  # answered while the worker was busy
    scheduler.supersede("a")
    await asyncio.wait_for(running, GUARD_S)
    await asyncio.wait_for(scheduler.run("c", SpinJob(steps=1)), GUARD_S)  # the worker got past it
    assert queued.calls == 0


async def test_a_job_that_started_before_its_deadline_is_stopped_by_it_not_dropped(scheduler):
    job = SpinJob(step_s=0.002)
    outcome = await asyncio.wait_for(scheduler.run("doc", job, budget_s=0.05), GUARD_S)
    assert outcome.status == "done" and outcome.budget_exhausted and job.calls == 1


async def test_a_failing_job_is_reported_and_the_worker_survives(scheduler):
    def broken(should_stop):
        raise RuntimeError("boom")

    outcome = await asyncio.wait_for(scheduler.run("doc", broken), GUARD_S)
    assert outcome.status == "failed" and "boom" in str(outcome.error)
    assert (await asyncio.wait_for(scheduler.run("doc", SpinJob(steps=1)), GUARD_S)).status == "done"


async def test_fifty_rapid_requests_all_answered_and_only_the_newest_decodes_to_the_end(scheduler):
    jobs = [SpinJob(steps=20) for _ in range(50)]
    tasks = []
    for job in jobs:
        tasks.append(asyncio.ensure_future(scheduler.run("doc", job, debounce_s=0.02)))
        await asyncio.sleep(0)  # each request arrives as its own event, like LSP messages
    outcomes = await asyncio.wait_for(asyncio.gather(*tasks), GUARD_S)
    assert [o.status for o in outcomes] == ["superseded"] * 49 + ["done"]
    assert outcomes[-1].value == 20
    assert sum(job.calls for job in jobs) == 1  # the debounce kept the others from starting


async def test_close_stops_the_worker_and_later_runs_are_cancelled():
    sched = Scheduler()
    job = SpinJob()
    task = asyncio.ensure_future(sched.run("doc", job))
    await wait_started(job)
    await asyncio.to_thread(sched.close, 5.0)
    assert job.stopped_early.is_set()
    assert (await asyncio.wait_for(task, GUARD_S)).status == "cancelled"
    assert (await sched.run("doc", SpinJob(steps=1))).status == "cancelled"
    assert sched._thread is not None and not sched._thread.is_alive()


async def test_a_background_job_runs_when_the_worker_is_free(scheduler):
    outcome = await asyncio.wait_for(scheduler.run_background(SpinJob(steps=3)), GUARD_S)
    assert outcome.status == "done" and outcome.value == 3


async def test_any_request_stops_a_running_background_job_and_skips_a_queued_one(scheduler):
    running, queued = SpinJob(), SpinJob()
    first = asyncio.ensure_future(scheduler.run_background(running))
    second = asyncio.ensure_future(scheduler.run_background(queued))
    await wait_started(running)
    request = await asyncio.wait_for(scheduler.run("other-doc", SpinJob(steps=2)), GUARD_S)
    assert request.status == "done" and request.value == 2
    assert running.stopped_early.is_set()
    assert (await asyncio.wait_for(first, GUARD_S)).status == "superseded"
    assert (await asyncio.wait_for(second, GUARD_S)).status == "superseded"
    assert queued.calls == 0


async def test_cancelling_the_task_awaiting_a_background_job_stops_the_job(scheduler):
    job = SpinJob()
    task = asyncio.ensure_future(scheduler.run_background(job))
    await wait_started(job)
    task.cancel()
    assert await asyncio.to_thread(job.stopped_early.wait, GUARD_S)


async def test_idle_housekeeping_runs_once_nothing_waits():
    """``on_idle`` (the server gives freed memory back there) runs after a job and only once the
    queue is empty: a job queued behind another never waits for it. One that raises leaves the
    worker serving."""
    first, second = SpinJob(steps=20), SpinJob(steps=2)
    seen: list[tuple[int, int]] = []  # (first's calls, second's calls) at each idle run

    def on_idle() -> None:
        seen.append((first.calls, second.calls))
        if len(seen) == 1:
            raise RuntimeError("housekeeping failed")

    sched = Scheduler(on_idle=on_idle)
    try:
        runs = [sched.run("a", first), sched.run("b", second)]
        outcomes = await asyncio.wait_for(asyncio.gather(*runs), GUARD_S)
        assert [o.status for o in outcomes] == ["done", "done"]
        await asyncio.sleep(0.05)
        assert seen == [(1, 1)]  # not between the two jobs
        third = await asyncio.wait_for(sched.run("c", SpinJob(steps=1)), GUARD_S)  # the worker lives
        assert third.status == "done"
        await asyncio.sleep(0.05)
        assert seen == [(1, 1), (1, 1)]
    finally:
        sched.close()


async def test_a_stop_hook_passed_in_wraps_each_request_jobs_check_and_no_background_jobs():
    """``wrap_request_stop`` (how the soak makes a decode fail) sees every request job that runs,
    and what it returns is the check the job polls; background jobs keep their own."""
    wrapped: list[int] = []

    def stop_at_once(should_stop):
        wrapped.append(len(wrapped) + 1)
        return lambda: True

    sched = Scheduler(wrap_request_stop=stop_at_once)
    try:
        requests = [SpinJob(steps=50), SpinJob(steps=50)]
        for i, job in enumerate(requests):
            outcome = await asyncio.wait_for(sched.run(f"doc{i}", job), GUARD_S)
            assert outcome.status == "done" and outcome.value == 0  # stopped before its first step
        background = SpinJob(steps=5)
        outcome = await asyncio.wait_for(sched.run_background(background), GUARD_S)
        assert outcome.status == "done" and outcome.value == 5
        assert wrapped == [1, 2]
    finally:
        sched.close()


class Records(logging.Handler):
    """The records a logger emits, stamped by the server's ``RequestIdFilter``."""

    def __init__(self) -> None:
        super().__init__()
        self.addFilter(request_log.RequestIdFilter())
        self.lines: list[tuple[str, str]] = []  # (message, the request stamp)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.getMessage(), record.request))


async def test_a_job_runs_in_its_submitters_context_so_its_log_lines_name_its_request(scheduler):
    """Two requests at once, each job logging on the worker thread: each line carries the id of
    the request that submitted the job; the loop's own context is left as it was."""
    logger = logging.getLogger("tests.scheduler.jobs")
    records = Records()
    logger.addHandler(records)
    logger.setLevel(logging.DEBUG)

    def job(name: str):
        def run(should_stop) -> str | None:
            logger.debug("%s on %s", name, threading.current_thread().name)
            return request_log.current()

        return run

    async def serve(request_id: int | str, key: str):
        with request_log.serving(request_id):
            return await scheduler.run(key, job(key))

    try:
        first, second = await asyncio.wait_for(asyncio.gather(serve(7, "a"), serve("x-8", "b")), GUARD_S)
        unnamed = await asyncio.wait_for(scheduler.run("c", job("c")), GUARD_S)
    finally:
        logger.removeHandler(records)
    assert (first.value, second.value, unnamed.value) == ("7", "x-8", None)
    assert sorted(records.lines) == [
        (f"a on {scheduler.name}", " [request 7]"),
        (f"b on {scheduler.name}", " [request x-8]"),
        (f"c on {scheduler.name}", ""),
    ]
    assert request_log.current() is None
