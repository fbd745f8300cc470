"""The /gpupool/api endpoints against an in-memory scheduler: auth, errors, paths, forwarding."""

from __future__ import annotations

import json
import re
from typing import Any

import nbformat
import pytest
from tornado.httpclient import HTTPClientError

from jupyter_gpupool.handlers import ROUTES

SAMPLE_ARGS = {"job_id": "j-000001", "action": "cancel", "name": "me"}


def concrete(pattern: str) -> str:
    """A request path for a route pattern, with sample values for its groups."""
    path = re.sub(r"\(\?P<(\w+)>[^)]*\)", lambda m: SAMPLE_ARGS[m.group(1)], pattern)
    assert "(" not in path, path
    return path


def write_notebook(path: Any, source: str = "x = 1\n", tags: tuple[str, ...] = ("parameters",)) -> None:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["tags"] = list(tags)
    nb.cells = [cell, nbformat.v4.new_code_cell("print(x)")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


async def fetch_json(jp_fetch: Any, *parts: str, **kwargs: Any) -> tuple[int, Any]:
    try:
        reply = await jp_fetch(*parts, **kwargs)
    except HTTPClientError as err:
        assert err.response is not None
        return err.code, json.loads(err.response.body)
    return reply.code, json.loads(reply.body) if reply.body else None


async def test_every_handler_refuses_requests_without_a_token(jp_fetch: Any, fake_pool: Any, gpupool_app: Any) -> None:
    """Walk every route the extension registered; each method must refuse anonymous and bad-token calls."""
    seen = 0
    for pattern, cls in ROUTES:
        path = concrete(pattern)
        for method in ("GET", "POST", "PUT"):
            if getattr(cls, method.lower(), None) is None or method.lower() not in vars(cls):
                continue
            for headers in ({"Authorization": ""}, {"Authorization": "token not-the-token"}):
                body = b"{}" if method in ("POST", "PUT") else None
                with pytest.raises(HTTPClientError) as info:
                    await jp_fetch("gpupool", "api", *path.split("/"), method=method, body=body, headers=headers)
                assert info.value.code in (401, 403), (method, path, info.value.code)
                seen += 1
    assert seen >= 2 * len(ROUTES)
    # and nothing happened on the scheduler side
    assert fake_pool.jobs == {}


async def test_status_adds_identity_and_reports_unreachable_scheduler(jp_fetch: Any, fake_pool: Any) -> None:
    code, status = await fetch_json(jp_fetch, "gpupool", "api", "status")
    assert code == 200
    assert status["me"] == "me" and status["project"] == "me" and status["reachable"] is True
    assert status["simulated"] is True and len(status["pool"]["nodes"][0]["gpus"]) == 4
    fake_pool.down = True
    code, reply = await fetch_json(jp_fetch, "gpupool", "api", "status")
    assert code == 503 and "cannot reach the scheduler" in reply["error"]


async def test_job_actions_are_the_owners(jp_fetch: Any, fake_pool: Any) -> None:
    other = fake_pool.client("bob")
    theirs = await other.submit({"project": "bob", "kind": "train", "command": ["true"], "gpus": 1})
    mine = await fake_pool.client("me").submit({"project": "me", "kind": "train", "command": ["true"], "gpus": 1})
    code, reply = await fetch_json(jp_fetch, "gpupool", "api", "jobs", theirs["id"], "cancel", method="POST", body=b"")
    assert code == 403 and "bob" in reply["error"]
    assert fake_pool.jobs[theirs["id"]]["state"] == "running"
    code, reply = await fetch_json(jp_fetch, "gpupool", "api", "jobs", mine["id"], "pause", method="POST", body=b"")
    assert code == 200 and reply["state"] == "paused"
    code, jobs = await fetch_json(jp_fetch, "gpupool", "api", "jobs", params={"mine": "1"})
    assert [j["id"] for j in jobs] == [mine["id"]]
    code, jobs = await fetch_json(jp_fetch, "gpupool", "api", "jobs")
    assert {j["id"] for j in jobs} == {mine["id"], theirs["id"]}
    code, reply = await fetch_json(jp_fetch, "gpupool", "api", "jobs", "j-999999")
    assert code == 404 and "j-999999" in reply["error"]


async def test_parameters_listed_and_paths_outside_root_refused(
    jp_fetch: Any, fake_pool: Any, jp_root_dir: Any, tmp_path: Any
) -> None:
    write_notebook(jp_root_dir / "nb.ipynb", "lr: float = 0.1  # learning rate\nepochs = 3\n")
    code, reply = await fetch_json(jp_fetch, "gpupool", "api", "parameters", params={"path": "nb.ipynb"})
    assert code == 200
    params = {p["name"]: p for p in reply["parameters"]}
    assert params["lr"]["inferred_type_name"] == "float" and params["lr"]["default"] == "0.1"
    assert params["lr"]["help"] == "learning rate" and params["epochs"]["default"] == "3"

    outside = tmp_path / "outside.ipynb"
    write_notebook(outside)
    (jp_root_dir / "link.ipynb").symlink_to(outside)
    for bad in ("../outside.ipynb", str(outside), "link.ipynb", "sub/../../outside.ipynb"):
        code, reply = await fetch_json(jp_fetch, "gpupool", "api", "parameters", params={"path": bad})
        assert code == 403 and "outside the server root" in reply["error"], bad
        code, reply = await fetch_json(jp_fetch, "gpupool", "api", "promote", method="POST",
                                       body=json.dumps({"path": bad}))
        assert code == 403 and "outside the server root" in reply["error"], bad
    assert fake_pool.jobs == {}
    assert not list(tmp_path.glob("outside.runs"))
    code, reply = await fetch_json(jp_fetch, "gpupool", "api", "parameters", params={"path": "missing.ipynb"})
    assert code == 404


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("not json", "malformed JSON"),
        (json.dumps({"gpus": 1}), "'path'"),
        (json.dumps({"path": "nb.ipynb", "gpus": 1, "gpu_fraction": 0.5}), "not both"),
        (json.dumps({"path": "nb.ipynb", "gpus": -1}), "positive"),
        (json.dumps({"path": "nb.ipynb", "priority": "high"}), "integer"),
        (json.dumps({"path": "nb.ipynb", "parameters": {"not valid": 1}}), "identifier"),
        (json.dumps({"path": "nb.txt"}), "not a notebook"),
    ],
)
async def test_promote_rejects_bad_requests(jp_fetch: Any, fake_pool: Any, jp_root_dir: Any,
                                            body: str, message: str) -> None:
    write_notebook(jp_root_dir / "nb.ipynb")
    (jp_root_dir / "nb.txt").write_text("x")
    code, reply = await fetch_json(jp_fetch, "gpupool", "api", "promote", method="POST", body=body)
    assert code == 400 and message in reply["error"]
    assert fake_pool.jobs == {}


