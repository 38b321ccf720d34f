"""The scheduler's run, replayed."""

from __future__ import annotations

import heapq
from dataclasses import dataclass


@dataclass
class Replay:
    """A schedule replayed: when it ended, and each stage's span."""

    makespan: float
    spans: dict[int, tuple[float, float]]


def schedule(
    deps: dict[int, list[int]],
    durations: dict[int, list[float]],
    slots: int,
    adapt_s: dict[int, float] | None = None,
    dispatch_s: float = 0.0,
) -> Replay:
    """The scheduler's run, replayed: a stage's tasks are ready once every
    stage it reads is published, the ready task with the longest remaining
    path runs first, at most `slots` at once. The driver is one loop
    (runtime/src/scheduler/ready.rs): asking how a newly ready stage runs
    takes `adapt_s[stage]` and handing out a task `dispatch_s`, and
    nothing starts meanwhile."""
    adapt_s = adapt_s or {}
    readers: dict[int, list[int]] = {sid: [] for sid in deps}
    for sid, ds in deps.items():
        for dep in ds:
            readers[dep].append(sid)
    remaining: dict[int, float] = {}

    def rest(sid: int) -> float:
        if sid not in remaining:
            above = max((rest(r) for r in readers[sid]), default=0.0)
            remaining[sid] = max(durations[sid]) + above
        return remaining[sid]

    waiting = {sid: set(ds) for sid, ds in deps.items()}
    left = {sid: len(d) for sid, d in durations.items()}
    # A stage's tasks take the same time, so they are handled in batches:
    # (-remaining path, stage, tasks) ready, (end, stage, tasks) running.
    ready: list[tuple[float, int, int]] = []
    running: list[tuple[float, int, int]] = []
    spans: dict[int, tuple[float, float]] = {}
    uniform = {sid: min(ts) == max(ts) for sid, ts in durations.items()}
    now = 0.0
    busy = 0.0  # the driver's loop is busy until then
    free = slots

    def release(sid: int) -> None:
        nonlocal busy
        busy = max(busy, now) + adapt_s.get(sid, 0.0)
        heapq.heappush(ready, (-rest(sid), sid, len(durations[sid])))

    for sid, unpublished in waiting.items():
        if not unpublished:
            release(sid)
    while ready or running:
        while ready and free > 0:
            path, sid, n = heapq.heappop(ready)
            take = min(n, free)
            if take < n:
                heapq.heappush(ready, (path, sid, n - take))
            free -= take
            start = max(now, busy)
            busy = start + take * dispatch_s
            first = spans.get(sid, (start, start))[0]
            times = durations[sid]
            if uniform[sid]:
                # Handed out one after another; taken to end together, at
                # the mean of their ends.
                end = start + dispatch_s * (take - 1) / 2 + times[0]
                heapq.heappush(running, (end, sid, take))
            else:
                # Tasks timed one by one (a measured run): each its own.
                done = len(times) - n
                for i in range(done, done + take):
                    end = start + dispatch_s * (i - done) + times[i]
                    heapq.heappush(running, (end, sid, 1))
            spans[sid] = (first, end)
        now, sid, n = heapq.heappop(running)
        free += n
        left[sid] -= n
        if left[sid] == 0:
            spans[sid] = (spans[sid][0], now)
            for r in readers[sid]:
                waiting[r].discard(sid)
                if not waiting[r]:
                    release(r)
    return Replay(makespan=now, spans=spans)


def critical_path(
    deps: dict[int, list[int]], durations: dict[int, list[float]]
) -> float:
    """The longest chain of stages through their deps (each stage its slowest
    task): what no number of machines makes shorter."""
    memo: dict[int, float] = {}

    def longest(sid: int) -> float:
        if sid not in memo:
            below = max((longest(d) for d in deps[sid]), default=0.0)
            memo[sid] = below + max(durations[sid])
        return memo[sid]

    return max(longest(sid) for sid in deps)


def sharing(
    spans: dict[int, tuple[float, float]], tasks: dict[int, int], slots: int
) -> dict[int, float]:
    """Tasks in flight beside each stage's, on the one prefix: every stage's
    tasks at once (up to the slots), weighted by how much of the stage's
    span it overlaps, the whole capped at the slots."""
    load = {}
    for sid, (a, b) in spans.items():
        length = max(b - a, 1e-9)
        total = 0.0
        for other, (c, e) in spans.items():
            overlap = min(b, e) - max(a, c)
            if overlap > 0:
                total += min(slots, tasks[other]) * overlap / length
        load[sid] = min(float(slots), max(total, float(min(slots, tasks[sid]))))
    return load
