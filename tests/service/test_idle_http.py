"""Idle settings over HTTP: the admin sets them with PUT /projects/{name}; a bad one is a 400 naming the field."""

from __future__ import annotations

from gpupool.client import GpupoolClient
from tests.api.servers import EmbeddedThread, http


def test_the_admin_sets_idle_rules_and_bad_ones_are_400s(tmp_path):
    srv = EmbeddedThread(tmp_path / "state", simulate="2xA100-80GB", admin_token="admin-t",
                         projects={"vision": {"train_guarantee": 1}})
    try:
        alice = GpupoolClient(srv.url, "admin-t").create_token("alice")["token"]
        url = srv.url + "/api/v1/projects/vision"
        status, body = http("PUT", url, token=alice, body={"idle": {"train": {"action": "pause"}}})
        assert status == 403 and "only an admin may change projects" in body["error"]
        status, body = http("PUT", url, token="admin-t",
                            body={"idle": {"train": {"action": "pause", "window_s": 7200}}})
        assert status == 200, body
        assert body["idle"]["train"] == {"below_percent": 5.0, "window_s": 7200.0, "action": "pause"}
        status, projects = http("GET", srv.url + "/api/v1/projects", token=alice)
        assert status == 200 and projects[0]["idle"]["train"]["action"] == "pause"  # users see the rules
        for value, named in (({"train": {"action": "cull"}}, "idle.train.action"),
                             ({"build": {"window_s": 0}}, "idle.build.window_s"),
                             ({"build": {"below_percent": 101}}, "idle.build.below_percent"),
                             ({"nightly": {}}, "unknown field"), (5, "idle")):
            status, body = http("PUT", url, token="admin-t", body={"idle": value})
            assert status == 400 and named in body["error"], (value, status, body)
            assert "below_percent" in body["error"] or "unknown field" in body["error"]
        status, body = http("GET", srv.url + "/api/v1/projects", token="admin-t")
        assert body[0]["idle"]["train"]["window_s"] == 7200.0  # refusals changed nothing
    finally:
        srv.close()
