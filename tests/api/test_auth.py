"""Authentication of every route: no token and a wrong token are refused with 401 JSON.

The route walk reads the Application's own router, so an endpoint added later
without authentication fails this test without anyone remembering to list it.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request

import pytest

from gpupool.api.app import make_app
from gpupool.api.auth import parse_authorization
from gpupool.wire.errors import Unauthorized

from .fake_core import ADMIN_TOKEN, FakeCore
from .servers import AppServer, http

PUBLIC = {"/healthz", "/api/v1/openapi.json"}
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH")


def registered_routes() -> list[tuple[str, str]]:
    """(method, concrete path) for every method of every registered handler, each alternation expanded."""
    app = make_app(FakeCore())
    out = []
    for rule in app.wildcard_router.rules:
        paths = [rule.matcher.regex.pattern.rstrip("$").replace("\\", "")]
        group = re.compile(r"\(\?P<(\w+)>([^()]*)\)")
        while any(group.search(p) for p in paths):
            expanded = []
            for p in paths:
                m = group.search(p)
                if m is None:
                    expanded.append(p)
                    continue
                choices = m.group(2).split("|") if "|" in m.group(2) else ["x1"]
                expanded += [p[: m.start()] + c + p[m.end():] for c in choices]
            paths = expanded
        ours = [base for base in rule.target.__mro__ if base.__module__.startswith("gpupool.api")]
        for method in METHODS:
            if any(method.lower() in vars(base) for base in ours):
                out += [(method, p) for p in paths]
    return out


ROUTES = registered_routes()
# Paths no route matches: the default handler must authenticate too, so that without a token
# nobody learns which paths exist.
UNKNOWN = [("GET", "/api/v1/nothing-here"), ("POST", "/api/v1/jobs/x1/explode"), ("DELETE", "/api/v2/jobs"),
           ("GET", "/"), ("PUT", "/not/the/api")]


@pytest.fixture(scope="module")
def server():
    srv = AppServer(FakeCore())
    yield srv
    srv.close()


def test_route_walk_found_every_endpoint():
    paths = {p for _, p in ROUTES}
    assert "/api/v1/jobs/x1/pause" in paths and "/api/v1/jobs/x1/logs" in paths and "/metrics" in paths
    assert ("DELETE", "/api/v1/projects/x1") in ROUTES and ("GET", "/api/v1/report") in ROUTES
    assert ("GET", "/api/v1/report/series") in ROUTES
    assert ("POST", "/api/v1/nodes/x1/use") in ROUTES
    assert len(ROUTES) == 23


@pytest.mark.parametrize(("method", "path"), [r for r in ROUTES if r[1] not in PUBLIC] + UNKNOWN)
@pytest.mark.parametrize("header", [None, "token wrong-token", "Bearer wrong-token", "Basic YWxpY2U6eA==", "token"])
def test_every_route_refuses_missing_or_wrong_token(server, method, path, header):
    headers = {"Authorization": header} if header else {}
    status, body = http(method, server.url + path, headers=headers, body={})
    assert status == 401, (method, path, status, body)
    assert body["status"] == 401 and body["error"]
    assert "token" in body["error"]


@pytest.mark.parametrize("path", sorted(PUBLIC))
def test_public_routes_need_no_token(server, path):
    status, body = http("GET", server.url + path)
    assert status == 200
    assert isinstance(body, dict)


def test_valid_tokens_token_and_bearer(server):
    assert http("GET", server.url + "/api/v1/whoami", token="alice-token") == (200, {"user": "alice", "admin": False})
    status, body = http("GET", server.url + "/api/v1/whoami", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert (status, body) == (200, {"user": "admin", "admin": True})


def test_metrics_need_token_and_serve_prometheus_text(server):
    assert http("GET", server.url + "/metrics")[0] == 401
    status, text = http("GET", server.url + "/metrics", token="alice-token")
    assert status == 200 and "gpupool_fake_submitted_total" in text
    # The API's own request metrics, refused requests included.
    assert 'gpupool_api_requests_total{endpoint="Metrics",method="GET",status="401"}' in text
    assert "gpupool_api_request_seconds_bucket" in text


@pytest.mark.parametrize(("method", "path"), UNKNOWN)
def test_unknown_path_is_json_404_with_a_token(server, method, path):
    status, body = http(method, server.url + path, token="alice-token", body={})
    assert status == 404 and body["status"] == 404 and path in body["error"]


def test_wrong_method_is_json_405_after_auth(server):
    assert http("DELETE", server.url + "/api/v1/status")[0] == 401
    status, body = http("DELETE", server.url + "/api/v1/status", token="alice-token")
    assert status == 405 and "DELETE" in body["error"]


def test_user_cannot_touch_another_users_job(server):
    status, job = http("POST", server.url + "/api/v1/jobs", token="alice-token",
                       body={"project": "vision", "command": ["true"]})
    assert status == 201
    for action in ("pause", "resume", "cancel", "renew"):
        status, body = http("POST", f"{server.url}/api/v1/jobs/{job['id']}/{action}", token="bob-token")
        assert status == 403, action
        assert body["type"] == "Forbidden"
    status, body = http("GET", f"{server.url}/api/v1/jobs/{job['id']}/logs", token="bob-token")
    assert status == 403
    # Everyone sees the queue; the owner and the admin may act.
    assert http("GET", f"{server.url}/api/v1/jobs/{job['id']}", token="bob-token")[0] == 200
    assert http("GET", f"{server.url}/api/v1/jobs/{job['id']}/logs", token=ADMIN_TOKEN)[0] == 200
    assert http("POST", f"{server.url}/api/v1/jobs/{job['id']}/cancel", token="alice-token")[1]["state"] == "cancelled"


def test_only_admin_sets_quotas_and_tokens(server):
    status, body = http("PUT", server.url + "/api/v1/projects/nlp", token="alice-token", body={"weight": 2})
    assert status == 403
    assert http("GET", server.url + "/api/v1/projects", token="alice-token")[1][-1]["name"] == "vision"
    assert http("POST", server.url + "/api/v1/tokens", token="alice-token", body={"user": "carol"})[0] == 403
    status, body = http("POST", server.url + "/api/v1/tokens", token=ADMIN_TOKEN, body={"user": "carol"})
    assert status == 201 and body["user"] == "carol"
    assert http("GET", server.url + "/api/v1/whoami", token=body["token"])[1]["user"] == "carol"


@pytest.mark.parametrize(("header", "token"), [("token abc", "abc"), ("Bearer abc", "abc"), ("TOKEN  abc ", "abc"),
                                                ("bearer a b", "a b")])
def test_parse_authorization_accepts(header, token):
    assert parse_authorization(header) == token


@pytest.mark.parametrize("header", [None, "", "abc", "Basic abc", "token ", "Bearer"])
def test_parse_authorization_refuses(header):
    with pytest.raises(Unauthorized):
        parse_authorization(header)


def test_401_names_the_scheme_and_replies_are_not_cached(server):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with pytest.raises(urllib.error.HTTPError) as refused:
        opener.open(server.url + "/api/v1/whoami", timeout=30)
    with refused.value as reply:
        assert reply.code == 401
        assert reply.headers["WWW-Authenticate"] == 'Bearer realm="gpupool"'
        assert reply.headers["Cache-Control"] == "no-store"
    request = urllib.request.Request(server.url + "/api/v1/whoami", headers={"Authorization": "token alice-token"})
    with opener.open(request, timeout=30) as reply:
        assert reply.headers["Cache-Control"] == "no-store"
