"""Start LocalStack's SQS (host mode, no Docker) for the tests and benchmarks that need real FIFO semantics.

LocalStack lives in its own pinned virtualenv, built by ``scripts/install-localstack.sh``
(once, about a minute; later calls find its marker and return at once). The server runs
from a temporary directory with every directory it writes to inside it, so
nothing lands in the repository, ``/tmp/localstack`` or ``/var/lib/localstack``.

State: LocalStack's community edition has no reset endpoint, so each test
works in its own uniquely named queue (the contract suite does) and deletes it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from fairpost.mailer.errors import ServiceError
from fairpost.mailer.testing.services import die_with_parent, free_port
from fairpost.mailer.testing.wait import wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO_ROOT / "scripts" / "install-localstack.sh"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0


def localstack_venv() -> Path:
    """The install script's target: ``$FAIRPOST_LOCALSTACK_VENV``, else ``<repo>/.localstack-venv``."""
    configured = os.environ.get("FAIRPOST_LOCALSTACK_VENV")
    return Path(configured) if configured else REPO_ROOT / ".localstack-venv"


def ensure_localstack() -> Path:
    """Install LocalStack if it is not yet installed; return the venv's python."""
    result = subprocess.run(
        ["bash", str(INSTALL_SCRIPT)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if result.returncode != 0:
        output = result.stdout[-2000:] + result.stderr[-4000:]
        raise ServiceError(f"{INSTALL_SCRIPT.name} failed ({result.returncode}):\n{output}")
    return localstack_venv() / "bin" / "python"


@dataclass(frozen=True)
class LocalStackServer:
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]


def _sqs_state(url: str) -> str | None:
    """SQS's state in ``/_localstack/health`` (``available``, then ``running`` once loaded), or None."""
    try:
        with urllib.request.urlopen(url + "/_localstack/health", timeout=2) as response:
            health = json.load(response)
    except (OSError, ValueError):
        return None
    state = health.get("services", {}).get("sqs")
    return state if isinstance(state, str) else None


def _load_sqs(url: str) -> None:
    """LocalStack loads a service on its first request (about 5 s for SQS): pay that here, not in a test."""
    query = urllib.parse.urlencode({"Action": "ListQueues", "Version": "2012-11-05"})
    urllib.request.urlopen(f"{url}/?{query}", timeout=START_TIMEOUT).close()


@contextmanager
def localstack_server() -> Iterator[LocalStackServer]:
    """LocalStack with SQS only, on a free port of 127.0.0.1; stopped (whole process group) on exit."""
    python = ensure_localstack()
    with tempfile.TemporaryDirectory(prefix="fairpost-localstack-") as workdir:
        root = Path(workdir)
        port = free_port()
        env = {
            **os.environ,
            "GATEWAY_LISTEN": f"127.0.0.1:{port}",
            "LOCALSTACK_HOST": f"127.0.0.1:{port}",
            "SERVICES": "sqs",
            "DNS_ADDRESS": "0",
            "SKIP_SSL_CERT_DOWNLOAD": "1",
            "DISABLE_EVENTS": "1",
            # Queue URLs on 127.0.0.1 (not *.localhost.localstack.cloud, which needs DNS).
            "SQS_ENDPOINT_STRATEGY": "path",
            # This machine looks like a container to LocalStack, which would then write
            # to /var/lib/localstack; host mode keeps every directory under FILESYSTEM_ROOT.
            "OVERRIDE_IN_DOCKER": "0",
            "FILESYSTEM_ROOT": str(root / "fs"),
            "LOCALSTACK_VOLUME_DIR": str(root / "volume"),
            "PERSISTENCE": "0",
        }
        env.pop("VIRTUAL_ENV", None)
        server = LocalStackServer(port=port, log_path=root / "localstack.log")
        with server.log_path.open("wb") as log:
            process = subprocess.Popen(
                [str(python), "-m", "localstack.runtime.main"],
                cwd=root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        try:
            wait_for(
                lambda: _exited(process, server) or _sqs_state(server.url) in ("available", "running"),
                within=START_TIMEOUT,
                what=f"LocalStack to answer /_localstack/health on {server.url}",
                interval=0.1,
            )
            _load_sqs(server.url)
            wait_for(
                lambda: _exited(process, server) or _sqs_state(server.url) == "running",
                within=START_TIMEOUT,
                what=f"LocalStack to report SQS running on {server.url}",
                interval=0.1,
            )
            yield server
        finally:
            _stop(process)


def _exited(process: subprocess.Popen[bytes], server: LocalStackServer) -> bool:
    if process.poll() is None:
        return False
    raise ServiceError(
        f"LocalStack exited with {process.returncode} before it was ready:\n{server.log_tail()}"
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, SIGKILL it if it is still there after STOP_TIMEOUT."""
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with suppress(subprocess.TimeoutExpired):
        process.wait(timeout=STOP_TIMEOUT)
    # Children may outlive the leader: whatever is left of the group goes.
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=STOP_TIMEOUT)
