"""The OpenAPI description of ``hindsight serve``'s JSON API, served at ``/openapi.json``.

Hand-written: the API is small, and a description written for people says more than one
generated from function signatures. A test checks every route of the app appears here.
"""

from __future__ import annotations

from typing import Any


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


_ERRORS = {
    "400": {"description": "Bad input; nothing was applied.", **_json(_ref("Error"))},
    "401": {"description": "The token is missing or wrong.", **_json(_ref("Error"))},
}
_NOT_FOUND = {"404": {"description": "No such task or lesson.", **_json(_ref("Error"))}}
_BY = {"by": {"type": "string", "description": "Who makes the change (kept in the history)."}}


def _op(
    summary: str,
    *,
    body: dict[str, Any] | None = None,
    ok: str = "200",
    missing: bool = False,
    params: list[dict[str, Any]] | None = None,
    result: dict[str, Any] | None = None,
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "responses": {
            ok: {"description": "OK", **_json(result or {"type": "object"})},
            **_ERRORS,
            **(_NOT_FOUND if missing else {}),
        },
    }
    if body is not None:
        op["requestBody"] = {"required": True, **_json(body)}
    if params:
        op["parameters"] = params
    return op


def _q(name: str, description: str, kind: str = "string") -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": {"type": kind},
    }


