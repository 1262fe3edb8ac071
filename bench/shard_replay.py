"""What one busy Redis shard carries: the daemon's own commands, replayed.

The end-to-end figure (:func:`bench.scale_pipeline.redis_cpu_per_mail`)
divides a quiet redis-server's CPU by the mails of a one-replica drain. On
a small shared machine that charges each command a cache gone cold since
the last one and a round trip of its own, which a shard that is the
bottleneck does not pay: its clients' commands are waiting when it reads.
So the capacity is measured on the same work, busy:

1. ``MONITOR`` records, in the order Redis ran them, every command clients
   sent during a one-replica drain of ``mails`` mails of 20 tenants,
   enqueue through the SDK included (a script's own commands are not
   recorded: the script runs them again on replay).
2. A fresh redis-server, default configuration, with the same scripts
   loaded, runs the same commands in the same order, sent ``depth`` at a
   time on one connection, as a busy shard finds them waiting.
   Blocking and administrative commands (``BLPOP``, ``INFO``, ``CONFIG``,
   ``SCRIPT``, ...) are left out.
3. Redis CPU (``INFO cpu``) over the replay, per mail, and the mails per
   second one core carries at that cost; ``INFO commandstats`` shows
   where it goes. Each depth is replayed five times, each on a fresh server,
   and the replay of median CPU counts.
4. Straight after each replay, the same server runs ``redis-benchmark -t set
   -P 10`` and its CPU per ``SET`` is taken the same way: a mail's cost in
   SETs is a ratio the machine's speed cancels out of (the absolute rate
   moved fourfold between two VMs of the same kind). An operator divides the
   SETs a second ``redis-benchmark -t set -P 10`` reports on their own shard
   by it to know the mails a second that shard carries.

``python -m bench.shard_replay [--mails N] [--callgrind]`` runs it alone;
``--callgrind`` also counts the instructions Redis runs per mail on replay
(valgrind): exact and the same on a busy machine, for comparing versions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import redis

from bench.cluster import Backend, BenchError, services, world
from bench.figures import Figure
from bench.load import Load, wait_sent
from bench.redis_profile import script_sources
from fairpost.dispatcher.keys import ANCHOR, TOTAL_INFLIGHT
from fairpost.mailer.sdk.keys import MailKeys
from fairpost.mailer.testing.services import ManagedProcess, free_port, redis_server
from fairpost.mailer.testing.wait import wait_for

TENANTS = 20
UNBOUND = {"global_limits": "100000/second", "tenant_limits": "100000/second"}
DEPTHS = (1, 10, 100)
"""Commands sent at a time on replay: one (every command a round trip of its
own), ten, a hundred."""
JUDGED_DEPTH = 10
TARGET = 20_000
"""Mails a second one shard must carry: above the largest SES sending quotas."""
SETS_TARGET = 45
"""A mail's Redis CPU, in SETs of ``redis-benchmark -t set -P 10`` on the same
server, at most (#41: half the 94 of 2026-11-26)."""
REPLAYS = 5
"""Replays at each depth; the one of median CPU counts."""
SKIPPED = frozenset(
    {"BLPOP", "INFO", "CONFIG", "SCRIPT", "CLIENT", "PING", "SLOWLOG", "MONITOR", "HELLO", "ECHO", "SCAN"}
)

_ARG = re.compile(rb'"((?:[^"\\]|\\.)*)"')
_ESCAPES = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"a": b"\a", b"b": b"\b", b'"': b'"', b"\\": b"\\"}
_ESCAPE = re.compile(rb"\\(x[0-9a-fA-F]{2}|.)")


def _unescape(arg: bytes) -> bytes:
    """One argument as MONITOR quotes it (sdscatrepr), back to its bytes."""

    def one(m: re.Match[bytes]) -> bytes:
        code = m.group(1)
        if code[:1] == b"x" and len(code) == 3:
            return bytes([int(code[1:], 16)])
        return _ESCAPES.get(code, code)

    return _ESCAPE.sub(one, arg)


