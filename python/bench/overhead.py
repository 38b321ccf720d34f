"""Per-task fixed cost of the Python workers: one process per task vs a pool.

A tiny query over many tiny Parquet files, so that nearly all of a task's
time is the worker's fixed cost (start an interpreter, import DataFusion,
load the plugin, build the session) rather than work::

    python python/bench/overhead.py [--maps 16] [--workers 2] [--repeat 3]

Each mode runs the query ``--repeat`` times, every run in a fresh shuffle
directory; the table shows the median run. ``ms/task`` is the run's wall
time divided by its task count; ``in worker`` is the mean time workers
report for a task (``elapsed_ms``: session, decoding, execution and
publishing, without starting the process). Modes:

- ``process``: ``python -m dfx_engine.worker ENVELOPE`` per task;
- ``pool, per query``: ``run_distributed``'s own pool, started and closed by
  each query;
- ``pool, warm``: one :class:`~dfx_engine.driver.WorkerPool` for every run,
  warmed by one query first;
- with ``--dfx PATH``, ``dfx, process`` and ``dfx, pool, warm``: the same
  with the Rust host's workers (``dfx worker``, ``dfx worker --serve``);
- with ``--ray``, ``ray, warm``: each task a Ray task on a local Ray
  instance of ``--workers`` CPUs (:class:`~dfx_engine.ray.RayExecutor`),
  warmed by one query first.

``dispatch→report`` is the median of the driver's time per task, from its
dispatch to its report (``wall_ms``): for these near-empty tasks, the
executor's per-task cost.

Run it with the interpreter the wheel is installed in (``python/.venv`` once
``run-tests.sh`` has run). It sits outside the package's directory so that
the source tree's ``dfx_engine``, which has no native module, does not
shadow the installed one. Not a test: the figures depend on the machine.
The query also runs in process once, for the floor no distribution beats.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import tempfile
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from dfx_engine.driver import WorkerPool, run_distributed, run_local
from dfx_engine.session import SessionSpec

if TYPE_CHECKING:
    from collections.abc import Callable

    from dfx_engine.driver import DistributedResult

SQL = "SELECT count(*) AS n, sum(x) AS total FROM t"


def write_table(directory: pathlib.Path, files: int) -> None:
    """``files`` Parquet files of four rows each: one map task per file."""
    directory.mkdir()
    for index in range(files):
        table = pa.table({"x": pa.array([index * 4 + i for i in range(4)], pa.int64())})
        pq.write_table(table, directory / f"part-{index}.parquet")


def timed(run: Callable[[], DistributedResult]) -> tuple[float, int, float, float]:
    """Wall ms of ``run``, and figures of its tasks.

    The figures: its task count, the mean task time workers report, and the
    median dispatch-to-report time of its tasks.
    """
    started = time.perf_counter()
    result = run()
    wall = (time.perf_counter() - started) * 1000.0
    inside = [r.elapsed_ms for r in result.reports.values() if r.elapsed_ms]
    dispatched = [r.wall_ms for r in result.reports.values() if r.wall_ms]
    return (
        wall,
        len(result.tasks),
        statistics.fmean(inside) if inside else 0.0,
        statistics.median(dispatched) if dispatched else 0.0,
    )


def main() -> None:
    """Run every mode and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--maps", type=int, default=16, help="files = map tasks")
    parser.add_argument("--workers", type=int, default=2, help="max_workers")
    parser.add_argument("--repeat", type=int, default=3, help="runs per mode")
    parser.add_argument(
        "--dfx", help="the Rust host binary: measure its workers too (dfx worker)"
    )
    parser.add_argument(
        "--ray", action="store_true", help="measure Ray tasks too (a local Ray)"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="dfx-bench-") as scratch:
        root = pathlib.Path(scratch)
        write_table(root / "t", args.maps)
        runs = iter(range(1_000_000))

        def spec() -> SessionSpec:
            # The aggregate split: one stage, one map per file, then the root.
            return SessionSpec(
                tables={"t": str(root / "t")},
                shuffle_dir=str(root / f"shuffle-{next(runs)}"),
                target_partitions=args.maps,
                split="aggregate",
            )

        started = time.perf_counter()
        run_local(SQL, spec())
        local = (time.perf_counter() - started) * 1000.0

        rows: list[tuple[str, float, int, float, float]] = []

        def measure(name: str, run: Callable[[], DistributedResult]) -> None:
            samples = sorted(
                (timed(run) for _ in range(args.repeat)), key=lambda s: s[0]
            )
            rows.append((name, *samples[len(samples) // 2]))

        measure(
            "process",
            lambda: run_distributed(
                SQL, spec(), max_workers=args.workers, worker_mode="process"
            ),
        )
        measure(
            "pool, per query",
            lambda: run_distributed(SQL, spec(), max_workers=args.workers),
        )
        with WorkerPool(max_workers=args.workers) as pool:
            run_distributed(SQL, spec(), pool=pool)
            measure("pool, warm", lambda: run_distributed(SQL, spec(), pool=pool))
        if args.dfx:
            rust = [args.dfx, "worker"]
            measure(
                "dfx, process",
                lambda: run_distributed(
                    SQL,
                    spec(),
                    worker_command=rust,
                    max_workers=args.workers,
                    worker_mode="process",
                ),
            )
            with WorkerPool(max_workers=args.workers, worker_command=rust) as pool:
                run_distributed(SQL, spec(), pool=pool)
                measure(
                    "dfx, pool, warm",
                    lambda: run_distributed(SQL, spec(), pool=pool),
                )

        if args.ray:
            measure_ray(
                args.workers,
                lambda executor: run_distributed(SQL, spec(), executor=executor),
                measure,
            )

    print(
        f"{args.maps} map tasks, {args.workers} workers, median of {args.repeat} "
        f"runs; the query in process: {local:.1f} ms"
    )
    print(
        f"{'mode':<16} {'ms/query':>9} {'tasks':>6} {'ms/task':>8} {'in worker':>10} "
        f"{'dispatch→report':>16}"
    )
    for name, wall, tasks, inside, dispatched in rows:
        print(
            f"{name:<16} {wall:>9.1f} {tasks:>6} {wall / tasks:>8.1f} {inside:>10.1f} "
            f"{dispatched:>16.1f}"
        )


def measure_ray(
    workers: int,
    run: Callable[[Any], DistributedResult],
    measure: Callable[[str, Callable[[], DistributedResult]], None],
) -> None:
    """Measure ``run`` on a local Ray of ``workers`` CPUs, warmed by one run."""
    import ray

    from dfx_engine.ray import RayExecutor

    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    try:
        executor = RayExecutor(max_workers=workers)
        run(executor)
        measure("ray, warm", lambda: run(executor))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
