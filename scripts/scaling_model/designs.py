"""A query at a target: each stage's tasks and the requests they make,
as built or as designed with machine-sized tasks."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .costs import (
    BYTES_IN_FLIGHT,
    COLLECT_LIMIT,
    FOOTER_BYTES,
    LOCAL,
    MAX_PARTS_IN_FLIGHT,
    MB,
    PARSE_MB_S,
    PART_SIZE,
    REQUEST_CUT,
    SEGMENT_ROWS,
    TAIL_GUESS,
    Costs,
    MapFile,
    Store,
    Terms,
    request_s,
)
from .fit import StageFit, target_maps
from .schedule import critical_path, schedule, sharing


@dataclass
class Design:
    """How tasks and the exchange are cut: as built (the defaults), or
    machine-sized (`machine_tasks`), optionally with Flight between workers."""

    name: str = "as built"
    # Machine-sized: one task per machine per stage, running its slice of the
    # stage's partitions on all c cores; byte ranges in reports and
    # envelopes (no marker GET by a reader or the driver); a reader's ranges
    # fetched concurrently, adjacent ones coalesced (one request per reader
    # task and upstream task, cut at REQUEST_CUT), BYTES_IN_FLIGHT at once.
    machine_tasks: bool = False
    # Ranges: byte ranges in reports and envelopes (no marker GET by a
    # reader or the driver), a reader's ranges fetched concurrently and
    # coalesced; with a task per core. Machine-sized tasks have them too.
    ranges: bool = False
    bytes_in_flight: int = BYTES_IN_FLIGHT
    # Parts of a map's upload in flight (MAX_PARTS_IN_FLIGHT as built).
    parts_in_flight: int = MAX_PARTS_IN_FLIGHT
    # Flight: the shuffle's bytes between workers, not through S3.
    shuffle_store: Store | None = None
    # Where map files are uploaded, when not to the shuffle's store: S3 as
    # the durable copy beside Flight (shuffle durability `both`).
    put_store: Store | None = None
    # Flight: a reader on the machine that wrote a map reads its file from
    # disk (BucketStream, a map of its own process's server), so only the
    # other machines' maps are requests: (k - 1) / k of them, the tasks
    # spread evenly.
    owner_reads_disk: bool = False
    # Partitioned prefixes the shuffle's objects are spread over (one, the
    # query's location, before KEY_PREFIXES).
    prefixes: int = 1
    # Partitioned prefixes the tables' files are spread over (the user's
    # layout, not dfx's).
    table_prefixes: int = 1
    # Machine-sized tasks whose partitions each request their own bucket of
    # every upstream task (shuffle_reader.rs per partition, as built): one
    # request per (reader partition, upstream task) instead of one per pair
    # of tasks.
    request_per_partition: bool = False
    # Whole (`collapse_stages`, a plan no wider than a task): the whole
    # plan pipelined in one process, its exchanges repartitions in memory,
    # so no map file is written or read.
    one_stage: bool = False

    def __post_init__(self) -> None:
        """Machine-sized tasks read by ranges."""
        self.ranges = self.ranges or self.machine_tasks


@dataclass
class Target:
    """A cluster and a data size."""

    machines: int
    cores: int
    scale: float
    store: Store
    partitions: int = 0  # default: one per core
    tables_on_store: bool = True
    # Ranged GETs a Parquet scan makes per byte of its file (counted on moto;
    # the default: one per multipart part's size).
    table_gets_per_byte: float = 1 / PART_SIZE
    design: Design = field(default_factory=Design)
    terms: Terms = field(default_factory=Terms)
    # The driver's own time per task; None: the pool's, as measured.
    task_ms: float | None = None
    parse_mb_s: float = PARSE_MB_S

    @property
    def slots(self) -> int:
        """Tasks at once: one per core, or one per machine (machine-sized tasks)."""
        return (
            self.machines if self.design.machine_tasks else self.machines * self.cores
        )

    @property
    def parts(self) -> int:
        """The plan's partitions: one per core unless told."""
        return self.partitions or self.machines * self.cores


