"""The Kubernetes manifests in deploy/kubernetes/ are valid and say what the proxy needs.

Validated offline against the schemas `kubernetes-validate` carries for a current
release (strict: an unknown or misspelled field is an error), then read for what a
schema cannot see: that the probes reach /readyz and /healthz where the proxy
listens, that the agent's base URL is the sidecar's, that each ConfigMap's
config.yaml loads with the proxy's own loader under the pod's environment, that
every Secret a pod names exists with the key it names, and that the replicas share
their tenant salt.
"""

from __future__ import annotations

import copy
import posixpath
import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from dockerfile import parse

from proxy.config import Settings, build_settings

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy" / "kubernetes"
# A current release; kubernetes-validate (pinned in pyproject.toml) carries its schemas.
KUBERNETES_VERSION = "1.37"
# The CLI's timeout_graceful_shutdown (proxy/cli/__init__.py): how long SIGTERM's drain may take.
DRAIN_SECONDS = 30
IMAGE = parse((REPO / "Dockerfile").read_text(encoding="utf-8"))


def documents(folder: Path) -> list[dict[str, Any]]:
    return [d for f in sorted(folder.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text(encoding="utf-8")) if d]


SETUPS = sorted(p.name for p in DEPLOY.iterdir() if p.is_dir())
ALL = [(setup, d) for setup in SETUPS for d in documents(DEPLOY / setup)]


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    assert found, f"no {kind} named {name!r}"
    return found[0]


def ctxproxy_containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in pod.get("initContainers", []) + pod["containers"] if c["image"].startswith("ctxproxy:")]


def secret_value(docs: list[dict[str, Any]], name: str, key: str) -> str:
    data = named(docs, "Secret", name).get("stringData", {})
    assert key in data, f"Secret {name} has no key {key!r}"
    return str(data[key])


def pod_env(docs: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, str]:
    """What the container's process sees: the image's ENV, then the pod's (Secret references resolved)."""
    env = dict(IMAGE.env) if container["image"].startswith("ctxproxy:") else {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = str(var["value"])
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = secret_value(docs, ref["name"], ref["key"])
    return env


def mounted_config(docs: list[dict[str, Any]], pod: dict[str, Any], container: dict[str, Any],
                   env: dict[str, str]) -> str:
    """The text at $CTXPROXY_CONFIG, as the pod's ConfigMap volume puts it there."""
    path = env["CTXPROXY_CONFIG"]
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == posixpath.dirname(path))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    data = named(docs, "ConfigMap", volume["configMap"]["name"])["data"]
    return str(data[posixpath.basename(path)])


def settings_of(setup: str) -> tuple[Settings, dict[str, Any], dict[str, Any], dict[str, str]]:
    docs = documents(DEPLOY / setup)
    (deployment,) = [d for d in of_kind(docs, "Deployment") if ctxproxy_containers(d["spec"]["template"]["spec"])]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = ctxproxy_containers(pod)
    env = pod_env(docs, container)
    raw = yaml.safe_load(mounted_config(docs, pod, container, env))
    return build_settings(raw, env, source=f"{setup} ConfigMap config.yaml"), pod, container, env


def probe_url(probe: dict[str, Any], container: dict[str, Any]) -> tuple[str, int]:
    """(path, port) an httpGet or exec (`urlopen(...)`) probe reaches."""
    if "httpGet" in probe:
        port = probe["httpGet"]["port"]
        if isinstance(port, str):
            port = next(p["containerPort"] for p in container["ports"] if p.get("name") == port)
        return probe["httpGet"]["path"], int(port)
    m = re.search(r"http://127\.0\.0\.1:(\d+)(/\w+)", " ".join(probe["exec"]["command"]))
    assert m, f"an exec probe that requests no local URL: {probe}"
    return m.group(2), int(m.group(1))


def dockerfile_user() -> int:
    user = IMAGE.user.partition(":")[0]
    assert user.isdigit(), f"USER {IMAGE.user}: numeric, so runAsNonRoot can check it"
    return int(user)


# --------------------------------------------------------------------------- the schemas


def test_the_schemas_are_of_a_current_kubernetes_release() -> None:
    assert SETUPS == ["shared", "sidecar"]
    major, minor = (int(x) for x in kubernetes_validate.latest_version().split(".")[:2])
    assert (major, minor) >= (1, 37)