def parse_monitor_line(line: bytes) -> tuple[str, list[bytes]] | None:
    """``+1700000000.123456 [0 127.0.0.1:5000] "SET" "k" "v"`` -> (client, args);
    None for anything else (the ``+OK`` that starts the stream)."""
    parsed = _parse_timed(line)
    return None if parsed is None else parsed[1:]


def _parse_timed(line: bytes) -> tuple[float, str, list[bytes]] | None:
    """A MONITOR line as (its time, in seconds, client, args); None for anything else."""
    head, sep, rest = line.partition(b"] ")
    if not sep or b" [" not in head:
        return None
    words = head.split(b" ")
    client = words[-1].decode(errors="replace")
    return float(words[0].lstrip(b"+")), client, [_unescape(m.group(1)) for m in _ARG.finditer(rest)]


_HANDOFF_LEASE = 7
"""handoff.lua's ARGV: the anchor (:data:`ANCHOR`), then the claims' lease end
(ms; 0: not known), from this place (calls.ScriptCalls.handoff)."""


@functools.cache
def _handoff_shas() -> frozenset[bytes]:
    return frozenset(
        sha.encode() for sha, (name, _) in script_sources().items() if name == "dispatcher/handoff.lua"
    )


def lease_at(args: list[bytes]) -> int | None:
    """Where a hand-off's lease end is in its command (None: another command, or no
    lease end given). A hand-off within its claims' lease writes less: a replay
    long after the capture would take the other path for every one."""
    if len(args) < 3 or args[0].upper() != b"EVALSHA" or args[1] not in _handoff_shas():
        return None
    at = 3 + int(args[2]) + _HANDOFF_LEASE
    if args[at - 1] != ANCHOR.encode():
        raise BenchError("handoff.lua's arguments moved: bench.shard_replay's _HANDOFF_LEASE is out of date")
    return at if args[at] != b"0" else None


class Recorder:
    """MONITOR on its own connection, in a thread, until stopped."""

    def __init__(self, port: int) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port))
        self._sock.sendall(b"MONITOR\r\n")
        self.commands: list[list[bytes]] = []
        self._buffer = b""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="monitor", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        self._sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                chunk = self._sock.recv(1 << 20)
            except TimeoutError:
                continue
            if not chunk:
                return
            self._buffer += chunk
            *lines, self._buffer = self._buffer.split(b"\r\n")
            for line in lines:
                parsed = _parse_timed(line)
                # Commands a script runs are shown as from "lua": the replayed script runs them.
                if parsed and parsed[1] != "lua" and parsed[2]:
                    self.commands.append(relative_lease(parsed[0], parsed[2]))

    def mark(self, client: redis.Redis, text: str) -> None:
        """Send an ECHO until MONITOR shows it: every command Redis ran before it is
        recorded (MONITOR starts some time after it is asked for, and shows
        commands some time after they ran)."""

        def seen() -> bool:
            client.echo(text)
            return [b"ECHO", text.encode()] in self.commands

        wait_for(seen, within=30, what=f"MONITOR to show the ECHO {text!r}")

    def stop(self) -> list[list[bytes]]:
        """The commands recorded, each hand-off's lease end kept as the ms from its
        command (``@<ms>``): :func:`_run` makes it a time again when it replays it."""
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()
        return self.commands