def filter_deps(fits: dict[int, StageFit]) -> dict[int, set[int]]:
    """The deps each stage reads only through a join filter, read off the
    shape: stage s depends on d, and a third stage reads both (the join
    whose probe side s scans and whose build side d is). The planner's
    `add_join_filters` makes exactly this shape; the figures do not name
    it."""
    out: dict[int, set[int]] = {sid: set() for sid in fits}
    for reader in fits.values():
        deps = set(reader.stage.deps)
        for s in reader.stage.deps:
            out[s] |= deps & set(fits[s].stage.deps)
    return out


def adaptive_reads(
    fits: dict[int, StageFit], sid: int, filtered: set[int], at_partitions: int
) -> dict[int, int]:
    """Marker reads of each upstream stage by the driver's adaptive step
    for stage `sid` (adapt::adapt_stage, asked once per stage that reads a
    stage, from the scheduler's `queue_ready`), in its maps: only for a
    stage whose partitions are the buckets of hash reads
    (`coalesce::hash_reads`). A partitioned join (two hash reads or more)
    is read by the broadcast switch (`switch_stage`: build and probe maps),
    the skew split (`split_stage`: the probe's maps) and coalescing
    (`partition_bytes`: every read once), when none of them decides first
    (at scale none does: TPC-H has no skew, and its large builds do not
    switch); one hash read (an aggregate) by coalescing alone. The probe is
    taken as the larger side (DataFusion builds on the smaller)."""
    s = fits[sid].stage
    hash_deps = [
        d
        for d in s.deps
        if d not in filtered
        and fits[d].stage.buckets > 1
        and fits[d].stage.buckets == s.maps
    ]
    if not hash_deps:
        return {}
    times = dict.fromkeys(hash_deps, 1)
    if len(hash_deps) >= 2:
        probe = max(hash_deps, key=lambda d: fits[d].stage.rows)
        times = dict.fromkeys(hash_deps, 2)
        times[probe] = 3
    return times


