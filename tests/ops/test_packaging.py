"""Packaging and the container image.

The Dockerfile is checked by reading it (no Docker engine is needed): it lints
clean, runs ``fairpost run`` as a non-root user and asks ``fairpost health``.
The wheel is built from the working tree and installed, without any extra,
into a clean virtualenv: the SDK-only install that applications use, and the
same wheel the image installs (with the ``daemon`` extra).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

import fairpost

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
SDK_DEPENDENCIES = frozenset({"redis", "pydantic", "pydantic-settings", "email-validator", "idna"})
"""All an SDK-only install pulls in (pyproject's dependencies): the SDK stays small."""
WHEEL_MAX_BYTES = 2_000_000
"""The wheel holds code, Lua scripts and the demo's scenarios: nothing big."""
# Installed only with the daemon extra; an SDK-only install must not pull them.
DAEMON_ONLY_MODULES = ("aioboto3", "boto3", "hiredis", "prometheus_client", "rich")


def pyproject() -> dict[str, Any]:
    with (REPO / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)


def wheel_packages() -> list[str]:
    packages: list[str] = pyproject()["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    return packages


# The folders src/fairpost links to: installed as fairpost.config, ... (docs/design.md, "Layout").
PARTS = ("config", "dispatcher", "mailer")


# --- Reading the Dockerfile ---------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, USER, ...
    args: str  # the rest of the logical line, continuations joined
    stage: int  # index of the FROM it belongs to; -1 before the first FROM


def parse_dockerfile(text: str) -> list[Instruction]:
    """Split a Dockerfile into instructions, as Docker's parser does for the
    cases this repository uses: ``\\`` continuations, and comment lines both
    on their own and inside a continuation."""
    instructions: list[Instruction] = []
    stage = -1
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical = pending + line
        pending = ""
        keyword, _, args = logical.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        instructions.append(Instruction(keyword, args.strip(), stage))
    assert not pending, "the Dockerfile ends inside a line continuation"
    return instructions


def exec_form(args: str) -> list[str]:
    """The JSON (exec) form of CMD, ENTRYPOINT or HEALTHCHECK CMD; fails on shell form."""
    assert args.startswith("["), f"not in exec form (a shell would be PID 1 and eat SIGTERM): {args}"
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(item, str) for item in value), args
    return value


def env_pairs(args: str) -> dict[str, str]:
    """``ENV a=1 b=2`` (the only ENV form this repository uses)."""
    pairs: dict[str, str] = {}
    for word in shlex.split(args):
        name, sep, value = word.partition("=")
        assert sep, f"ENV without '=': {args}"
        pairs[name] = value
    return pairs


def final_stage(instructions: Sequence[Instruction]) -> list[Instruction]:
    last = max(instruction.stage for instruction in instructions)
    return [instruction for instruction in instructions if instruction.stage == last]


def base_images(instructions: Sequence[Instruction]) -> list[str]:
    """Every FROM's image, with global ARG defaults substituted and earlier
    stages (``FROM builder``) left out."""
    args: dict[str, str] = {}
    stages: set[str] = set()
    images: list[str] = []
    for instruction in instructions:
        if instruction.keyword == "ARG" and instruction.stage == -1:
            name, _, default = instruction.args.partition("=")
            args[name.strip()] = default.strip().strip('"')
        elif instruction.keyword == "FROM":
            words = [word for word in instruction.args.split() if not word.startswith("--")]
            image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], words[0])
            if len(words) == 3 and words[1].upper() == "AS":
                stages.add(words[2])
            if image not in stages:
                images.append(image)
    return images


@pytest.fixture(scope="module")
def dockerfile() -> list[Instruction]:
    return parse_dockerfile(DOCKERFILE.read_text())


def hadolint_binary() -> Path | None:
    beside_python = Path(sys.executable).with_name("hadolint")
    if beside_python.exists():
        return beside_python
    found = shutil.which("hadolint")
    return Path(found) if found else None