def _path(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


_PAGE = [
    _q("page", "1-based page number.", "integer"),
    _q("limit", "Rows per page (default 50).", "integer"),
]

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "Hindsight",
        "version": "1",
        "description": "Experience memory for AI agents: record runs, recall lessons, report "
        "outcomes, review the lesson book. Writes (and reads from other machines) need "
        "'Authorization: Bearer <token>'.",
    },
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": {
            "Error": {
                "type": "object",
                "properties": {"error": {"type": "string"}},
                "required": ["error"],
            },
            "Event": {
                "type": "object",
                "description": "One step of a run, the wire format of DESIGN.md.",
                "required": ["type"],
                "properties": {
                    "event_id": {"type": "string"},
                    "task_id": {
                        "type": "string",
                        "description": "Optional on a task_start: one is made.",
                    },
                    "seq": {"type": "integer"},
                    "timestamp": {"type": "string", "format": "date-time"},
                    "type": {
                        "enum": [
                            "task_start",
                            "user_input",
                            "llm_decision",
                            "action_executed",
                            "state_change",
                            "feedback",
                            "task_end",
                        ]
                    },
                    "agent_state": {"type": "object"},
                    "context": {"type": "object"},
                    "input": {"type": "object"},
                    "decision": {"type": "object"},
                    "result": {"type": "object"},
                },
            },
            "Lesson": {"type": "object", "description": "A lesson as Lesson.to_dict()."},
            "Task": {"type": "object", "description": "A task as Task.to_dict()."},
            "Recall": {
                "type": "object",
                "properties": {
                    "lessons": {"type": "array", "items": _ref("Lesson"), "maxItems": 3},
                    "advice": {
                        "type": "string",
                        "description": "The lessons rendered for a prompt.",
                    },
                },
            },
            "RecallQuery": {
                "type": "object",
                "properties": {
                    "task_type": {"type": "string"},
                    "tools": {"type": "array", "items": {"type": "string"}},
                    "intent": {"enum": ["query", "operation", "analysis"]},
                    "scope": {"type": "string", "description": "global, project:NAME or user:NAME"},
                    "query": {"type": "string"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 3},
                },
            },
        },
    },
    "security": [{"bearer": []}],
    "paths": {
        "/api/health": {"get": _op("Is the server up (no store access).")},
        "/api/events": {
            "post": _op(
                'Record one event, a list, or {"events": [...]}; all are checked before any is recorded.',
                body={
                    "oneOf": [
                        _ref("Event"),
                        {"type": "array", "items": _ref("Event")},
                        {
                            "type": "object",
                            "properties": {"events": {"type": "array", "items": _ref("Event")}},
                        },
                    ]
                },
                ok="201",
            )
        },
        "/api/tasks": {
            "get": _op(
                "Recorded tasks, newest first.",
                params=[
                    _q("task_type", "Only this task type."),
                    _q("status", "running, succeeded or failed."),
                    _q("since", "Started on or after this date (2025-01-31)."),
                    _q("until", "Started on or before this date."),
                    *_PAGE,
                ],
            ),
            "post": _op(
                "Start a task: records its task_start and recalls lessons for it (injected).",
                body={
                    "type": "object",
                    "required": ["task_type"],
                    "properties": {
                        "task_type": {"type": "string"},
                        "goal": {"type": "string"},
                        "tools": {"type": "array", "items": {"type": "string"}},
                        "scope": {"type": "string"},
                        "intent": {"enum": ["query", "operation", "analysis"]},
                        "query": {"type": "string"},
                        "task_id": {"type": "string"},
                        "recall": {"type": "boolean", "default": True},
                    },
                },
                ok="201",
            ),
        },
        "/api/tasks/{task_id}": {
            "get": {
                **_op(
                    "A task with its chronicle (steps, key nodes), injected lessons and reviews.",
                    missing=True,
                ),
                "parameters": [_path("task_id")],
            }
        },
        "/api/tasks/{task_id}/end": {
            "post": {
                **_op(
                    "End a task with its outcome; rate the lessons injected into it as helpful "
                    "or harmful (any other id is not counted: the answer names it in "
                    "lessons_ignored).",
                    body={
                        "type": "object",
                        "required": ["status"],
                        "properties": {
                            "status": {"enum": ["succeeded", "failed"]},
                            "summary": {"type": "string"},
                            "helpful": {"type": "array", "items": {"type": "string"}},
                            "harmful": {"type": "array", "items": {"type": "string"}},
                        },
                    },
                    missing=True,
                    result={
                        "type": "object",
                        "properties": {
                            "task_id": {"type": "string"},
                            "status": {"enum": ["succeeded", "failed"]},
                            "lessons_updated": {"type": "array", "items": {"type": "string"}},
                            "lessons_ignored": {"type": "array", "items": {"type": "string"}},
                            "note": {"type": "string"},
                        },
                    },
                ),
                "parameters": [_path("task_id")],
            }
        },
        "/api/tasks/{task_id}/feedback": {
            "post": {
                **_op(
                    "Record a person's feedback on a task (text, score -1..1).",
                    body={
                        "type": "object",
                        "properties": {
                            "text": {"type": "string"},
                            "score": {"type": "number", "minimum": -1, "maximum": 1},
                        },
                    },
                    ok="201",
                    missing=True,
                ),
                "parameters": [_path("task_id")],
            }
        },
        "/api/tasks/{task_id}/reflect": {
            "post": {
                **_op("Review a task now into lessons.", missing=True),
                "parameters": [_path("task_id")],
            }
        },
        "/api/recall": {
            "get": _op(
                "Recall at most 3 lessons (tools comma-separated).",
                params=[
                    _q("task_type", ""),
                    _q("tools", ""),
                    _q("intent", ""),
                    _q("scope", ""),
                    _q("query", ""),
                    _q("limit", "", "integer"),
                ],
                result=_ref("Recall"),
            ),
            "post": _op(
                "Recall at most 3 lessons.", body=_ref("RecallQuery"), result=_ref("Recall")
            ),
        },
        "/api/lessons": {
            "get": _op(
                "The lesson book, best value first.",
                params=[
                    _q("q", "Words that must all occur."),
                    _q("status", "active, needs_review, rejected, expired."),
                    _q("task_type", ""),
                    _q("scope", ""),
                    *_PAGE,
                ],
            )
        },
        "/api/lessons/{lesson_id}": {
            "get": {
                **_op("One lesson with its history.", missing=True),
                "parameters": [_path("lesson_id")],
            }
        },
        "/api/lessons/{lesson_id}/{action}": {
            "post": {
                **_op(
                    "Review a lesson: action is confirm, reject, pin, unpin, edit or split (the wordings "
                    "merged on the model's word alone become lessons of their own, for review).",
                    body={
                        "type": "object",
                        "required": ["by"],
                        "properties": {
                            **_BY,
                            "reason": {"type": "string"},
                            "changes": {
                                "type": "object",
                                "description": "For edit: advice, general_rule, root_cause, "
                                "suggestions, task_type, scope, tools, keywords, intent, step, error_type, valid_until.",
                            },
                        },
                    },
                    missing=True,
                    result=_ref("Lesson"),
                ),
                "parameters": [
                    _path("lesson_id"),
                    {
                        **_path("action"),
                        "schema": {"enum": ["confirm", "reject", "pin", "unpin", "edit", "split"]},
                    },
                ],
            }
        },
        "/api/reflections": {
            "get": _op(
                "Stored reviews, newest first.",
                params=[_q("task_id", ""), _q("limit", "", "integer")],
            )
        },
        "/api/review": {
            "get": _op(
                "What needs a person: conflicts, suspect quality, harm, and (judged_merges) the "
                "wordings merged on the model's word alone."
            )
        },
        "/api/conflicts/resolve": {
            "post": _op(
                "Settle a conflict: confirm one lesson, reject the other; with same=true the "
                "two say one thing and the kept one takes the other's support and wording.",
                body={
                    "type": "object",
                    "required": ["keep", "reject", "by"],
                    "properties": {
                        "keep": {"type": "string"},
                        "reject": {"type": "string"},
                        "same": {"type": "boolean"},
                        **_BY,
                    },
                },
                missing=True,
            )
        },
        "/openapi.json": {"get": _op("This description.")},
    },
}