def task_times(
    fits: dict[int, StageFit],
    at_partitions: int,
    target: Target,
    table_bytes: float,
    load: dict[int, float] | None = None,
) -> tuple[dict[int, list[float]], dict[str, float], dict[int, float]]:
    """Each stage's task durations (seconds) at `target`, the totals of
    requests, bytes and tasks, and the driver's adaptive time per stage.
    `table_bytes`: the query's tables at scale 1. `load`: tasks of any
    stage running beside each stage's (default: its own, up to the slots)."""
    store = target.store
    d = target.design
    terms = target.terms
    shuffle = d.shuffle_store or store
    p = target.parts
    if d.machine_tasks:
        # A task per machine's worth of the stage's maps at P partitions: one
        # per machine, or more where the stage had more maps than partitions
        # (a union's inputs side by side).
        maps = {
            sid: max(
                1, math.ceil(target_maps(f.stage.maps, at_partitions, p) / target.cores)
            )
            for sid, f in fits.items()
        }
    else:
        maps = {
            sid: target_maps(f.stage.maps, at_partitions, p) for sid, f in fits.items()
        }
    # Buckets per map file: the plan's partitions (a slice's buckets are
    # contiguous ranges in machine-sized tasks' files).
    buckets = {
        sid: 1
        if f.stage.buckets == 1
        else target_maps(f.stage.buckets, at_partitions, p)
        for sid, f in fits.items()
    }
    filtered = filter_deps(fits)
    tasks_per_machine = 1 if d.machine_tasks else target.cores
    # Requests one task has in flight: the as-built reader awaits each
    # (exchange/stream.rs: the markers, then one segment at a time).
    in_flight = max(1, d.bytes_in_flight // REQUEST_CUT) if d.ranges else 1
    # A task's scans: one partition's requests one at a time, a machine's
    # task its c partitions at once.
    scanning = target.cores if d.machine_tasks else 1
    bandwidth = min(store.conn_bw * scanning, store.machine_bw / tasks_per_machine)
    shuffle_bw = min(
        shuffle.conn_bw * in_flight, shuffle.machine_bw / tasks_per_machine
    )
    parse_per_byte = 1 / (target.parse_mb_s * MB) if terms.parse else 0.0
    keys = ("get", "table_get", "shuffle_get", "driver_get", "put", "bytes", "tasks")
    keys += ("read_bytes", "remote_bytes", "written_bytes", "disk_reads")
    totals = dict.fromkeys(keys + ("io", "parse", "given_up"), 0.0)
    remote = 1.0
    if d.owner_reads_disk:
        remote = (target.machines - 1) / target.machines
    scans_beta = sum(f.beta_ms for f in fits.values() if f.stage.maps > 1)
    files: dict[int, MapFile] = {}
    for sid, f in fits.items():
        u = f.stage
        grow = target.scale / f.scale
        files[sid] = MapFile.of(
            u.rows * grow / maps[sid], u.bytes * grow / maps[sid], buckets[sid]
        )

    def marker_gets(dep: int) -> int:
        # read_remote_marker (exchange/locate.rs): the tail, then the rest of
        # the index when the tail does not hold it (`Located::At`).
        big = files[dep].index_bytes > TAIL_GUESS - FOOTER_BYTES
        return 2 if terms.marker_size and big else 1

    out: dict[int, list[float]] = {}
    adapt_s: dict[int, float] = {}
    for sid, f in fits.items():
        s = f.stage
        m = maps[sid]
        grow = target.scale / f.scale
        # A machine's task runs its slice of partitions on all its cores.
        cores = target.cores if d.machine_tasks and s.maps > 1 else 1
        compute = (f.alpha_ms + f.beta_ms * target.scale / m / cores) / 1e3
        at_once = (load or {}).get(sid, min(target.slots, m)) * in_flight
        prefix_gets = store.get_rate * d.table_prefixes
        get_s, give_up = request_s(
            store.latency_s, at_once, prefix_gets, terms.slow_down
        )
        sh_get_s, sh_give_up = request_s(
            shuffle.latency_s, at_once, shuffle.get_rate * d.prefixes, terms.slow_down
        )
        put_to = d.put_store or shuffle
        sh_put_s, _ = request_s(
            put_to.latency_s, at_once, put_to.put_rate * d.prefixes, terms.slow_down
        )
        # Write (exchange/store.rs): one PUT, or a multipart upload (create,
        # parts, complete), MAX_PARTS_IN_FLIGHT parts at once.
        out_bytes = s.bytes * grow / m
        parts = math.ceil(out_bytes / PART_SIZE)
        puts = 1 if out_bytes <= PART_SIZE else 2 + parts
        put_bw = min(
            put_to.put_bw or put_to.conn_bw,
            min(put_to.conn_bw * in_flight, put_to.machine_bw / tasks_per_machine),
        )
        put_rounds = puts
        if d.machine_tasks and puts > 1:
            put_rounds = 2 + math.ceil(parts / d.parts_in_flight)
            put_bw = min(put_bw * d.parts_in_flight, put_to.machine_bw)
        io = put_rounds * sh_put_s + out_bytes / put_bw
        if d.one_stage:
            io, puts, out_bytes = 0.0, 0, 0.0
        gets = 0.0  # the shuffle's, this task's
        in_bytes = 0.0
        parse_s = 0.0
        request_cost = 0.0
        for dep in [] if d.one_stage else s.deps:
            u = fits[dep].stage
            um = maps[dep]
            rows = u.rows * grow
            if u.rows == 0 and d.ranges:
                # Its layouts say every bucket is empty: nothing is read.
                continue
            obj = u.bytes * grow / um  # one upstream map's file
            moto = obj / MB * shuffle.per_object_mb_s
            if dep in filtered[sid] and terms.filter_summaries:
                if d.machine_tasks:
                    # The summaries in the reports when small; a large one
                    # (TPC-H's Bloom filters: some hundred KB) fetched once
                    # per task, with the other reads: counted as fetched.
                    gets += um
                    continue
                # read_summaries (exec/join_filter.rs): for each build map in
                # turn, its marker, then its key summary's range.
                n = um * (marker_gets(dep) + 1)
                gets += n
                request_cost += n * (sh_get_s + moto)
                parse_s += um * files[dep].index_bytes * parse_per_byte
                continue
            # A build side past DataFusion's size for collecting it
            # (`hash_join_single_partition_threshold`) is planned as a
            # partitioned join at that scale: read here as a hash exchange.
            # (Its probe side's own exchange is not added.)
            broadcast = u.buckets == 1 and m > 1
            whole = u.buckets == 1 and not (
                broadcast and u.bytes * grow > COLLECT_LIMIT
            )
            if whole:
                # every map of it, by each task: a broadcast, or a gather
                # under a merge
                segs = um * max(1, -(-rows / um // SEGMENT_ROWS))
                share = u.bytes * grow
            else:
                ub = buckets[dep] if u.buckets > 1 else p
                segs = um * max(1, -(-rows / (um * ub) // SEGMENT_ROWS))
                share = u.bytes * grow / (ub if not d.machine_tasks else m)
            in_bytes += share
            if d.ranges:
                # One range per upstream task (a machine-sized slice's
                # buckets side by side, else the task's one bucket), cut at
                # REQUEST_CUT; or one per partition of the slice.
                least = cores if d.request_per_partition and not whole else 1
                # An empty range is not requested: of the (upstream map,
                # reader task) cells, those holding a row, the rows spread
                # evenly at random (all of them, past a few rows a cell).
                cells = um if whole else um * m
                held = 1 - (1 - 1 / cells) ** rows if cells > 1 else 1.0
                gets += um * max(least, math.ceil(share / um / REQUEST_CUT)) * held
                continue
            # shuffle_reader -> read_markers (exchange/locate.rs): each
            # upstream map's marker, awaited in turn before the first row;
            # then exchange/stream.rs: one ranged GET per segment, each
            # awaited before the next.
            markers = um * marker_gets(dep)
            gets += markers + segs
            request_cost += (markers + segs) * (sh_get_s + moto)
            parse_s += um * files[dep].index_bytes * parse_per_byte
        if d.ranges:
            # Concurrent: rounds of `in_flight` requests, the bytes at the
            # task's bandwidth.
            request_cost = math.ceil(gets / in_flight) * sh_get_s
        io += request_cost + in_bytes / shuffle_bw
        # The tables' bytes (their files whole: an upper bound, Parquet reads
        # the columns it needs), in as many ranged GETs per byte as were
        # counted on moto, spread over the stages of many maps by their work:
        # which stage holds a scan (a leaf, or a collected join's probe side
        # beside its readers) is not in the figures. A machine's task scans
        # its c partitions at once.
        table_gets = 0.0
        if s.maps > 1 and target.tables_on_store and scans_beta > 0:
            scan = table_bytes * target.scale * f.beta_ms / scans_beta / m
            table_gets = 2 + scan * target.table_gets_per_byte
            rounds = math.ceil(table_gets / cores) if d.machine_tasks else table_gets
            io += (
                rounds * (get_s + scan / MB * store.per_object_mb_s) + scan / bandwidth
            )
            totals["table_get"] += table_gets * m
            totals["given_up"] += table_gets * m * give_up
        if store is LOCAL:
            io = 0.0
            parse_s = 0.0
        # The driver's adaptive step for this stage: markers read one after
        # another (read_map_marker, each awaited) and parsed, in its loop.
        adapt_s[sid] = 0.0
        if terms.driver_markers and not d.ranges and store is not LOCAL:
            for dep, times in adaptive_reads(
                fits, sid, filtered[sid], at_partitions
            ).items():
                n = times * maps[dep]
                totals["driver_get"] += n * marker_gets(dep)
                per = marker_gets(dep) * shuffle.latency_s
                per += files[dep].index_bytes * parse_per_byte
                adapt_s[sid] += n * per
        totals["shuffle_get"] += gets * m * remote
        totals["disk_reads"] += gets * m * (1 - remote)
        totals["given_up"] += gets * m * sh_give_up
        totals["get"] += (gets * remote + table_gets) * m
        totals["put"] += puts * m
        totals["bytes"] += (in_bytes + out_bytes) * m
        totals["read_bytes"] += in_bytes * m
        totals["remote_bytes"] += in_bytes * m * remote
        totals["written_bytes"] += out_bytes * m
        totals["tasks"] += m
        totals["io"] += io * m
        totals["parse"] += parse_s * m
        out[sid] = [compute + io + parse_s] * m
    totals["root_maps"] = maps[min(fits)]
    root = fits[min(fits)]
    totals["root_bytes"] = root.stage.bytes * target.scale / root.scale
    totals["root_rows"] = root.stage.rows
    totals["root_segments"] = files[min(fits)].segments
    totals["root_marker_gets"] = marker_gets(min(fits))
    totals["adapt_s"] = sum(adapt_s.values())
    return out, totals, adapt_s


def predict(
    fits: dict[int, StageFit],
    final_read_ms: float,
    at_partitions: int,
    target: Target,
    costs: Costs,
    table_bytes: float = 0.0,
) -> dict[str, float]:
    """The wall time of a query at `target` (seconds), and its parts."""
    terms = target.terms
    deps = {sid: f.stage.deps for sid, f in fits.items()}
    task_ms = costs.dispatch_ms if target.task_ms is None else target.task_ms
    dispatch_s = task_ms / 1e3 if terms.driver_in_loop else 0.0

    def run(load: dict[int, float] | None) -> tuple:
        durations, totals, adapt = task_times(
            fits, at_partitions, target, table_bytes, load
        )
        if not terms.driver_in_loop:
            adapt = {}
        return (
            durations,
            totals,
            adapt,
            schedule(deps, durations, target.slots, adapt, dispatch_s),
        )

    durations, totals, _, replay = run(None)
    if terms.shared_prefix and target.store is not LOCAL:
        tasks = {sid: len(ds) for sid, ds in durations.items()}
        load = sharing(replay.spans, tasks, target.slots)
        durations, totals, _, replay = run(load)
    driver = (costs.driver_ms + costs.driver_per_stage_ms * len(fits)) / 1e3
    dispatch = totals["tasks"] * task_ms / 1e3
    # The head reads few rows in TPC-H (an aggregate, a top-k): its own time
    # is taken as measured, plus the root maps' requests: each map's marker
    # then its segments, the maps polled at once (or, in the first model,
    # two GETs a map one after another). By ranges: each root map's range.
    final = final_read_ms / 1e3
    shuffle = target.design.shuffle_store or target.store
    roots = totals["root_maps"]
    if target.store is not LOCAL and not target.design.one_stage:
        if target.design.ranges:
            # Each root map's range, none of an empty root.
            if totals["root_rows"] > 0:
                final += shuffle.latency_s
                totals["shuffle_get"] += roots
        elif terms.final_concurrent:
            chain = totals["root_marker_gets"] + totals["root_segments"]
            final += chain * shuffle.latency_s
            totals["shuffle_get"] += roots * chain
        else:
            final += 2 * roots * shuffle.latency_s
            totals["shuffle_get"] += 2 * roots
    totals["shuffle_get"] += totals["driver_get"]
    totals["get"] += totals["driver_get"]
    # The driver's lock on an S3 location (exchange/probe.rs): a LIST and a
    # conditional PUT of `_dfx-driver.lock` before any task, its DELETE
    # after the answer; three round trips of the query's own.
    design = target.design
    if target.store is not LOCAL and (design.shuffle_store is None or design.put_store):
        totals["put"] += 1
        final += 3 * target.store.latency_s
    if terms.driver_in_loop:
        wall = driver + replay.makespan + final
    else:
        # The adaptive reads one after another, beside the tasks' dispatch.
        wall = driver + max(replay.makespan, dispatch) + final + totals["adapt_s"]
    return {
        "wall": wall,
        "makespan": replay.makespan,
        "critical": critical_path(deps, durations),
        "work": sum(sum(ds) for ds in durations.values()) / target.slots,
        "driver": driver,
        "dispatch": dispatch,
        "final": final,
        **totals,
    }
