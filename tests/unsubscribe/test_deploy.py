"""The unsubscribe server's Deployment (deploy/kubernetes/unsubscribe.yaml): its own pods,
port and Service, apart from the daemon's and the console's, no AWS role, and valid
settings with the example Secret's keys. (tests/deploy validates every manifest
against Kubernetes' schemas.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fairpost.config import load_settings
from tests.support.kubernetes import apply_env, manifest


def container() -> dict[str, Any]:
    [found] = manifest("Deployment", "fairpost-unsubscribe")["spec"]["template"]["spec"]["containers"]
    return dict(found)


def test_the_unsubscribe_server_has_its_own_pods_port_and_service() -> None:
    deployment = manifest("Deployment", "fairpost-unsubscribe")
    ours = container()
    assert ours["args"] == ["unsubscribe-server"]
    ports = {p["name"]: p["containerPort"] for p in ours["ports"]}
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    for kind, name in (
        ("Service", "fairpost"),
        ("Service", "fairpost-console"),
        ("PodDisruptionBudget", "fairpost"),
        ("Deployment", "fairpost"),
        ("Deployment", "fairpost-console"),
    ):
        spec = manifest(kind, name)["spec"]
        selector = spec["selector"].get("matchLabels", spec["selector"])
        assert not selector.items() <= pod_labels.items(), f"{kind} {name} selects the unsubscribe pods"
        if kind == "Deployment":
            [other] = spec["template"]["spec"]["containers"]
            assert set(ports.values()).isdisjoint(p["containerPort"] for p in other["ports"])
    service = manifest("Service", "fairpost-unsubscribe")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    [port] = service["spec"]["ports"]
    assert ports[port["targetPort"]] == port["port"] == 8026
    for probe in ("readinessProbe", "livenessProbe"):
        assert ours[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    account = manifest("ServiceAccount", deployment["spec"]["template"]["spec"]["serviceAccountName"])
    assert "eks.amazonaws.com/role-arn" not in account["metadata"].get("annotations", {}), "it calls no AWS"


def test_its_settings_are_valid_with_the_example_keys(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ours = container()
    apply_env(ours, monkeypatch, tmp_path)
    section = load_settings().unsubscribe
    assert section.port == {p["name"]: p["containerPort"] for p in ours["ports"]}["http"]
    assert section.host == "0.0.0.0"
    assert section.base_url is not None and section.base_url.startswith("https://")
    [key] = section.keys
    assert "CHANGE-ME" in key.get_secret_value()
