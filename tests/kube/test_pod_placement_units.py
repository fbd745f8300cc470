"""Placement rules between Pod specs, job specs and the policy's nodes (pure; no API server)."""

from __future__ import annotations

import pytest

from gpupool.backends.kubernetes.nodes import read_node
from gpupool.backends.kubernetes.pod_placement import Unsupported, pod_spec_rules, rules_of_pod
from gpupool.policy.node_rules import Expr, NodeRules, Taint, Toleration
from gpupool.service.placement_rules import rules_of
from gpupool.wire.errors import InvalidRequest
from gpupool.wire.placement import check_placement, placement_of
from gpupool.wire.schemas import validate

AFFINITY = {"nodeAffinity": {
    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100", "a100"]}]},
        {"matchExpressions": [{"key": "mem", "operator": "Gt", "values": ["64"]}]}]},
    "preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 20, "preference": {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}}]}}


def node_json(taints: list[dict[str, str]]) -> dict:
    return {"metadata": {"name": "n1", "labels": {"gpu": "h100", "nvidia.com/gpu.product": "NVIDIA-H100"}},
            "spec": {"taints": taints},
            "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def test_a_node_brings_its_labels_and_the_taints_jobs_must_tolerate():
    pn = read_node(node_json([{"key": "dedicated", "value": "inference", "effect": "NoSchedule"},
                              {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                              {"key": "spot", "effect": "PreferNoSchedule"}]))
    assert pn is not None and not pn.problem
    node = pn.policy_node()
    assert ("gpu", "h100") in node.labels
    assert node.taints == (Taint("dedicated", "inference", "NoSchedule"), Taint("spot", "", "PreferNoSchedule"))


def test_a_pods_rules_become_job_spec_fields_the_wire_model_accepts_and_the_policy_reads():
    pod = {"metadata": {"name": "p"}, "spec": {
        "nodeSelector": {"example.com/gpu": "h100"}, "affinity": AFFINITY,
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"},
                        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                         "tolerationSeconds": 300}]}}
    fields = rules_of_pod(pod)
    spec = {"project": "p", "command": ["x"], **fields}
    validate("JobSpec", spec, "job spec")
    check_placement(spec)
    stored = placement_of(spec)
    rules = rules_of(stored)
    assert rules == NodeRules(
        selector=(("example.com/gpu", "h100"),),
        required=((Expr("gpu", "In", ("h100", "a100")),), (Expr("mem", "Gt", ("64",)),)),
        tolerations=(Toleration("dedicated", "Equal", "inference", "NoSchedule"),
                     Toleration("node.kubernetes.io/not-ready", "Exists", "", "NoExecute")),
        preferred=((20, (Expr("zone", "Exists"),)),))
    # and back into a pod of ours: the same rules
    back = pod_spec_rules(stored)
    assert back["nodeSelector"] == pod["spec"]["nodeSelector"]
    assert back["affinity"] == AFFINITY
    assert back["tolerations"][0] == pod["spec"]["tolerations"][0]
    assert rules_of({"gpus": 1}) is None


def test_rules_gpupool_cannot_honour_are_said():
    with pytest.raises(Unsupported, match="matchFields"):
        rules_of_pod({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}]}}}}})


@pytest.mark.parametrize(("fields", "message"), [
    ({"node_selector": {"bad key!": "x"}}, "node_selector must map label keys"),
    ({"node_selector": {"gpu": "x" * 64}}, "node_selector must map label keys"),
    ({"tolerations": [{"key": "a", "operator": "Maybe"}]}, "tolerations must be a list"),
    ({"tolerations": [{"operator": "Equal", "value": "x"}]}, "without a key must use operator Exists"),
    ({"node_affinity": {"required": [[{"key": "gpu", "operator": "In"}]]}}, "gpu In needs at least one value"),
    ({"node_affinity": {"required": [[{"key": "gpu", "operator": "Exists", "values": ["a"]}]]}}, "takes no values"),
    ({"node_affinity": {"required": [[]]}}, "node_affinity must be"),
    ({"node_affinity": {"preferred": [{"weight": 101, "match": [{"key": "a", "operator": "Exists"}]}]}},
     "node_affinity must be"),
])
def test_bad_placement_fields_are_refused_with_their_rule(fields, message):
    spec = {"project": "p", "command": ["x"], **fields}
    with pytest.raises(InvalidRequest, match=message):
        validate("JobSpec", spec, "job spec")
        check_placement(spec)


def test_every_replica_pod_of_a_gang_carries_the_jobs_rules():
    from gpupool.backends.base import Launch, ReplicaLaunch
    from gpupool.backends.kubernetes.gang_pods import replica_manifests
    from gpupool.backends.kubernetes.pods import PodSettings, pod_manifest

    placement = {"node_selector": {"gpu": "h100"},
                 "tolerations": [{"key": "dedicated", "operator": "Exists", "value": "", "effect": "NoSchedule"}]}
    replicas = tuple(ReplicaLaunch(r, f"n{r}", {}, {"node": f"n{r}", "gpus": []}) for r in range(2))
    launch = Launch("j-000001", 1, ["python", "x.py"], "", "alice", "vision", placement=placement, replicas=replicas)
    settings = PodSettings(namespace="gpupool", image="busybox")
    for _, _, _, manifest in replica_manifests(launch, settings):
        assert manifest["spec"]["nodeSelector"] == {"gpu": "h100"}
        assert manifest["spec"]["tolerations"][1:] == [{"key": "dedicated", "operator": "Exists",
                                                        "effect": "NoSchedule"}]
    plain = pod_manifest(Launch("j-000002", 1, ["x"], "", "alice", "vision"), settings)["spec"]
    assert "nodeSelector" not in plain and "affinity" not in plain and len(plain["tolerations"]) == 1
