"""The live progress line of ``run_distributed``: on a terminal, not elsewhere.

A real terminal is a tmux pane running a small script; the query is kept
running a few seconds by a Python function that sleeps in each task.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

if TYPE_CHECKING:
    import pathlib
    from collections.abc import Callable, Iterator

LINE_MARK = " running, "
"""Words only the live line holds (``tasks 2 running, 5/12 done``)."""

PATIENCE = 90.0
"""Seconds a wait for the pane may take: a bound against a hang."""

SCRIPT = textwrap.dedent(
    """
    import sys
    import time

    import pyarrow as pa
    from datafusion import udf

    from dfx_engine.driver import run_distributed
    from dfx_engine.session import SessionSpec


    def slow(values):
        time.sleep(1.0)
        return values


    table, shuffle, progress = sys.argv[1:]
    spec = SessionSpec(tables={"t": table}, shuffle_dir=shuffle, target_partitions=4)
    slow_id = udf(slow, [pa.int64()], pa.int64(), "immutable", name="slow_id")
    result = run_distributed(
        "SELECT sum(slow_id(k)) AS s FROM t",
        spec,
        [slow_id],
        max_workers=2,
        progress=progress == "on",
    )
    print("answer", result.batches[0].column(0)[0].as_py())
    """
)
"""Four tasks of a second each on two workers: the line has time to show."""

ANSWER = "answer 28"
"""The sum of ``k`` over the table: 0 to 7."""


class Tmux:
    """A detached session on a private tmux server, ended by :meth:`close`."""

    def __init__(self, name: str) -> None:
        """A private server named ``name``, not started yet."""
        if shutil.which("tmux") is None:
            pytest.fail("tmux is not installed; this test drives a real terminal")
        self.base = ["tmux", "-f", "/dev/null", "-L", name]
        self.scratch = tempfile.TemporaryDirectory()
        self.status_file = Path(self.scratch.name) / "exit-status"

    def run(self, *args: str) -> str:
        """``tmux args`` on this server; its stdout."""
        done = subprocess.run(
            [*self.base, *args], capture_output=True, text=True, check=True
        )
        return done.stdout

    def start(self, command: str) -> None:
        """Run ``command`` (``sh``) in a 160 x 20 pane kept after it exits.

        The pane's shell writes the command's exit status to a file: some
        tmux servers never reap their pane's process, so they never learn it.
        """
        status = shlex.quote(str(self.status_file))
        wrapped = f"{command}\necho $? > {status}.part && mv {status}.part {status}"
        self.run(
            *("new-session", "-d", "-s", "dfx", "-x", "160", "-y", "20", wrapped),
            *(";", "set-option", "-t", "dfx", "remain-on-exit", "on"),
        )

    def capture(self) -> str:
        """The pane's text, its scrollback included."""
        return self.run("capture-pane", "-p", "-J", "-S", "-", "-t", "dfx")

    def exit_status(self) -> int | None:
        """The pane program's exit status, ``None`` while it runs."""
        try:
            status = self.status_file.read_text().strip()
        except FileNotFoundError:
            return None
        return int(status)

    def wait_for(self, what: str, done: Callable[[str], bool]) -> str:
        """The pane once ``done`` holds for it; fails with the pane if never."""
        deadline = time.monotonic() + PATIENCE
        while True:
            pane = self.capture()
            if done(pane):
                return pane
            if time.monotonic() > deadline:
                pytest.fail(f"waited {PATIENCE}s for {what}; the pane shows:\n{pane}")
            time.sleep(0.05)

    def wait_for_exit(self) -> int:
        """The pane program's exit status once it exits."""
        self.wait_for("the program's exit", lambda _: self.exit_status() is not None)
        status = self.exit_status()
        assert status is not None
        return status

    def close(self) -> None:
        """End the server."""
        subprocess.run([*self.base, "kill-server"], capture_output=True, check=False)
        self.scratch.cleanup()


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    """A private tmux server for one test."""
    server = Tmux(f"dfx-py-{os.getpid()}-{time.monotonic_ns()}")
    yield server
    server.close()


