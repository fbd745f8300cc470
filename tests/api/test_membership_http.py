"""Project membership over HTTP: the admin sets members with PUT, a submit outside one's projects is a 403."""

from __future__ import annotations

import sys

from gpupool.client import GpupoolClient

from .servers import EmbeddedThread, http

JOB = {"project": "vision", "gpus": 1, "command": [sys.executable, "-c", "pass"]}


def test_members_set_by_put_decide_who_submits(tmp_path):
    srv = EmbeddedThread(tmp_path / "state", simulate="2xA100-80GB", admin_token="admin-t",
                         projects={"vision": {"train_guarantee": 1}})
    try:
        admin = GpupoolClient(srv.url, "admin-t")
        alice, bob = (admin.create_token(u)["token"] for u in ("alice", "bob"))
        status, body = http("PUT", srv.url + "/api/v1/projects/vision", token=alice, body={"members": ["alice"]})
        assert status == 403
        status, body = http("PUT", srv.url + "/api/v1/projects/vision", token="admin-t",
                            body={"members": ["alice", "@ml"]})
        assert status == 200 and body["members"] == ["@ml", "alice"]
        status, body = http("POST", srv.url + "/api/v1/jobs", token=bob, body=JOB)
        assert status == 403 and "not a member of project 'vision'" in body["error"]
        status, body = http("POST", srv.url + "/api/v1/jobs", token=alice, body=JOB)
        assert status == 201
        status, projects = http("GET", srv.url + "/api/v1/projects", token=bob)
        assert status == 200 and [(p["name"], p["member"]) for p in projects] == [("vision", False)]
        status, body = http("PUT", srv.url + "/api/v1/projects/vision", token="admin-t", body={"members": "alice"})
        assert status == 400 and "members" in body["error"] and "must be a list" in body["error"]
        status, body = http("PUT", srv.url + "/api/v1/projects/vision", token="admin-t", body={"members": None})
        assert status == 200 and body["members"] is None
        assert http("POST", srv.url + "/api/v1/jobs", token=bob, body=JOB)[0] == 201
    finally:
        srv.close()


def test_cli_sets_members_and_a_non_member_is_told(tmp_path):
    from .servers import cli_env, gpupool

    srv = EmbeddedThread(tmp_path / "state", simulate="2xA100-80GB", admin_token="admin-t",
                         projects={"vision": {"train_guarantee": 1}})
    try:
        bob = GpupoolClient(srv.url, "admin-t").create_token("bob")["token"]
        admin_env, bob_env = cli_env(srv.url, "admin-t", tmp_path), cli_env(srv.url, bob, tmp_path)
        out = gpupool(["projects", "set", "vision", "--members", "alice, @ml-team"], admin_env)
        assert out.returncode == 0 and "@ml-team, alice" in out.stdout, out.stderr
        out = gpupool(["projects"], bob_env)
        assert "@ml-team, alice (not you)" in out.stdout
        out = gpupool(["submit", "--project", "vision", "--gpus", "1", "--", "true"], bob_env)
        assert out.returncode == 1 and "bob is not a member of project 'vision'" in out.stderr
        out = gpupool(["projects", "set", "vision", "--open"], admin_env)
        assert out.returncode == 0 and "everyone" in out.stdout
        out = gpupool(["submit", "--project", "vision", "--gpus", "1", "--", "true"], bob_env)
        assert out.returncode == 0, out.stderr
        out = gpupool(["projects", "set", "vision", "--members", "bad name"], admin_env)
        assert out.returncode == 1 and "member 'bad name'" in out.stderr
    finally:
        srv.close()
