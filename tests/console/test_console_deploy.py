"""The console's Deployment (deploy/kubernetes/console.yaml) against the daemon's,
the settings and the image: its own pods, port and Service, valid settings with
the example Secret's token, and an IAM policy of exactly what it calls.
(tests/deploy validates every manifest against Kubernetes' schemas.)"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from botocore import xform_name
from botocore.session import get_session

from fairpost.config import load_settings
from tests.support.kubernetes import KUBERNETES, ROOT, apply_env, manifest


def console_container() -> dict[str, Any]:
    [container] = manifest("Deployment", "fairpost-console")["spec"]["template"]["spec"]["containers"]
    return dict(container)


def test_the_console_has_its_own_pods_port_and_service() -> None:
    console = manifest("Deployment", "fairpost-console")
    daemon = manifest("Deployment", "fairpost")
    container = console_container()
    assert container["args"] == ["console"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    [daemon_container] = daemon["spec"]["template"]["spec"]["containers"]
    assert set(ports.values()).isdisjoint(p["containerPort"] for p in daemon_container["ports"])
    pod_labels = console["spec"]["template"]["metadata"]["labels"]
    # The daemon's Service, PodDisruptionBudget and Deployment never take a console pod...
    for kind, name in (
        ("Service", "fairpost"),
        ("PodDisruptionBudget", "fairpost"),
        ("Deployment", "fairpost"),
    ):
        spec = manifest(kind, name)["spec"]
        selector = spec["selector"].get("matchLabels", spec["selector"])
        assert not selector.items() <= pod_labels.items(), f"{kind} {name} selects the console's pods"
    # ...and the console's Service takes only them, on the console's port.
    service = manifest("Service", "fairpost-console")
    assert service["spec"]["selector"] == console["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    daemon_labels = daemon["spec"]["template"]["metadata"]["labels"]
    assert not service["spec"]["selector"].items() <= daemon_labels.items()
    [port] = service["spec"]["ports"]
    assert ports[port["targetPort"]] == port["port"] == 8025
    assert "prometheus.io/scrape" not in service["metadata"].get("annotations", {})
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert console["spec"]["template"]["spec"]["serviceAccountName"] == "fairpost-console"
    assert manifest("ServiceAccount", "fairpost-console")


def test_its_settings_are_valid_and_read_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    container = console_container()
    apply_env(container, monkeypatch, tmp_path)
    console = load_settings().console
    assert console.port == {p["name"]: p["containerPort"] for p in container["ports"]}["http"]
    assert console.write is False, "the manifest's console starts read-only"
    # A pod listens on every interface for its Service: the default, 127.0.0.1, would not do.
    assert console.host == "0.0.0.0"
    assert console.token is not None and "CHANGE-ME" in console.token.get_secret_value()


def test_its_iam_policy_is_what_the_console_calls() -> None:
    session = get_session()
    operations = {
        xform_name(op): f"{prefix}:{op}"
        for service, prefix in (("sqs", "sqs"), ("sesv2", "ses"))
        for op in session.get_service_model(service).operation_names
    }
    called = {
        operations[m]
        for path in (ROOT / "mailer" / "console").rglob("*.py")
        for m in re.findall(r"\.([a-z_]+)\(", path.read_text())
        if m in operations
    }
    policy = json.loads((KUBERNETES / "iam-policy-console.json").read_text())
    allowed = {s["Action"] for s in policy["Statement"] if s["Effect"] == "Allow"}
    assert called == allowed == {"ses:GetAccount"}


def test_the_image_has_the_console() -> None:
    assert re.search(r'\[daemon,console\]"', (ROOT / "Dockerfile").read_text())
