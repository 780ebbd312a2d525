"""Read a model's review answer even when it is not quite the JSON that was asked for.

Models wrap JSON in markdown fences, add a sentence before it, leave a trailing comma, stop in
the middle, or rename keys (``rootCause``, ``"root cause"``, ``建议``). This module strips fences,
repairs the JSON with ``json_repair``, and maps near-miss keys onto the fixed ones. It returns
``None`` when nothing usable is there, so the caller can mark the reflection suspect.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

import json_repair

FULL_KEYS = (
    "task_goal",
    "execution_path",
    "effective_steps",
    "ineffective_steps",
    "key_decisions",
    "improvements",
    "lesson",
)
LESSON_KEYS = (
    "advice",
    "root_cause",
    "suggestions",
    "general_rule",
    "tools",
    "error_type",
    "keywords",
    "when",
    "prefer",
    "avoid",
)

# Near-miss spellings, after normalisation (lower case, no spaces, underscores, hyphens, colons).
# "建议" (suggestions) is the plural list; the second-person advice is "忠告"/"行动建议".
_ALIASES: dict[str, tuple[str, ...]] = {
    "task_goal": ("goal", "objective", "任务目标", "目标"),
    "execution_path": (
        "path",
        "execution",
        "executionsummary",
        "trajectory",
        "执行路径",
        "执行过程",
    ),
    "effective_steps": ("effective", "whatworked", "successfulsteps", "有效步骤", "有效的步骤"),
    "ineffective_steps": ("ineffective", "whatfailed", "failedsteps", "无效步骤", "无效的步骤"),
    "key_decisions": ("keydecisionpoints", "decisionpoints", "decisions", "关键决策", "关键决策点"),
    "improvements": ("improvement", "改进", "改进点", "改进方向", "改进措施"),
    "lesson": (
        "reusablelesson",
        "lessonlearned",
        "lessonslearned",
        "lessons",
        "教训",
        "经验",
        "经验教训",
    ),
    "advice": ("tip", "advise", "忠告", "行动建议", "给你的建议", "提示"),
    "root_cause": ("cause", "rootcauseanalysis", "reason", "根因", "根本原因", "原因"),
    "suggestions": (
        "suggestion",
        "recommendations",
        "recommendation",
        "建议",
        "改进建议",
        "具体建议",
    ),
    "general_rule": (
        "rule",
        "generalrules",
        "principle",
        "通用规则",
        "规则",
        "一般规则",
        "普遍规则",
    ),
    "tools": ("tool", "relatedtools", "工具"),
    "error_type": ("error", "errortypes", "错误类型", "错误"),
    "keywords": ("keyword", "tags", "关键词", "关键字"),
    "when": ("condition", "conditions", "条件", "何时"),
    "prefer": ("preferred", "优先", "推荐做法"),
    "avoid": ("不要", "避免"),
}


def _norm(key: str) -> str:
    key = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", key)  # rootCause -> root_Cause
    return re.sub(r"[\s_\-:：.·、]+", "", key.lower())


_CANONICAL: dict[str, str] = {}
for _key, _aliases in _ALIASES.items():
    for _alias in (_key, *_aliases):
        _CANONICAL[_norm(_alias)] = _key

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_-]*)[ \t]*\n?(.*?)(?:```|\Z)", re.DOTALL)


def strip_fences(text: str) -> str:
    """The body of the first markdown code fence that holds an object, or ``text`` unchanged.

    An opening fence without its closing one (an answer cut short) counts too.
    """
    for match in _FENCE.finditer(text):
        body = match.group(2).strip()
        if "{" in body:
            return body
    return text.strip()


def extract_json(text: str) -> dict[str, Any] | None:
    """The JSON object in a model's answer: exact, then between the outer braces, then repaired."""
    body = strip_fences(text)
    if not body:
        return None
    candidates = [body]
    start, end = body.find("{"), body.rfind("}")
    if 0 <= start < end:
        candidates.append(body[start : end + 1])
    for candidate in candidates:
        try:
            obj = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj
    if start < 0:
        return None  # prose: json_repair would turn words into strings, never into a review
    try:
        obj = json_repair.loads(body[start:])
    except Exception:  # json_repair is best effort; anything it cannot do means "not JSON"
        return None
    if isinstance(obj, list):
        obj = next((x for x in obj if isinstance(x, dict)), None)
    return obj if isinstance(obj, dict) and obj else None