@pytest.fixture
def numbers(tmp_path: pathlib.Path) -> pathlib.Path:
    """Four Parquet files of two rows: ``k`` 0 to 7."""
    directory = tmp_path / "t"
    directory.mkdir()
    for file in range(4):
        keys = pa.array([2 * file, 2 * file + 1], pa.int64())
        pq.write_table(pa.table({"k": keys}), directory / f"part-{file}.parquet")
    return directory


def script_command(
    tmp_path: pathlib.Path, numbers: pathlib.Path, name: str, progress: str
) -> list[str]:
    """The words running :data:`SCRIPT` over ``numbers``."""
    script = tmp_path / "query.py"
    script.write_text(SCRIPT)
    shuffle = tmp_path / f"shuffle-{name}"
    return [sys.executable, str(script), str(numbers), str(shuffle), progress]


def run_in_pane(
    tmux: Tmux, words: list[str], out: pathlib.Path, log: pathlib.Path
) -> None:
    """Start ``words`` in the pane, stdout to ``out``, every byte logged."""
    gate = f"gate-{os.getpid()}"
    client = " ".join(shlex.quote(word) for word in tmux.base)
    command = " ".join(shlex.quote(word) for word in words)
    tmux.start(f"{client} wait-for {gate}; {command} > {shlex.quote(str(out))}")
    tmux.run("pipe-pane", "-o", "-t", "dfx", f"cat >> {shlex.quote(str(log))}")
    tmux.run("wait-for", "-S", gate)


def counts(line: str, after: str) -> list[int]:
    """The ``a/b`` (or lone) count after ``after`` in ``line``."""
    found = re.search(re.escape(after) + r"(\d+(?:/\d+)?)", line)
    assert found, f"{after!r} and a count in {line!r}"
    return [int(n) for n in found.group(1).split("/")]


def test_a_long_query_shows_the_live_line_on_a_terminal(
    tmux: Tmux, tmp_path: pathlib.Path, numbers: pathlib.Path
) -> None:
    out, log = tmp_path / "answer.txt", tmp_path / "pane.log"
    run_in_pane(tmux, script_command(tmp_path, numbers, "tty", "on"), out, log)

    pane = tmux.wait_for("the live line", lambda pane: LINE_MARK in pane)
    line = next(line for line in pane.splitlines() if LINE_MARK in line)
    done, stages = counts(line, "stages ")
    assert stages >= 1, line
    assert done < stages, line
    (running,) = counts(line, "tasks ")
    tasks_done, tasks = counts(line, LINE_MARK)
    assert running >= 1, line
    assert tasks_done < tasks, line
    for part in (" published", " retries", "[00:00:0"):
        assert part in line, line
    assert tmux.exit_status() is None, pane

    assert tmux.wait_for_exit() == 0, tmux.capture()
    assert out.read_text().strip() == ANSWER
    # Drawn in place with carriage returns, then erased: the screen left
    # holds none of it.
    drawn = log.read_bytes().decode(errors="replace")
    assert "\r" in drawn, drawn
    assert LINE_MARK in drawn, drawn
    assert LINE_MARK not in tmux.capture(), tmux.capture()


def test_no_line_with_progress_off_or_without_a_terminal(
    tmux: Tmux, tmp_path: pathlib.Path, numbers: pathlib.Path
) -> None:
    # On a terminal, turned off: as long a run, nothing of the line.
    out, log = tmp_path / "answer.txt", tmp_path / "pane.log"
    run_in_pane(tmux, script_command(tmp_path, numbers, "off", "off"), out, log)
    assert tmux.wait_for_exit() == 0, tmux.capture()
    assert out.read_text().strip() == ANSWER
    assert LINE_MARK not in log.read_bytes().decode(errors="replace")

    # Through a pipe, on by default: the answer, and no line.
    started = time.monotonic()
    piped = subprocess.run(
        script_command(tmp_path, numbers, "pipe", "on"),
        capture_output=True,
        text=True,
        check=False,
    )
    assert piped.returncode == 0, piped.stderr
    assert time.monotonic() - started > 2, "as long a run as on the terminal"
    assert piped.stdout.strip() == ANSWER
    assert LINE_MARK not in piped.stderr, piped.stderr
    assert "\r" not in piped.stderr, piped.stderr
