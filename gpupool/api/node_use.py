"""``POST /api/v1/nodes/{node}/use``: a node agent reports its node's GPU use, per pod.

The one endpoint a node agent's token may call (and the only one it needs);
the one that also takes an agent's own service account token (bound by the
cluster to the node its pod runs on: the agent may then report only that node).
the body is the ``NodeUse`` wire shape, checked here; whether the token is
a node agent's, the node is in the pool and the GPUs are that node's is the
core's business (gpupool.service.reported_use), so a bad or foreign report
is a 4xx with a message the agent logs.
"""

from __future__ import annotations

from gpupool.api.auth import parse_authorization
from gpupool.api.base import ApiHandler, maybe_await
from gpupool.wire.errors import InvalidRequest, Unauthorized

MAX_NODE_NAME = 253  # a Kubernetes node name is a DNS subdomain


class NodeUseHandler(ApiHandler):
    node_agents = True

    async def prepare(self) -> None:
        """gpupool's tokens first (the shared node-agent token among them); else an agent's own service
        account token, which the core checks with the cluster and which binds the agent to its node."""
        try:
            await super().prepare()
        except Unauthorized:
            token = parse_authorization(self.request.headers.get("Authorization"))
            actor = await maybe_await(self.core.node_agent(token)) if hasattr(self.core, "node_agent") else None
            if actor is None:
                raise
            self.actor = actor

    async def post(self, node: str) -> None:
        if len(node) > MAX_NODE_NAME or "\x00" in node:
            raise InvalidRequest(f"a node name is at most {MAX_NODE_NAME} characters")
        body = self.json_body("NodeUse", "GPU use report")
        self.write_json(await maybe_await(self.core.report_node_use(self.actor, node, body)))