def canonical_keys(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with near-miss keys renamed to the fixed ones; unknown keys kept as they were."""
    out: dict[str, Any] = {}
    for key, value in obj.items():
        name = _CANONICAL.get(_norm(str(key)), key) if isinstance(key, str) else key
        out.setdefault(name, value)  # the first spelling wins
    return out


def parse_review(text: str, kind: Literal["full", "local"]) -> dict[str, Any] | None:
    """The review in ``text`` with canonical keys, or ``None`` when it holds no usable review.

    A full review always comes back with a ``lesson`` dict (built from top-level keys when the
    model flattened it); a local review is the lesson itself.
    """
    obj = extract_json(text)
    if obj is None:
        return None
    data = _unwrap(canonical_keys(obj))
    if kind == "local":
        # Some models answer a local review in the full shape; take its lesson.
        if isinstance(data.get("lesson"), dict) and not _has_lesson_keys(data):
            data = {**data, **canonical_keys(data["lesson"])}
        return data if _has_lesson_keys(data) else None
    lesson = data.get("lesson")
    if isinstance(lesson, list):
        lesson = next((x for x in lesson if isinstance(x, dict)), None) or (
            {"advice": as_text(lesson[0])} if lesson else None
        )
    if isinstance(lesson, str):
        lesson = {"advice": lesson}
    lesson = canonical_keys(lesson) if isinstance(lesson, dict) else {}
    for key in LESSON_KEYS:  # flattened answers put the lesson's keys at the top
        if key not in lesson and key in data:
            lesson[key] = data[key]
    data = {k: v for k, v in data.items() if k not in LESSON_KEYS or k in FULL_KEYS}
    data["lesson"] = lesson
    if not lesson and not any(k in data for k in FULL_KEYS if k != "lesson"):
        return None
    return data


def _has_lesson_keys(data: dict[str, Any]) -> bool:
    return any(data.get(k) for k in ("advice", "root_cause", "general_rule", "suggestions"))


def _unwrap(data: dict[str, Any]) -> dict[str, Any]:
    # {"review": {...}} or {"result": {...}}: one wrapper key around the real answer.
    known = set(FULL_KEYS) | set(LESSON_KEYS)
    for _ in range(2):
        if any(k in known for k in data) or len(data) != 1:
            break
        (inner,) = data.values()
        if not isinstance(inner, dict):
            break
        data = canonical_keys(inner)
    return data


# -- values -----------------------------------------------------------------------------------

_BULLET = re.compile(r"^\s*(?:[-*•·]|\d+[.)、]|[（(]?\d+[)）])\s*")


def as_text(value: Any) -> str:
    """A value as one line of text: lists joined with ``; ``, objects as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, list):
        return "; ".join(t for t in (as_text(v) for v in value) if t)
    if isinstance(value, dict):
        for key in ("text", "advice", "description", "step", "content"):
            if isinstance(value.get(key), str):
                return value[key].strip()
        return json.dumps(value, ensure_ascii=False)
    return str(value).strip()


def as_list(value: Any) -> list[str]:
    """A value as a list of non-empty strings; a string is split on lines, bullets and numbering."""
    if value is None:
        return []
    if isinstance(value, list):
        return [t for t in (as_text(v) for v in value) if t]
    if isinstance(value, str):
        parts = re.split(r"\n+|[；;](?=\s*\S)", value)
        items = [_BULLET.sub("", p).strip() for p in parts]
        return [p for p in items if p]
    text = as_text(value)
    return [text] if text else []


def as_dict(value: Any) -> dict[str, Any] | None:
    """A value as a dict, or ``None`` when it is not one (or empty)."""
    return value if isinstance(value, dict) and value else None
