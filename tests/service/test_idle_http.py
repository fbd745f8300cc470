"""Idle settings over HTTP: the admin sets them with PUT /projects/{name}; a bad one is a 400 naming the field."""

from __future__ import annotations

import json
import sys

from gpupool.client import GpupoolClient
from tests.api.servers import EmbeddedThread, cli_env, gpupool, http, wait_until


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


IDLE_JOB = "import time, gpupool; gpupool.sim_use(busy=0.0); time.sleep(60)"


def test_the_cli_sets_rules_and_shows_idle_jobs_in_every_view(tmp_path):
    """`gpupool projects set --idle`, then `gpupool list`, `status` and `describe` as a user reads them."""
    srv = EmbeddedThread(tmp_path / "state", simulate="2xA100-80GB", admin_token="admin-t",
                         projects={"vision": {"train_guarantee": 1, "idle": {"build": {"below_percent": 2}}}},
                         config={"tick_s": 0.2, "history_interval_s": 0.2})
    try:
        alice = GpupoolClient(srv.url, "admin-t").create_token("alice")["token"]
        admin_env, alice_env = cli_env(srv.url, "admin-t", tmp_path), cli_env(srv.url, alice, tmp_path)
        out = gpupool(["projects"], alice_env)  # the project was created with its rule (the quota config)
        assert out.returncode == 0 and "vision: build: cull below 2% for 30 min; train: off" in out.stdout, out
        out = gpupool(["projects", "set", "vision", "--idle", "train=flag,window=1s,below=10%"], admin_env)
        assert out.returncode == 0, out.stderr
        assert "vision: build: cull below 2% for 30 min; train: flag below 10% for 1 s" in out.stdout
        refused = gpupool(["projects", "set", "vision", "--idle", "train=cull"], admin_env)
        assert refused.returncode == 1 and "idle.train.action" in refused.stderr, refused
        refused = gpupool(["projects", "set", "vision", "--idle", "gpu=flag"], admin_env)
        assert refused.returncode == 2 and "starts with build or train" in refused.stderr, refused

        out = gpupool(["submit", "--project", "vision", "--gpus", "1", "--json", "--", sys.executable, "-c",
                       IDLE_JOB], alice_env)
        assert out.returncode == 0, out.stderr
        job_id = json.loads(out.stdout)["id"]
        wait_until(lambda: "running idle" in gpupool(["list"], alice_env).stdout, timeout=30,
                   what="the job flagged idle in gpupool list")
        listed = gpupool(["list"], alice_env).stdout
        assert "(idle: its GPU share has been used below its project's idle threshold" in listed
        assert "1 running (1 idle)" in gpupool(["status"], alice_env).stdout
        described = gpupool(["describe", job_id], alice_env).stdout
        assert "idle_since:" in described and "idle_action:      flag" in described
        assert gpupool(["cancel", job_id], alice_env).returncode == 0
        assert "while idle since" in json.loads(gpupool(["describe", job_id, "--json"], alice_env).stdout)["reason"]
    finally:
        srv.close()
