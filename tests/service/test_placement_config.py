"""Placement rules set per pool and per project (kube_pool_placement, kube_project_placement), combined
with a job's own at submit (issue 24, item 2)."""

from __future__ import annotations

import pytest

from gpupool.service.config import ServiceConfig
from gpupool.service.placement_config import check_placement_settings, with_settings
from gpupool.wire.errors import InvalidRequest

TOL = {"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoSchedule"}
H100 = [{"key": "gpu", "operator": "In", "values": ["h100"]}]
ZONE = [{"key": "zone", "operator": "In", "values": ["a"]}]


def test_pool_project_and_job_rules_all_hold():
    pools = {"train": {"tolerations": [TOL]}}
    projects = {"vision": {"node_selector": {"team": "vision"}, "node_affinity": {"required": [H100]}}}
    got = with_settings({"node_selector": {"disk": "ssd"}, "node_affinity": {"required": [ZONE]}}, pools, projects,
                        "train", "vision")
    assert got == {"node_selector": {"disk": "ssd", "team": "vision"},
                   "node_affinity": {"required": [[*H100, *ZONE]]},  # both must hold: their terms crossed
                   "tolerations": [{**TOL}]}
    assert with_settings({}, pools, projects, "build", "nlp") == {}  # the train pool's rules are not the build's
    assert with_settings({"tolerations": [TOL]}, pools, {}, "train", "x") == {"tolerations": [TOL]}


def test_a_job_selector_that_contradicts_its_projects_is_refused():
    with pytest.raises(InvalidRequest, match="no node could match both"):
        with_settings({"node_selector": {"team": "nlp"}}, {}, {"vision": {"node_selector": {"team": "vision"}}},
                      "train", "vision")


def test_settings_are_checked_when_the_service_starts(tmp_path):
    check_placement_settings({"train": {"tolerations": [TOL]}}, {"vision": {"node_selector": {"a": "b"}}})
    with pytest.raises(InvalidRequest, match="not a pool"):
        check_placement_settings({"gpu": {}}, {})
    with pytest.raises(InvalidRequest, match="must hold only"):
        check_placement_settings({}, {"vision": {"gpus": 1}})
    with pytest.raises(InvalidRequest, match="kube_project_placement.vision: .*needs at least one value"):
        check_placement_settings({}, {"vision": {"node_affinity": {"required": [[{"key": "a", "operator": "In"}]]}}})
    with pytest.raises(InvalidRequest, match="for the kubernetes backend"):
        ServiceConfig(state_dir=tmp_path, kube_pool_placement={"train": {"tolerations": [TOL]}})
