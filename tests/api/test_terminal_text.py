"""Other users' text never acts on a terminal (issue 22, item 5).

A job named ``"\\x1b]0;pwned\\x07\\x1b[2J\\x1b[31mEVIL"`` set another user's
window title and cleared their screen in ``gpupool list`` and ``describe``.
The service now refuses control characters, line separators and bidi marks
in the fields users set for others to read (name, labels, client_key,
gpu_model) with a 400 naming the field, and the CLI escapes them in whatever
it prints, since rows stored before the rule (or reasons from elsewhere)
never went through it.
"""

from __future__ import annotations

import time

import pytest

from gpupool.client import GpupoolClient
from gpupool.service.store import JobRecord

from .servers import EmbeddedThread, cli_env, gpupool, http

EVIL = "\x1b]0;pwned\x07\x1b[2J\x1b[31mEVIL"
SLEEP = ["sleep", "60"]


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    root = tmp_path_factory.mktemp("terminal")
    srv = EmbeddedThread(root / "state", simulate="2xA100-80GB", admin_token="admin-t",
                         projects={"vision": {"train_guarantee": 1}},
                         config={"tick_s": 0.2, "poll_s": 0.05, "on_shutdown": "stop"})
    srv.alice = GpupoolClient(srv.url, "admin-t").create_token("alice")["token"]
    srv.bob = GpupoolClient(srv.url, "admin-t").create_token("bob")["token"]
    srv.home = root
    yield srv
    srv.close()


@pytest.mark.parametrize(("extra", "field"), [
    ({"name": EVIL}, "name"),
    ({"name": "ok\u202egnp.exe"}, "name"),  # a right-to-left override reorders what the reader sees
    ({"name": "two\u2028lines"}, "name"),
    ({"name": "c1 \x9b2J"}, "name"),  # the one-byte CSI of C1
    ({"labels": {"note": EVIL}}, "labels.note"),
    ({"labels": {"a\x1b[2Jb": "x"}}, "labels"),
    ({"client_key": "k\x1b[2J"}, "client_key"),
    ({"gpu_model": "A100\x1b[2J"}, "gpu_model"),
])
def test_submit_refuses_control_characters_naming_the_field(svc, extra, field):
    spec = {"project": "vision", "gpus": 1, "command": SLEEP, **extra}
    status, reply = http("POST", svc.url + "/api/v1/jobs", token=svc.alice, body=spec)
    assert status == 400, reply
    message = reply["error"]
    assert message.startswith(f"invalid job spec: {field}"), message
    assert "must not contain control characters" in message
    assert "\x1b" not in message and "\u202e" not in message  # the refusal itself shows them escaped
    listed = GpupoolClient(svc.url, "admin-t").jobs(state="queued,running,paused")
    assert all(j["name"] != extra.get("name") for j in listed)


def test_the_core_refuses_them_too_whoever_calls(svc):
    """A caller that is not the HTTP API gets the same check and the same sentence: both are the wire model's."""
    from gpupool.service.actor import Actor
    from gpupool.wire.errors import InvalidRequest

    async def submit() -> None:
        await svc.core.submit(Actor("alice", False), {"project": "vision", "gpus": 1, "command": SLEEP,
                                                       "labels": {"note": EVIL}})

    with pytest.raises(InvalidRequest, match=r"^invalid job spec: labels\.note: the value must not contain control characters"):
        svc.loops.run(submit())


def test_plain_unicode_names_and_labels_are_accepted(svc):
    spec = {"project": "vision", "gpus": 1, "command": SLEEP, "name": "entraînement 日本語 🚀",
            "labels": {"équipe": "vision — α"}}
    status, job = http("POST", svc.url + "/api/v1/jobs", token=svc.alice, body=spec)
    assert status == 201, job
    assert job["name"] == "entraînement 日本語 🚀"
    GpupoolClient(svc.url, svc.alice).cancel(job["id"])


def _insert(svc, **fields) -> str:
    """A job stored through the core, past validation: what a row from before the rule looks like."""
    def make(job_id: str, num: int) -> JobRecord:
        return JobRecord(id=job_id, num=num, project="vision", user="bob", kind="train", request={"gpus": 1},
                         submitted_at=time.time(), command=["sleep", "60"], **fields)

    return svc.loops.call(lambda: svc.core.book.insert_new_job(make).id)


def test_list_and_describe_print_another_users_stored_text_escaped(svc):
    job_id = _insert(svc, name=EVIL, state="paused", user_paused=True, reason="paused by bob\x1b[2J",
                     labels={"note\x1b[31m": "x\u202ey"}, workdir="/tmp/\x1b]0;t\x07")
    finished = _insert(svc, name="done", state="failed", reason="pod said \x1b[2J\x9b2J", finished_at=time.time())
    env = cli_env(svc.url, svc.alice, svc.home)  # alice reads bob's jobs

    listed = gpupool(["list", "--all"], env)
    assert listed.returncode == 0, listed.stderr
    assert not any(c in listed.stdout for c in "\x1b\x07\x9b\u202e"), repr(listed.stdout)
    row = next(line for line in listed.stdout.splitlines() if line.startswith(job_id))
    assert "\\x1b]0;pwned\\x07" in row  # clipped to the column, but escaped
    done_row = next(line for line in listed.stdout.splitlines() if line.startswith(finished))
    assert "pod said \\x1b[2J\\x9b2J" in done_row

    shown = gpupool(["describe", job_id], env)
    assert shown.returncode == 0, shown.stderr
    assert not any(c in shown.stdout for c in "\x1b\x07\x9b\u202e"), repr(shown.stdout)
    lines = dict(line.split(":", 1) for line in shown.stdout.splitlines() if ":" in line)
    assert lines["name"].strip() == "\\x1b]0;pwned\\x07\\x1b[2J\\x1b[31mEVIL"
    assert lines["reason"].strip() == "paused by bob\\x1b[2J"
    assert '"note\\u001b[31m": "x\\u202ey"' in lines["labels"]  # JSON's own escapes
    assert lines["workdir"].strip() == "/tmp/\\x1b]0;t\\x07"

    # --json stays exact JSON (escaped by the encoder), so scripts read the stored text back unchanged.
    import json

    as_json = gpupool(["describe", job_id, "--json"], env)
    assert "\x1b" not in as_json.stdout and json.loads(as_json.stdout)["name"] == EVIL
    GpupoolClient(svc.url, "admin-t").cancel(job_id)


def test_events_and_refusals_print_escaped(svc):
    job_id = _insert(svc, name=EVIL, state="paused", user_paused=True, reason="held\x1b[2J")
    env = cli_env(svc.url, svc.alice, svc.home)
    events = gpupool(["events"], env)
    assert events.returncode == 0 and "\x1b" not in events.stdout
    # a refusal quoting the refused text comes back escaped too
    refused = gpupool(["submit", "--project", "vision", "--gpus", "1", "--name", EVIL, "--", *SLEEP], env)
    assert refused.returncode == 1
    assert "\x1b" not in refused.stderr and "name must not contain control characters" in refused.stderr
    GpupoolClient(svc.url, "admin-t").cancel(job_id)
