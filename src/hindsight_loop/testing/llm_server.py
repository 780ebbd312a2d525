"""A real HTTP server on 127.0.0.1 that plays an LLM: scripted answers and scripted faults.

It speaks OpenAI chat-completions (``POST /v1/chat/completions``) and Anthropic Messages
(``POST /v1/messages``), so the official clients talk to it exactly as they talk to the real
services; nothing in the client is patched. Each request takes the next item of the script: a
``Reply`` (an answer, possibly fenced, broken, prose, empty or truncated) or a ``Fault`` (an HTTP
error such as 429 with ``Retry-After`` or 500, a hang past the client's timeout, a connection
dropped mid-answer). Every request received is recorded in ``server.requests``.

Example::

    from hindsight_loop.testing.llm_server import LLMServer, fenced, rate_limited

    with LLMServer([rate_limited(0.01), fenced({"root_cause": "…"})]) as server:
        llm = OpenAILLM("fake", base_url=server.openai_base_url, api_key="test")
        ...
        assert len(server.requests) == 2
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

from hindsight_loop.llm import estimate_tokens

# -- the script -------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class Reply:
    """A scripted answer (HTTP 200)."""

    text: str
    """The assistant's text, sent as is."""
    finish_reason: Literal["stop", "length"] = "stop"
    """``length`` says the answer was cut at max_tokens (Anthropic: ``max_tokens``)."""
    tokens_in: int | None = None
    """Prompt tokens to report; ``None`` estimates them from the request."""
    tokens_out: int | None = None
    """Answer tokens to report; ``None`` estimates them from ``text``."""
    model: str | None = None
    """Model name to report; ``None`` echoes the request's model."""
    delay: float = 0.0
    """Seconds to wait before answering."""


@dataclass(kw_only=True, slots=True)
class Fault:
    """A scripted failure."""

    kind: Literal["status", "hang", "disconnect"] = "status"
    """``status``: an HTTP error; ``hang``: no answer for ``seconds``; ``disconnect``: the
    connection drops halfway through the body."""
    status: int = 500
    message: str = "scripted failure"
    headers: dict[str, str] = field(default_factory=dict)
    seconds: float = 30.0
    """How long a hang lasts (it ends early when the server closes)."""


Item = Reply | Fault
Handler = Callable[["RecordedRequest"], Item]


def answer(content: Any, **kwargs: Any) -> Reply:
    """A clean answer: a dict/list is sent as JSON text, a string as is."""
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    return Reply(text=text, **kwargs)


def fenced(obj: Any, *, lang: str = "json", **kwargs: Any) -> Reply:
    """JSON inside a markdown code fence, with a sentence around it, as chat models like to do."""
    body = json.dumps(obj, ensure_ascii=False, indent=2)
    return Reply(
        text=f"Here is the review:\n\n```{lang}\n{body}\n```\n\nHope this helps.", **kwargs
    )


def broken(obj: Any, **kwargs: Any) -> Reply:
    """JSON cut before its closing brace, with a trailing comma: repairable, not parseable."""
    text = json.dumps(obj, ensure_ascii=False, indent=1)
    return Reply(text=text.rstrip()[:-1].rstrip() + ",\n", **kwargs)


def prose(text: str = "", **kwargs: Any) -> Reply:
    """An answer in prose with no JSON in it."""
    return Reply(
        text=text
        or "The agent kept calling the same tool with the wrong encoding. Next time, check the "
        "file's encoding first and then parse it.",
        **kwargs,
    )


def empty(**kwargs: Any) -> Reply:
    """An empty answer."""
    return Reply(text="", **kwargs)


def truncated(obj: Any, *, keep: float = 0.5, **kwargs: Any) -> Reply:
    """The first part of a JSON answer, marked as cut at max_tokens."""
    text = json.dumps(obj, ensure_ascii=False)
    return Reply(text=text[: max(1, int(len(text) * keep))], finish_reason="length", **kwargs)


def rate_limited(retry_after: float = 1.0, **kwargs: Any) -> Fault:
    """HTTP 429 with a ``Retry-After`` header (seconds)."""
    return Fault(
        status=429,
        message="rate limit exceeded",
        headers={"Retry-After": f"{retry_after:g}"},
        **kwargs,
    )


def server_error(status: int = 500, message: str = "internal server error") -> Fault:
    """An HTTP error such as 500, 502, 503 or Anthropic's 529."""
    return Fault(status=status, message=message)