def test_hadolint_passes() -> None:
    binary = hadolint_binary()
    if binary is None:
        reason = "hadolint is not installed (it comes with the test extra: scripts/bootstrap.sh test)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    result = subprocess.run(
        [str(binary), "--no-color", str(DOCKERFILE)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"hadolint:\n{result.stdout}{result.stderr}"


def test_image_runs_as_a_non_root_user(dockerfile: list[Instruction]) -> None:
    users = [instruction.args for instruction in final_stage(dockerfile) if instruction.keyword == "USER"]
    assert users, "the final stage never sets USER, so it runs as root"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}
    assert user == "10001", "a fixed numeric uid lets Kubernetes' runAsNonRoot check it"


def test_image_runs_fairpost_run(dockerfile: list[Instruction]) -> None:
    stage = final_stage(dockerfile)
    entrypoint = [exec_form(i.args) for i in stage if i.keyword == "ENTRYPOINT"]
    cmd = [exec_form(i.args) for i in stage if i.keyword == "CMD"]
    assert entrypoint and cmd
    assert entrypoint[-1] + cmd[-1] == ["fairpost", "run"]


def test_image_healthcheck_and_port(dockerfile: list[Instruction]) -> None:
    stage = final_stage(dockerfile)
    healthchecks = [i.args for i in stage if i.keyword == "HEALTHCHECK"]
    assert healthchecks, "no HEALTHCHECK"
    options, _, command = healthchecks[-1].partition("CMD ")
    assert exec_form(command.strip()) == ["fairpost", "health"]
    for option in ("--interval=", "--timeout=", "--start-period="):
        assert option in options, f"HEALTHCHECK without {option}"

    env: dict[str, str] = {}
    for instruction in stage:
        if instruction.keyword == "ENV":
            env.update(env_pairs(instruction.args))
    exposed = [port for i in stage if i.keyword == "EXPOSE" for port in i.args.split()]
    assert env["FAIRPOST_HTTP_PORT"] in exposed
    assert env["PATH"].startswith("/opt/fairpost/bin:")


def test_stages_share_one_pinned_base_image(dockerfile: list[Instruction]) -> None:
    # The virtualenv copied out of the builder points at the builder's Python.
    images = base_images(dockerfile)
    assert len(images) >= 2 and len(set(images)) == 1, images
    name, _, tag = images[0].partition(":")
    assert name == "python"
    assert re.fullmatch(r"3\.11\.\d+-slim-\w+", tag), f"pin a full slim tag, not {tag!r}"


def test_docker_context_lets_in_what_the_build_needs() -> None:
    allowed = {
        line.strip().removeprefix("!").rstrip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip().startswith("!")
    }
    needed = {"pyproject.toml", "README.md", "src", *PARTS}
    assert needed <= allowed, f".dockerignore keeps out {sorted(needed - allowed)}"


# --- The wheel, installed without extras into a clean virtualenv --------------


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    workdir: Path  # an empty directory to run commands in, away from the sources

    def run(self, *command: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        env = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("FAIRPOST_", "PYTHON", "VIRTUAL_ENV"))
        }
        env.update(extra_env or {})
        return subprocess.run(command, cwd=self.workdir, env=env, capture_output=True, text=True, timeout=120)


def run_checked(command: Sequence[str], cwd: Path) -> None:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{shlex.join(command)} failed:\n{result.stdout}{result.stderr}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("packaging")
    dist, venv, workdir = root / "dist", root / "venv", root / "work"
    workdir.mkdir()
    run_checked([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(REPO)], cwd=root)
    (wheel,) = dist.glob("fairpost-*.whl")
    # No pip in the new venv: this environment's pip installs into it, which
    # saves bootstrapping one, and the venv sees no site-packages but its own.
    run_checked([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=root)
    run_checked(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--quiet",
            "--disable-pip-version-check",
            str(wheel),
        ],
        cwd=root,
    )
    return Installed(wheel=wheel, venv=venv, workdir=workdir)


slow = pytest.mark.slow
# Building and installing happen in the first of these tests to run.
install_timeout = pytest.mark.timeout(300)


