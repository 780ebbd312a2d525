"""The writer's fast path changes how fast an event is prepared, never what is stored.

``record._plain_dict`` lets the writer skip the sanitizer's walk for a payload the walk would
give back unchanged. Here, over generated agent events and adversarial ones (secret-named keys
at any depth, text and lists at and past the limit, nesting at and past the depth limit, NaN,
huge integers, lone surrogates, subclasses, enums, tuples, keys that are not text), the check
says yes only where the walk changes nothing, and a batch prepared with it gives the rows,
hook payloads and warnings of the full walk event by event.
"""

from __future__ import annotations

import dataclasses
import decimal
import enum
import json
import random
import uuid
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hindsight_loop import record as R
from hindsight_loop.record import MAX_DEPTH, Recorder, _Sanitizer

LIMIT = R.DEFAULT_MAX_TEXT
WORDS = ["report", "rows", "编码", "retry", "quarter", "销售", "csv", "amount", "gbk", "null"]


class Color(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


class Name(enum.StrEnum):
    PATH = "path"


class MyStr(str):
    pass


class MyFloat(float):
    pass


@dataclasses.dataclass
class Point:
    x: int
    y: float


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))[: n * 4]


def _event(rng: random.Random, i: int) -> tuple[str, dict[str, Any]]:
    """An agent's event as the facade builds it (the bench's mix, smaller)."""
    k = i % 5
    if k in (0, 1):
        failed = rng.random() < 0.2
        result: dict[str, Any] = {"status": "failed" if failed else "succeeded"}
        result["output"] = (
            None if failed else {"rows": rng.randint(0, 99), "preview": _text(rng, 30)}
        )
        if failed:
            result |= {"error_type": "EncodingError", "error_message": _text(rng, 10)}
        payload = {
            "input": {"tool": rng.choice(["read_csv", "query"]), "args": {"q": _text(rng, 20)}},
            "result": result,
            "agent_state": {"current_step": rng.choice(["load", "clean"])},
        }
        return "action_executed", payload
    if k == 2:
        decision = {
            "chosen_action": "read_csv",
            "alternatives": ["query", "ask"],
            "confidence": rng.choice([0.5, 1.0, None]),
            "reasoning": _text(rng, 15),
        }
        return "llm_decision", {"decision": decision, "agent_state": {"current_step": "load"}}
    if k == 3:
        return "user_input", {"input": {"text": _text(rng, 12)}}
    return "feedback", {"input": {"text": "wrong again", "score": -1}}


def _deep(levels: int, kinds: str) -> Any:
    """Nested ``levels`` deep, dicts (``d``) and lists (``l``) by turns of ``kinds``."""
    value: Any = "bottom"
    for i in range(levels):
        value = {"note": value} if kinds[i % len(kinds)] == "d" else [value]
    return value


def _adversarial() -> list[tuple[str, Any]]:
    """Payloads where the walk has something to do, or only just nothing."""
    out: list[tuple[str, Any]] = []
    for n in (LIMIT - 1, LIMIT, LIMIT + 1, 5 * LIMIT):
        out.append(("user_input", {"input": {"text": "a" * n}}))
        out.append(("user_input", {"input": {"text": "密" * n}}))
        out.append(("state_change", {"agent_state": {"items": list(range(n))}}))
        out.append(("state_change", {"agent_state": {"nested": [["x"] * n]}}))
    for levels in range(MAX_DEPTH - 2, MAX_DEPTH + 4):
        for kinds in ("d", "l", "dl", "ld", "ddl"):
            out.append(("state_change", {"agent_state": {"tree": _deep(levels, kinds)}}))
            out.append(("state_change", _deep(levels, kinds) if kinds[0] == "d" else {"x": 1}))
    odd_values: list[Any] = [
        float("nan"),
        float("inf"),
        float("-inf"),
        MyFloat(1.5),
        2**70,
        -(2**80),
        2**64 - 1,
        -(2**63),
        Level.HIGH,
        Color.RED,
        Name.PATH,
        MyStr("text"),
        (1, "a"),
        {1, 2},
        frozenset({"x"}),
        b"bytes",
        bytearray(b"\xff\xfe"),
        "lone \ud800 surrogate",
        "\udcff",
        datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),
        uuid.UUID(int=7),
        decimal.Decimal("1.10"),
        decimal.Decimal("NaN"),
        Point(1, 2.5),
        complex(1, 2),
        Path("/tmp/x"),
        object(),
        True,
        None,
        -0.0,
        1e308,
        "",
        [],
        {},
    ]
    for v in odd_values:
        out.append(("action_executed", {"input": {"tool": "t", "args": {"v": v}}}))
        out.append(("state_change", {"agent_state": {"list": [1, v, "x"]}}))
    secret_keys = ["password", "api_key", "db.password", "sec_ret", "X-Api-Key", "密码", "tokens"]
    for key in secret_keys:
        out.append(("action_executed", {"input": {"tool": "t", "args": {key: "hunter2"}}}))
        out.append(("state_change", {"agent_state": {"a": [{"b": {key: {"c": 1}}}]}}))
    out += [
        ("state_change", {"agent_state": {1: "int key", "ok": 2}}),
        ("state_change", {"agent_state": {Name.PATH: "an enum key equal to a plain one"}}),
        ("state_change", {"agent_state": {MyStr("path"): "a str subclass key"}}),
        ("state_change", {"agent_state": {Color.RED: "an enum key"}}),
        ("state_change", {"agent_state": {(1, 2): "a tuple key"}}),
        ("action_executed", {"type": "action_executed", "task_id": "x", "input": {"tool": "t"}}),
        ("action_executed", {"input": {"tool": "t", "args": {"q": "api_key=sk-" + "a" * 30}}}),
        ("user_input", {"input": {"text": "密码是 hunter2-Secret! " + "x" * LIMIT}}),
        ("state_change", {"agent_state": {"brand_new_key_" + str(i): i for i in range(3)}}),
        # a secret in text the agent serialized itself (escaped Chinese secret word)
        (
            "action_executed",
            {
                "input": {"tool": "call_api", "args": {}},
                "result": {"output": {"body": json.dumps({"note": "密码是 hunter2-Secret!"})}},
            },
        ),
    ]
    return out