def rejected(status: int = 400, message: str = "invalid request") -> Fault:
    """A client error (400/401/404/422) the client should not retry."""
    return Fault(status=status, message=message)


def hang(seconds: float = 30.0) -> Fault:
    """Accept the request and say nothing for ``seconds`` (longer than the client's timeout)."""
    return Fault(kind="hang", seconds=seconds)


def disconnect() -> Fault:
    """Send headers and half the body, then drop the connection."""
    return Fault(kind="disconnect")


# -- what was received ------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class RecordedRequest:
    """One request the server received."""

    protocol: Literal["openai", "anthropic", "other"]
    method: str
    path: str
    headers: dict[str, str]
    """Header names lower-cased."""
    body: dict[str, Any]
    """The JSON body (``{}`` when there was none or it was not JSON)."""
    received_at: float
    """``time.monotonic()`` on arrival."""

    @property
    def model(self) -> str | None:
        return self.body.get("model")

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages") or [])

    @property
    def system(self) -> str:
        """The system prompt, whichever protocol carried it."""
        if self.protocol == "anthropic":
            return _text(self.body.get("system"))
        return "\n".join(
            _text(m.get("content")) for m in self.messages if m.get("role") == "system"
        )

    @property
    def prompt(self) -> str:
        """The text of the last user message."""
        users = [m for m in self.messages if m.get("role") == "user"]
        return _text(users[-1].get("content")) if users else ""

    @property
    def prefill(self) -> str | None:
        """The start of the answer the client prefilled (Anthropic), if any."""
        msgs = self.messages
        if msgs and msgs[-1].get("role") == "assistant":
            return _text(msgs[-1].get("content"))
        return None

    @property
    def json_mode(self) -> bool:
        """True when an OpenAI client asked for ``response_format`` JSON."""
        fmt = self.body.get("response_format")
        return isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


# -- the server -------------------------------------------------------------------------------


