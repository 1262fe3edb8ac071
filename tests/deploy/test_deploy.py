"""The deployment files against the daemon and against each other.

``deploy/kubernetes`` (validated against Kubernetes' schemas), the Prometheus
rules and their unit tests (promtool), the Grafana dashboard, and
``docs/runbooks.md``: every metric a query names is one the daemon exports
(read from its real ``/metrics`` endpoint), every probe, port, user and grace
period agrees with the Dockerfile, docker-compose.yml and the settings, and
the IAM policies hold exactly the AWS actions the code calls.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes_validate  # type: ignore[import-untyped]  # ships no type information
import promql_parser
import pytest
import yaml
from botocore import xform_name
from botocore.session import get_session
from prometheus_client import enable_created_metrics
from prometheus_client.parser import text_string_to_metric_families

from fairpost.config import ConfigError, Settings, load_settings
from fairpost.config.sections import SenderSettings
from fairpost.mailer.daemon.http import Check, HttpServer
from fairpost.mailer.daemon.metric_labels import DEAD_REASONS, SES_RESULTS, THROTTLE_REASONS
from fairpost.mailer.daemon.metrics import Metrics
from fairpost.mailer.ops.stats import ScopeStats, Stats, WindowUsage
from fairpost.mailer.quota.reputation import WINDOWS as REPUTATION_WINDOWS
from fairpost.mailer.quota.reputation import Reputation, WindowCounts

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
PROMETHEUS = ROOT / "deploy" / "prometheus"
ALERTS = PROMETHEUS / "alerts.yml"
ALERT_TESTS = PROMETHEUS / "alerts.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "fairpost.json"
RUNBOOKS = ROOT / "docs" / "runbooks.md"

KUBERNETES_VERSIONS = ("1.31.0", "1.37.0")
"""Kubernetes releases the manifests are checked against, with the schemas
kubernetes-validate bundles (strict: an unknown field is an error): one that
clusters still run under extended support, and the newest it ships."""

PENDING_METRICS: frozenset[str] = frozenset()
"""Metrics another change is adding to the daemon (none now). The rule
group ``fairpost-upcoming`` alerts on them, and only it may use them. Once the
daemon exports one, the tests below fail: move its alerts into the group
``fairpost`` and drop the metric from this set."""

UPCOMING_GROUP = "fairpost-upcoming"

PROMETHEUS_SERIES = frozenset({"up"})
"""Series Prometheus writes itself for every scrape target."""

SCRAPE_LABELS = frozenset({"job", "instance"})
"""Labels Prometheus adds to every scraped series."""

GRAFANA_VARIABLES = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$__range": "6h",
    "$job": "fairpost",
    "$tenant": "acme",
}
"""Stand-ins for the dashboard's variables, so that its queries parse as PromQL."""

SEVERITIES = frozenset({"critical", "warning", "info"})


# -- reading the files -----------------------------------------------------------


def load_yaml_documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def manifest_files() -> list[Path]:
    return sorted(p for p in KUBERNETES.glob("*.yaml") if p.name != "kustomization.yaml")


def manifests() -> list[dict[str, Any]]:
    return [doc for path in manifest_files() for doc in load_yaml_documents(path)]