async def test_promote_submits_snapshot_to_run_dir(jp_fetch: Any, fake_pool: Any, jp_root_dir: Any) -> None:
    (jp_root_dir / "work").mkdir()
    write_notebook(jp_root_dir / "work" / "nb.ipynb", "lr = 0.1\n")
    body = {"path": "work/nb.ipynb", "gpus": 0.5, "priority": 3, "parameters": {"lr": 0.5}}
    code, job = await fetch_json(jp_fetch, "gpupool", "api", "promote", method="POST", body=json.dumps(body))
    assert code == 201
    assert job["kind"] == "train" and job["priority"] == 3 and job["request"]["gpu_fraction"] == 0.5
    assert job["run_dir"] == f"work/nb.runs/{job['id']}"
    assert job["output_notebook"] == f"work/nb.runs/{job['id']}/output.ipynb"
    snapshot = jp_root_dir / job["run_dir"] / "input.ipynb"
    assert snapshot.read_bytes() == (jp_root_dir / "work" / "nb.ipynb").read_bytes()
    command = job["command"]
    assert command[1:3] == ["-m", "jupyter_gpupool.runner"]
    assert json.loads(command[command.index("-y") + 1]) == {"lr": 0.5}
    assert command[command.index("--kernel") + 1] == "python3"
    code, again = await fetch_json(jp_fetch, "gpupool", "api", "jobs", job["id"])
    assert again["output_notebook"] == job["output_notebook"]


async def test_project_put_is_admin_and_events_forwarded(jp_fetch: Any, fake_pool: Any) -> None:
    code, project = await fetch_json(jp_fetch, "gpupool", "api", "projects", "vision", method="PUT",
                                     body=json.dumps({"build_quota": 2}))
    assert code == 200 and project["build_quota"] == 2
    await fake_pool.client("me").submit({"project": "me", "kind": "build", "gpu_fraction": 0.25})
    code, events = await fetch_json(jp_fetch, "gpupool", "api", "events", params={"since": "0"})
    assert code == 200 and events["events"][-1]["state"] == "running"
    code, reply = await fetch_json(jp_fetch, "gpupool", "api", "events", params={"since": "x"})
    assert code == 400 and "integer" in reply["error"]