class LLMServer:
    """A fake OpenAI + Anthropic endpoint on 127.0.0.1, replaying a script; a context manager."""

    def __init__(
        self,
        script: Iterable[Item] | Handler = (),
        *,
        default: Item | None = None,
        model: str = "fake-model",
    ) -> None:
        """Prepare (``start()`` or ``with`` binds the port).

        Args:
            script: Items answered in order, one per request; or a function from the request to
                the item to answer.
            default: Answer once the script is used up; ``None`` answers HTTP 500
                ``script exhausted`` so a test that asks more than it scripted fails visibly.
            model: Model name reported when a request names none.
        """
        self._handler: Handler | None = script if callable(script) else None
        self._script: deque[Item] = deque() if callable(script) else deque(script)
        self.default = default
        self.model = model
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # lifecycle
    def start(self) -> LLMServer:
        if self._httpd is not None:
            return self
        self._httpd = _HTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="hindsight-llm-server",
            daemon=True,
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving: ends hangs, drops idle keep-alive connections, joins every thread."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        with self._lock:
            open_sockets = list(self._sockets)
        for sock in open_sockets:
            # Wakes handler threads blocked reading the next request of a keep-alive connection.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        httpd.server_close()  # joins the handler threads (block_on_close)
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> LLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # addresses
    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        if self._httpd is None:
            raise RuntimeError(
                "the LLM server is not running: use 'with LLMServer(...)' or start()"
            )
        port = self._httpd.server_address[1]
        return f"http://127.0.0.1:{port}"

    @property
    def openai_base_url(self) -> str:
        """``base_url`` for the ``openai`` client (with ``/v1``)."""
        return f"{self.url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """``base_url`` for the ``anthropic`` client (without ``/v1``: the client adds it)."""
        return self.url

    # script
    def add(self, *items: Item) -> None:
        """Append items to the script."""
        with self._lock:
            self._script.extend(items)

    @property
    def remaining(self) -> int:
        """Script items not used yet."""
        with self._lock:
            return len(self._script)

    def _next(self, request: RecordedRequest) -> Item:
        if self._handler is not None:
            return self._handler(request)
        with self._lock:
            if self._script:
                return self._script.popleft()
        return self.default or Fault(status=500, message="LLMServer script exhausted")

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = False  # joined on close, so no thread outlives a test
    block_on_close = True
    allow_reuse_address = True


def _make_handler(server: LLMServer) -> type[BaseHTTPRequestHandler]:
    class _Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, like the real services
        timeout = 10  # an idle keep-alive connection is dropped after this many seconds

        def setup(self) -> None:
            super().setup()
            with server._lock:
                server._sockets.add(self.connection)

        def finish(self) -> None:
            with contextlib.suppress(OSError):
                super().finish()
            with server._lock:
                server._sockets.discard(self.connection)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
            pass  # quiet: tests read server.requests instead

        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            if self.path.rstrip("/").endswith("/models"):
                self._send_json(
                    200, {"object": "list", "data": [{"id": server.model, "object": "model"}]}
                )
            else:
                self._send_json(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                body = {}
            path = self.path.split("?", 1)[0].rstrip("/")
            protocol: Literal["openai", "anthropic", "other"] = (
                "openai"
                if path.endswith("/chat/completions")
                else "anthropic"
                if path.endswith("/messages")
                else "other"
            )
            request = RecordedRequest(
                protocol=protocol,
                method="POST",
                path=self.path,
                headers={k.lower(): v for k, v in self.headers.items()},
                body=body if isinstance(body, dict) else {},
                received_at=time.monotonic(),
            )
            server._record(request)
            if protocol == "other":
                self._send_json(404, {"error": {"message": f"no route {self.path}"}})
                return
            item = server._next(request)
            try:
                if isinstance(item, Fault):
                    self._fault(item, request)
                else:
                    self._reply(item, request)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client gave up (its timeout): nothing to do

        # answers
        def _reply(self, reply: Reply, request: RecordedRequest) -> None:
            if reply.delay and server._stopping.wait(reply.delay):
                self.close_connection = True
                return
            model = reply.model or request.model or server.model
            tokens_in = reply.tokens_in
            if tokens_in is None:
                tokens_in = estimate_tokens(request.system + request.prompt)
            text = reply.text
            if request.protocol == "anthropic":
                prefill = request.prefill
                if prefill and text.startswith(prefill):
                    text = text[len(prefill) :]  # the model continues its prefilled start
                tokens_out = (
                    reply.tokens_out if reply.tokens_out is not None else estimate_tokens(text)
                )
                self._send_json(
                    200,
                    {
                        "id": f"msg_{len(server.requests)}",
                        "type": "message",
                        "role": "assistant",
                        "model": model,
                        "content": [{"type": "text", "text": text}] if text else [],
                        "stop_reason": "max_tokens"
                        if reply.finish_reason == "length"
                        else "end_turn",
                        "stop_sequence": None,
                        "usage": {"input_tokens": tokens_in, "output_tokens": tokens_out},
                    },
                )
                return
            tokens_out = reply.tokens_out if reply.tokens_out is not None else estimate_tokens(text)
            self._send_json(
                200,
                {
                    "id": f"chatcmpl-{len(server.requests)}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": reply.finish_reason,
                            "logprobs": None,
                        }
                    ],
                    "usage": {
                        "prompt_tokens": tokens_in,
                        "completion_tokens": tokens_out,
                        "total_tokens": tokens_in + tokens_out,
                    },
                },
            )

        def _fault(self, fault: Fault, request: RecordedRequest) -> None:
            if fault.kind == "hang":
                server._stopping.wait(fault.seconds)
                self.close_connection = True
                self._send_json(504, {"error": {"message": "hung"}})
                return
            if fault.kind == "disconnect":
                payload = json.dumps({"id": "cut", "choices": [], "padding": "x" * 200}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload[: len(payload) // 2])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if request.protocol == "anthropic":
                body: dict[str, Any] = {
                    "type": "error",
                    "error": {
                        "type": _anthropic_error_type(fault.status),
                        "message": fault.message,
                    },
                }
            else:
                body = {
                    "error": {"message": fault.message, "type": "scripted", "code": fault.status}
                }
            self._send_json(fault.status, body, headers=fault.headers)

        def _send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
            payload = json.dumps(body, ensure_ascii=False).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
            self.wfile.flush()

    return _Handler


def _anthropic_error_type(status: int) -> str:
    return {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        429: "rate_limit_error",
        529: "overloaded_error",
    }.get(status, "api_error")


__all__ = [
    "Fault",
    "LLMServer",
    "RecordedRequest",
    "Reply",
    "answer",
    "broken",
    "disconnect",
    "empty",
    "fenced",
    "hang",
    "prose",
    "rate_limited",
    "rejected",
    "server_error",
    "truncated",
]
