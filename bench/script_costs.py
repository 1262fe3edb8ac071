"""Where Redis's instructions go on the budget's workload: ``python -m bench.script_costs``.

bench/budget.py counts the commands and script calls of its fixed workload
(2,000 mails of 20 tenants) and, with ``--callgrind``, the instructions Redis
runs on their replay. This splits that count two ways, each exact (callgrind
counts instructions, not seconds: a busy machine gives the same figures):

- *by script*: the replay runs under callgrind with a dump after each
  ``EVALSHA``, and each dump is the script's that it follows (with the commands
  sent on their own just before it, a few percent), and a dump after each
  ``SCRIPT LOAD`` puts the server's start and the scripts' loading apart;
- *by kind of work*: of one replay without dumps, the instructions inside
  Redis's own functions: the commands scripts run (``scriptCall``), Lua's
  interpreter with the replies made Lua values (``lua_pcall`` less those), a
  call's KEYS and ARGV made Lua strings (``luaCallFunction`` less
  ``lua_pcall``), and the rest: reading and parsing what clients send,
  replies, commands sent on their own, start-up and script loading.

It needs valgrind (with its ``callgrind_annotate``) and Debian's
redis-server, whose symbols name those functions (Redis 7.0 and later).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench.budget import MAILS, budget_settings, capture, use_services
from bench.cluster import BenchError, services
from bench.redis_profile import script_names, script_sources
from bench.shard_replay import callgrind_replay
from fairpost.mailer.testing.ses_server import SesServer

KINDS = (
    ("the commands scripts run", "scriptCall", None),
    ("Lua's interpreter, replies made Lua values included", "lua_pcall", "scriptCall"),
    ("KEYS and ARGV made Lua strings", "luaCallFunction", "lua_pcall"),
    ("the rest: reading, parsing, replies, commands of their own", None, "luaCallFunction"),
)
"""Each kind of work: its name, the function whose inclusive count it is (None:
the program's), less that of another (None: nothing)."""

_SUMMARY = re.compile(r"^(?:summary|totals): (\d+)", re.MULTILINE)
_INCLUSIVE = re.compile(r"^\s*([\d,]+) \([ \d.]+%\)\s+\S*?:([A-Za-z_]\w*) \[", re.MULTILINE)
_TOTAL = re.compile(r"^\s*([\d,]+) \([ \d.]+%\)\s+PROGRAM TOTALS", re.MULTILINE)


def dump_total(path: Path) -> int:
    """The instructions of one callgrind output file (its summary line)."""
    found = _SUMMARY.search(path.read_text())
    if found is None:
        raise BenchError(f"callgrind wrote no summary to {path}")
    return int(found.group(1))


START = "the start of the server and the loading of the scripts"


def by_script(
    commands: Sequence[Sequence[bytes]], dumps: Sequence[int], names: Mapping[str, str], loads: int
) -> dict[str, int]:
    """Instructions per script, :data:`START` first, from the dumps of a replay
    with one after each ``SCRIPT`` and ``EVALSHA`` command: ``dumps[i]`` is the
    count since the dump before. The first ``loads`` are the replay's own
    loading of the scripts; each later one is the command's it follows (a
    ``SCRIPT`` command's too: with the start)."""
    owners = [START] * loads
    for command in commands:
        name = command[0].upper()
        if name == b"SCRIPT":
            owners.append(START)
        elif name == b"EVALSHA":
            owners.append(names.get(command[1].decode(), "a script unknown"))
    if len(owners) != len(dumps):
        raise BenchError(f"{len(dumps)} dumps for {len(owners)} script calls and loads")
    totals: collections.Counter[str] = collections.Counter()
    for owner, count in zip(owners, dumps, strict=True):
        totals[owner] += count
    return {START: totals.pop(START, 0), **dict(totals.most_common())}


def by_kind(annotated: str) -> dict[str, int]:
    """Instructions per kind of work (:data:`KINDS`), from ``callgrind_annotate
    --inclusive=yes`` of a whole replay."""
    inclusive: dict[str, int] = {}
    for count, function in _INCLUSIVE.findall(annotated):
        inclusive.setdefault(function, int(count.replace(",", "")))
    total = _TOTAL.search(annotated)
    if total is None:
        raise BenchError("callgrind_annotate printed no program total")
    inclusive[""] = int(total.group(1).replace(",", ""))
    missing = {f for _, of, less in KINDS for f in (of, less) if f and f not in inclusive}
    if missing:
        names = ", ".join(sorted(missing))
        raise BenchError(f"no {names} in the profile: a redis-server without its symbols?")
    return {name: inclusive[of or ""] - (inclusive[less] if less else 0) for name, of, less in KINDS}


DUMPED = ("--dump-after=scriptCommand", "--dump-after=evalShaCommand")
"""valgrind's options for :func:`by_script`: a dump after each ``SCRIPT`` and
``EVALSHA`` command."""


def dump_totals(out: Path) -> tuple[list[int], int]:
    """The counts of the dumps callgrind wrote beside its output file ``out``, in
    order, and that of ``out`` itself (what ran after the last dump)."""
    numbered = sorted(out.parent.glob(f"{out.name}.*"), key=lambda p: int(p.suffix[1:]))
    return [dump_total(p) for p in numbered], dump_total(out)


def annotate(out: Path) -> str:
    """``callgrind_annotate --inclusive=yes`` of a callgrind output file, every function."""
    return subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(out)],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip


def main() -> None:
    description = __doc__.split("\n\n")[0]
    argparse.ArgumentParser(prog="python -m bench.script_costs", description=description).parse_args()
    if shutil.which("callgrind_annotate") is None:
        raise BenchError("bench.script_costs needs callgrind_annotate (Debian: apt-get install valgrind)")
    with services("fairpost-costs-") as backend, SesServer() as ses:
        use_services(backend, ses)
        commands = asyncio.run(capture(budget_settings(backend.redis_url()), backend.redis_port))
    with callgrind_replay(commands, MAILS) as out:
        annotated = annotate(out)
    with callgrind_replay(commands, MAILS, options=DUMPED) as out:
        dumps, rest = dump_totals(out)

    kinds = by_kind(annotated)
    in_all = sum(kinds.values()) / MAILS
    print(f"Instructions Redis ran a mail on replay of {MAILS} mails, {in_all:,.0f} in all:")
    for name, count in kinds.items():
        print(f"  {name:58} {count / MAILS:9,.0f}")
    print("... by script (each with the commands sent on their own just before it):")
    for name, count in by_script(commands, dumps, script_names(), len(script_sources())).items():
        print(f"  {name:58} {count / MAILS:9,.0f}")
    print(f"  {'after the last script call (the check that the mails were sent)':58} {rest / MAILS:9,.0f}")


if __name__ == "__main__":
    main()