async def test_scheduler_that_cannot_start_is_503_on_every_endpoint(jp_fetch: Any, gpupool_app: Any) -> None:
    """A connection failure that is not a scheduler error (embedded start fails) is a 503, the admin PUT too."""
    async def broken() -> None:
        raise OSError("no space left on device")

    gpupool_app.connection._connect = broken
    for method, path, body in (("GET", "status", None), ("PUT", "projects/vision", json.dumps({"build_quota": 2}))):
        code, reply = await fetch_json(jp_fetch, "gpupool", "api", *path.split("/"), method=method, body=body)
        assert code == 503 and "cannot reach the scheduler" in reply["error"], (path, code, reply)


DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize(("parts", "method", "body", "message"), [
    (("promote",), "POST", DEEP, "nested too deeply"),
    (("projects", "vision"), "PUT", DEEP, "nested too deeply"),
    (("promote",), "POST", b'{"path": "nb.ipynb", "parameters": {"x": ' + b"[" * 500 + b"]" * 500 + b"}}",
     "nested too deeply"),
    (("promote",), "POST", b'{"path": "nb\\ud800.ipynb"}', "path: the string is not valid Unicode"),
    (("promote",), "POST", b'{"path": "nb.ipynb", "parameters": {"tag": "\\udfff"}}', "not valid Unicode"),
    (("promote",), "POST", b'{"path": "nb.ipynb", "project": "p\\ud800"}', "not valid Unicode"),
    (("projects", "vision"), "PUT", b'{"\\ud800": 1}', "not valid Unicode"),
    (("promote",), "POST", b'{"path": "nb.ipynb", "gpus": NaN}', "NaN"),
    (("promote",), "POST", b'{"path": "\xff.ipynb"}', "not UTF-8"),
], ids=["promote-deep", "project-deep", "parameters-500-deep", "path-surrogate", "parameter-surrogate",
        "project-surrogate", "project-key-surrogate", "nan", "not-utf8"])
async def test_bodies_that_cannot_be_kept_are_400(jp_fetch: Any, fake_pool: Any, jp_root_dir: Any,
                                                  parts: tuple[str, ...], method: str, body: bytes,
                                                  message: str) -> None:
    write_notebook(jp_root_dir / "nb.ipynb")
    code, reply = await fetch_json(jp_fetch, "gpupool", "api", *parts, method=method, body=body)
    assert code == 400 and message in reply["error"], (code, reply)
    assert fake_pool.jobs == {} and "vision" not in fake_pool.projects
    assert not (jp_root_dir / "nb.runs").exists()


