"""The grading pool: math-verify in worker processes, off the event loop, with a hard kill.

Flow of one grade (``Grader.grade``):

1. no boxed answer -> ``missing_final_answer``; an answer over ``max_answer_chars`` ->
   ``unparseable_answer`` (never sent to a worker);
2. exact fast paths: equal normal forms (``answers.normalize_answer``) -> correct; both
   plain integers or integer fractions (``closed_form.exact_rational``) -> compared exactly;
   closed-form numbers (integers, decimals, ``\\frac``, ``\\sqrt``, ``\\pi``, powers) as
   rational intervals, and such a number against a tuple/set/interval of several distinct
   ones (``closed_form.closed_form_verdict``) -> decided only where the policies' verdict is
   certain (equal exact rationals, or further apart than any tolerance), else undecided; the
   same for the plain number inside one decoration (``\\$18``, ``18 \\text{ dollars}``,
   ``x = 18``, ``\\mathbf{18}``: ``closed_form.undecorated``) against a plain-number gold.
   Pure string/Fraction code, no sympy (most MATH-500 short answers end here or earlier;
   figures in ``benchmarks/README.md``);
3. verdict cache (LRU, keyed by a digest of gold and answer) and in-flight de-duplication;
4. fair admission (``GradingConfig.fairness``, on by default): every grade names its owner (the
   session), waits in that owner's queue, and goes to pebble only when a worker is free (or about
   to be: ``PIPELINE_S``), the owner
   whose grades have used the least worker time so far going first (start-time fair queueing
   over worker seconds; an owner that starts from idle is ranked ``hard_timeout_s`` ahead of
   the grade dispatched last, so it does not wait for a whole round of busy owners, and it
   cannot bank more credit than that by idling; between owners charged alike, the one with
   fewer grades waiting goes first, so a session with one grade is not queued behind a round of
   new sessions with many). A session that floods the pool with costly answers therefore queues behind its
   own work while another session's grade waits for at most one running grade per worker
   (measured in ``benchmarks/README.md``, "Hostile load"). ``Grader.backlog`` counts an owner's
   grades queued or running, for the transports' backpressure;
5. a worker process runs :func:`env_server.grading.worker.grade_answer` (math-verify, with
   its own soft timeouts); pebble kills a worker that runs past ``hard_timeout_s``, starts a
   replacement and the grade becomes reward 0 with ``grading_timeout``. A worker that dies
   (OOM under its address-space cap, SIGKILL) gives the same result. Workers fork from a
   forkserver that has imported math-verify and warmed its parser once
   (``env_server.grading.preload``); inside, parsing is two-stage (SLL, then LL) and cached
   (see ``grading_worker``).

pebble is used rather than ``concurrent.futures.ProcessPoolExecutor`` because the latter
cannot kill one stuck task without breaking the whole pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import heapq
import itertools
import logging
import multiprocessing
import os
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Hashable
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from env_server.debate.answers import LOOP_ANSWER_CHARS, normalize_answer
from env_server.debate.closed_form import closed_form_verdict, exact_rational, is_plain_number, undecorated
from env_server.protocol.grades import Grade, GradeSource
from env_server.protocol.markers import ErrorKind

__all__ = ["GradeCache", "Grader", "GradingConfig"]

if TYPE_CHECKING:
    from pebble import ProcessPool

log = logging.getLogger(__name__)


class GradingConfig(BaseModel):
    """Grading pool settings.

    Attributes:
        workers: worker processes (default: CPU count).
        hard_timeout_s: wall-clock limit of one grade in a worker, seconds; past it the worker
            is killed and replaced.
        soft_timeout_s: math-verify's own per-parse/per-compare timeout (integer seconds,
            ``signal.alarm``); below ``hard_timeout_s`` so most slow inputs end cleanly.
        sig_figs: significant figures a decimal answer must agree to (see grading_worker).
        max_answer_chars: input cap on the extracted final answer (the boxed content).
        cache_size: verdicts kept in the LRU cache.
        worker_max_tasks: tasks before a worker is recycled (bounds sympy cache growth).
        worker_memory_mb: address-space cap of a worker (``RLIMIT_AS``), MiB; 0 disables.
        fairness: per-session fair admission to the workers (module docstring, step 4); ``False``
            sends grades to the workers first come, first served (the behaviour before it, kept
            so ``benchmarks/hostile_load.py`` can measure the difference). ``mathdebate serve
            --grading-fairness on|off``.
        session_backlog: grades of one session queued or running in a worker beyond which
            ``/ws/mux`` holds that session's next frames until its backlog is below it again
            (backpressure on a session that outruns the workers; other sessions are not held).
            Only with ``fairness``.
    """

    workers: int = Field(default_factory=lambda: max(1, os.cpu_count() or 1), ge=1, le=256)
    hard_timeout_s: float = Field(default=5.0, gt=0, le=600)
    soft_timeout_s: int = Field(default=3, ge=1, le=600)
    sig_figs: int = Field(default=6, ge=1, le=30)
    max_answer_chars: int = Field(default=8192, ge=1)
    cache_size: int = Field(default=200_000, ge=0)
    worker_max_tasks: int = Field(default=2000, ge=0)
    worker_memory_mb: int = Field(default=4096, ge=0)
    fairness: bool = True
    session_backlog: int = Field(default=4, ge=1)


class GradeCache:
    """LRU map ``(gold, answer) -> (correct, error_kind)`` keyed by a 16-byte BLAKE2b digest,
    so memory does not grow with answer length."""

    def __init__(self, max_size: int) -> None:
        self._max_size = max_size
        self._data: OrderedDict[bytes, Grade] = OrderedDict()

    @staticmethod
    def key(gold: str, answer: str) -> bytes:
        return hashlib.blake2b(f"{gold}\x00{answer}".encode(), digest_size=16).digest()

    def get(self, key: bytes) -> Grade | None:
        grade = self._data.get(key)
        if grade is not None:
            self._data.move_to_end(key)
        return grade

    def put(self, key: bytes, grade: Grade) -> None:
        if self._max_size <= 0:
            return
        self._data[key] = grade
        self._data.move_to_end(key)
        while len(self._data) > self._max_size:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)


#: scheduling niceness added to grading workers: when workers and the event loop compete for
#: cores (a flood of answers that need a worker), the loop, which serves every session's steps,
#: runs first; grading still gets every idle cycle
WORKER_NICENESS = 10


def _init_worker(memory_mb: int) -> None:
    """Worker initializer: lower the worker's CPU priority (``WORKER_NICENESS``) and cap its
    address space so a memory bomb fails inside the worker."""
    with contextlib.suppress(OSError):  # not permitted: the default priority
        os.nice(WORKER_NICENESS)
    if memory_mb > 0:
        import resource

        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


#: Grades handed to pebble beyond one per worker, so that a worker that finishes starts its next
#: grade without a round trip through the event loop: about ``PIPELINE_S`` of work per worker at
#: the recent pace of grading (the mean interval between finished grades, times the workers), at
#: most ``MAX_AHEAD``. Quick grades (a few ms) keep several waiting (with none, 100 owners of
#: fresh grades got about 0.77x the grades/s of first come, first served); costly ones (seconds)
#: none, so a new owner's grade waits for at most one running grade per worker.
PIPELINE_S = 0.01
MAX_AHEAD = 8
#: worker seconds charged to an owner when one of its grades starts (the real time is charged
#: when it ends): an owner whose grade is running ranks behind owners waiting with the same
#: charge, so it does not take a second worker while others wait
DISPATCH_CHARGE_S = 0.01


class _Owner:
    """One owner's (session's) grades waiting for a worker, and its worker time so far."""

    __slots__ = ("backlog", "key", "queue", "queued", "room", "used")

    def __init__(self, key: Hashable, used: float) -> None:
        self.key = key
        self.queue: deque[tuple[str, str, asyncio.Future[Grade]]] = deque()
        self.used = used  # worker seconds charged (start-time fair queueing tag)
        self.backlog = 0  # grades queued or running
        self.queued = False  # in the ready heap
        self.room: asyncio.Event | None = None  # set when the backlog falls below session_backlog


class Grader:
    """Asynchronous grader over a pool of worker processes.

    Create it inside a running event loop's lifetime (``await grader.start()``) and close it
    on shutdown. ``grade`` is safe to call concurrently from many sessions.
    """

    def __init__(self, config: GradingConfig | None = None) -> None:
        self.config = config or GradingConfig()
        self.cache = GradeCache(self.config.cache_size)
        #: counters: ``requests``, ``rule``/``exact``/``numeric``/``closed_form``/``cache``/``worker`` (how each grade was
        #: decided), ``deduplicated``, ``timeouts``, ``worker_deaths``, ``pool_restarts``,
        #: ``kind:<error_kind>``.
        self.stats: Counter[str] = Counter()
        self._inflight: dict[bytes, asyncio.Future[Grade]] = {}
        self._pool: ProcessPool | None = None
        self._closed = False
        # fair admission (module docstring, step 4)
        self._owners: dict[Hashable, _Owner] = {}
        self._ready: list[tuple[float, int, int, _Owner]] = []  # (used, backlog, seq, owner) of owners with queued grades
        self._seq = itertools.count()
        self._vtime: float | None = None  # the highest charge a dispatched grade's owner had (None: none yet)
        self._running = 0
        self._started: set[asyncio.Future[None]] = set()  # admitted grades running in pebble
        self._pace_s = 1.0  # moving mean of worker seconds per finished grade (PIPELINE_S)
        self._last_done = time.monotonic()

    async def start(self) -> None:
        """Start the worker processes (idempotent) and warm them up, so import and
        first-parse costs are paid before the first real grade."""
        if self._pool is None:
            self._pool = self._new_pool()
            await asyncio.gather(*(self._run_worker("1", "1") for _ in range(self.config.workers)))

    def _new_pool(self) -> ProcessPool:
        """A pebble pool whose workers fork from a forkserver that has already imported
        math-verify, so a replacement worker starts in milliseconds."""
        from pebble import ProcessPool

        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["env_server.grading.preload"])
        return ProcessPool(
            max_workers=self.config.workers,
            max_tasks=self.config.worker_max_tasks,
            initializer=_init_worker,
            initargs=(self.config.worker_memory_mb,),
            context=context,
        )

    def close(self) -> None:
        """Stop the workers (pending grades fail; callers treat them as timeouts)."""
        self._closed = True
        if self._pool is not None:
            self._pool.stop()  # type: ignore[no-untyped-call]  # pebble 5 leaves stop() unannotated
            self._pool.join(timeout=5)
            self._pool = None

    @property
    def worker_pids(self) -> list[int]:
        """PIDs of the live worker processes (for fault-injection tests)."""
        if self._pool is None:
            return []
        return list(self._pool._pool_manager.worker_manager.workers)  # pebble keys workers by pid

    def quick_grade(self, gold: str, answer: str | None) -> Grade | None:
        """The grade if it is known without a worker (rule, exact path or cache), else None.

        Counts as a request in ``stats`` only when it answers."""
        if answer is None:
            grade = Grade(False, ErrorKind.MISSING_FINAL_ANSWER, "rule")
        elif len(answer) > self.config.max_answer_chars:
            grade = Grade(False, ErrorKind.UNPARSEABLE_ANSWER, "rule")
        elif len(answer) > LOOP_ANSWER_CHARS:  # too long for the event loop: the cache, else a worker
            cached = self.cache.get(GradeCache.key(gold, answer))
            if cached is None:
                return None
            grade = Grade(cached.correct, cached.error_kind, "cache")
        elif (decided := self._loop_verdict(gold, answer)) is not None:
            grade = Grade(decided[0], None, decided[1])
        elif (is_plain_number(gold) and (plain := undecorated(answer)) is not None
              and (decided := self._loop_verdict(gold, plain)) is not None):
            grade = Grade(decided[0], None, "decorated")
        else:
            cached = self.cache.get(GradeCache.key(gold, answer))
            if cached is None:
                return None
            grade = Grade(cached.correct, cached.error_kind, "cache")
        self.stats["requests"] += 1
        return self._count(grade)

    def _loop_verdict(self, gold: str, answer: str) -> tuple[bool, GradeSource] | None:
        """``(correct, source)`` from the event-loop paths, in order: equal normal forms
        (``exact``), both exact rationals (``numeric``), closed-form values (``closed_form``);
        ``None`` when none decides."""
        if normalize_answer(answer) == normalize_answer(gold):
            return True, "exact"
        if (gold_value := exact_rational(gold)) is not None and (value := exact_rational(answer)) is not None:
            return gold_value == value, "numeric"
        verdict = closed_form_verdict(gold, answer, self.config.sig_figs)
        return None if verdict is None else (verdict, "closed_form")

    def backlog(self, owner: Hashable) -> int:
        """Grades of ``owner`` queued for or running in a worker (0 without fair admission)."""
        state = self._owners.get(owner)
        return state.backlog if state is not None else 0

    async def room(self, owner: Hashable) -> None:
        """Return once ``owner``'s backlog is below ``config.session_backlog``."""
        state = self._owners.get(owner)
        while state is not None and state.backlog >= self.config.session_backlog:
            if state.room is None:
                state.room = asyncio.Event()
            await state.room.wait()
            state = self._owners.get(owner)

    async def grade(self, gold: str, answer: str | None, owner: Hashable = None) -> Grade:
        """Grade ``answer`` (the extracted final answer, ``answers.final_answer``, or None) against ``gold``.

        Args:
            owner: who asks (the session id): with ``config.fairness`` a grade that needs a
                worker waits behind its owner's earlier ones, and owners share the workers
                fairly (module docstring, step 4).

        Never raises for bad input: failures become ``unparseable_answer`` or
        ``grading_timeout``.
        """
        quick = self.quick_grade(gold, answer)
        if quick is not None:
            return quick
        assert answer is not None
        self.stats["requests"] += 1
        key = GradeCache.key(gold, answer)
        pending = self._inflight.get(key)
        if pending is not None:
            self.stats["deduplicated"] += 1
            return await asyncio.shield(pending)
        future: asyncio.Future[Grade] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            grade = await (self._admitted(owner, gold, answer) if self.config.fairness else self._run_worker(gold, answer))
            if grade.error_kind is not ErrorKind.GRADING_TIMEOUT:
                self.cache.put(key, grade)
            future.set_result(grade)
        except BaseException as exc:  # cancellation: wake the waiters with a timeout grade
            future.set_result(Grade(False, ErrorKind.GRADING_TIMEOUT, "worker"))
            raise exc
        finally:
            del self._inflight[key]
        return self._count(grade)

    async def _admitted(self, owner: Hashable, gold: str, answer: str) -> Grade:
        """A worker's grade, queued in ``owner``'s queue until the fair scheduler starts it."""
        state = self._owners.get(owner)
        credit = (self._vtime or 0.0) - self.config.hard_timeout_s  # an idle owner's head start (module docstring)
        if state is None:
            state = self._owners[owner] = _Owner(owner, credit)
        future: asyncio.Future[Grade] = asyncio.get_running_loop().create_future()
        state.queue.append((gold, answer, future))
        state.backlog += 1
        if not state.queued:
            state.used = max(state.used, credit)
            self._enqueue(state)
        self._dispatch()
        try:
            return await future
        finally:
            state.backlog -= 1
            if state.backlog < self.config.session_backlog and state.room is not None:
                state.room.set()
                state.room = None
            if state.backlog == 0 and self._owners.get(owner) is state:
                del self._owners[owner]

    def _enqueue(self, state: _Owner) -> None:
        state.queued = True
        heapq.heappush(self._ready, (state.used, state.backlog, next(self._seq), state))

    def _dispatch(self) -> None:
        """Start queued grades while a worker is free, least-served owner first."""
        limit = self.config.workers * (1 + min(MAX_AHEAD, int(PIPELINE_S / max(self._pace_s, 1e-6))))
        while self._running < limit and self._ready:
            used, backlog, _, state = heapq.heappop(self._ready)
            state.queued = False
            if (used, backlog) < (state.used, state.backlog):  # charged or more queued since: re-rank
                self._enqueue(state)
                continue
            while state.queue and state.queue[0][2].done():  # its waiter was cancelled
                state.queue.popleft()
            if not state.queue:
                continue
            gold, answer, future = state.queue.popleft()
            self._vtime = used if self._vtime is None else max(self._vtime, used)
            state.used += DISPATCH_CHARGE_S
            if state.queue:
                self._enqueue(state)
            self._running += 1
            task = asyncio.ensure_future(self._run_admitted(state, gold, answer, future))
            self._started.add(task)  # the loop keeps only weak references to tasks
            task.add_done_callback(self._started.discard)

    async def _run_admitted(self, state: _Owner, gold: str, answer: str, future: asyncio.Future[Grade]) -> None:
        start = time.monotonic()
        try:
            grade = await self._run_worker(gold, answer)
        except BaseException:
            grade = Grade(False, ErrorKind.GRADING_TIMEOUT, "worker")
            raise
        finally:
            now = time.monotonic()
            state.used += now - start - DISPATCH_CHARGE_S
            pace = min(now - self._last_done, now - start) * self.config.workers
            self._pace_s += 0.1 * (pace - self._pace_s)
            self._last_done = now
            self._running -= 1
            if not future.done():
                future.set_result(grade)
            if state.queue and not state.queued:
                self._enqueue(state)
            if not self._closed:
                self._dispatch()

    def _count(self, grade: Grade) -> Grade:
        self.stats[grade.source] += 1
        if grade.error_kind is not None:
            self.stats[f"kind:{grade.error_kind.value}"] += 1
        return grade

    async def _run_worker(self, gold: str, answer: str, retry: bool = True) -> Grade:
        from pebble import ProcessExpired

        from env_server.grading.worker import grade_answer

        if self._pool is None:
            if self._closed:
                return Grade(False, ErrorKind.GRADING_TIMEOUT, "worker")
            self._pool = self._new_pool()
        pool = self._pool
        try:
            future = pool.schedule(
                grade_answer,
                args=(gold, answer, self.config.sig_figs, self.config.soft_timeout_s),
                timeout=self.config.hard_timeout_s,
            )
            correct, kind = await asyncio.wrap_future(future)
        except FutureTimeoutError:
            self.stats["timeouts"] += 1
            log.warning("grade killed after %.1fs (answer of %d chars)", self.config.hard_timeout_s, len(answer))
            return Grade(False, ErrorKind.GRADING_TIMEOUT, "worker")
        except ProcessExpired as exc:
            self.stats["worker_deaths"] += 1
            log.warning("grading worker died (%s); it is replaced", exc)
            return Grade(False, ErrorKind.GRADING_TIMEOUT, "worker")
        except RuntimeError as exc:  # includes BrokenProcessPool
            if self._closed:
                return Grade(False, ErrorKind.GRADING_TIMEOUT, "worker")
            # pebble marks the whole pool broken when an idle worker dies while no task runs
            # ("All workers expired"): replace the pool and try once more.
            log.warning("grading pool broken (%s); starting a new one", exc)
            self.stats["pool_restarts"] += 1
            if self._pool is pool:
                pool.stop()  # type: ignore[no-untyped-call]  # pebble 5 leaves stop() unannotated
                self._pool = None
            if retry:
                return await self._run_worker(gold, answer, retry=False)
            return Grade(False, ErrorKind.GRADING_TIMEOUT, "worker")
        return Grade(bool(correct), ErrorKind(kind) if kind else None, "worker")
