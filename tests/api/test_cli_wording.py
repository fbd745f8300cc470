"""What the `gpupool` CLI says, run against a real scheduler (issue 22, item 13).

Each test drives the real CLI (``gpupool.cli.main.main``) against an embedded
scheduler (the real core and HTTP API) and checks the words a user reads.
"""

from __future__ import annotations

import json
import sys

import pytest

from gpupool.cli import main as cli
from gpupool.client import GpupoolClient

from .servers import EmbeddedThread, wait_until

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]
SETTINGS = {"tick_s": 0.2, "poll_s": 0.05, "pause_grace_s": 2.0, "min_runtime_s": 0.0, "resume_backoff_s": 0.0,
            "on_shutdown": "stop"}


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    root = tmp_path_factory.mktemp("wording")
    srv = EmbeddedThread(root / "state", simulate="4xA100-80GB", admin_token="admin-t",
                         projects={"vision": {"train_guarantee": 1}}, config=SETTINGS)
    srv.alice = GpupoolClient(srv.url, "admin-t").create_token("alice")["token"]
    yield srv
    admin = GpupoolClient(srv.url, "admin-t")
    for job in admin.jobs(state="queued,running,paused"):
        admin.cancel(job["id"])
    srv.close()


@pytest.fixture
def gp(svc, monkeypatch, tmp_path, capsys):
    """``gp(*argv, token=...)`` -> (exit, stdout, stderr) of the real CLI against the service (alice by default)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GPUPOOL_URL", svc.url)

    def run(*argv: str, token: str | None = None) -> tuple[int, str, str]:
        monkeypatch.setenv("GPUPOOL_TOKEN", token or svc.alice)
        code = cli.main(list(argv))
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


def _submit(gp, *options: str) -> str:
    code, out, err = gp("submit", "--project", "vision", *options, "--", *SLEEP)
    assert code == 0, err
    return out.split()[0]


def _wait_state(svc, job_id: str, state: str) -> dict:
    client = GpupoolClient(svc.url, "admin-t")
    return wait_until(lambda: (j := client.job(job_id))["state"] == state and j, what=f"{job_id} {state}")


def _cell(table: str, row: str, column: str) -> str:
    """The cell of a CLI table under ``column`` in the row starting with ``row`` (columns are left-aligned)."""
    header, *rows = table.splitlines()
    line = next(r for r in rows if r.split()[0] == row)
    start = header.index(column)
    return line[start:].split("  ")[0].strip()


def test_gpu_counts_are_plural_where_more_than_one(svc, gp):
    code, out, err = gp("submit", "--project", "vision", "--gpus", "2", "--", *SLEEP)
    assert code == 0, err
    job_id = out.split()[0]
    assert out.startswith(f"{job_id} queued: 2 GPUs in project vision as alice;"), out
    one = _submit(gp, "--gpus", "1")
    code, out, _ = gp("list")
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert " 2 GPUs " in rows[job_id] and " 1 GPU " in rows[one], out
    assert "2 GPUs" in gp("describe", job_id)[1]
    for j in (job_id, one):
        assert gp("cancel", j)[0] == 0


def test_projects_counts_paused_jobs_apart_from_pending_as_status_does(svc, gp):
    paused = _submit(gp, "--gpus", "1")
    assert gp("pause", paused)[0] == 0
    _wait_state(svc, paused, "paused")
    running = _submit(gp, "--gpus", "1")
    _wait_state(svc, running, "running")
    queued = _submit(gp, "--gpus", "4")  # waits: one of the 4 GPUs is held
    code, out, err = gp("projects")
    assert code == 0, err
    assert _cell(out, "vision", "PENDING") == "1" and _cell(out, "vision", "PAUSED") == "1", out
    status = gp("status")[1]
    assert "1 pending, 1 running, 1 paused" in status, status
    (project,) = [p for p in GpupoolClient(svc.url, svc.alice).projects() if p["name"] == "vision"]
    assert project["pending"] == 1 and project["paused"] == 1
    for j in (paused, running, queued):
        assert gp("cancel", j)[0] == 0


def test_json_and_url_go_before_or_after_the_command(svc, gp, monkeypatch):
    job_id = _submit(gp, "--gpus", "1")
    monkeypatch.setenv("GPUPOOL_URL", "http://127.0.0.1:9")  # nothing there: only --url finds the service
    for argv in (["--json", "describe", job_id, "--url", svc.url], ["describe", job_id, "--json", "--url", svc.url],
                 ["--url", svc.url, "--json", "describe", job_id], ["--json", "--url", svc.url, "describe", job_id]):
        code, out, err = gp(*argv)
        assert code == 0, (argv, err)
        assert json.loads(out)["id"] == job_id, argv
    code, out, err = gp("--json", "list", "--url", svc.url)
    assert code == 0 and job_id in [j["id"] for j in json.loads(out)], err
    code, out, err = gp("--json", "cancel", job_id, "--url", svc.url)
    assert code == 0 and json.loads(out)["state"] == "cancelled", err


def test_resume_of_a_job_that_is_not_paused_says_what_it_is_doing_and_exits_1(svc, gp):
    job_id = _submit(gp, "--gpus", "1")
    _wait_state(svc, job_id, "running")
    code, out, err = gp("resume", job_id)
    assert (code, out) == (1, ""), (code, out, err)
    assert err == f"gpupool: error: job {job_id} is already running; only paused jobs can be resumed\n"
    assert gp("pause", job_id)[0] == 0
    _wait_state(svc, job_id, "paused")
    code, out, err = gp("resume", job_id)  # a paused job resumes as before
    assert code == 0 and out.startswith(f"{job_id} "), err
    assert gp("cancel", job_id)[0] == 0
    code, _, err = gp("resume", job_id)
    assert code == 1 and f"job {job_id} is cancelled; only paused jobs can be resumed" in err


def test_admin_commands_by_a_non_admin_say_how_admins_are_made(svc, gp):
    for argv, what in ((["projects", "set", "vision", "--guarantee", "2"], "change projects"),
                       (["projects", "delete", "vision"], "delete projects"),
                       (["tokens", "create", "carol"], "create tokens")):
        code, out, err = gp(*argv)
        assert (code, out) == (1, ""), (argv, err)
        assert err.startswith(f"gpupool: error: only an admin may {what}, and alice is not one: "), err
        assert "admin token" in err and "Hub admin" in err and "docs/cli.md" in err, err
    vision = [p for p in GpupoolClient(svc.url, svc.alice).projects() if p["name"] == "vision"]
    assert vision and vision[0]["train_guarantee"] == 1  # nothing changed


def test_describe_stops_saying_preemptible_once_the_flag_is_cleared(svc, gp):
    first = _submit(gp, "--gpus", "1")
    _wait_state(svc, first, "running")
    second = _submit(gp, "--gpus", "1")  # beyond vision's guarantee of 1: preemptible
    assert _wait_state(svc, second, "running")["preemptible"] is True
    shown = gp("describe", second)[1]
    assert " as preemptible: " in shown and "preemptible:      True" in shown, shown
    assert gp("cancel", first)[0] == 0  # the second job now runs within the guarantee
    client = GpupoolClient(svc.url, "admin-t")
    wait_until(lambda: client.job(second)["preemptible"] is False, what=f"{second} no longer preemptible")
    code, shown, err = gp("describe", second)
    assert code == 0, err
    assert "as preemptible" not in shown and "preemptible:      False" in shown, shown
    assert "within project vision's guarantee of 1 GPU" in shown and "no longer preemptible" in shown, shown
    assert gp("cancel", second)[0] == 0


def test_describe_of_a_finished_or_paused_job_says_which_gpus_it_ran_on(svc, gp):
    code, out, err = gp("submit", "--project", "vision", "--gpus", "1", "--", sys.executable, "-c", "pass")
    assert code == 0, err
    done = out.split()[0]
    job = _wait_state(svc, done, "succeeded")
    node, gpu = job["ran_on"]["node"], job["ran_on"]["gpus"][0]["index"]  # the node is this host's name
    code, shown, err = gp("describe", done)
    assert code == 0, err
    assert f"ran on:           GPU {gpu} ({node})\n" in shown, shown
    paused = _submit(gp, "--gpus", "2")
    running = _wait_state(svc, paused, "running")
    assert "ran on:" not in gp("describe", paused)[1]  # running: its assignment says where
    assert gp("pause", paused)[0] == 0
    _wait_state(svc, paused, "paused")
    indexes = ", ".join(str(g["index"]) for g in running["assignment"]["gpus"])
    assert f"ran on:           GPUs {indexes} ({node})\n" in gp("describe", paused)[1]
    assert gp("cancel", paused)[0] == 0
