"""fairpost installs beside any application (issue #25).

Everything the wheel installs lives under ``fairpost``: an application whose own
code has a ``config`` package and a ``dispatcher`` module (cookiecutter-django's
layout), in a virtualenv that also holds PyPI's ``config`` distribution, imports
the SDK as the README shows it, enqueues a mail, and runs the console script
until the daemon has sent that mail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from fairpost import MailClient
from fairpost.config import load_settings
from fairpost.mailer.testing.wait import wait_for

REPO = Path(__file__).resolve().parents[2]
PREFIX = "beside"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@dataclass(frozen=True)
class App:
    """A fresh virtualenv with fairpost[daemon] and PyPI's ``config``, and the
    application's own directory (its ``config`` package and ``dispatcher.py``)."""

    wheel: Path
    venv: Path
    workdir: Path

    def env(self, extra: dict[str, str]) -> dict[str, str]:
        env = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("FAIRPOST_", "PYTHON", "VIRTUAL_ENV"))
        }
        # The application's own code is importable, as it is in its process.
        env["PYTHONPATH"] = str(self.workdir)
        return {**env, **extra}

    def run(self, *command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            command, cwd=self.workdir, env=self.env(env), capture_output=True, text=True, timeout=120
        )

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)


def checked(command: list[str], cwd: Path) -> None:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{command} failed:\n{result.stdout}{result.stderr}"


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> App:
    root = tmp_path_factory.mktemp("beside")
    dist, venv, workdir = root / "dist", root / "venv", root / "app"
    checked([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(REPO)], cwd=root)
    (wheel,) = dist.glob("fairpost-*.whl")
    checked([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=root)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet"]
    # PyPI's `config` first, as an application's dependencies would have it.
    checked([*pip, "--disable-pip-version-check", "config", f"{wheel}[daemon]"], cwd=root)
    (workdir / "config").mkdir(parents=True)
    (workdir / "config" / "__init__.py").write_text("DEBUG = True\n")
    (workdir / "dispatcher.py").write_text("ROUTES: dict[str, str] = {}\n")
    return App(wheel=wheel, venv=venv, workdir=workdir)


def test_the_wheel_installs_one_top_level_name(app: App) -> None:
    names = zipfile.ZipFile(app.wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"fairpost"}
    for part in ("config", "dispatcher", "mailer"):
        assert f"fairpost/{part}/__init__.py" in names


def test_the_applications_own_config_and_dispatcher_stay_its_own(app: App) -> None:
    probe = textwrap.dedent("""
        import json, config, dispatcher, fairpost
        from fairpost import MailClient
        print(json.dumps([config.DEBUG, dispatcher.ROUTES, fairpost.__file__, MailClient.__module__]))
    """)
    result = app.run(app.bin("python"), "-c", probe, env={})
    assert result.returncode == 0, result.stderr
    debug, routes, fairpost_file, module = json.loads(result.stdout)
    assert (debug, routes) == (True, {})
    assert Path(fairpost_file).is_relative_to(app.venv), "fairpost was imported from the sources"
    assert module == "fairpost.mailer.sdk.client"


@pytest.fixture
def daemon_env(redis_url: str, aws_env: str, ses_env: object) -> dict[str, str]:
    return {
        "FAIRPOST_REDIS_URL": redis_url,
        "FAIRPOST_KEY_PREFIX": PREFIX,
        "FAIRPOST_SENDER__WAIT_SECONDS": "1",
        **{name: value for name, value in os.environ.items() if name.startswith("AWS_")},
    }


def test_the_readme_sdk_and_the_daemon_work_there(app: App, daemon_env: dict[str, str]) -> None:
    assert app.run(app.bin("fairpost"), "--help", env=daemon_env).returncode == 0
    checked_config = app.run(app.bin("fairpost"), "check-config", env=daemon_env)
    assert checked_config.returncode == 0, checked_config.stderr
    init = app.run(app.bin("fairpost"), "init-aws", env=daemon_env)
    assert init.returncode == 0, init.stderr

    # The README's SDK section, as an application runs it.
    enqueue = textwrap.dedent("""
        from fairpost import MailClient, InvalidMail

        client = MailClient.from_env()
        job_id = client.send(
            "acme",
            sender="Acme <no-reply@acme.example>",
            to=["ada@example.com"],
            subject="Welcome",
            text="Hello",
        )
        print(job_id, client.status(job_id).state)
    """)
    result = app.run(app.bin("python"), "-c", enqueue, env=daemon_env)
    assert result.returncode == 0, result.stderr
    job_id, state = result.stdout.split()
    assert state == "queued"

    settings = load_settings(redis_url=daemon_env["FAIRPOST_REDIS_URL"], key_prefix=PREFIX)
    log = app.workdir / "daemon.log"
    with log.open("wb") as out:
        daemon = subprocess.Popen(
            [app.bin("fairpost"), "run"],
            cwd=app.workdir,
            env=app.env(daemon_env),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        with MailClient(settings) as client:

            def sent() -> bool:
                assert daemon.poll() is None, log.read_text()
                return client.status(job_id).state == "sent"

            wait_for(sent, within=60, what="the mail sent by the daemon installed beside the app")
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
    assert daemon.returncode == 0, log.read_text()
