"""Fuzz the real service from its own OpenAPI document: no request may get a 5xx.

Requests for every operation of the served document (valid ones and ones
broken in a single place, see :mod:`tests.api.fuzzgen`) go to a real
`gpupool serve` process on simulated GPUs. Whatever arrives, the answer must be
a success or a 4xx with the JSON error shape, never a server error, and the
service must still work afterwards.

The service runs with PATH pointing at an empty directory, so a generated
command line cannot start any real program.
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.api.openapi import build_document

from .fuzzgen import operations, request_for
from .servers import ServeProcess, http

SETTINGS = {"tick_s": 0.2, "poll_s": 0.05, "pause_grace_s": 0.5, "on_shutdown": "stop", "min_runtime_s": 0.0,
            "history_interval_s": 0.5}
EXAMPLES = int(os.environ.get("GPUPOOL_FUZZ_EXAMPLES", "300"))
RANDOM = os.environ.get("GPUPOOL_FUZZ_RANDOM") == "1"  # explore new inputs instead of the fixed sequence
DOC = build_document()


def _fuzz_operations() -> list:
    """Operations of the served document, with long-poll waits capped so the fuzzer does not sit in them."""
    ops = operations(DOC)
    for op in ops:
        if "timeout" in op.query:
            op.query["timeout"] = {**op.query["timeout"], "maximum": 0.2}
    return ops


OPERATIONS = _fuzz_operations()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    empty_bin = root / "bin"
    empty_bin.mkdir()
    serve = ServeProcess(root / "state", root, settings=SETTINGS, extra_env={"PATH": str(empty_bin)})
    serve.start()
    status, _ = http("PUT", serve.url + "/api/v1/projects/vision", token=serve.admin_token,
                     body={"train_guarantee": 2, "build_quota": 1})
    assert status == 200
    status, job = http("POST", serve.url + "/api/v1/jobs", token=serve.admin_token,
                       body={"project": "vision", "command": ["no-such-program"], "gpus": 1})
    assert status in (200, 201), job
    status, build = http("POST", serve.url + "/api/v1/jobs", token=serve.admin_token,
                         body={"project": "vision", "kind": "build", "gpu_fraction": 0.25})
    assert status in (200, 201), build
    status, user = http("POST", serve.url + "/api/v1/tokens", token=serve.admin_token, body={"user": "fuzzer"})
    assert status == 201
    serve.known = {"job_id": [job["id"], build["id"], "j-999999"], "name": ["vision", "nlp", "other"]}
    serve.tokens = {"admin": serve.admin_token, "user": user["token"]}
    yield serve
    serve.stop()


def test_document_is_valid_openapi():
    schema = schemathesis.from_dict(DOC)  # checks the document against the OpenAPI 3.0 meta-schema
    assert len(list(schema.get_all_operations())) == len(OPERATIONS) == 20


def test_requests_never_get_5xx(live):
    seen: dict[int, int] = {}

    @given(data=st.data())
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
              derandomize=not RANDOM, database=None)
    def one_request(data):
        op = data.draw(st.sampled_from(OPERATIONS))
        method, path, body = data.draw(request_for(op, live.known))
        who = data.draw(st.sampled_from(["admin", "user"]))
        status, reply = http(method, live.url + path, token=live.tokens[who], raw_body=body, timeout=30)
        seen[status] = seen.get(status, 0) + 1
        assert status < 500, f"{status} for {method} {path} body={body[:300] if body else body!r}: {reply!r:.500}"
        if status >= 400:
            assert isinstance(reply, dict) and reply["status"] == status and reply["error"], (method, path, reply)

    one_request()
    assert any(code < 300 for code in seen) and any(400 <= code < 500 for code in seen), seen


def test_service_still_healthy_after_fuzzing(live):
    status, body = http("GET", live.url + "/api/v1/status", token=live.admin_token)
    assert status == 200 and body["simulated"] is True
    # The fuzzer may have changed or deleted the project; set it again, then submit.
    status, _ = http("PUT", live.url + "/api/v1/projects/vision", token=live.admin_token, body={"weight": 1})
    assert status == 200
    status, job = http("POST", live.url + "/api/v1/jobs", token=live.admin_token,
                       body={"project": "vision", "command": ["still-works"]})
    assert status == 201, job
    assert job["state"] in ("queued", "running", "failed")