def nested(depth: int) -> Any:
    """``depth`` lists inside one another around a number."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(("parameters", "message"), [
    ({"blob": "x" * 70_000}, "parameters are too large: 69 KiB, at most 64 KiB"),
    ({f"p{i}": "y" * 1000 for i in range(100)}, "parameters are too large: 99 KiB, at most 64 KiB"),
    ({"deep": nested(40)}, "parameter 'deep' is nested too deeply: 40 levels, at most 32"),
])
async def test_promote_refuses_parameters_the_run_cannot_take(jp_fetch: Any, fake_pool: Any, jp_root_dir: Any,
                                                             parameters: dict[str, Any], message: str) -> None:
    write_notebook(jp_root_dir / "nb.ipynb")
    body = json.dumps({"path": "nb.ipynb", "parameters": parameters})
    code, reply = await fetch_json(jp_fetch, "gpupool", "api", "promote", method="POST", body=body)
    assert code == 400 and reply["error"] == message, reply
    assert fake_pool.jobs == {}
    body = json.dumps({"path": "nb.ipynb", "parameters": {"deep": nested(32), "blob": "x" * 60_000}})
    code, job = await fetch_json(jp_fetch, "gpupool", "api", "promote", method="POST", body=body)
    assert code == 201, job  # the limits themselves are allowed


async def test_huge_promote_body_error_does_not_show_the_scheduler_url(jp_fetch: Any, gpupool_app: Any,
                                                                       jp_root_dir: Any) -> None:
    """50 MB of parameters, on the real embedded scheduler: a 400 about the parameters, no internal URL."""
    write_notebook(jp_root_dir / "nb.ipynb")
    await gpupool_app.connection.client()  # the embedded scheduler is up: its URL is known
    body = json.dumps({"path": "nb.ipynb", "parameters": {"blob": "x" * 50_000_000}})
    code, reply = await fetch_json(jp_fetch, "gpupool", "api", "promote", method="POST", body=body)
    url = gpupool_app.connection.url
    assert url and url not in reply["error"], reply
    assert code == 400 and reply["error"] == "parameters are too large: 48829 KiB, at most 64 KiB", reply
    for field in ("path", "project"):
        body = json.dumps({"path": "nb.ipynb", field: "z" * 5_000_000})
        code, reply = await fetch_json(jp_fetch, "gpupool", "api", "promote", method="POST", body=body)
        assert code == 400 and "too long" in reply["error"] and len(reply["error"]) < 300, reply


async def test_unreachable_scheduler_message_hides_its_url(jp_fetch: Any, fake_pool: Any) -> None:
    fake_pool.down = True
    for parts in (("status",), ("jobs",)):
        code, reply = await fetch_json(jp_fetch, "gpupool", "api", *parts)
        assert code == 503 and "cannot reach the scheduler" in reply["error"], reply
        assert "http://fake" not in reply["error"], reply


async def test_promote_refuses_a_runs_directory_that_leads_outside_the_root(
    jp_fetch: Any, fake_pool: Any, jp_root_dir: Any, tmp_path: Any
) -> None:
    """``nb.runs`` (or a run's ``<job-id>`` folder in it) may be a symlink: the run's files must stay in the root."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    write_notebook(jp_root_dir / "nb.ipynb")
    (jp_root_dir / "nb.runs").symlink_to(outside)
    code, reply = await fetch_json(jp_fetch, "gpupool", "api", "promote", method="POST",
                                   body=json.dumps({"path": "nb.ipynb"}))
    assert code == 403 and reply["error"].startswith("'nb.runs' is outside the server root"), reply
    assert fake_pool.jobs == {} and list(outside.iterdir()) == []

    (jp_root_dir / "nb.runs").unlink()
    (jp_root_dir / "nb.runs").mkdir()
    (jp_root_dir / "nb.runs" / "j-000001").symlink_to(outside)  # the next job's id, made in advance
    code, reply = await fetch_json(jp_fetch, "gpupool", "api", "promote", method="POST",
                                   body=json.dumps({"path": "nb.ipynb"}))
    assert code == 403 and "'j-000001' in 'nb.runs' is a symbolic link" in reply["error"], reply
    assert fake_pool.jobs["j-000001"]["state"] == "cancelled"  # submitted before its id was known: taken back
    assert list(outside.iterdir()) == [] and not list((jp_root_dir / "nb.runs").glob(".staging-*"))

    # a symlink that stays inside the root is fine
    (jp_root_dir / "nb.runs" / "j-000001").unlink()
    (jp_root_dir / "nb.runs").rmdir()
    (jp_root_dir / "results").mkdir()
    (jp_root_dir / "nb.runs").symlink_to(jp_root_dir / "results")
    code, job = await fetch_json(jp_fetch, "gpupool", "api", "promote", method="POST",
                                 body=json.dumps({"path": "nb.ipynb"}))
    assert code == 201, job
    assert (jp_root_dir / "results" / job["id"] / "input.ipynb").is_file()


def test_claim_snapshot_refuses_a_run_folder_that_is_a_symlink(tmp_path: Any) -> None:
    """The runner claims the snapshot too (when the job starts first): it must not follow a planted link."""
    from gpupool.wire.errors import Forbidden
    from jupyter_gpupool.promote import claim_snapshot

    runs, outside = tmp_path / "nb.runs", tmp_path / "outside"
    runs.mkdir()
    outside.mkdir()
    (runs / ".staging-a.ipynb").write_text("{}")
    (runs / "j-000007").symlink_to(outside)
    with pytest.raises(Forbidden):
        claim_snapshot(str(runs), ".staging-a.ipynb", "j-000007")
    assert list(outside.iterdir()) == []
    assert claim_snapshot(str(runs), ".staging-a.ipynb", "j-000008") == str(runs / "j-000008")
    assert (runs / "j-000008" / "input.ipynb").read_text() == "{}"