def _payloads() -> list[tuple[str, Any]]:
    rng = random.Random(41)
    return [_event(rng, i) for i in range(1500)] + _adversarial()


def _walk(payload: Any) -> tuple[Any, list[str], bool]:
    sanitizer = _Sanitizer(LIMIT, check_utf8=False)
    clean = sanitizer.value(payload)
    return clean, sanitizer.problems, sanitizer.secret_key


def test_the_fast_check_says_yes_only_where_the_walk_changes_nothing() -> None:
    payloads = [p for _, p in _payloads()]
    for p in payloads:  # the walk learns the plain keys, as the writer's first batch does
        _walk(p)
    said_yes = 0
    for p in payloads:
        if type(p) is dict and R._plain_dict(p, 0, LIMIT):
            said_yes += 1
            clean, problems, secret_key = _walk(p)
            assert clean is p, p
            assert problems == [] and not secret_key, p
    # Not a check that never says yes: every generated event, and the adversarial payloads
    # with only plain values within the limits.
    assert said_yes > 1500
    adversarial = [p for _, p in _adversarial()]
    assert (
        sum(type(p) is dict and R._plain_dict(p, 0, LIMIT) for p in adversarial)
        < len(adversarial) // 2
    )


def test_each_limit_is_where_the_walk_has_it() -> None:
    """At and past each limit: text, list length, nesting of dicts and lists in every order."""
    payloads = [p for _, p in _adversarial()]
    for p in payloads:
        _walk(p)
    for p in payloads:
        if type(p) is not dict:
            continue
        clean, problems, secret_key = _walk(p)
        unchanged = clean is p and not problems and not secret_key
        if R._plain_dict(p, 0, LIMIT):
            assert unchanged, p
        elif unchanged:
            # The check may say no where the walk keeps the payload only for a value the walk
            # leaves alone that is not plain JSON (an exact bool/int/float/str is): none here
            # but keys seen for the first time, which the walk has now learned.
            assert R._plain_dict(p, 0, LIMIT) or _has_unplain(p), p


def _has_unplain(v: Any) -> bool:
    if type(v) is dict:
        return any(type(k) is not str or _has_unplain(x) for k, x in v.items())
    if type(v) is list:
        return any(_has_unplain(x) for x in v)
    return type(v) not in (str, int, bool, float, type(None))


def _rows(
    rec: Recorder, items: list[Any], *, batch: bool
) -> tuple[list[Any], list[Any], list[str], list[Any]]:
    keep: list[Any] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if batch:
            rows, raw = rec._prepare(items, keep)
        else:
            rows, raw = [], []
            for item in items:
                rows.append(rec._row(item, None, keep))  # a checking sanitizer: the full walk
    return rows, keep, [str(w.message) for w in caught], raw


def test_a_batch_on_the_fast_path_stores_the_rows_of_the_full_walk(tmp_path: Path) -> None:
    """Rows (bodies, redaction, projections), hook payloads and warnings: byte for byte those
    of each event prepared alone with the full walk (``_row`` with a checking sanitizer, which
    never takes the fast path), in a second batch, when the keys are known."""
    items = [
        ("tsk_f", i, 1_700_000_000_000_000_000 + i * 37_000, etype, payload, f"evt_{i}")
        for i, (etype, payload) in enumerate(_payloads())
    ]
    for batch_guards in (True, False):
        rec = Recorder(
            lambda rows: None,
            dead_letter=tmp_path / "dl.jsonl",
            start=False,
            batch_guards=batch_guards,
        )
        _rows(rec, items, batch=True)  # learn the keys: the fast path from here on
        fast = sum(type(i[4]) is dict and R._plain_dict(i[4], 0, LIMIT) for i in items)
        assert fast > 1500
        rows_a, keep_a, warned_a, raw_a = _rows(rec, items, batch=True)
        rows_b, keep_b, warned_b, raw_b = _rows(rec, items, batch=False)
        assert raw_a == raw_b == []
        assert len(rows_a) == len(rows_b) == len(items)
        for a, b in zip(rows_a, rows_b, strict=True):
            assert a == b, (a, b)
        assert keep_a == keep_b
        assert warned_a == warned_b
        assert len(warned_a) >= 40  # the adversarial events were reported, both ways
        assert all(b"hunter2" not in row[5] for row in rows_a)  # every secret redacted
        assert sum(row[6] is not None for row in rows_a) > 1400  # projections kept


def test_timestamps_cached_by_the_millisecond_read_as_before(tmp_path: Path) -> None:
    """``_iso`` keeps the last millisecond's text: every nanosecond still reads as UTC."""
    rec = Recorder(lambda rows: None, dead_letter=tmp_path / "dl.jsonl", start=False)
    rng = random.Random(5)
    base = 1_700_000_000_000_000_000
    stamps = sorted(base + rng.randrange(0, 5 * 10**9) for _ in range(3000))
    stamps += [base + 999_999_999, base + 10**9, base - 1, base, 253_402_300_799_999_999_999]
    for ns in stamps + stamps[::-1]:
        dt = datetime.fromtimestamp(ns // 10**9, UTC)
        want = f"{dt:%Y-%m-%dT%H:%M:%S}.{ns % 10**9 // 10**6:03d}Z"
        assert rec._iso(ns) == want, ns
