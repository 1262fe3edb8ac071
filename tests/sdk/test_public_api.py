"""The public API is exactly the documented names (as httpx checks its own exports).

Adding or removing an export must be a deliberate change to this file (and
to the README), never an accident of an import in ``__init__``.
"""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import fairpost
from fairpost import config, mailer

MAILER_API = [
    "AsyncEvent",
    "AsyncMailClient",
    "Attachment",
    "ConfigError",
    "DeadLetters",
    "Deliverability",
    "Event",
    "EvictingRedis",
    "FairpostError",
    "InvalidMail",
    "JobStatus",
    "Mail",
    "MailClient",
    "NotReplayable",
    "RedisFailed",
    "RedisNearlyFull",
    "Suppressions",
    "TooLateToCancel",
    "UnknownJob",
    "Unsubscribes",
    "Webhooks",
]
CONFIG_API = [
    "TENANT_ID_RULE",
    "ConfigError",
    "DispatcherSettings",
    "FairpostError",
    "Limits",
    "SenderSettings",
    "Settings",
    "TenantSettings",
    "Window",
    "format_limits",
    "is_valid_tenant_id",
    "load_settings",
    "mask_url",
    "parse_limits",
]
DOCUMENTED = {"fairpost": MAILER_API, "fairpost.mailer": MAILER_API, "fairpost.config": CONFIG_API}
DAEMON_ONLY = ("aioboto3", "boto3", "botocore", "prometheus_client")


@pytest.mark.parametrize(
    ("package", "names"), [(fairpost, MAILER_API), (mailer, MAILER_API), (config, CONFIG_API)]
)
def test_all_is_the_documented_list(package: ModuleType, names: list[str]) -> None:
    assert package.__all__ == names
    assert len(set(names)) == len(names)


@pytest.mark.parametrize(("name", "names"), DOCUMENTED.items())
def test_every_exported_name_is_importable(name: str, names: list[str]) -> None:
    package = importlib.import_module(name)
    for export in names:
        assert getattr(package, export, None) is not None, f"{name}.{export} is missing"
    namespace: dict[str, object] = {}
    exec(f"from {name} import *", namespace)  # what `import *` really gives
    assert sorted(set(namespace) - {"__builtins__"}) == sorted(names)


@pytest.mark.parametrize(
    ("package", "names"), [(fairpost, MAILER_API), (mailer, MAILER_API), (config, CONFIG_API)]
)
def test_no_other_public_name_leaks(package: ModuleType, names: list[str]) -> None:
    public = {
        attr
        for attr, value in vars(package).items()
        if not attr.startswith("_") and not isinstance(value, ModuleType)
    }
    assert public == set(names)


def test_the_top_level_names_are_the_sdks_own() -> None:
    for name in MAILER_API:
        assert getattr(fairpost, name) is getattr(mailer, name)


def test_shared_errors_are_the_same_classes() -> None:
    assert mailer.ConfigError is config.ConfigError
    assert mailer.FairpostError is config.FairpostError
    for error in (
        mailer.InvalidMail,
        mailer.UnknownJob,
        mailer.ConfigError,
        mailer.TooLateToCancel,
        mailer.NotReplayable,
        mailer.RedisFailed,
    ):
        assert issubclass(error, mailer.FairpostError)


def test_the_sdk_imports_none_of_the_daemon() -> None:
    code = (
        "import json, sys, fairpost\n"
        f"print(json.dumps(sorted(m for m in {list(DAEMON_ONLY)!r} if m in sys.modules)))\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    daemon_modules, everything = (json.loads(line) for line in result.stdout.splitlines())
    assert daemon_modules == []
    # a real import happened (the check above cannot pass on an empty interpreter)
    assert {"fairpost", "fairpost.mailer.sdk.client", "redis", "email_validator", "pydantic_settings"} <= set(
        everything
    )
    loaded_daemon_parts = [
        m
        for m in everything
        if m.split(".")[0] in DAEMON_ONLY
        or m in ("fairpost.mailer.daemon.sender", "fairpost.mailer.daemon.app")
    ]
    assert loaded_daemon_parts == []


ROOT = Path(__file__).resolve().parents[2]
DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_IMPORT = re.compile(r"^from fairpost import (?P<names>[^\n(]+)$", re.MULTILINE)


def documented_imports() -> list[tuple[str, str]]:
    """(page, name) for every name a page's examples import with ``from fairpost import ...``."""
    found = []
    for page in DOC_PAGES:
        for match in _IMPORT.finditer(page.read_text(encoding="utf-8")):
            names = match["names"].split("#", 1)[0]
            found += [(page.name, name.strip()) for name in names.split(",") if name.strip()]
    return found


def test_the_docs_import_sdk_names() -> None:
    # The check below must have something to check: the outcome feed's pages use these.
    assert {("outcomes.md", n) for n in ("Webhooks", "Event", "AsyncEvent", "MailClient")} <= set(
        documented_imports()
    )


@pytest.mark.parametrize(("page", "name"), documented_imports())
def test_every_name_the_docs_import_from_fairpost_is_exported(page: str, name: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from fairpost import {name}", namespace)  # as the page's reader would
    assert namespace[name] is getattr(fairpost, name)
    assert name in MAILER_API, f"{page} imports {name}, which is not in the documented list"