@pytest.mark.parametrize(("setup", "doc"), ALL, ids=[f"{s}-{d['kind']}-{d['metadata']['name']}" for s, d in ALL])
def test_every_manifest_validates_strictly(setup: str, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_a_misspelled_or_mistyped_field_fails_validation() -> None:
    deployment = named(documents(DEPLOY / "shared"), "Deployment", "ctxproxy")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    misspelled = copy.deepcopy(deployment)
    misspelled["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = container["readinessProbe"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(misspelled, KUBERNETES_VERSION, strict=True)
    mistyped = copy.deepcopy(deployment)
    mistyped["spec"]["replicas"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(mistyped, KUBERNETES_VERSION, strict=True)


# --------------------------------------------------------------------------- what the proxy needs


@pytest.mark.parametrize("setup", SETUPS)
def test_the_configmap_config_loads_with_the_proxys_own_loader(setup: str) -> None:
    settings, pod, container, env = settings_of(setup)
    assert settings.admin_token and settings.admin_token == env["CTXPROXY_ADMIN_TOKEN"]
    assert {p["containerPort"] for p in container["ports"]} == {settings.server.port}
    assert container["image"] == "ctxproxy:" + tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "version"]


def test_the_shared_replicas_use_redis_and_share_the_tenant_salt_from_one_secret() -> None:
    settings, _, container, env = settings_of("shared")
    assert settings.store.startswith(("redis://", "rediss://"))
    docs = documents(DEPLOY / "shared")
    refs = {v["name"]: v["valueFrom"]["secretKeyRef"] for v in container["env"] if "valueFrom" in v}
    assert refs["CTXPROXY_TENANT_SALT"]["name"] == refs["CTXPROXY_STORE"]["name"] == "ctxproxy-shared"
    assert settings.tenant_salt == secret_value(docs, "ctxproxy-shared", "tenant-salt") != "ctxproxy-tenant-v1"
    assert settings.server.host == "0.0.0.0"
    # The Redis beside it (or the managed one in the Secret) is the one the URL names.
    host = urlsplit(settings.store).hostname
    if host == "ctxproxy-redis":
        service = named(docs, "Service", "ctxproxy-redis")
        assert service["spec"]["ports"][0]["port"] == urlsplit(settings.store).port


def test_the_sidecar_agent_talks_to_the_proxy_over_localhost() -> None:
    settings, pod, _, _ = settings_of("sidecar")
    assert settings.server.host == "127.0.0.1"
    (agent,) = [c for c in pod["containers"] if c["name"] == "agent"]
    env = {v["name"]: v.get("value") for v in agent["env"]}
    assert env["OPENAI_BASE_URL"] == f"http://127.0.0.1:{settings.server.port}/v1" == "http://127.0.0.1:8080/v1"
    # A native sidecar: started (and healthy) before the agent, stopped after it.
    (proxy,) = pod["initContainers"]
    assert proxy["restartPolicy"] == "Always" and "startupProbe" in proxy


@pytest.mark.parametrize("setup", SETUPS)
def test_readiness_probes_readyz_and_liveness_healthz_where_the_proxy_listens(setup: str) -> None:
    settings, _, container, _ = settings_of(setup)
    assert probe_url(container["readinessProbe"], container) == ("/readyz", settings.server.port)
    assert probe_url(container["livenessProbe"], container) == ("/healthz", settings.server.port)
    if setup == "shared":  # the kubelet reaches the pod IP: the proxy must listen beyond loopback
        assert "httpGet" in container["readinessProbe"] and settings.server.host == "0.0.0.0"


def test_the_sidecars_sqlite_file_is_on_an_emptydir_mounted_at_data() -> None:
    settings, pod, container, _ = settings_of("sidecar")
    assert settings.store.startswith("sqlite:////data/")
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/data"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert "emptyDir" in volume


@pytest.mark.parametrize("setup", SETUPS)
def test_every_secret_and_configmap_a_pod_names_exists_beside_it(setup: str) -> None:
    docs = documents(DEPLOY / setup)
    for deployment in of_kind(docs, "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        for c in pod.get("initContainers", []) + pod["containers"]:
            for var in c.get("env", []):
                if "valueFrom" in var:
                    ref = var["valueFrom"]["secretKeyRef"]
                    secret_value(docs, ref["name"], ref["key"])
        for volume in pod.get("volumes", []):
            if "configMap" in volume:
                named(docs, "ConfigMap", volume["configMap"]["name"])


@pytest.mark.parametrize("setup", SETUPS)
def test_every_pod_runs_non_root_on_a_read_only_root_with_no_capabilities(setup: str) -> None:
    for deployment in of_kind(documents(DEPLOY / setup), "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        for c in pod.get("initContainers", []) + pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"], c["name"]
            assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"], c["name"]
            if c in ctxproxy_containers(pod):
                assert sc["readOnlyRootFilesystem"] is True
                assert pod["securityContext"]["runAsUser"] == dockerfile_user()
        if ctxproxy_containers(pod):
            assert pod["terminationGracePeriodSeconds"] > DRAIN_SECONDS


def test_the_shared_service_selects_three_replicas_and_its_disruption_budget_keeps_two() -> None:
    docs = documents(DEPLOY / "shared")
    deployment = named(docs, "Deployment", "ctxproxy")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = named(docs, "Service", "ctxproxy")
    assert service["spec"]["selector"].items() <= labels.items()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    names = {p["name"] for p in container["ports"]}
    assert all(p["targetPort"] in names for p in service["spec"]["ports"])
    pdb = named(docs, "PodDisruptionBudget", "ctxproxy")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert deployment["spec"]["replicas"] - pdb["spec"]["maxUnavailable"] >= 2
