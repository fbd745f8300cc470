"""The OpenAPI document matches the application's routes and is a valid OpenAPI 3.0 document."""

from __future__ import annotations

import json
import re
import socket
import threading

import pytest
import schemathesis

from gpupool.api.app import ROUTES
from gpupool.api.openapi import build_document
from gpupool.wire.errors import InvalidRequest
from gpupool.wire.schemas import COMPONENTS, to_json_schema, validate

from .fake_core import ADMIN_TOKEN, FakeCore
from .servers import AppServer, http
from .test_auth import registered_routes


def doc_operations(doc: dict) -> set[tuple[str, str]]:
    out = set()
    for path, item in doc["paths"].items():
        for method in ("get", "post", "put", "delete", "patch"):
            if method in item:
                out.add((method.upper(), re.sub(r"\{\w+\}", "x1", path)))
    return out


def test_document_lists_exactly_the_routes():
    doc = build_document()
    routes = {(m, re.sub(r"/(pause|resume|cancel|renew)$", r"/\1", p)) for m, p in registered_routes()}
    assert doc_operations(doc) == routes
    assert len(ROUTES) == len({p for p, _ in ROUTES})


def test_document_is_valid_openapi_and_served():
    schema = schemathesis.from_dict(build_document())  # validates against the OpenAPI 3.0 meta-schema
    assert len(list(schema.get_all_operations())) == 23
    srv = AppServer(FakeCore())
    try:
        status, served = http("GET", srv.url + "/api/v1/openapi.json")
        assert status == 200 and served == json.loads(json.dumps(build_document()))
        for path, item in served["paths"].items():
            public = path in ("/healthz", "/api/v1/openapi.json")
            for method, op in item.items():
                if method == "parameters":
                    continue
                assert (op.get("security") == []) is public, (method, path)
                if not public:
                    assert "401" in op["responses"], (method, path)
    finally:
        srv.close()


def test_every_component_converts_to_checkable_json_schema():
    import jsonschema

    for name, schema in COMPONENTS.items():
        jsonschema.Draft202012Validator.check_schema(to_json_schema(schema))
        assert "nullable" not in json.dumps(to_json_schema(schema)), name


@pytest.mark.parametrize(("body", "message"), [
    ({}, "'project' is required"),
    ({"project": "p", "gpu_fraction": 1}, "gpu_fraction"),
    ({"project": "p", "gpu_fraction": 0}, "gpu_fraction"),
    ({"project": "p", "gpus": 10**9}, "gpus"),
    ({"project": "p", "gpu_memory": 2**60}, "gpu_memory"),
    ({"project": "p", "gpus": "2"}, "gpus"),
    ({"project": "p", "gpu": 1}, "unknown field"),
    ({"project": "p", "command": ["a\x00b"]}, "NUL"),
    ({"project": "p", "env": {"A=B": "1"}}, "env"),
    ({"project": "p", "priority": 1.5}, "priority"),
    ({"project": "p", "kind": "batch"}, "kind"),
    ({"project": "p", "image": "a b"}, "invalid job spec: image must be a container image reference"),
    ({"project": "p", "image": "x" * 513}, "image must be a container image reference"),
    ({"project": "p", "image": 5}, "image"),
    ([1, 2], "the job spec must be a JSON object"),
])
def test_job_spec_validation_messages(body, message):
    with pytest.raises(InvalidRequest, match=re.escape(message)):
        validate("JobSpec", body, "job spec")


def test_sse_stream_delivers_events_and_resumes_from_last_event_id():
    core = FakeCore()
    srv = AppServer(core)
    try:
        port = int(srv.url.rsplit(":", 1)[1])
        received: list[str] = []
        done = threading.Event()

        def listen() -> None:
            with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
                s.sendall(b"GET /api/v1/events?since=0 HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n"
                          + f"Authorization: token {ADMIN_TOKEN}\r\n\r\n".encode())
                buf = b""
                while buf.count(b"event: job") < 2:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
                received.append(buf.decode())
                done.set()

        thread = threading.Thread(target=listen)
        thread.start()
        for _ in range(2):
            status, _ = http("POST", srv.url + "/api/v1/jobs", token="alice-token",
                             body={"project": "vision", "command": ["true"]})
            assert status == 201
        assert done.wait(20)
        thread.join(5)
        text = received[0]
        assert "text/event-stream" in text
        assert "id: 1\nevent: job\ndata: " in text and "id: 2\n" in text
        assert '"job_id":"j-000002"' in text
        # Long-poll answers at once when events are newer than since, and names the next since.
        status, body = http("GET", srv.url + "/api/v1/events?since=1&timeout=5", token="alice-token")
        assert status == 200 and [e["seq"] for e in body["events"]] == [2] and body["last"] == 2
        status, body = http("GET", srv.url + "/api/v1/events?since=2&timeout=0.1", token="alice-token")
        assert status == 200 and body == {"events": [], "last": 2}
        for bad in ("since=-1", "since=x", "timeout=61", "timeout=nan", "timeout=-1"):
            status, body = http("GET", srv.url + "/api/v1/events?" + bad, token="alice-token")
            assert status == 400 and body["error"], bad
    finally:
        srv.close()
