"""The OpenAPI 3.0 document served at /api/v1/openapi.json.

Built from :mod:`gpupool.wire.schemas` (the same dicts that validate request
bodies) and the operation table below. ``tests/api/test_openapi*.py`` check
that every route of the application appears here with the same methods, and
fuzz the service from this document.
"""

from __future__ import annotations

import copy
from typing import Any

from gpupool.wire.limits import MAX_PROJECT_NAME, MAX_REPLICAS
from gpupool.wire.schemas import COMPONENTS, JOB_KINDS, MAX_LIST, MAX_LOG_CHUNK, MAX_SEQ, MAX_WAIT_S

MAX_JOB_ID = 256  # ids are short (j-000042); this only bounds what a client may send

API_VERSION = "1.0.0"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {400: "Bad input (the message says what is wrong)", 401: "No token or a wrong token",
            403: "Not allowed for this user", 404: "No such object", 409: "The object's state forbids it"}
    return {str(c): _json(_ref("Error"), text[c]) for c in codes}


def _path_param(name: str, description: str, max_length: int) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "description": description,
            "schema": {"type": "string", "minLength": 1, "maxLength": max_length}}


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description, "schema": schema}


def _op(summary: str, reply: dict[str, Any], *, status: str = "200", errors: tuple[int, ...] = (401,),
        params: list[dict[str, Any]] | None = None, body: str | None = None,
        body_required: bool = True, public: bool = False, extra: dict[str, Any] | None = None,
        tag: str = "scheduler") -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "tags": [tag], "responses": {status: reply, **_errors(*errors)}}
    op["operationId"] = summary.lower().replace(" ", "_").replace("'", "").replace(",", "")
    if extra:
        op["responses"].update(extra)
    if params:
        op["parameters"] = params
    if body:
        op["requestBody"] = {"required": body_required,
                             "content": {"application/json": {"schema": _ref(body)}}}
    if public:
        op["security"] = []
    return op


JOB_ID = _path_param("job_id", "The job's id, e.g. j-000042", MAX_JOB_ID)
PROJECT_NAME = _path_param("name", "The project's name", MAX_PROJECT_NAME)


