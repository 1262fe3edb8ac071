"""Servers started for the tests, the demo and the benchmarks end with the process that
started them, even when it is SIGKILLed and has no chance to stop them (Linux only)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fairpost.mailer.testing.localstack import localstack_venv
from fairpost.mailer.testing.services import die_with_parent
from fairpost.mailer.testing.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
# Read at import: the autouse fixture that drops FAIRPOST_* would make the parent install its own.
LOCALSTACK_VENV = str(localstack_venv())

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="a parent-death signal is Linux's"
)

# The throwaway parent: starts one server as the fixtures do, says so, then waits to be killed.
PARENT = """
import sys, time
from contextlib import ExitStack
from pathlib import Path

kind, workdir = sys.argv[1], Path(sys.argv[2])
with ExitStack() as stack:
    if kind == "redis":
        from fairpost.mailer.testing.services import start_redis
        start_redis(workdir)
    else:
        from fairpost.mailer.testing.localstack import localstack_server
        stack.enter_context(localstack_server())
    print("ready", flush=True)
    time.sleep(600)
"""


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command (state, ppid, pgrp...), or None if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def _processes() -> dict[int, list[str]]:
    """Every live process (not a zombie: nothing here may reap an orphan) and its stat fields."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None and fields[0] != "Z":
            found[int(entry.name)] = fields
    return found


def _in_groups(groups: set[int]) -> set[int]:
    return {pid for pid, fields in _processes().items() if int(fields[2]) in groups}


@pytest.mark.parametrize(
    "kind", ["redis", pytest.param("localstack", marks=[pytest.mark.localstack, pytest.mark.slow])]
)
def test_a_server_ends_with_its_sigkilled_parent(kind: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "FAIRPOST_LOCALSTACK_VENV": LOCALSTACK_VENV,
    }
    groups: set[int] = set()
    with subprocess.Popen(
        [sys.executable, "-c", PARENT, kind, str(tmp_path)], env=env, stdout=subprocess.PIPE, cwd=tmp_path
    ) as parent:
        try:
            assert parent.stdout is not None
            assert parent.stdout.readline() == b"ready\n", "the parent could not start its server"
            # The servers run in sessions of their own: each child's group is all it started.
            groups = {pid for pid, fields in _processes().items() if int(fields[1]) == parent.pid}
            assert groups, "the parent has no child"
            parent.kill()
            parent.wait(timeout=10)
            wait_for(
                lambda: not _in_groups(groups), within=60, what=f"the {kind} server to end with its parent"
            )
        finally:
            parent.kill()
            for pid in _in_groups(groups):
                os.kill(pid, signal.SIGKILL)


def test_a_child_started_from_a_thread_outlives_the_thread() -> None:
    # Linux sends the parent-death signal when the *thread* that forked the child
    # ends. The failover tests restart a killed redis-server from a worker
    # thread; with the signal armed it died with that thread, and the failover
    # never finished (tests/e2e/test_failover.py).
    started: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        started.append(subprocess.Popen(["sleep", "60"], preexec_fn=die_with_parent()))

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    [child] = started
    try:
        # The signal, had it been armed, comes as the thread ends: give it time to land.
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=2)
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()
