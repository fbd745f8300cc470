"""Talk to a kernel as JupyterLab does: through the Jupyter server's REST API and its kernel websocket.

The tests of kernel pods drive a real ``jupyter server`` process, so code is
run the way the browser runs it: ``execute_request`` on the shell channel of
``/api/kernels/<id>/channels`` (Jupyter's JSON websocket protocol), its output
read from iopub until the reply and the kernel's return to idle.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from tornado.httpclient import HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect


@dataclass
class Execution:
    """What one execute_request produced: its reply's status, stdout/stderr text, and an error's name."""

    status: str
    output: str
    error: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)


def _message(msg_type: str, content: dict[str, Any], session: str, channel: str) -> dict[str, Any]:
    return {"header": {"msg_id": uuid.uuid4().hex, "username": "test", "session": session, "msg_type": msg_type,
                       "version": "5.3", "date": dt.datetime.now(dt.timezone.utc).isoformat()},
            "parent_header": {}, "metadata": {}, "content": content, "channel": channel, "buffers": []}


class KernelChannels:
    """One websocket to a kernel of a Jupyter server (``async with KernelChannels(port, token, kernel_id)``)."""

    def __init__(self, port: int, token: str, kernel_id: str) -> None:
        self.url = f"ws://127.0.0.1:{port}/api/kernels/{kernel_id}/channels?session_id={uuid.uuid4().hex}"
        self.token = token
        self.session = uuid.uuid4().hex
        self.ws: WebSocketClientConnection | None = None

    async def __aenter__(self) -> KernelChannels:
        self.ws = await websocket_connect(HTTPRequest(self.url, headers={"Authorization": f"token {self.token}"}))
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self.ws is not None:
            self.ws.close()

    async def send(self, msg_type: str, content: dict[str, Any], channel: str = "shell") -> str:
        assert self.ws is not None
        msg = _message(msg_type, content, self.session, channel)
        await self.ws.write_message(json.dumps(msg))
        return str(msg["header"]["msg_id"])

    async def execute(self, code: str, timeout: float = 60.0, started: asyncio.Event | None = None) -> Execution:
        """Run ``code``; its reply and output. ``started`` is set once the kernel says it is busy with it."""
        assert self.ws is not None
        msg_id = await self.send("execute_request", {"code": code, "silent": False, "store_history": True,
                                                     "user_expressions": {}, "allow_stdin": False,
                                                     "stop_on_error": True})
        out: list[str] = []
        seen: list[dict[str, Any]] = []
        reply: dict[str, Any] | None = None
        idle = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while reply is None or not idle:
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(f"no reply to {code!r} within {timeout} s (saw {[m['msg_type'] for m in seen]})")
            raw = await asyncio.wait_for(self.ws.read_message(), left)
            if raw is None:
                raise ConnectionError("the kernel's websocket closed")
            msg = json.loads(raw)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            seen.append(msg)
            kind = msg["msg_type"]
            if kind == "stream":
                out.append(msg["content"]["text"])
            elif kind == "status":
                state = msg["content"]["execution_state"]
                if state == "busy" and started is not None:
                    started.set()
                idle = state == "idle"
            elif kind == "execute_reply":
                reply = msg
        content = reply["content"]
        return Execution(str(content["status"]), "".join(out), str(content.get("ename") or ""), seen)

    async def wait_ready(self, timeout: float = 60.0) -> None:
        """Until the kernel answers a kernel_info_request (a restarted kernel takes a moment)."""
        assert self.ws is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            msg_id = await self.send("kernel_info_request", {})
            try:
                while True:
                    raw = await asyncio.wait_for(self.ws.read_message(), max(0.1, min(2.0, deadline - loop.time())))
                    if raw is None:
                        raise ConnectionError("the kernel's websocket closed")
                    msg = json.loads(raw)
                    if msg["msg_type"] == "kernel_info_reply" and msg["parent_header"].get("msg_id") == msg_id:
                        return
            except asyncio.TimeoutError:
                if loop.time() > deadline:
                    raise TimeoutError(f"the kernel did not answer within {timeout} s") from None
