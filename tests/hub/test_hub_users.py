"""JupyterHub users on one shared `gpupool serve`, with their Hub tokens (a real Hub on loopback).

The Hub (tests/hub/conftest.py) has alice and carol in group ``vision``, bob
in ``nlp``, dave in no group, and hubadmin as its admin; gpupool runs as its
managed service with one simulated GPU, so two ¼ GPU shares can only add up on
the same GPU.
"""

from __future__ import annotations

from typing import Any

from tests.api.servers import cli_env, gpupool, wait_until
from tests.hub.conftest import Hub

TRAIN = {"kind": "train", "command": ["sleep", "60"], "gpu_fraction": 0.25}


def _projects(hub: Hub, user: str) -> dict[str, Any]:
    status, reply = hub.gp("GET", "/projects", user)
    assert status == 200, reply
    return {p["name"]: p for p in reply}


def test_hub_users_are_scheduler_users_with_their_groups_as_projects(hub: Hub) -> None:
    assert hub.gp("GET", "/whoami", "alice") == (200, {"user": "alice", "admin": False, "project": "vision"})
    assert hub.gp("GET", "/whoami", "bob") == (200, {"user": "bob", "admin": False, "project": "nlp"})
    # the Hub's admin is the scheduler's admin
    assert hub.gp("GET", "/whoami", "hubadmin")[1]["admin"] is True
    # each sees which projects are theirs: their group's, not the other's
    mine = _projects(hub, "alice")
    assert mine["vision"]["member"] is True and mine["vision"]["members"] == ["@vision"]
    assert _projects(hub, "bob")["nlp"]["member"] is True
    assert _projects(hub, "bob")["vision"]["member"] is False
    assert _projects(hub, "alice")["nlp"]["member"] is False
    # gpupool's own tokens keep working next to the Hub's
    status, who = hub.gp("GET", "/whoami", token=hub.gpupool_admin_token)
    assert status == 200 and who["admin"] is True
    status, made = hub.gp("POST", "/tokens", token=hub.gpupool_admin_token, body={"user": "erin"})
    assert status == 201
    assert hub.gp("GET", "/whoami", token=made["token"]) == (200, {"user": "erin", "admin": False})
    # a token neither knows: 401
    status, reply = hub.gp("GET", "/whoami", token="not-a-token")
    assert status == 401 and reply["error"] == "invalid token"


def test_admin_sets_quotas_and_both_users_share_the_one_gpu(hub: Hub) -> None:
    _projects(hub, "alice"), _projects(hub, "bob")  # their first requests make their groups' projects
    # quotas stay gpupool's: only an admin (the Hub's) sets them
    status, reply = hub.gp("PUT", "/projects/vision", "alice", body={"build_quota": 1})
    assert status == 403, reply
    for name in ("vision", "nlp"):
        status, reply = hub.gp("PUT", f"/projects/{name}", "hubadmin", body={"build_quota": 0.5})
        assert status == 200 and reply["build_quota"] == 0.5 and reply["members"] == [f"@{name}"]
    shares = {}
    for user, project in (("alice", "vision"), ("bob", "nlp")):
        status, job = hub.gp("POST", "/jobs", user, body={"project": project, "kind": "build", "gpu_fraction": 0.25})
        assert status == 201 and job["state"] == "running" and job["user"] == user, job
        shares[user] = job
    gpus = {g["id"] for job in shares.values() for g in job["assignment"]["gpus"]}
    assert len(gpus) == 1  # one pool: both quarters on the same GPU
    status, pool = hub.gp("GET", "/pool", "alice")
    held = {g["id"]: g for node in pool["nodes"] for g in node["gpus"]}[gpus.pop()]
    assert held["allocated"] == 0.5
    assert sorted((a["user"], a["project"], a["fraction"]) for a in held["allocations"]) == [
        ("alice", "vision", 0.25), ("bob", "nlp", 0.25)]
    # a user cannot put work into a project that is not theirs
    status, reply = hub.gp("POST", "/jobs", "alice", body={"project": "nlp", "kind": "build", "gpu_fraction": 0.25})
    assert status == 403 and "not a member of project 'nlp'" in reply["error"]
    for user, job in shares.items():
        assert hub.gp("POST", f"/jobs/{job['id']}/cancel", user)[0] == 200