async def capture(backend: Backend, mails: int) -> list[list[bytes]]:
    """The commands clients sent during a one-replica drain of ``mails`` mails."""
    with world(backend, "shard-replay", UNBOUND) as w:
        w.start_replicas(1)
        async with Load(w.settings) as load:
            for n in range(TENANTS):
                await load.burst(f"warm{n}", 5)
            if not await wait_sent(w.ses, 5 * TENANTS, within=60):
                raise RuntimeError("the warm-up mails were not sent")
            recorder = Recorder(backend.redis_port)
            client = redis.Redis(port=backend.redis_port)
            try:
                recorder.mark(client, "start")
                for n in range(TENANTS):
                    await load.burst(f"d{n}", mails // TENANTS)
                if not await wait_sent(w.ses, 5 * TENANTS + mails, within=300):
                    raise RuntimeError("the mails were not all sent")
                # SES has them; the replica records each as sent just after, and
                # frees its slot: none left in flight (one read a poll, replayed too).
                prefix = w.settings.key_prefix
                wait_for(lambda: _none_in_flight(client, prefix), within=60, what="every mail recorded")
                recorder.mark(client, "end")
            finally:
                client.close()
                commands = recorder.stop()
    return [c for c in commands if c[0].upper().decode(errors="replace") not in SKIPPED]


def relative_lease(at_s: float, args: list[bytes]) -> list[bytes]:
    lease = lease_at(args)
    if lease is not None:
        args[lease] = b"@%d" % (int(args[lease]) - round(at_s * 1000))
    return args


def absolute_lease(args: list[bytes]) -> list[bytes]:
    """A recorded hand-off's lease end as far from now as it was from the hand-off
    when recorded: the claims before it, replayed just before it, are as young."""
    lease = lease_at(args)
    if lease is None or args[lease][:1] != b"@":
        return args
    return [*args[:lease], b"%d" % (time.time() * 1000 + int(args[lease][1:])), *args[lease + 1 :]]


def _chunks(commands: list[list[bytes]], size: int) -> Iterator[list[list[bytes]]]:
    for start in range(0, len(commands), size):
        yield commands[start : start + size]


def _cpu(client: redis.Redis) -> float:
    info: dict[str, Any] = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _none_in_flight(client: redis.Redis, prefix: str) -> bool:
    return int(client.hget(MailKeys(prefix).counts(), TOTAL_INFLIGHT) or 0) == 0


def _sent(client: redis.Redis) -> int:
    """Job records in state sent: the replay did the drain's work if it finished its mails."""
    sent = 0
    for key in client.scan_iter(match="*:job:*", count=1000):
        sent += client.hget(key, "state") == b"sent"
    return sent


def _load_scripts(client: redis.Redis) -> None:
    for _, source in script_sources().values():
        client.script_load(source)


def _run(client: redis.Redis, commands: list[list[bytes]], depth: int) -> list[Exception]:
    """Send the commands ``depth`` at a time; the error replies."""
    errors: list[Exception] = []
    for chunk in _chunks(commands, depth):
        with client.pipeline(transaction=False) as pipe:
            for args in chunk:
                cast(Any, pipe).execute_command(*absolute_lease(args))
            replies = pipe.execute(raise_on_error=False)
        errors += [r for r in replies if isinstance(r, Exception)]
    return errors


def _check(client: redis.Redis, errors: list[Exception], mails: int) -> None:
    """Raise unless the replay did the drain's work: no error reply, and exactly
    the drain's mails finished as sent."""
    if errors:
        raise RuntimeError(f"{len(errors)} commands failed on replay, the first: {errors[0]}")
    if (sent := _sent(client)) != mails:
        raise RuntimeError(f"the replay finished {sent} mails as sent, not {mails}")


@dataclass
class Replay:
    cpu: float
    """Redis CPU seconds of the whole replay."""
    usec: dict[str, int]
    """Microseconds of each top-level command (INFO commandstats)."""
    set_cpu: float | None = None
    """Redis CPU seconds of one ``SET`` of :data:`REFERENCE`, on the same server
    straight after; ``None`` where redis-benchmark is not installed."""


def replay(commands: list[list[bytes]], depth: int, mails: int, *, reference: bool = False) -> Replay:
    """The Redis CPU the commands take on a fresh server, sent ``depth`` at a time
    (script loading not counted); with ``reference``, also the CPU of a SET
    there (:func:`set_cpu`). Raises as :func:`_check`."""
    with redis_server() as server:
        client = redis.Redis(port=server.port)
        try:
            _load_scripts(client)
            client.config_resetstat()
            before = _cpu(client)
            errors = _run(client, commands, depth)
            cpu = _cpu(client) - before
            stats: dict[str, Any] = client.info("commandstats")
            _check(client, errors, mails)
            one_set = set_cpu(client, server.port, SETS_PER_MAIL * mails) if reference else None
        finally:
            client.close()
    usec = {name[8:]: int(v["usec"]) for name, v in stats.items() if not name.startswith("cmdstat_info")}
    return Replay(cpu, usec, one_set)


REFERENCE = ("-t", "set", "-P", "10", "-q")
"""The reference load: redis-benchmark's SETs, ten at a time on each of its 50
connections, as an operator would run it on a shard of their own."""
SETS_PER_MAIL = 100
"""SETs of the reference load a mail of the replay: about as much Redis CPU as
the replay itself, so that a moment of the machine's own work weighs alike."""


def set_cpu(client: redis.Redis, port: int, sets: int) -> float | None:
    """Redis CPU seconds per SET of ``sets`` of :data:`REFERENCE` on the server at ``port``."""
    benchmark = shutil.which("redis-benchmark")
    if benchmark is None:
        return None
    before = _cpu(client)
    subprocess.run(
        [benchmark, "-h", "127.0.0.1", "-p", str(port), "-n", str(sets), *REFERENCE],
        check=True, stdout=subprocess.DEVNULL, timeout=600,
    )  # fmt: skip
    return (_cpu(client) - before) / sets


def instructions(commands: list[list[bytes]], mails: int, depth: int = JUDGED_DEPTH) -> float:
    """Instructions a fresh redis-server runs per mail on replay, counted by
    valgrind's callgrind: the same count whatever else the machine does, for
    comparing two versions of the scripts (start-up, script loading and the
    check that the mails were sent included, a few percent of a 2,000-mail
    replay)."""
    with callgrind_replay(commands, mails, depth) as out:
        found = re.search(r"^summary: (\d+)", out.read_text(), re.MULTILINE)
        if found is None:
            raise BenchError(f"callgrind wrote no summary to {out}")
    return int(found.group(1)) / mails


@contextlib.contextmanager
def callgrind_replay(
    commands: list[list[bytes]], mails: int, depth: int = JUDGED_DEPTH, options: Sequence[str] = ()
) -> Iterator[Path]:
    """Replays the commands on a fresh redis-server under callgrind (valgrind's
    ``options`` added) and yields its output file, once the server has ended;
    files callgrind dumps on the way (``--dump-after``) are beside it, named
    after it with ``.1``, ``.2``, ... Raises as :func:`_check`."""
    valgrind, server = shutil.which("valgrind"), shutil.which("redis-server")
    if valgrind is None or server is None:
        raise BenchError("--callgrind needs valgrind and redis-server (Debian: apt-get install valgrind)")
    with tempfile.TemporaryDirectory(prefix="fairpost-callgrind-") as tmp:
        out, port = Path(tmp) / "callgrind.out", free_port()
        argv = [valgrind, "--tool=callgrind", f"--callgrind-out-file={out}", *options]
        argv += [server, "--port", str(port)]
        # hz 1: the server's timer work grows with how long the replay takes (slower
        # under load); at one round a second it is a fraction of a percent of the count.
        argv += ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", tmp, "--hz", "1"]
        proc = ManagedProcess("redis-server under callgrind", argv, Path(tmp) / "redis.log")
        client = redis.Redis(port=port)
        try:
            proc.wait_started(lambda: _pings(client))
            _load_scripts(client)
            _check(client, _run(client, commands, depth), mails)
            with contextlib.suppress(redis.ConnectionError):
                client.shutdown(nosave=True)
            proc.process.wait(timeout=60)
        finally:
            client.close()
            proc.stop()
        yield out


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


async def measure(backend: Backend, mails: int) -> list[Figure]:
    return figures(await capture(backend, mails), mails)


def _median_replay(
    commands: list[list[bytes]], depth: int, mails: int, times: int
) -> tuple[Replay, float | None]:
    """The replay of median CPU of ``times`` (each on a fresh server): one replay
    of a 2,000-mail drain is a tenth of a second of Redis CPU, which a moment of
    the machine's own work moves by a fifth. At the judged depth, also the median
    of each replay's mail in SETs (each taken on its own server, at its moment)."""
    reference = depth == JUDGED_DEPTH
    runs = [replay(commands, depth, mails, reference=reference) for _ in range(times)]
    in_sets = sorted(r.cpu / mails / r.set_cpu for r in runs if r.set_cpu)
    runs.sort(key=lambda run: run.cpu)
    return runs[len(runs) // 2], in_sets[len(in_sets) // 2] if in_sets else None


def figures(commands: list[list[bytes]], mails: int) -> list[Figure]:
    medians = {depth: _median_replay(commands, depth, mails, REPLAYS) for depth in DEPTHS}
    runs = {depth: run for depth, (run, _) in medians.items()}
    per_mail = {depth: run.cpu / mails for depth, run in runs.items()}
    cpu, usec = runs[JUDGED_DEPTH].cpu, runs[JUDGED_DEPTH].usec
    in_sets = medians[JUDGED_DEPTH][1]
    top = sorted(usec.items(), key=lambda kv: -kv[1])[:5]
    where = ", ".join(f"{name} {v / mails:.0f}" for name, v in top)
    depths = "; ".join(f"{d} at a time: {per_mail[d] * 1e6:.0f} µs, {1 / per_mail[d]:,.0f}/s" for d in DEPTHS)
    judged = per_mail[JUDGED_DEPTH]
    sets = ""
    if in_sets is not None:
        sets = (
            f"; a mail costs the Redis CPU of {in_sets:.0f} SETs of `redis-benchmark {' '.join(REFERENCE)}` "
            f"on the same server: a shard carries {TARGET:,} mails/s where that reports "
            f"{TARGET * in_sets:,.0f} SETs/s or more"
        )
    reference = Figure(
        key="scale_mail_in_sets",
        title="Scale: Redis CPU per mail, in redis-benchmark SETs",
        value=in_sets,
        op="<=",
        target=SETS_TARGET,
        detail=(
            f"each of the {REPLAYS} replays {JUDGED_DEPTH} at a time against `redis-benchmark "
            f"{' '.join(REFERENCE)}` on the same server straight after, the median; this "
            f"machine: about {in_sets / judged:,.0f} SETs/s of one core"
            if in_sets is not None
            else "redis-benchmark (Debian: redis-tools) is not installed"
        ),
    )
    return [
        Figure(
            key="scale_shard_cpu_per_mail",
            title="Scale: Redis CPU per mail on a busy shard (the drain's commands replayed)",
            value=judged * 1e6,
            unit=" µs",
            detail=(
                f"{len(commands)} commands of a {mails}-mail drain of {TENANTS} tenants (1 replica, "
                f"enqueue included), replayed in order on a fresh redis-server, {JUDGED_DEPTH} at a "
                f"time (the median of {REPLAYS} replays): {cpu * 1000:.0f} ms of Redis CPU (INFO cpu); "
                f"µs per mail by command "
                f"(commandstats, script commands counted twice): {where}; {depths}"
            ),
            data={"commands": len(commands), "mails": mails, "per_mail_by_depth": per_mail, "usec": usec},
        ),
        Figure(
            key="scale_mails_per_shard",
            title="Scale: mails per second one Redis shard can carry",
            value=1 / judged if judged > 0 else float("inf"),
            unit="/s",
            op=">=",
            target=TARGET,
            detail=(
                f"one core's second of Redis CPU over {judged * 1e6:.1f} µs a mail, the drain's commands "
                f"arriving {JUDGED_DEPTH} at a time; {depths}{sets}"
            ),
        ),
        reference,
    ]


def main() -> None:
    description = __doc__.split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="python -m bench.shard_replay", description=description)
    parser.add_argument("--mails", type=int, default=2000)
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="also count the instructions Redis runs per mail on replay (valgrind; slow, exact)",
    )
    args = parser.parse_args()
    with services("fairpost-shard-") as backend:
        commands = asyncio.run(capture(backend, args.mails))
    for figure in figures(commands, args.mails):
        print(f"{figure.title}: {figure.value_text()} ({figure.verdict}) {figure.detail}")
    if args.callgrind:
        per_mail = instructions(commands, args.mails)
        print(f"Instructions Redis ran per mail on replay (callgrind): {per_mail:,.0f}")


if __name__ == "__main__":
    main()
