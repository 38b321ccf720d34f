"""The measured figures: the file `measure` writes, and the queries and
stages the model reads of it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

TABLES = (
    "customer",
    "lineitem",
    "nation",
    "orders",
    "part",
    "partsupp",
    "region",
    "supplier",
)


QUERIES = [f"q{n}" for n in range(1, 23)]


REPO = Path(__file__).resolve().parent.parent.parent


DEFAULT_FILE = REPO / "scripts" / "scaling-measurements.json"


def write(path: Path, figures: dict) -> None:
    """One line per run, so the file stays small and diffs run by run."""
    lines = [json.dumps({k: v for k, v in figures.items() if k != "sets"})]
    for label, meta in sorted(figures.get("sets", {}).items()):
        head = {k: v for k, v in meta.items() if k != "runs"}
        lines.append(json.dumps({"set": label, **head}, sort_keys=True))
        lines += [json.dumps({"set": label, "run": r}) for r in meta["runs"]]
    path.write_text("\n".join(lines) + "\n")


def read(path: Path) -> dict:
    """The figures `write` wrote."""
    lines = path.read_text().splitlines()
    figures = {**json.loads(lines[0]), "sets": {}}
    for line in lines[1:]:
        item = json.loads(line)
        label = item.pop("set")
        if "run" in item:
            figures["sets"][label]["runs"].append(item["run"])
        else:
            figures["sets"][label] = {**item, "runs": []}
    return figures


@dataclass
class Stage:
    """One stage of one query as measured."""

    id: int
    maps: int
    buckets: int
    deps: list[int]
    task_ms: list[float]  # each map's task, as the driver timed it
    bytes: float  # published, all maps
    rows: float  # published, all maps


@dataclass
class Profile:
    """One query in one set of runs: its stages and clocks."""

    query: str
    stages: dict[int, Stage]
    wall_ms: float  # `dfx run`'s own clock, start to answer, fastest run
    final_read_ms: float
    runs: int
    walls: list[float] = field(default_factory=list)


def profiles(figures: dict, label: str) -> dict[str, Profile]:
    """The queries of set `label`, each from its fastest run: other work on
    the machine only ever adds time, so the fastest run is the least
    disturbed one, and its stages and wall time are taken together."""
    by_query: dict[str, list[dict]] = {}
    for run in figures["sets"][label]["runs"]:
        by_query.setdefault(run["query"], []).append(run["analyze"])
    out = {}
    for query, docs in by_query.items():
        doc = min(docs, key=lambda d: d["wall_ms"])
        stages = {
            s["stage_id"]: Stage(
                id=s["stage_id"],
                maps=s["maps"],
                buckets=s["buckets"],
                deps=list(s["deps"]),
                task_ms=[t["wall_ms"] for t in s["tasks"]],
                bytes=sum(t["bytes"] or 0 for t in s["tasks"]),
                rows=sum(t["rows"] for t in s["tasks"]),
            )
            for s in doc["stages"]
        }
        out[query] = Profile(
            query=query,
            stages=stages,
            wall_ms=doc["wall_ms"],
            final_read_ms=doc["final_read_ms"],
            runs=len(docs),
            walls=sorted(d["wall_ms"] for d in docs),
        )
    return out


def query_table_bytes(query: str, sizes: dict[str, int]) -> float:
    """The bytes of every table `query` names (its files whole)."""
    sql = (REPO / "host" / "queries" / f"{query}.sql").read_text().lower()
    for sep in ",()":
        sql = sql.replace(sep, " ")
    words = set(sql.split())
    return float(sum(size for table, size in sizes.items() if table in words))