@slow
@install_timeout
def test_wheel_is_small_and_needs_only_the_sdk_dependencies(installed: Installed) -> None:
    # What an install costs that is fairpost's to decide: the wheel's size and what it
    # pulls in without an extra (how long pip takes is the machine's and the network's).
    assert installed.wheel.stat().st_size < WHEEL_MAX_BYTES, installed.wheel.stat().st_size
    with zipfile.ZipFile(installed.wheel) as wheel:
        (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
        requires = Parser().parsestr(wheel.read(metadata).decode()).get_all("Requires-Dist") or []
    core = {r.name for r in map(Requirement, requires) if r.marker is None or "extra" not in str(r.marker)}
    assert core == SDK_DEPENDENCIES


@slow
@install_timeout
def test_wheel_holds_the_packages_and_their_scripts(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    assert wheel_packages() == ["src/fairpost"]
    assert "fairpost/__init__.py" in names
    for part in PARTS:
        assert f"fairpost/{part}/__init__.py" in names
        # Lua scripts live beside the modules that load them.
        for script in (REPO / part).rglob("*.lua"):
            installed_as = f"fairpost/{script.relative_to(REPO).as_posix()}"
            assert installed_as in names, f"{script.name} is missing from the wheel"
    assert not any(name.startswith(("tests/", "bench/", "src/", *(f"{p}/" for p in PARTS))) for name in names)


@slow
@install_timeout
def test_sdk_only_install_runs_fairpost(installed: Installed) -> None:
    result = installed.run(str(installed.venv / "bin" / "fairpost"), "--help")
    assert result.returncode == 0, result.stderr
    assert "usage: fairpost" in result.stdout

    probe = (
        "import importlib.util, json, fairpost; "
        f"daemon = [m for m in {DAEMON_ONLY_MODULES!r} if importlib.util.find_spec(m)]; "
        "print(json.dumps([fairpost.__file__, daemon]))"
    )
    result = installed.run(str(installed.venv / "bin" / "python"), "-c", probe)
    assert result.returncode == 0, result.stderr
    fairpost_file, daemon_modules = json.loads(result.stdout)
    assert Path(fairpost_file).is_relative_to(installed.venv), "fairpost was imported from the sources"
    assert daemon_modules == [], "the SDK-only install pulled in daemon dependencies"


@slow
@install_timeout
def test_the_wheel_is_the_version_fairpost_names(installed: Installed) -> None:
    # One source of truth (#38): the wheel's version is read from fairpost.__version__.
    assert installed.wheel.name.startswith(f"fairpost-{fairpost.__version__}-"), installed.wheel.name
    result = installed.run(str(installed.venv / "bin" / "fairpost"), "--version")
    assert (result.returncode, result.stdout) == (0, f"fairpost {fairpost.__version__}\n"), result.stderr


@slow
@install_timeout
def test_sdk_only_install_died_with_module_not_found_on_a_daemon_command(
    installed: Installed, redis_url: str
) -> None:
    fairpost = str(installed.venv / "bin" / "fairpost")
    for command, extra in ((["init-aws"], "daemon"), (["run"], "daemon"), (["demo"], "demo")):
        result = installed.run(fairpost, *command)
        assert result.returncode == 2, f"fairpost {command[0]}:\n{result.stdout}{result.stderr}"
        assert result.stderr.count("\n") == 1, result.stderr
        assert f"pip install 'fairpost[{extra}]'" in result.stderr
    # What needs only Redis works with the SDK alone.
    env = {"FAIRPOST_REDIS_URL": redis_url}
    send = ["send", "--tenant", "acme", "--from", "a@example.com", "--to", "b@example.org", "--subject", "s"]
    result = installed.run(fairpost, *send, "--text", "t", extra_env=env)
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip()
    for command in (
        ["status", job_id],
        ["stats"],
        ["quota", "show"],
        ["tenant", "pause", "acme"],
        ["dead", "list"],
    ):
        result = installed.run(fairpost, *command, extra_env=env)
        assert result.returncode == 0, f"fairpost {shlex.join(command)}:\n{result.stdout}{result.stderr}"


@slow
@install_timeout
@pytest.mark.parametrize("command", [["run", "--help"], ["health", "--help"]], ids=["run", "health"])
def test_container_commands_work_outside_docker(installed: Installed, command: list[str]) -> None:
    # The image's ENTRYPOINT/CMD and HEALTHCHECK; parsing their options must
    # not need the daemon extra.
    result = installed.run(str(installed.venv / "bin" / "fairpost"), *command)
    assert result.returncode == 0, f"fairpost {shlex.join(command)}:\n{result.stdout}{result.stderr}"
    if command[0] == "run":
        assert "--role" in result.stdout
