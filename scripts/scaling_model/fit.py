"""A query's stages as lines in the scale factor, and the driver's fixed
costs."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .costs import Costs
from .profile import QUERIES, Profile, Stage
from .schedule import schedule


@dataclass
class StageFit:
    """A stage's task time as a line: each task pays `alpha_ms` whatever the
    scale (decode, opening its inputs, a hash table's setup, a one-file
    table's scan), and the stage's tasks together `beta_ms` per unit of
    scale factor, shared by however many tasks it is cut into."""

    stage: Stage  # the shape: maps, buckets, deps (of the largest scale)
    scale: float  # the scale the shape's bytes and rows were measured at
    alpha_ms: float
    beta_ms: float


def fit_query(
    measured: list[tuple[float, Profile]], costs: Costs
) -> dict[int, StageFit]:
    """Each stage's line through its mean task time at each measured scale
    (least squares; a stage measured at one scale only: through the typical
    per-task intercept of the stages measured at several)."""
    measured = sorted(measured, key=lambda sp: sp[0])
    top_scale, top = measured[-1]
    fits = {}
    for sid, stage in top.stages.items():
        points = [
            (sc, statistics.fmean(p.stages[sid].task_ms))
            for sc, p in measured
            if sid in p.stages
        ]
        # A scan of a one-file table (`nation`, `region`: the same rows at
        # every scale), or a stage whose rows in and out are alike at every
        # scale (over an aggregate's few groups): its time does not grow.
        # (A scan's rows in are its table's, unseen: one of a table of
        # several files grows.)
        rows = [
            p.stages[sid].rows + sum(p.stages[d].rows for d in stage.deps)
            for _, p in measured
        ]
        if stage.deps:
            # (A stage may scan a table beside its readers, the probe side of
            # a collected join: its time grows though its readers' rows do
            # not, so its time must not grow either.)
            times = [y for _, y in points]
            constant = (
                len(points) > 1
                and max(rows) <= 1.05 * min(rows)
                and times[-1] <= 1.5 * times[0]
            )
        else:
            constant = stage.maps == 1
        if constant:
            fits[sid] = StageFit(
                stage=stage,
                scale=top_scale,
                alpha_ms=statistics.fmean(y for _, y in points),
                beta_ms=0.0,
            )
            continue
        if len(points) == 1:
            sc, mean = points[0]
            alpha = min(costs.typical_alpha_ms, mean)
            beta = (mean - alpha) / sc
        else:
            xs, ys = [x for x, _ in points], [y for _, y in points]
            mx, my = statistics.fmean(xs), statistics.fmean(ys)
            sxx = sum((x - mx) ** 2 for x in xs)
            slope = max(0.0, sum((x - mx) * (y - my) for x, y in points) / sxx)
            alpha = max(0.0, my - slope * mx)
            beta = slope
        fits[sid] = StageFit(
            stage=stage, scale=top_scale, alpha_ms=alpha, beta_ms=beta * stage.maps
        )
    return fits


def target_maps(maps: int, measured_partitions: int, partitions: int) -> int:
    """A stage's maps at `partitions`: those that had one per partition (a
    scan of P files, a hash exchange's P buckets) get `partitions`; a
    single-task stage (a one-file table, an operator needing all its input)
    stays one."""
    if maps == 1:
        return 1
    return max(1, round(maps * partitions / measured_partitions))


def replay_ms(profile: Profile, slots: int) -> float:
    """The makespan of the measured tasks themselves, replayed on `slots`."""
    measured = {sid: [t / 1e3 for t in s.task_ms] for sid, s in profile.stages.items()}
    deps = {sid: s.deps for sid, s in profile.stages.items()}
    return schedule(deps, measured, slots).makespan * 1e3


def fit_driver(sets: list[dict[str, Profile]], slots: int) -> tuple[float, float]:
    """The driver's once-per-query time as d0 + d1 * stages: least squares
    over what the wall times leave once the runs' own tasks are replayed and
    their final reads taken off (plugin load, session, plan, encode, pool
    start)."""
    xs, ys = [], []
    for runs in sets:
        for prof in runs.values():
            xs.append(len(prof.stages))
            ys.append(prof.wall_ms - replay_ms(prof, slots) - prof.final_read_ms)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    d1 = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - d1 * mx, d1


def typical_alpha(
    inputs: list[tuple[float, dict[str, Profile]]], costs: Costs
) -> float:
    """The median per-task intercept of the stages that grow, over the queries
    planned alike at every input scale."""
    costs.typical_alpha_ms = costs.task_fixed_ms
    alphas = []
    for query in QUERIES:
        points = [(scale, runs[query]) for scale, runs in inputs if query in runs]
        if len(points) > 1 and all(shape(p) == shape(points[0][1]) for _, p in points):
            alphas += [
                f.alpha_ms for f in fit_query(points, costs).values() if f.beta_ms > 0
            ]
    return statistics.median(alphas) if alphas else costs.task_fixed_ms


def shape(profile: Profile) -> dict[int, tuple]:
    """A plan's stages with their deps, maps and buckets: two runs of a query
    planned alike have the same shape. DataFusion picks a join's kind from
    the tables' sizes, so a scale may plan a query otherwise."""
    return {
        sid: (tuple(s.deps), s.maps, s.buckets) for sid, s in profile.stages.items()
    }


_FITS: dict[tuple, dict[int, StageFit] | None] = {}


def fits_for(
    query: str, inputs: list[tuple[float, dict[str, Profile]]], costs: Costs
) -> dict[int, StageFit] | None:
    """The query's stage lines over the input sets that planned it as the
    largest scale did (the others are left out)."""
    key = (query, tuple((sc, id(runs)) for sc, runs in inputs), costs.typical_alpha_ms)
    if key not in _FITS:
        _FITS[key] = _fits_for(query, inputs, costs)
    return _FITS[key]


def _fits_for(
    query: str, inputs: list[tuple[float, dict[str, Profile]]], costs: Costs
) -> dict[int, StageFit] | None:
    points = [(scale, runs[query]) for scale, runs in inputs if query in runs]
    if not points:
        return None
    top = max(points, key=lambda sp: sp[0])[1]
    alike = [(sc, p) for sc, p in points if shape(p) == shape(top)]
    return fit_query(alike, costs)