def manifest(kind: str, name: str) -> dict[str, Any]:
    found = [m for m in manifests() if m["kind"] == kind and m["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name!r} in {KUBERNETES}, found {len(found)}"
    return found[0]


def kustomization() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    return data


def alert_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(ALERTS.read_text())["groups"]
    return groups


def alert_rules() -> list[tuple[str, dict[str, Any]]]:
    """(group name, rule) for every alerting rule."""
    return [(g["name"], rule) for g in alert_groups() for rule in g["rules"] if "alert" in rule]


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def dashboard_panels() -> Iterator[dict[str, Any]]:
    for panel in dashboard()["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row holds its panels


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every label_values() variable."""
    queries = [
        (f"panel {panel['title']!r} target {target['refId']}", target["expr"])
        for panel in dashboard_panels()
        for target in panel.get("targets", [])
    ]
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]
        text = query["query"] if isinstance(query, dict) else query
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", text)
        assert match, f"variable {variable['name']}: expected label_values(SELECTOR, LABEL), got {text!r}"
        queries.append((f"variable {variable['name']!r}", match.group(1)))
    return queries


def substitute_variables(expr: str) -> str:
    for name in sorted(GRAFANA_VARIABLES, key=len, reverse=True):
        expr = expr.replace("${" + name[1:] + "}", GRAFANA_VARIABLES[name]).replace(
            name, GRAFANA_VARIABLES[name]
        )
    assert "$" not in expr, f"a Grafana variable without a stand-in in {expr!r}"
    return expr


def compose_service(name: str) -> dict[str, Any]:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    service: dict[str, Any] = compose["services"][name]
    return service


def seconds(duration: str) -> float:
    """Compose durations: ``15s``, ``1m30s``."""
    parts = re.fullmatch(r"(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?", duration)
    assert parts and duration, f"unexpected duration {duration!r}"
    return int(parts.group(1) or 0) * 60 + float(parts.group(2) or 0)


def dockerfile_user() -> tuple[int, int]:
    match = re.search(r"^USER\s+(\d+):(\d+)\s*$", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    assert match, "the Dockerfile's USER is not numeric uid:gid"
    return int(match.group(1)), int(match.group(2))


def pod_spec(kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = manifest(kind, name)["spec"]["template"]["spec"]
    return spec


def container_env(container: Mapping[str, Any]) -> dict[str, str]:
    """The container's literal ``env`` values (references left out)."""
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


# -- the daemon's real /metrics ---------------------------------------------------


@dataclass(frozen=True)
class Exported:
    names: frozenset[str]
    """Every series name the daemon exports."""
    labels: Mapping[str, Mapping[str, frozenset[str]]]
    """Series name -> label name -> the values seen (label names: every one the series has)."""


async def _get(port: int, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}{path}") as response:
        return response.status, await response.text()


def _sample_stats() -> Stats:
    """What the gauges are filled from at scrape time: a tenant, a window each."""
    window = WindowUsage(seconds=1, limit=14, used=3)
    reputation = Reputation(
        "acme", 0, tuple(WindowCounts(s, 200, 3, 0, 200, 3, 0) for s in REPUTATION_WINDOWS), None
    )
    return Stats(
        at_ms=0,
        global_=ScopeStats("global", backlog=5, inflight=2, windows=[window], limits_source="settings"),
        tenants=[
            ScopeStats(
                "acme",
                backlog=5,
                inflight=2,
                windows=[window],
                limits_source="settings",
                paused=True,
                reputation=reputation,
            )
        ],
        replicas=["a", "b"],
    )


async def _scrape_daemon(probe_paths: tuple[str, ...]) -> tuple[str, dict[str, int]]:
    """Serve the daemon's HTTP endpoints on a free port, as ``fairpost run`` does
    (process metrics on, every label value the code uses met once), and fetch
    /metrics and the probe paths."""
    metrics = Metrics(process_metrics=True)
    metrics.dispatched("acme")
    metrics.sent("acme", created_ms=1)
    metrics.retried("acme")
    metrics.received(3)
    metrics.receive_failed()
    metrics.handed_back(1)
    for reason in THROTTLE_REASONS:
        metrics.throttled("acme", reason)
    for reason in DEAD_REASONS:
        metrics.dead("acme", reason)
    for result in SES_RESULTS:
        metrics.ses_call(result, 0.05)

    async def ready() -> Check:
        return Check(True, "test")

    async def refresh() -> None:
        metrics.update(_sample_stats())

    server = HttpServer(
        metrics, port=0, host="127.0.0.1", alive=lambda: Check(True, "test"), ready=ready, refresh=refresh
    )
    await server.start()
    stop = asyncio.Event()
    serving = asyncio.create_task(server.run(stop))
    try:
        status, text = await _get(server.port, "/metrics")
        assert status == 200
        probes = {path: (await _get(server.port, path))[0] for path in probe_paths}
    finally:
        stop.set()
        await serving
    return text, probes


def _probe_paths() -> tuple[str, ...]:
    container = pod_spec("Deployment", "fairpost")["containers"][0]
    return tuple(
        container[probe]["httpGet"]["path"] for probe in ("startupProbe", "livenessProbe", "readinessProbe")
    )


@pytest.fixture(scope="module")
def scraped() -> tuple[str, dict[str, int]]:
    # An event loop of its own, in a thread of its own: nothing of the other
    # tests' loops is touched. The daemon drops the "_created" series
    # process-wide; put them back after.
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, _scrape_daemon(_probe_paths())).result(timeout=60)
    finally:
        enable_created_metrics()  # type: ignore[no-untyped-call]  # unannotated upstream


@pytest.fixture(scope="module")
def exported(scraped: tuple[str, dict[str, int]]) -> Exported:
    text, _ = scraped
    names: set[str] = set()
    for match in re.finditer(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE):
        name, kind = match.groups()
        suffixes = {
            "counter": ("",),  # exported with its _total already
            "gauge": ("",),
            "histogram": ("_bucket", "_sum", "_count"),
            "summary": ("", "_sum", "_count"),
            "info": ("",),
        }[kind]
        names.update(name + suffix for suffix in suffixes)
    labels: dict[str, dict[str, set[str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            names.add(sample.name)
            seen = labels.setdefault(sample.name, {})
            for label, value in sample.labels.items():
                seen.setdefault(label, set()).add(value)
    return Exported(
        frozenset(names),
        {name: {label: frozenset(values) for label, values in ls.items()} for name, ls in labels.items()},
    )


def test_the_scrape_is_what_production_exports(exported: Exported) -> None:
    assert not any(name.endswith("_created") for name in exported.names)
    assert {
        "fairpost_mail_sent_total",
        "fairpost_mail_latency_seconds_bucket",
        "process_cpu_seconds_total",
    } <= exported.names
    landed = sorted(exported.names & PENDING_METRICS)
    assert not landed, (
        f"the daemon now exports {landed}: move their alerts from the group {UPCOMING_GROUP!r} "
        "into 'fairpost' and drop them from PENDING_METRICS"
    )


def test_probe_paths_answer_on_the_daemon(scraped: tuple[str, dict[str, int]]) -> None:
    _, probes = scraped
    assert probes and all(status == 200 for status in probes.values()), probes


# -- PromQL: every query names real metrics and label values ------------------------


@dataclass(frozen=True)
class Selector:
    name: str
    matchers: tuple[tuple[str, promql_parser.MatchOp, str], ...]
    """(label, operator, value)."""


def selectors(expr: str) -> list[Selector]:
    found: list[Selector] = []

    def visit(node: promql_parser.Expr) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            matchers = [(m.name, m.op, m.value) for m in node.matchers.matchers]
            name = node.name or next((v for label, op, v in matchers if label == "__name__"), None)
            assert name, f"a selector without a metric name in {expr!r}"
            found.append(Selector(name, tuple(m for m in matchers if m[0] != "__name__")))
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def all_queries() -> list[tuple[str, str]]:
    rules = [(f"alert {rule['alert']} ({group})", rule["expr"]) for group, rule in alert_rules()]
    return rules + [(where, substitute_variables(expr)) for where, expr in dashboard_queries()]


@pytest.mark.parametrize(("where", "expr"), all_queries(), ids=[w for w, _ in all_queries()])
def test_queries_use_exported_metrics_and_labels(where: str, expr: str, exported: Exported) -> None:
    for selector in selectors(expr):
        if selector.name in PROMETHEUS_SERIES or selector.name in PENDING_METRICS:
            continue
        assert selector.name in exported.names, f"{where}: the daemon exports no {selector.name!r}"
        known = exported.labels.get(selector.name, {})
        for label, op, value in selector.matchers:
            if label in SCRAPE_LABELS:
                continue
            assert label in known, f"{where}: {selector.name} has no label {label!r} (it has {sorted(known)})"
            if label == "tenant" or op not in (promql_parser.MatchOp.Equal, promql_parser.MatchOp.Re):
                continue  # tenants are the users' own; negative matchers cannot be wrong
            wanted = value.split("|") if op == promql_parser.MatchOp.Re else [value]
            unknown = {v for v in wanted if re.fullmatch(r"[\w ]+", v) and v not in known[label]}
            assert not unknown, f"{where}: {selector.name}{{{label}}} is never {sorted(unknown)}"


def test_pending_metrics_are_exactly_the_upcoming_group(exported: Exported) -> None:
    upcoming = {
        s.name for group, rule in alert_rules() if group == UPCOMING_GROUP for s in selectors(rule["expr"])
    }
    assert upcoming == PENDING_METRICS, "the group fairpost-upcoming must alert on exactly PENDING_METRICS"
    elsewhere = {
        (where, s.name)
        for where, expr in all_queries()
        if f"({UPCOMING_GROUP})" not in where
        for s in selectors(expr)
        if s.name in PENDING_METRICS
    }
    assert not elsewhere, f"only the group {UPCOMING_GROUP} may use metrics not exported yet: {elsewhere}"


# -- Prometheus rules ----------------------------------------------------------------


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        message = (
            "promtool is not installed (Debian's package `prometheus` ships it; "
            "scripts/bootstrap.sh installs it when run as root)"
        )
        if os.environ.get("CI"):
            pytest.fail(message + ": CI must run the Prometheus rule tests")
        pytest.skip(message)
    return path


def test_promtool_check_rules(promtool: str) -> None:
    result = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_test_rules(promtool: str) -> None:
    result = subprocess.run(
        [promtool, "test", "rules", ALERT_TESTS.name],
        cwd=PROMETHEUS,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    cases: dict[str, set[bool]] = {}
    for test in yaml.safe_load(ALERT_TESTS.read_text())["tests"]:
        for case in test.get("alert_rule_test", []):
            cases.setdefault(case["alertname"], set()).add(bool(case.get("exp_alerts")))
    names = {rule["alert"] for _, rule in alert_rules()}
    assert not set(cases) - names, f"tests of alerts that do not exist: {sorted(set(cases) - names)}"
    for name in sorted(names):
        assert cases.get(name) == {True, False}, (
            f"{name} needs a test where it fires and one where it does not"
        )


def runbook_anchors() -> set[str]:
    """GitHub's anchors for the runbook's second-level headings."""
    headings = re.findall(r"^## (.+)$", RUNBOOKS.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize(("group", "rule"), alert_rules(), ids=[r["alert"] for _, r in alert_rules()])
def test_alert_annotations_and_runbook(group: str, rule: dict[str, Any]) -> None:
    annotations = rule.get("annotations", {})
    assert {"summary", "description", "runbook_url"} <= set(annotations), rule["alert"]
    assert rule.get("labels", {}).get("severity") in SEVERITIES, rule["alert"]
    path, _, anchor = annotations["runbook_url"].partition("#")
    assert path == "docs/runbooks.md" and (ROOT / path).is_file()
    assert anchor == rule["alert"].lower() and anchor in runbook_anchors(), (
        f"{rule['alert']}: docs/runbooks.md needs a section '## {rule['alert']}'"
    )


def test_alert_names_unique_and_one_runbook_section_each() -> None:
    names = [rule["alert"] for _, rule in alert_rules()]
    assert len(names) == len(set(names))
    assert runbook_anchors() == {name.lower() for name in names}
    assert [g["name"] for g in alert_groups()] == ["fairpost"] + ([UPCOMING_GROUP] if PENDING_METRICS else [])


# -- Grafana -------------------------------------------------------------------------


def test_dashboard_uses_a_datasource_variable() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    wanted = {"type": "prometheus", "uid": "${datasource}"}
    for panel in dashboard_panels():
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == wanted, panel["title"]
        assert all(t["datasource"] == wanted for t in panel["targets"]), panel["title"]
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == wanted, variable["name"]


def test_dashboard_layout() -> None:
    panels = list(dashboard_panels())
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    taken: set[tuple[int, int]] = set()
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {
            (x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & taken, f"panel {panel['title']!r} overlaps another"
        taken |= cells


def test_dashboard_shows_what_on_call_needs() -> None:
    exprs = [substitute_variables(expr) for _, expr in dashboard_queries()]
    used = {s.name for expr in exprs for s in selectors(expr)}
    assert {
        "fairpost_mail_sent_total",
        "fairpost_tenant_quota_limit",
        "fairpost_global_quota_used",
        "fairpost_global_quota_limit",
        "fairpost_mail_throttled_total",
        "fairpost_mail_dead_total",
        "fairpost_backlog",
        "fairpost_inflight",
        "fairpost_replicas",
    } <= used
    assert any(
        "histogram_quantile(" in e and "fairpost_mail_latency_seconds_bucket" in e and "by (le)" in e
        for e in exprs
    )


# -- Kubernetes ------------------------------------------------------------------------


@pytest.mark.parametrize("path", manifest_files(), ids=[p.name for p in manifest_files()])
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_manifest_is_valid_kubernetes(path: Path, version: str) -> None:
    documents = load_yaml_documents(path)
    assert documents, f"{path.name} holds no manifest"
    for document in documents:
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = "/".join(str(p) for p in exc.path)
            pytest.fail(
                f"{path.name}: {document['kind']} {document['metadata']['name']}: {where}: {exc.message}"
            )


def test_kustomization_lists_every_manifest() -> None:
    listed = kustomization()["resources"]
    examples = {p.name for p in manifest_files() if p.name.endswith(".example.yaml")}
    assert examples == {"secret.example.yaml"}
    assert sorted(listed) == sorted(p.name for p in manifest_files() if p.name not in examples), (
        "kustomization.yaml must list every manifest of deploy/kubernetes (examples excepted)"
    )
    assert len(listed) == len(set(listed))


def test_kustomization_namespace_and_image() -> None:
    k = kustomization()
    assert manifest("Namespace", k["namespace"])
    images = {i["name"] for i in k["images"]}
    for kind, name in (
        ("Deployment", "fairpost"),
        ("Job", "fairpost-init-aws"),
        ("Deployment", "fairpost-console"),
    ):
        for container in pod_spec(kind, name)["containers"]:
            assert container["image"].split(":")[0] in images, (
                f"{kind} {name}: image not set by kustomization"
            )


def test_deployment_shape() -> None:
    deployment = manifest("Deployment", "fairpost")
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    spec = pod_spec("Deployment", "fairpost")
    (container,) = spec["containers"]
    assert container["args"] == ["run"]
    assert "BENCHMARKS.md" in (KUBERNETES / "deployment.yaml").read_text(), "say where the requests come from"
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    pdb = manifest("PodDisruptionBudget", "fairpost")
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert (
        manifest("Service", "fairpost")["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    )
    job_labels = manifest("Job", "fairpost-init-aws")["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert not selector.items() <= job_labels.items(), "the Job's pod must not count as a daemon pod"


def test_probes_and_ports_agree_with_compose_and_image() -> None:
    container = pod_spec("Deployment", "fairpost")["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    env = container_env(container)
    compose_env = compose_service("fairpost-a")["environment"]
    port = int(compose_env["FAIRPOST_HTTP_PORT"])
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"FAIRPOST_HTTP_PORT={port}" in dockerfile and re.search(rf"^EXPOSE {port}$", dockerfile, re.M)
    assert int(env["FAIRPOST_HTTP_PORT"]) == port
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        target = container[probe]["httpGet"]["port"]
        assert ports.get(target, target) == port, probe
    # /readyz waits up to 2 s for Redis and 3 s for SQS.
    assert container["readinessProbe"]["timeoutSeconds"] > 5
    service_port = manifest("Service", "fairpost")["spec"]["ports"][0]
    assert ports.get(service_port["targetPort"], service_port["targetPort"]) == port
    assert manifest("Service", "fairpost")["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    # compose publishes the same container port
    assert all(p.endswith(f":{port}") for p in compose_service("fairpost-a")["ports"])


def test_shutdown_grace_agrees_with_compose_and_settings() -> None:
    spec = pod_spec("Deployment", "fairpost")
    env = container_env(spec["containers"][0])
    compose = compose_service("fairpost-a")
    default = Settings.model_fields["shutdown_grace"].default
    grace = float(env.get("FAIRPOST_SHUTDOWN_GRACE", default))
    assert grace == float(compose["environment"].get("FAIRPOST_SHUTDOWN_GRACE", default))
    # The daemon's stop takes at most the grace period plus 5 s (docs/operations.md, "Shutdown").
    assert spec["terminationGracePeriodSeconds"] >= grace + 5
    # ... or the long polls in flight plus 5 s, if they wait longer: they land, never cut off.
    configured = tomllib.loads(manifest("ConfigMap", "fairpost-config")["data"]["fairpost.toml"])
    wait = float(
        env.get(
            "FAIRPOST_SENDER__WAIT_SECONDS",
            configured["fairpost"].get("sender", {}).get("wait_seconds", SenderSettings().wait_seconds),
        )
    )
    assert spec["terminationGracePeriodSeconds"] >= max(grace, wait) + 5
    assert spec["terminationGracePeriodSeconds"] == seconds(compose["stop_grace_period"])
    liveness = spec["containers"][0]["livenessProbe"]
    assert liveness["periodSeconds"] * liveness["failureThreshold"] > spec["terminationGracePeriodSeconds"], (
        "a replica shutting down answers /healthz with 503: liveness must not kill it before it is done"
    )


@pytest.mark.parametrize(
    ("kind", "name"),
    [("Deployment", "fairpost"), ("Job", "fairpost-init-aws"), ("Deployment", "fairpost-console")],
)
def test_pods_run_as_the_image_user_read_only(kind: str, name: str) -> None:
    uid, gid = dockerfile_user()
    spec = pod_spec(kind, name)
    security = spec["securityContext"]
    assert security["runAsNonRoot"] is True
    assert (security["runAsUser"], security["runAsGroup"]) == (uid, gid)
    assert security["seccompProfile"]["type"] == "RuntimeDefault"
    volumes = {v["name"]: v for v in spec["volumes"]}
    for container in spec["containers"]:
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
        tmp = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
        assert len(tmp) == 1 and "emptyDir" in volumes[tmp[0]["name"]]
    assert manifest("ServiceAccount", spec["serviceAccountName"])


def test_configured_settings_are_valid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ConfigMaps, the Deployment's env and the example Secret make valid settings."""
    for name in list(os.environ):
        if name.startswith("FAIRPOST_"):
            monkeypatch.delenv(name)
    config_file = tmp_path / "fairpost.toml"
    config_file.write_text(manifest("ConfigMap", "fairpost-config")["data"]["fairpost.toml"])
    spec = pod_spec("Deployment", "fairpost")
    (container,) = spec["containers"]
    env_maps = [e["configMapRef"]["name"] for e in container["envFrom"]]
    mounted = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    config_volume = next(
        v for v in spec["volumes"] if v.get("configMap", {}).get("name") == "fairpost-config"
    )
    variables: dict[str, str] = {}
    for name in env_maps:
        variables.update(manifest("ConfigMap", name)["data"])
    variables.update(container_env(container))
    redis_url = next(e for e in container["env"] if e["name"] == "FAIRPOST_REDIS_URL")
    secret_ref = redis_url["valueFrom"]["secretKeyRef"]
    secret = manifest("Secret", secret_ref["name"])
    variables["FAIRPOST_REDIS_URL"] = secret["stringData"][secret_ref["key"]]
    # The file is where the Deployment mounts it.
    item = config_volume["configMap"]["items"][0]
    assert variables["FAIRPOST_CONFIG_FILE"] == f"{mounted[config_volume['name']]}/{item['path']}"
    variables["FAIRPOST_CONFIG_FILE"] = str(config_file)
    for name, value in variables.items():
        if name.startswith("FAIRPOST_"):
            monkeypatch.setenv(name, value)
    try:
        settings = load_settings()
    except ConfigError as exc:
        pytest.fail(f"the manifests' settings are invalid: {exc}")
    assert settings.http_port == 9090
    assert "CHANGE-ME" in settings.redis_url, "the example Secret must hold an obvious placeholder"
    assert "secret.example.yaml" not in kustomization()["resources"]
    # SES events are on (the reputation guard and suppression feed on them); the
    # Job creates their queue, and the IAM policies name both queues the settings use.
    assert settings.events_queue_name, "the manifests read no SES events"
    (job,) = pod_spec("Job", "fairpost-init-aws")["containers"]
    assert job["args"] == ["init-aws", "--events"]
    for policy in ("iam-policy.json", "iam-policy-init-aws.json"):
        resources = [
            r
            for s in json.loads((KUBERNETES / policy).read_text())["Statement"]
            for r in ([s["Resource"]] if isinstance(s["Resource"], str) else s["Resource"])
        ]
        for queue in (settings.queue_name, settings.events_queue_name):
            assert any(r.startswith("arn:aws:sqs:") and r.endswith(":" + queue) for r in resources), queue


# -- IAM: exactly the actions the code calls -----------------------------------------------


def _aws_calls() -> dict[Path, set[str]]:
    """Per source file of the installed packages (the demo and the emulators left out), the SQS and
    SES v2 operations it calls, as IAM actions."""
    session = get_session()
    operations: dict[str, str] = {}
    for service, prefix in (("sqs", "sqs"), ("sesv2", "ses")):
        for op in session.get_service_model(service).operation_names:
            # SQS authorizes each batch call with the single-message action.
            operations[xform_name(op)] = f"{prefix}:{op.removesuffix('Batch')}"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    # src/fairpost links to the folders it installs; rglob does not follow links.
    folders = [link.resolve() for package in packages for link in (ROOT / package).iterdir() if link.is_dir()]
    assert folders, f"no package folders under {packages}"
    calls: dict[Path, set[str]] = {}
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            # The demo and the local emulators (mailer/testing) run under no IAM role.
            if {"demo", "testing"} & set(path.relative_to(ROOT).parts):
                continue
            found = {operations[m] for m in re.findall(r"\.([a-z_]+)\(", path.read_text()) if m in operations}
            if found:
                calls[path] = found
    return calls


def _policy_actions(name: str) -> set[str]:
    actions: set[str] = set()
    for statement in json.loads((KUBERNETES / name).read_text())["Statement"]:
        assert statement["Effect"] == "Allow"
        action = statement["Action"]
        actions.update([action] if isinstance(action, str) else action)
    return actions


def test_iam_policies_hold_the_actions_the_code_calls() -> None:
    calls = _aws_calls()
    init = {a for found in calls.values() if "sqs:CreateQueue" in found for a in found}
    daemon = {a for found in calls.values() if "sqs:CreateQueue" not in found for a in found}
    assert "ses:SendEmail" in daemon and "sqs:ReceiveMessage" in daemon, calls
    assert _policy_actions("iam-policy.json") == daemon
    assert _policy_actions("iam-policy-init-aws.json") == init


# -- the README snippet ---------------------------------------------------------------------


def test_the_kubernetes_docs_name_real_files() -> None:
    # The section lives in the README, or in docs/ if the README moves it there.
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    sections = [
        page.read_text().split("## Deploying on Kubernetes", 1)[1].split("\n## ", 1)[0]
        for page in pages
        if "## Deploying on Kubernetes" in page.read_text()
    ]
    assert len(sections) == 1, "one 'Deploying on Kubernetes' section, in the README or docs/"
    text = sections[0]
    assert "kubectl apply -k deploy/kubernetes" in text
    assert "docs/runbooks.md" in text
    for path in re.findall(r"`((?:deploy|docs)/[\w./-]+)`", text):
        assert (ROOT / path).exists(), path
