"""Fuzz the real service from its own OpenAPI document: no request may get a 5xx.

Two generators send requests for every operation of the served document to a
real `gpupool serve` process on simulated GPUs: our own (valid requests and
ones broken in a single place, lone surrogates and deep nesting included, see
:mod:`tests.api.fuzzgen`), and schemathesis's positive and negative cases
(hypothesis pinned below 6.170.10 in pyproject.toml: later ones removed an
internal API that hypothesis-jsonschema 0.23 calls). Whatever arrives, the
answer must be a success or a 4xx with the JSON error shape, never a server
error, and the service must still work afterwards. Both are bounded
(``GPUPOOL_FUZZ_EXAMPLES``, ``GPUPOOL_SCHEMATHESIS_EXAMPLES``) so they run with
every test run.

The service runs with PATH pointing at an empty directory, so a generated
command line cannot start any real program.
"""

from __future__ import annotations

import copy
import os

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gpupool.api.openapi import build_document

from .fuzzgen import UNSTORABLE_MODES, operations, request_for
from .servers import ServeProcess, http

SETTINGS = {"tick_s": 0.2, "poll_s": 0.05, "pause_grace_s": 0.5, "on_shutdown": "stop", "min_runtime_s": 0.0,
            "history_interval_s": 0.5}
EXAMPLES = int(os.environ.get("GPUPOOL_FUZZ_EXAMPLES", "300"))
RANDOM = os.environ.get("GPUPOOL_FUZZ_RANDOM") == "1"  # explore new inputs instead of the fixed sequence
DOC = build_document()
SCHEMATHESIS_EXAMPLES = int(os.environ.get("GPUPOOL_SCHEMATHESIS_EXAMPLES", "8"))  # per operation and method
MAX_FUZZ_WAIT_S = 0.2


def _fuzz_operations() -> list:
    """Operations of the served document, with long-poll waits capped so the fuzzer does not sit in them."""
    ops = operations(DOC)
    for op in ops:
        if "timeout" in op.query:
            op.query["timeout"] = {**op.query["timeout"], "maximum": MAX_FUZZ_WAIT_S}
    return ops


def _document_for_schemathesis(known: dict[str, list[str]]) -> dict:
    """The served document with the long-poll wait of GET /events capped as for our own fuzzer, and path
    parameters drawn from ids that exist (positive cases act on real jobs and projects; negative ones
    get any other string: for a bare string of length 1 and up, schemathesis finds no negative path value)."""
    doc = copy.deepcopy(DOC)
    for item in doc["paths"].values():
        for op in [item, *(v for v in item.values() if isinstance(v, dict))]:
            for param in op.get("parameters", []):
                if param["name"] == "timeout" and param["in"] == "query":
                    param["schema"]["maximum"] = MAX_FUZZ_WAIT_S
                if param["in"] == "path":
                    param["schema"] = {"type": "string", "enum": known[param["name"]]}
    return doc


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
    status, pool = http("GET", serve.url + "/api/v1/pool", token=serve.admin_token)
    assert status == 200
    nodes = [node["name"] for node in pool["nodes"]]  # the pool's own node, and one that is not there
    serve.known = {"job_id": [job["id"], build["id"], "j-999999"], "name": ["vision", "nlp", "other"],
                   "node": [*nodes, "no-such-node"],
                   "examples": {  # bodies the service accepts, for the fuzzer to break in one place
                       "POST /api/v1/jobs": {"project": "vision", "command": ["no-such-program", "--x"], "name": "n",
                                             "env": {"SEED": "1"}, "labels": {"a": "b"}, "client_key": "k",
                                             "gpu_fraction": 0.25},
                       "PUT /api/v1/projects/{name}": {"weight": 2},
                       "POST /api/v1/tokens": {"user": "someone"}}}
    serve.tokens = {"admin": serve.admin_token, "user": user["token"]}
    yield serve
    serve.stop()


def test_document_is_valid_openapi():
    schema = schemathesis.from_dict(DOC)  # checks the document against the OpenAPI 3.0 meta-schema
    assert len(list(schema.get_all_operations())) == len(OPERATIONS) == 23


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


def test_lone_surrogates_and_deep_nesting_never_get_5xx(live):
    """Bodies a decoder accepts but nothing after it can hold: a 4xx each, from every operation with a body.

    Before the shared decoder refused them, a lone surrogate in a job's name was a 500 from the store.
    """
    with_body = [op for op in OPERATIONS if op.body_schema is not None]
    refused: dict[str, int] = {}

    @given(data=st.data())
    @settings(max_examples=max(EXAMPLES // 3, 20), deadline=None, suppress_health_check=list(HealthCheck),
              derandomize=not RANDOM, database=None, phases=[Phase.explicit, Phase.generate])  # the body is in the
    # message; shrinking a server-side crash request by request would take minutes
    def one_request(data):
        op = data.draw(st.sampled_from(with_body))
        method, path, body = data.draw(request_for(op, live.known, UNSTORABLE_MODES))
        status, reply = http(method, live.url + path, token=live.admin_token, raw_body=body, timeout=30)
        assert 400 <= status < 500, f"{status} for {method} {path} body={body[:300]!r}: {reply!r:.500}"
        for why in ("not valid Unicode", "nested too deeply"):
            refused[why] = refused.get(why, 0) + (why in reply["error"])

    one_request()
    assert all(refused.values()), refused  # both shapes reached the decoder's checks


@pytest.mark.parametrize("method", list(schemathesis.DataGenerationMethod), ids=lambda m: m.value)
def test_schemathesis_cases_never_get_5xx(live, method):
    """schemathesis draws requests from the document itself: a second opinion on our own generator."""
    schema = schemathesis.from_dict(_document_for_schemathesis(live.known), base_url=live.url)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == len(OPERATIONS)
    seen: dict[int, int] = {}
    for operation in operations:
        @given(case=operation.as_strategy(data_generation_method=method))
        @settings(max_examples=SCHEMATHESIS_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
                  derandomize=not RANDOM, database=None)
        def one_case(case):
            case.headers = {**(case.headers or {}), "Authorization": f"token {live.admin_token}"}
            response = case.call(base_url=live.url, timeout=30)
            seen[response.status_code] = seen.get(response.status_code, 0) + 1
            assert response.status_code < 500, (
                f"{response.status_code} for {case.method} {case.formatted_path} query={case.query!r} "
                f"body={case.body!r:.300}: {response.text[:500]}")
            if response.status_code >= 400:
                reply = response.json()
                assert reply["status"] == response.status_code and reply["error"], reply

        try:
            one_case()
        except schemathesis.exceptions.SkipTest:  # nothing to break: no parameters and no body (GET /healthz)
            assert method is schemathesis.DataGenerationMethod.negative and not operation.body
    assert any(code < 300 for code in seen), seen
    if method is schemathesis.DataGenerationMethod.negative:
        assert any(400 <= code < 500 for code in seen), seen


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
