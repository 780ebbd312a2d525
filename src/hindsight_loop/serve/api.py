"""The JSON API: agents in any language record runs, recall lessons and report outcomes;
review tools list and change the lesson book.

Bodies are the wire format of DESIGN.md (events exactly as ``hs.record`` takes them, lessons
and tasks as their ``to_dict``). A bad request gets a 4xx with ``{"error": "..."}`` saying what
to send instead, and nothing of it is applied: a batch of events is checked whole before any
of it is recorded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from hindsight_loop.models import MAX_LESSONS, Event, Lesson, new_id
from hindsight_loop.recall import LessonSet
from hindsight_loop.serve import book
from hindsight_loop.serve.book import BadInput, NotFound

if TYPE_CHECKING:
    from hindsight_loop.hindsight import Hindsight

#: Most events one request may carry: bigger trajectories go in several requests.
MAX_BATCH = 10_000
INTENTS = ("query", "operation", "analysis")


class JSONResponse(Response):
    """JSON that keeps Chinese readable (orjson: UTF-8, non-ASCII as is)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS, default=str)


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def _body(request: Request) -> Any:
    raw = await request.body()
    if not raw.strip():
        raise BadInput("the request body is empty: send a JSON object")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadInput(f"the body is not valid JSON ({exc})") from None


async def _object(request: Request) -> dict[str, Any]:
    data = await _body(request)
    if not isinstance(data, dict):
        raise BadInput(f"the body must be a JSON object, got {type(data).__name__}")
    return data


def _text(data: dict[str, Any], name: str, *, required: bool = False, default: str = "") -> str:
    value = data.get(name)
    if value is None:
        if required:
            raise BadInput(f"{name!r} is required (a string)")
        return default
    if not isinstance(value, str) or (required and not value.strip()):
        raise BadInput(f"{name!r} must be a non-empty string, got {value!r}")
    return value


def _names(data: dict[str, Any], name: str) -> list[str]:
    value = data.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadInput(f"{name!r} must be a list of strings")
    return value


def _intent(value: Any) -> str | None:
    if value in (None, ""):
        return None
    if value not in INTENTS:
        raise BadInput(f"intent must be one of {', '.join(INTENTS)}, got {value!r}")
    return str(value)


def _scope(value: Any) -> str | None:
    if value in (None, ""):
        return None
    from hindsight_loop.lessons import check_scope

    try:
        return check_scope(str(value))
    except ValueError as exc:
        raise BadInput(str(exc)) from None


def _limit(value: Any, default: int, most: int) -> int:
    if value in (None, ""):
        return default
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise BadInput(f"limit must be a whole number 1-{most}, got {value!r}") from None
    if not 1 <= n <= most:
        raise BadInput(f"limit must be a whole number 1-{most}, got {value!r}")
    return n


async def _blocking(fn: Any, *args: Any) -> Any:
    """Run a facade call (SQLite, a flush) in a worker thread, off the event loop."""
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(fn, *args)


def lesson_view(lesson: Lesson) -> dict[str, Any]:
    out = lesson.to_dict()
    if lesson.score is None:
        out.pop("score", None)
    return out


