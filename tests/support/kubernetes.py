"""The Kubernetes manifests (deploy/kubernetes), read as the tests of each component read them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"


def manifests() -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted(KUBERNETES.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for doc in yaml.safe_load_all(path.read_text())
        if doc is not None
    ]


def manifest(kind: str, name: str) -> dict[str, Any]:
    [found] = [m for m in manifests() if m["kind"] == kind and m["metadata"]["name"] == name]
    return dict(found)


def apply_env(container: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Set the environment ``container`` gets: its ConfigMaps, its values, the example
    Secrets' placeholders and the mounted config file."""
    variables: dict[str, str] = {}
    for source in container["envFrom"]:
        variables.update(manifest("ConfigMap", source["configMapRef"]["name"])["data"])
    for entry in container["env"]:
        if "value" in entry:
            variables[entry["name"]] = entry["value"]
        else:
            ref = entry["valueFrom"]["secretKeyRef"]
            variables[entry["name"]] = manifest("Secret", ref["name"])["stringData"][ref["key"]]
    config = tmp_path / "fairpost.toml"
    config.write_text(manifest("ConfigMap", "fairpost-config")["data"]["fairpost.toml"])
    variables["FAIRPOST_CONFIG_FILE"] = str(config)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
