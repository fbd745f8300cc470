"""``gpupool cancel --user NAME``: an admin settles a departed user's work (issue 22, item 14).

A deleted Hub user's jobs are not tied to their login and run on; the admin
cancels them in one command. The real CLI against a real scheduler.
"""

from __future__ import annotations

import sys

import pytest

from gpupool.cli import main as cli
from gpupool.client import GpupoolClient

from .servers import EmbeddedThread

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture
def svc(tmp_path):
    srv = EmbeddedThread(tmp_path / "state", simulate="2xA100-80GB", admin_token="admin-t",
                         projects={"vision": {"train_guarantee": 2}},
                         config={"tick_s": 0.2, "poll_s": 0.05, "pause_grace_s": 1.0, "on_shutdown": "stop"})
    admin = GpupoolClient(srv.url, "admin-t")
    srv.tokens = {u: admin.create_token(u)["token"] for u in ("alice", "bob")}
    yield srv
    srv.close()


def _gp(svc, monkeypatch, capsys, token: str, *argv: str) -> tuple[int, str, str]:
    monkeypatch.setenv("GPUPOOL_URL", svc.url)
    monkeypatch.setenv("GPUPOOL_TOKEN", token)
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_an_admin_cancels_every_unfinished_job_of_a_user(svc, monkeypatch, capsys):
    mine = {}
    for user, n in (("alice", 3), ("bob", 1)):
        client = GpupoolClient(svc.url, svc.tokens[user])
        mine[user] = [client.submit({"project": "vision", "gpus": 1, "command": SLEEP})["id"] for _ in range(n)]

    code, out, err = _gp(svc, monkeypatch, capsys, svc.tokens["bob"], "cancel", "--user", "alice")
    assert code == 1 and all(f"{j}: " in err for j in mine["alice"]), err  # not bob's to cancel
    assert "cancelled 0 jobs of alice" in out

    code, out, err = _gp(svc, monkeypatch, capsys, "admin-t", "cancel", "--user", "alice")
    assert code == 0, err
    assert out.splitlines()[-1] == "cancelled 3 jobs of alice"
    admin = GpupoolClient(svc.url, "admin-t")
    assert {admin.job(j)["state"] for j in mine["alice"]} == {"cancelled"}
    assert admin.job(mine["bob"][0])["state"] in ("queued", "running")

    code, out, _ = _gp(svc, monkeypatch, capsys, "admin-t", "cancel", "--user", "alice")
    assert code == 0 and out.strip() == "alice has no queued, running or paused job"
    code, _, err = _gp(svc, monkeypatch, capsys, "admin-t", "cancel")
    assert code == 2 and "one of the arguments job --user is required" in err