def test_one_user_cannot_pause_anothers_job(hub: Hub) -> None:
    status, job = hub.gp("POST", "/jobs", "alice", body={"project": "vision", **TRAIN})
    assert status == 201, job
    status, reply = hub.gp("POST", f"/jobs/{job['id']}/pause", "bob")
    assert status == 403 and "only alice (the owner) or an admin" in reply["error"]
    status, reply = hub.gp("POST", f"/jobs/{job['id']}/cancel", "bob")
    assert status == 403
    # carol shares alice's group, not her jobs
    assert hub.gp("POST", f"/jobs/{job['id']}/pause", "carol")[0] == 403
    status, reply = hub.gp("POST", f"/jobs/{job['id']}/cancel", "alice")
    assert status == 200 and reply["state"] in ("cancelled", "running"), reply


def test_a_user_removed_from_a_group_loses_its_project(hub: Hub) -> None:
    build = {"project": "vision", "kind": "build", "gpu_fraction": 0.25}
    status, job = hub.gp("POST", "/jobs", "carol", body=build)
    assert status in (201, 409), job  # 409: the build quota is a test above's; membership is the point
    if status == 201:
        hub.gp("POST", f"/jobs/{job['id']}/cancel", "carol")
    status, reply = hub.call("DELETE", "/groups/vision/users", {"users": ["carol"]})
    assert status == 200, reply

    def refused() -> bool:
        return hub.gp("POST", "/jobs", "carol", body=build)[0] == 403

    wait_until(refused, timeout=10, interval=0.3, what="carol's Hub groups to be read again")
    assert _projects(hub, "carol")["vision"]["member"] is False
    # in no group now: her default is her personal project (personal projects are on here)
    assert hub.gp("GET", "/whoami", "carol")[1] == {"user": "carol", "admin": False, "project": "carol"}
    hub.call("POST", "/groups/vision/users", {"users": ["carol"]})
    wait_until(lambda: _projects(hub, "carol")["vision"]["member"], timeout=10, interval=0.3,
               what="carol back in vision")


def test_a_user_in_no_group_gets_a_personal_project(hub: Hub) -> None:
    status, who = hub.gp("GET", "/whoami", "dave")
    assert who == {"user": "dave", "admin": False, "project": "dave"}
    mine = _projects(hub, "dave")["dave"]
    assert mine["members"] == ["dave"] and mine["build_quota"] == 0.25 and mine["member"] is True
    assert _projects(hub, "alice")["dave"]["member"] is False


def test_tokens_that_may_not_use_the_pool_are_refused(hub: Hub) -> None:
    # a token alice made for something narrower does not reach the GPUs
    narrow = hub.token("alice", scopes=["read:users:name!user=alice"])
    status, reply = hub.gp("GET", "/whoami", token=narrow)
    assert status == 403 and "access:services!service=gpupool" in reply["error"]
    # a service's token is not a user's
    status, reply = hub.gp("GET", "/whoami", token=hub.driver_token)
    assert status == 401 and "not of a user" in reply["error"]
    # a Hub user named like the admin token's user would own its jobs
    status, reply = hub.gp("GET", "/whoami", "admin")
    assert status == 403 and "name of this scheduler's admin token" in reply["error"]


def test_the_cli_in_a_hub_server_acts_as_its_user(hub: Hub, tmp_path: Any) -> None:
    # what a terminal in alice's Hub-spawned server has: the Hub's GPUPOOL_URL and her server's Hub token
    env = cli_env(hub.gpupool, None, tmp_path)
    env["JUPYTERHUB_API_TOKEN"] = hub.user_token("alice")
    done = gpupool(["whoami"], env)
    assert done.returncode == 0 and "alice" in done.stdout, done.stderr
    # the token goes only to the scheduler the Hub named, not to a URL given by hand
    done = gpupool(["whoami", "--url", hub.gpupool + "/"], env)
    assert done.returncode != 0 and "alice" not in done.stdout


def test_the_hubs_groups_are_projects_before_any_member_comes(hub: Hub) -> None:
    # robotics has no members yet: only the service's own listing of the Hub's groups can have made it
    def made() -> dict[str, Any]:
        status, projects = hub.gp("GET", "/projects", token=hub.gpupool_admin_token)
        return next((p for p in projects if p["name"] == "robotics"), {})

    robotics = wait_until(made, timeout=20, interval=0.3, what="the robotics group's project")
    assert robotics["members"] == ["@robotics"]
