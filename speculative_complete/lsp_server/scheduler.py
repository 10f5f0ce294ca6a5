"""One decode worker thread per model, with cancel-previous per document, debounce and a time budget.

The engine is synchronous and not thread-safe, and a running thread cannot be interrupted, so the
scheduler owns exactly one worker thread and hands each job a ``should_stop`` callable that the
engine polls between target passes. The event loop side never blocks: a request awaits an asyncio
future that the worker resolves with ``call_soon_threadsafe``.

Why supersede instead of relying on ``$/cancelRequest``: Neovim's client never cancels its older
requests, so a newer request on the same document (the user typed on) resolves the older one at
once as ``superseded`` and stops its decode within one engine step. The scheduler is generic over
the job callable, so its logic is tested without a model.

Background jobs (prefetch, indexing draft sources) use the worker only while no request needs
it: any request's arrival stops every background job at its next step and skips queued ones.
After a job, when no other waits, the worker runs its owner's housekeeping (``on_idle``).

A test may wrap each request job's stop check (``wrap_request_stop``): the soak makes one decode
fail from inside its engine loop that way (``benchmarks/soak_server.py``); the product passes none.
A job runs in a copy of the context it was submitted from, so that its log lines carry the id
of the request it serves (``request_log``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
StopCheck = Callable[[], bool]
Job = Callable[[StopCheck], T]
# "expired": the time budget ran out while the job still waited for the worker; it never runs.
Status = Literal["done", "superseded", "cancelled", "failed", "expired"]


WAITS_WINDOW = 2000  # the most recent request jobs whose waits ``Scheduler.waits_ms`` keeps
# Wraps a request job's stop check: called once per request job the worker runs, with its check.
StopHook = Callable[[StopCheck], StopCheck]


@dataclass
class Outcome(Generic[T]):
    """How a scheduled job ended; ``value`` is set only when the job itself returned."""

    status: Status
    value: T | None = None
    error: BaseException | None = None
    budget_exhausted: bool = False  # the job returned because its time budget ran out
    queued_ms: float = 0.0  # from submission (after debounce) to the worker picking it up
    run_ms: float = 0.0


@dataclass(eq=False)
class Ticket:
    """One request's claim on the worker; ``cancel`` is what the engine ends up polling."""

    key: str
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    deadline: float | None = None  # time.monotonic() after which the job should stop
    cancel: threading.Event = field(default_factory=threading.Event)
    superseded: bool = False
    enqueued_at: float = 0.0
    background: bool = False
    # The job until the worker takes it, or until it is given up on while queued (superseded,
    # cancelled, out of budget): then dropped at once, with the document text it holds, rather
    # than when the worker reaches it in the queue. Decided once, under ``claim``.
    job: Job | None = None
    started: bool = False
    claim: threading.Lock = field(default_factory=threading.Lock)
    # The submitter's context (the request's id, for its log lines), which the job runs in.
    context: contextvars.Context = field(default_factory=contextvars.copy_context)

    def take(self) -> Job | None:
        """The worker takes the job: None when it was given up on while queued (worker thread)."""
        with self.claim:
            job, self.job = self.job, None
            self.started = job is not None
            return job

    def drop(self) -> bool:
        """Give up on the job unless the worker has taken it: True when it was still queued."""
        with self.claim:
            self.job = None
            return not self.started

    def stop(self, superseded: bool = False) -> None:
        """Tell a running job to stop at its next step; a queued one never starts."""
        self.superseded = self.superseded or superseded
        self.cancel.set()
        self.drop()

    def budget_exhausted(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def should_stop(self) -> bool:
        return self.cancel.is_set() or self.budget_exhausted()

    def resolve(self, outcome: Outcome) -> None:
        """Settle the future from any thread; a future already settled (superseded) stays as it is."""

        def settle() -> None:
            if not self.future.done():
                self.future.set_result(outcome)

        with contextlib.suppress(RuntimeError):  # the loop is closed: the server is shutting down
            self.loop.call_soon_threadsafe(settle)


class Scheduler:
    """Runs jobs one at a time on a daemon worker thread; at most one live job per key."""

    def __init__(
        self,
        name: str = "decode-worker",
        on_idle: Callable[[], None] | None = None,
        wrap_request_stop: StopHook | None = None,
    ) -> None:
        """``on_idle`` runs on the worker after a job when no other job waits (the answer already
        sent): housekeeping that must not delay an answer, such as giving freed memory back.
        ``wrap_request_stop`` (tests only) wraps each request job's stop check, e.g. to raise
        from inside a decode; background jobs keep theirs."""
        self.name = name
        self._on_idle = on_idle
        self._wrap_request_stop = wrap_request_stop
        self._queue: queue.SimpleQueue[Ticket | None] = queue.SimpleQueue()
        self._active: dict[str, Ticket] = {}  # key -> newest ticket; touched on the loop thread only
        self._background: set[Ticket] = set()  # background tickets not finished yet; loop thread only
        self._thread: threading.Thread | None = None
        self._closed = False
        self._lock = threading.Lock()
        # How long each request job that started waited for the worker, superseded ones included:
        # a keystroke's wait behind the work it superseded, which an answer's phases cannot show
        # (a superseded request is answered before its job ends). Appended on the worker thread.
        self.waits_ms: deque[float] = deque(maxlen=WAITS_WINDOW)

    # -- event loop side ---------------------------------------------------------------------
    async def run(
        self, key: str, job: Job[T], *, debounce_s: float = 0.0, budget_s: float | None = None
    ) -> Outcome[T]:
        """Run ``job`` for ``key`` after the debounce, superseding any earlier job for ``key``.

        The time budget counts from this call, i.e. from the request's arrival, because that is
        the latency the user sees. If the awaiting task is cancelled ($/cancelRequest, shutdown)
        the job is told to stop and the cancellation propagates to the caller.
        """
        if self._closed:
            return Outcome("cancelled")
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + budget_s if budget_s else None
        ticket = Ticket(key=key, future=loop.create_future(), loop=loop, deadline=deadline)
        self.preempt_background()
        self.supersede(key)
        self._active[key] = ticket
        try:
            if debounce_s > 0:
                await asyncio.wait([ticket.future], timeout=debounce_s)
                if ticket.future.done():  # superseded while waiting
                    return ticket.future.result()
            return await self._submit(ticket, job)
        finally:
            if self._active.get(key) is ticket:
                del self._active[key]

    async def run_background(self, job: Job[T]) -> Outcome[T]:
        """Run ``job`` when the worker is free; any request arriving meanwhile stops or skips it."""
        if self._closed:
            return Outcome("cancelled")
        loop = asyncio.get_running_loop()
        ticket = Ticket(key="(background)", future=loop.create_future(), loop=loop, background=True)
        self._background.add(ticket)
        try:
            return await self._submit(ticket, job)
        finally:
            self._background.discard(ticket)

    async def _submit(self, ticket: Ticket, job: Job[T]) -> Outcome[T]:
        """Hand ``job`` to the worker and wait for its outcome; a cancelled waiter stops the job.

        A job still queued when its time budget runs out (the worker is busy with another
        document's decode) is answered then, as expired, and never runs: the budget is the
        latency the user was promised, wherever the time went.
        """
        self._start_worker()
        ticket.enqueued_at = time.monotonic()
        ticket.job = job
        self._queue.put(ticket)
        try:
            if ticket.deadline is not None:
                remaining = ticket.deadline - time.monotonic()
                await asyncio.wait([ticket.future], timeout=max(remaining, 0.0))
                if not ticket.future.done() and ticket.drop():
                    queued_ms = (time.monotonic() - ticket.enqueued_at) * 1000
                    return Outcome("expired", budget_exhausted=True, queued_ms=queued_ms)
            return await ticket.future  # a running job stops at its next step
        except asyncio.CancelledError:
            ticket.stop()
            raise

    def preempt_background(self) -> int:
        """Stop every background job now (a request needs the worker); how many were stopped."""
        stopped = 0
        for ticket in list(self._background):
            if not ticket.cancel.is_set():
                ticket.stop(superseded=True)
                stopped += 1
        return stopped

    def supersede(self, key: str) -> bool:
        """Stop the live job for ``key``, if any, and answer it now as superseded."""
        previous = self._active.pop(key, None)
        if previous is None:
            return False
        previous.stop(superseded=True)
        if not previous.future.done():
            previous.future.set_result(Outcome("superseded"))
        return True

    def close(self, timeout_s: float = 1.0) -> None:
        """Stop every job and the worker; safe to call twice and from a non-loop thread."""
        self._closed = True
        for ticket in [*self._active.values(), *self._background]:
            ticket.stop()
        self._queue.put(None)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
            if thread.is_alive() and timeout_s > 0:
                log.warning("decode worker still busy after %.1f s; leaving it (daemon)", timeout_s)

    # -- worker side -----------------------------------------------------------------------------
    def _start_worker(self) -> None:
        with self._lock:
            if self._thread is None:
                # A daemon: a decode can't be interrupted, and it must never keep the process alive
                # after the client has gone.
                self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
                self._thread.start()

    def _work(self) -> None:
        while True:
            ticket = self._queue.get()
            if ticket is None:
                return
            job = ticket.take()
            picked = time.monotonic()
            queued_ms = (picked - ticket.enqueued_at) * 1000
            if job is None or ticket.cancel.is_set():  # given up on while queued: don't start it
                status = "superseded" if ticket.superseded else "cancelled"
                ticket.resolve(Outcome(status, queued_ms=queued_ms))
                continue
            if not ticket.background:
                self.waits_ms.append(queued_ms)
            outcome = ticket.context.run(self._run_job, ticket, job)
            outcome.queued_ms = queued_ms
            outcome.run_ms = (time.monotonic() - picked) * 1000
            if ticket.cancel.is_set() and outcome.status == "done":
                outcome.status = "superseded" if ticket.superseded else "cancelled"
            with contextlib.suppress(Exception):
                ticket.resolve(outcome)
            if self._on_idle is not None and self._queue.empty():
                try:
                    self._on_idle()
                except Exception:
                    log.exception("the worker's idle housekeeping failed")

    def _run_job(self, ticket: Ticket, job: Job) -> Outcome:
        """Run ``job`` (worker thread, in its submitter's context); a job that raises fails."""
        try:
            stop = ticket.should_stop
            if not ticket.background and self._wrap_request_stop is not None:
                stop = self._wrap_request_stop(stop)
            value = job(stop)
        except Exception as exc:
            log.exception("job for %s failed", ticket.key)
            return Outcome("failed", error=exc)
        return Outcome(
            "done", value, budget_exhausted=ticket.budget_exhausted() and not ticket.cancel.is_set()
        )
