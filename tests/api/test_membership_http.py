"""Project membership over HTTP: the admin sets members with PUT, a submit outside one's projects is a 403."""

from __future__ import annotations

import sys

from scheduler.client import GpupoolClient

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
        assert status == 400 and "members" in body["error"] and "array" in body["error"]
        status, body = http("PUT", srv.url + "/api/v1/projects/vision", token="admin-t", body={"members": None})
        assert status == 200 and body["members"] is None
        assert http("POST", srv.url + "/api/v1/jobs", token=bob, body=JOB)[0] == 201
    finally:
        srv.close()
