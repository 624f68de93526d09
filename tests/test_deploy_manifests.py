"""deploy/kubernetes/: every manifest validates against the Kubernetes API schemas shipped by
`kubernetes-validate` (strict: no unknown fields), and they say what issue 21 asks (probes on
/readyz and /healthz, a grace period above the drain timeout, a headless recognizer Service,
a GPU per replica, HPAs on the metrics the servers export)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

kv = pytest.importorskip("kubernetes_validate")

K8S_VERSION = "1.33.0"  # the version the manifests are documented for (docs/deploying.md)
DIR = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes"


def documents() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(DIR.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        out += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return out


def find(kind: str, name: str) -> dict:
    return next(d for _, d in documents() if d["kind"] == kind and d["metadata"]["name"] == name)


def test_every_manifest_validates_strictly():
    docs = documents()
    assert len(docs) >= 10
    for file, doc in docs:
        kv.validate(doc, K8S_VERSION, strict=True)  # raises ValidationError naming the field


def test_kustomization_lists_every_manifest():
    kust = yaml.safe_load((DIR / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == sorted(p.name for p in DIR.glob("*.yaml") if p.name != "kustomization.yaml")


def drain_timeout(args: list[str]) -> float:
    return float(args[args.index("--drain-timeout") + 1])


@pytest.mark.parametrize("name", ["duplex-agent", "duplex-asr"])
def test_probes_and_grace_period_above_the_drain(name):
    spec = find("Deployment", name)["spec"]["template"]["spec"]
    c = spec["containers"][0]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert spec["terminationGracePeriodSeconds"] > drain_timeout(c["args"])
    assert find("PodDisruptionBudget", name)


def test_recognizers_on_gpus_behind_a_headless_service_the_agents_use():
    asr = find("Deployment", "duplex-asr")["spec"]["template"]["spec"]["containers"][0]
    assert asr["args"][0] == "asr-serve" and asr["resources"]["limits"]["nvidia.com/gpu"] == 1
    svc = find("Service", "duplex-asr")["spec"]
    assert svc["clusterIP"] == "None" and not svc.get("publishNotReadyAddresses", False)
    agent = find("Deployment", "duplex-agent")["spec"]["template"]["spec"]["containers"][0]
    port = svc["ports"][0]["port"]
    assert agent["args"][agent["args"].index("--asr") + 1] == f"ws://duplex-asr:{port}"


def test_autoscalers_use_metrics_the_servers_export():
    from asr.serving.server import AsrServer

    agent_hpa = find("HorizontalPodAutoscaler", "duplex-agent")["spec"]["metrics"][0]["pods"]["metric"]["name"]
    asr_hpa = find("HorizontalPodAutoscaler", "duplex-asr")["spec"]["metrics"][0]["pods"]["metric"]["name"]
    rules = yaml.safe_load(find("ConfigMap", "prometheus-adapter-duplex")["data"]["config.yaml"])["rules"]
    exposed = {r["name"]["as"]: r for r in rules}
    assert {agent_hpa, asr_hpa} <= set(exposed)
    series = {re.match(r"\w+", r["seriesQuery"]).group(0) for r in rules}

    class Rec:
        batch_size, sessions, name = 2, [], "x"

    from prometheus_client import generate_latest

    asr_names = generate_latest(AsrServer(Rec()).metrics.registry).decode()
    assert "duplex_asr_slots_free" in series and "duplex_asr_slots_free " in asr_names
    assert "duplex_asr_slots " in asr_names
    assert "duplex_sessions_active" in series
    assert "duplex_sessions_active" in (Path(__file__).resolve().parent.parent / "agent" / "serving" / "metrics.py").read_text()