class Api:
    """The API's endpoints over one facade (blocking calls: Starlette runs them in threads)."""

    def __init__(self, hs: Hindsight, cache: book.BookCache) -> None:
        self.hs = hs
        self.cache = cache

    # -- recording ---------------------------------------------------------------------------
    def check_events(self, data: Any) -> tuple[list[dict[str, Any]], str | None]:
        """The events of a request, every one checked, with a task id given to a ``task_start``
        that has none (and to the events of that batch without one). Raises ``BadInput``
        listing every problem; nothing is recorded then."""
        if isinstance(data, dict) and "events" in data:
            data = data["events"]
        batch = [data] if isinstance(data, dict) else data
        if not isinstance(batch, list):
            raise BadInput('send one event object, a list of events, or {"events": [...]}')
        if not batch:
            raise BadInput("no events: send at least one")
        if len(batch) > MAX_BATCH:
            raise BadInput(f"{len(batch)} events in one request; send at most {MAX_BATCH}")
        batch = [dict(e) if isinstance(e, dict) else e for e in batch]
        new_task: str | None = None
        for e in batch:
            if isinstance(e, dict) and e.get("type") == "task_start" and not e.get("task_id"):
                if new_task is not None:
                    raise BadInput("two task_start events without a task_id: give each its own")
                new_task = e["task_id"] = new_id("tsk")
        if new_task is not None:
            for e in batch:
                if isinstance(e, dict) and not e.get("task_id"):
                    e["task_id"] = new_task
        problems = []
        for i, e in enumerate(batch):
            try:
                Event.from_dict(e)
            except (ValueError, TypeError, OverflowError) as exc:
                problems.append(f"event {i}: {exc}")
            else:
                if e["type"] == "task_start" and not isinstance(e.get("task_type"), str):
                    problems.append(f"event {i}: a task_start needs a 'task_type' (a string)")
        if problems:
            raise BadInput("nothing was recorded: " + "; ".join(problems[:20]))
        return batch, new_task

    async def record(self, request: Request) -> Response:
        batch, new_task = self.check_events(await _body(request))
        task_ids: list[str] = []
        for e in batch:
            self.hs.record(e)
            if e["task_id"] not in task_ids:
                task_ids.append(e["task_id"])
        await _blocking(self.hs.flush)
        out: dict[str, Any] = {"recorded": len(batch), "task_ids": task_ids}
        if new_task:
            out["task_id"] = new_task
        return JSONResponse(out, status_code=201)

    def _recall(self, data: dict[str, Any]) -> Any:
        return self.hs.recall(
            task_type=_text(data, "task_type") or None,
            tools=data["tools"],
            query=_text(data, "query"),
            intent=_intent(data.get("intent")),
            scope=_scope(data.get("scope")),
            limit=_limit(data.get("limit"), MAX_LESSONS, MAX_LESSONS),
        )

    async def start_task(self, request: Request) -> Response:
        return await _blocking(self._start_task, await _object(request))

    def _start_task(self, data: dict[str, Any]) -> Response:
        task_type = _text(data, "task_type", required=True)
        tools = _names(data, "tools")
        scope = _scope(data.get("scope")) or "global"
        intent = _intent(data.get("intent"))
        task_id = _text(data, "task_id") or new_id("tsk")
        recall = data.get("recall", True)
        if not isinstance(recall, bool):
            raise BadInput(f"'recall' must be true or false, got {recall!r}")
        if self.hs.get_task(task_id) is not None:
            raise BadInput(f"task {task_id!r} exists already: start a task with a new id")
        found = (
            self._recall({**data, "tools": tools, "scope": scope, "intent": intent})
            if recall
            else LessonSet()
        )
        event = {
            "type": "task_start",
            "task_id": task_id,
            "task_type": task_type,
            "goal": _text(data, "goal"),
            "tools": tools,
            "scope": scope,
            "intent": intent,
            "injected_lesson_ids": [x.lesson_id for x in found],
        }
        if data.get("timestamp") is not None:
            event["timestamp"] = data["timestamp"]
        self.check_events(event)
        self.hs.record(event)
        self.hs.flush()
        return JSONResponse(
            {
                "task_id": task_id,
                "lessons": [lesson_view(x) for x in found],
                "advice": found.as_prompt() if found else "",
            },
            status_code=201,
        )

    async def end_task(self, request: Request) -> Response:
        return await _blocking(
            self._end_task, request.path_params["task_id"], await _object(request)
        )

    def _end_task(self, task_id: str, data: dict[str, Any]) -> Response:
        status = data.get("status")
        if status not in ("succeeded", "failed"):
            raise BadInput(f"status must be 'succeeded' or 'failed', got {status!r}")
        helpful, harmful = _names(data, "helpful"), _names(data, "harmful")
        both = set(helpful) & set(harmful)
        if both:
            raise BadInput(f"lessons both helpful and harmful: {', '.join(sorted(both))}")
        self.hs.flush()
        if self.hs.get_task(task_id) is None:
            raise NotFound(f"no task {task_id!r}: start it with POST /api/tasks first")
        rated = {**dict.fromkeys(helpful, True), **dict.fromkeys(harmful, False)}
        updated = self.hs.report_outcome(
            task_id,
            status,
            summary=_text(data, "summary"),
            rated=rated,  # type: ignore[arg-type]
        )
        # The task ended all the same: a wrong id must not lose the run's outcome.
        return JSONResponse(
            updated.answer(
                task_id,
                status,
                how="recalled by POST /api/tasks, or named in its task_start's injected_lesson_ids",
            )
        )

    async def feedback(self, request: Request) -> Response:
        """A person's word on a running task (a ``feedback`` event: text and a score -1..1)."""
        return await _blocking(
            self._feedback, request.path_params["task_id"], await _object(request)
        )

    def _feedback(self, task_id: str, data: dict[str, Any]) -> Response:
        text = _text(data, "text")
        score = data.get("score")
        if score is not None and (
            isinstance(score, bool) or not isinstance(score, int | float) or not -1 <= score <= 1
        ):
            raise BadInput(f"score must be a number from -1 to 1, got {score!r}")
        if not text and score is None:
            raise BadInput("feedback needs 'text', 'score' (-1..1) or both")
        self.hs.flush()
        if self.hs.get_task(task_id) is None:
            raise NotFound(f"no task {task_id!r}: start it with POST /api/tasks first")
        body: dict[str, Any] = {"text": text}
        if score is not None:
            body["score"] = score
        self.hs.record({"type": "feedback", "task_id": task_id, "input": body})
        self.hs.flush()
        return JSONResponse({"task_id": task_id, "recorded": 1}, status_code=201)

    def reflect(self, request: Request) -> Response:
        task_id = request.path_params["task_id"]
        self.hs.flush()
        if self.hs.get_task(task_id) is None:
            raise NotFound(f"no task {task_id!r}; list them with GET /api/tasks")
        reflection = self.hs.reflect(task_id)
        lessons = [x for i in reflection.lesson_ids if (x := self.hs.lesson(i)) is not None]
        out = reflection.to_dict()
        out["lessons"] = [lesson_view(x) for x in lessons]
        return JSONResponse(out)

    # -- recall ------------------------------------------------------------------------------
    async def recall(self, request: Request) -> Response:
        if request.method == "GET":
            q = request.query_params
            data: dict[str, Any] = {k: q.get(k) for k in ("task_type", "query", "intent", "scope")}
            data["limit"] = q.get("limit")
            data["tools"] = [t for v in q.getlist("tools") for t in v.split(",") if t.strip()]
            data = {k: v for k, v in data.items() if v is not None}
        else:
            data = await _object(request)
            data["tools"] = _names(data, "tools")
        found = await _blocking(self._recall, data)
        return JSONResponse(
            {
                "lessons": [lesson_view(x) for x in found],
                "advice": found.as_prompt() if found else "",
            }
        )

    # -- reads -------------------------------------------------------------------------------
    def tasks(self, request: Request) -> Response:
        q = request.query_params
        page = book.runs_page(
            self.hs,
            page=book.page_number(q.get("page")),
            task_type=q.get("task_type") or None,
            status=q.get("status") or None,
            since=book.day_bound(q.get("since"), "since"),
            until=book.day_bound(q.get("until"), "until"),
            size=_limit(q.get("limit"), book.PAGE_SIZE, 500),
        )
        return JSONResponse(
            {"tasks": [t.to_dict() for t in page.items], "page": page.page, "next": page.has_next}
        )

    def task(self, request: Request) -> Response:
        view = book.run_view(self.hs, request.path_params["task_id"])
        return JSONResponse(
            {
                "task": view["task"].to_dict(),
                "chronicle": view["chronicle"].to_dict(),
                "injected_lessons": [lesson_view(x) for x in view["injected"]],
                "reflections": [r.to_dict() for r in view["reflections"]],
            }
        )

    def lessons(self, request: Request) -> Response:
        q = request.query_params
        page = book.lessons_page(
            self.cache.get(self.hs),
            page=book.page_number(q.get("page")),
            q=q.get("q") or "",
            status=q.get("status") or None,
            task_type=q.get("task_type") or None,
            scope=q.get("scope") or None,
            size=_limit(q.get("limit"), book.PAGE_SIZE, 500),
        )
        return JSONResponse(
            {
                "lessons": [lesson_view(x) for x in page.items],
                "page": page.page,
                "next": page.has_next,
                "total": page.total,
            }
        )

    def lesson(self, request: Request) -> Response:
        lesson_id = request.path_params["lesson_id"]
        lesson = self.hs.lesson(lesson_id)
        if lesson is None:
            raise NotFound(f"no lesson {lesson_id!r}; list them with GET /api/lessons")
        return JSONResponse(lesson_view(lesson))

    def reflections(self, request: Request) -> Response:
        q = request.query_params
        found = self.hs.reflections(
            q.get("task_id") or None, limit=_limit(q.get("limit"), 100, 1000)
        )
        return JSONResponse({"reflections": [r.to_dict() for r in found]})

    def review(self, request: Request) -> Response:
        queue = book.review_queue(self.cache.get(self.hs))
        return JSONResponse(
            {
                "queue": [
                    {
                        "lesson": lesson_view(i.lesson),
                        "reasons": i.reasons,
                        "conflicts_with": [lesson_view(r) for r in i.rivals],
                        "judged_merges": i.judged,
                    }
                    for i in queue
                ]
            }
        )

    # -- review actions ----------------------------------------------------------------------
    async def change(self, request: Request) -> Response:
        data = await _object(request)
        by = _text(data, "by", required=True)
        action = request.path_params["action"]
        changes = data.get("changes") if action == "edit" else None
        changed = await _blocking(
            lambda: book.act(
                self.hs,
                request.path_params["lesson_id"],
                action,
                by=by,
                reason=_text(data, "reason"),
                changes=changes,
                cache=self.cache,
            )
        )
        return JSONResponse(lesson_view(changed))

    async def resolve(self, request: Request) -> Response:
        data = await _object(request)
        by = _text(data, "by", required=True)
        keep = _text(data, "keep", required=True)
        drop = _text(data, "reject", required=True)
        same = data.get("same", False)
        if not isinstance(same, bool):
            raise BadInput("'same' must be true or false")
        kept, dropped = await _blocking(
            lambda: book.resolve_conflict(self.hs, keep, drop, by=by, cache=self.cache, same=same)
        )
        return JSONResponse({"kept": lesson_view(kept), "rejected": lesson_view(dropped)})

    def health(self, request: Request) -> Response:
        return JSONResponse({"ok": True})

    def openapi(self, request: Request) -> Response:
        from hindsight_loop.serve.openapi import OPENAPI

        return JSONResponse(OPENAPI)

    def routes(self) -> list[Route]:
        return [
            Route("/api/health", self.health),
            Route("/openapi.json", self.openapi),
            Route("/api/events", self.record, methods=["POST"]),
            Route("/api/tasks", self.tasks, methods=["GET"]),
            Route("/api/tasks", self.start_task, methods=["POST"]),
            Route("/api/tasks/{task_id}", self.task),
            Route("/api/tasks/{task_id}/end", self.end_task, methods=["POST"]),
            Route("/api/tasks/{task_id}/feedback", self.feedback, methods=["POST"]),
            Route("/api/tasks/{task_id}/reflect", self.reflect, methods=["POST"]),
            Route("/api/recall", self.recall, methods=["GET", "POST"]),
            Route("/api/lessons", self.lessons),
            Route("/api/lessons/{lesson_id}", self.lesson),
            Route("/api/lessons/{lesson_id}/{action}", self.change, methods=["POST"]),
            Route("/api/reflections", self.reflections),
            Route("/api/review", self.review),
            Route("/api/conflicts/resolve", self.resolve, methods=["POST"]),
        ]