def _paths() -> dict[str, Any]:
    job_reply = _json(_ref("Job"), "The job")
    action_errors = (401, 403, 404, 409)
    return {
        "/healthz": {"get": _op("Health check", _json({"type": "object"}, "The service is up"),
                                errors=(), public=True, tag="service")},
        "/metrics": {"get": _op(
            "Prometheus metrics",
            {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}},
            tag="service")},
        "/api/v1/openapi.json": {"get": _op("OpenAPI document", _json({"type": "object"}, "This document"),
                                            errors=(), public=True, tag="service")},
        "/api/v1/whoami": {"get": _op("Who am I", _json(_ref("WhoAmI"), "The token's user"))},
        "/api/v1/status": {"get": _op("Status", _json(_ref("Status"), "Pool, projects and queue at a glance"))},
        "/api/v1/pool": {"get": _op("Pool", _json(_ref("Pool"), "Nodes and GPUs with their allocations"))},
        "/api/v1/projects": {"get": _op("List projects", _json({"type": "array", "items": _ref("Project")},
                                                                "All projects with quotas and use"))},
        "/api/v1/projects/{name}": {
            "parameters": [PROJECT_NAME],
            "put": _op("Set project", _json(_ref("Project"), "The project (created if missing)"),
                       errors=(400, 401, 403), body="ProjectFields", body_required=False),
            "delete": _op("Delete project", {"description": "Deleted"}, status="204",
                          errors=(401, 403, 404, 409)),
        },
        "/api/v1/jobs": {
            "get": _op("List jobs", _json({"type": "array", "items": _ref("Job")}, "Jobs, newest first"),
                       errors=(400, 401), params=[
                           _query("project", {"type": "string"}, "Only this project's jobs"),
                           _query("user", {"type": "string"}, "Only this user's jobs"),
                           _query("state", {"type": "string"}, "Comma-separated states, e.g. queued,running"),
                           _query("kind", {"type": "string", "enum": JOB_KINDS}, "train or build"),
                           _query("limit", {"type": "integer", "minimum": 1, "maximum": MAX_LIST}, "At most this many"),
                       ]),
            "post": _op("Submit job", _json(_ref("Job"), "The new job"), status="201",
                        errors=(400, 401, 404, 409), body="JobSpec",
                        extra={"200": _json(_ref("Job"), "The live job that already had this client_key")}),
        },
        "/api/v1/jobs/{job_id}": {"parameters": [JOB_ID],
                                  "get": _op("Get job", job_reply, errors=(401, 404))},
        **{f"/api/v1/jobs/{{job_id}}/{action}": {
            "parameters": [JOB_ID],
            "post": _op(f"{action.capitalize()} job", job_reply, errors=action_errors),
        } for action in ("pause", "resume", "cancel", "renew")},
        "/api/v1/jobs/{job_id}/logs": {"parameters": [JOB_ID], "get": _op(
            "Read job log", _json(_ref("Logs"), "A chunk of the job's output"), errors=(400, 401, 403, 404),
            params=[_query("offset", {"type": "integer", "minimum": 0, "maximum": 2**62}, "Byte offset to read from"),
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": MAX_LOG_CHUNK}, "Most bytes"),
                    _query("replica", {"type": "integer", "minimum": 0, "maximum": MAX_REPLICAS - 1},
                           "A multi-node gang's replica K alone (0 <= K < the job's replicas, else 400); "
                           "without it a gang's lines are each prefixed [K]")])},
        "/api/v1/events": {"get": _op(
            "Events", {**_json(_ref("Events"), "Events newer than since (long-poll)"),
                       "content": {"application/json": {"schema": _ref("Events")},
                                   "text/event-stream": {"schema": {"type": "string"}}}},
            errors=(400, 401),
            params=[_query("since", {"type": "integer", "minimum": 0, "maximum": MAX_SEQ}, "Last seq seen"),
                    _query("timeout", {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S},
                           "Seconds to wait for an event (long-poll)")])},
        "/api/v1/history": {"get": _op(
            "Usage history", _json(_ref("History"), "Samples of use per project and GPU"), errors=(400, 401),
            params=[_query("since", {"type": "number"}, "Unix time of the oldest sample wanted")])},
        "/api/v1/report": {"get": _op(
            "Allocated vs used report", _json(_ref("Report"), "Allocated, used and idle GPU-hours per project, "
                                          "user or job, build and train apart (a user: their own jobs and "
                                          "their projects; an admin: everything)"), errors=(400, 401),
            params=[_query("since", {"type": "number"}, "Unix time the report starts at (default 30 days ago)"),
                    _query("by", {"type": "string", "enum": ["project", "user", "job"]},
                           "Rows per project (default), user or job")])},
        "/api/v1/report/series": {"get": _op(
            "Allocated vs used over time", _json(_ref("ReportSeries"), "Mean GPUs allocated, measured and used "
                                                 "per bucket, per project, user or job, build and train apart "
                                                 "(who sees what: as the report)"), errors=(400, 401),
            params=[_query("since", {"type": "number"}, "Unix time the series starts at (default an hour ago)"),
                    _query("step", {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 366 * 86400},
                           "Seconds per bucket (rounded up to the rows' resolution; the range at most 360 steps)"),
                    _query("by", {"type": "string", "enum": ["project", "user", "job"]},
                           "A series per project (default), user or job")])},
        "/api/v1/tokens": {"post": _op("Create token", _json(_ref("Token"), "The new token"), status="201",
                                       errors=(400, 401, 403), body="TokenRequest")},
        "/api/v1/nodes/{node}/use": {"parameters": [_path_param("node", "The reporting agent's node", 253)],
                                     "post": _op(
            "Report node GPU use", _json({"type": "object"}, "The report was taken (what it held, and for how "
                                         "long it counts)"), errors=(400, 401, 403, 404), body="NodeUse",
            tag="node agents")},
    }


def build_document(server_url: str | None = None) -> dict[str, Any]:
    """Return the whole OpenAPI 3.0.3 document as a fresh dict."""
    doc: dict[str, Any] = {
        "openapi": "3.0.3",
        "info": {
            "title": "gpupool scheduler API",
            "version": API_VERSION,
            "description": "Fair sharing of a GPU pool: fractional build kernels and a training queue "
                           "with guaranteed quotas. GPU amounts are GPUs as numbers, memory in bytes, "
                           "times in Unix seconds. Errors are {\"error\", \"status\"}.",
        },
        "paths": _paths(),
        "components": {
            "schemas": copy.deepcopy(COMPONENTS),
            "securitySchemes": {"token": {
                "type": "apiKey", "in": "header", "name": "Authorization",
                "description": "'token <TOKEN>' or 'Bearer <TOKEN>'"}},
        },
        "security": [{"token": []}],
    }
    if server_url:
        doc["servers"] = [{"url": server_url}]
    return doc
