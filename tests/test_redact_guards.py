"""Redaction's guards change only how fast it is, never what it redacts.

``redact`` runs each pattern only when a cheap test finds something every match of it contains.
Here every pattern runs unconditionally, in ``redact``'s order, as the reference: on many
generated events (secrets, near misses, Chinese, quoted JSON, control characters, long text),
and on whole stored bodies of odd values, the guarded result is byte for byte the reference's.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from hindsight_loop import record as R
from hindsight_loop import redact_scan
from hindsight_loop.record import Recorder, _Sanitizer, redact


def _load() -> redact_scan.Scanner | None:
    """A scanner for record.py's guards, as its ``_scanner()`` loads one (the cache too)."""
    return redact_scan.load(R._WORD_CORES.pattern, R._VENDOR_STARTS)


@pytest.fixture(params=["python", "hyperscan"])
def guards(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test below with the pure-Python guards and with the one-pass Hyperscan guards."""
    if request.param == "python":
        monkeypatch.setattr(R, "_SCANNER", None)
    else:
        scanner = _load()
        if scanner is None:
            pytest.skip("hyperscan is not installed: pip install 'hindsight-loop[hyperscan]'")
        monkeypatch.setattr(R, "_SCANNER", scanner)
    return str(request.param)


def _every_pattern(blob: bytes, *, secret_key: bool | None) -> bytes:
    """``redact`` without its guards: every pattern, in its order, on the text with the
    characters the agent escaped or percent-encoded written out when that finds a secret."""
    view = R._decoded(blob)
    if view is not None:
        out = _every_pattern_as_is(view, secret_key=secret_key)
        if out != view:
            return out
    return _every_pattern_as_is(blob, secret_key=secret_key)


def _every_pattern_as_is(blob: bytes, *, secret_key: bool | None) -> bytes:
    blob = R._PEM.sub(b"[REDACTED PRIVATE KEY]", blob)
    if secret_key is None or secret_key:
        blob = R._KEY_PATTERN.sub(R._key_sub, blob)
    blob = R._AUTHORIZATION.sub(rb"\1[REDACTED]", blob)
    blob = R._BEARER.sub(rb"\1 [REDACTED]", blob)
    for _needle, pattern, repl in R._VENDOR:
        blob = pattern.sub(repl, blob)
    blob = R._FLAG.sub(R._flag_sub, blob)
    blob = R._COOKIE.sub(rb"\1[REDACTED]", blob)
    blob = R._TEXT_SECRET.sub(R._text_sub, blob)
    blob = R._SQL_PASSWORD.sub(rb"\1'[REDACTED]'", blob)
    for _needle, pattern in R._COMMAND_SECRETS:
        blob = pattern.sub(rb"\1[REDACTED]", blob)
    blob = R._USERINFO.sub(rb"\1[REDACTED]@", blob)
    return R._CARD.sub(R._card_sub, blob)


FRAGMENTS = [
    "plain words",
    "销售报表文件的编码错误",
    "x--y",
    "--password hunter2",
    "--max-tokens 9",
    "a=b",
    "password=Hunter2x",
    "max_tokens=512",
    "key: value",
    "X-Api-Key: abcd1234efgh",
    "token is abc123secret",
    "it is fine",
    "password\tis\tTabbed1",
    "line\nbreak",
    "密码：ZhColon1",
    "token是ZhShi2",
    "api_key 为 ZhWei3",
    "令牌 ZhLingpai5",
    "是的",
    "：",
    '{"password":"QuotedJson1"}',
    'reply {"api_key": "QuotedJson2"} done',
    'x\\":y',
    "Authorization: Token 9944b09199c62bcf",
    "Bearer abcdefgh12345678",
    "basic auth",
    "4111 1111 1111 1111",
    "4111-1111-1111-1111",
    "5555555555554444",
    "4222222222222",  # 13 digits: the shortest card
    "411111111111",  # 12: too short
    "3782 822463 10005",
    "1234 5678",
    "0000",
    "2024-11-20T14:32:10.882Z",
    "sk-abcdefghijklmnopqrstuvwx",
    "sk-proj-abcdefghijklmnopqrstuvwx",
    "pk-abcdefghijklmnopqrstuvwx",
    "rk-abcdefghijklmnopqrstuvwx",
    "task-abcdefghijklmnopqrstuvwx",  # not a key: "sk-" inside a word
    "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
    "whsec_live_4eC39HqLyjWDarjtT1zdp7dc",
    "pk_test_4eC39HqLyjWDarjtT1zdp7dc",
    "ghp_abcdefghijklmnop1234",
    "gho_abcdefghijklmnop1234 ghs-abcdefghijklmnop1234 ghu_abcdefghijklmnop1234",
    "github_pat_11ABCDEFG0abcdefghijklmnop",
    "glpat-abcdefghijklmnop1234",
    "xoxb-123456789012-abcdefghijklmnop",
    "xoxp_abcdefghijklmnopqrst",
    "AKIAABCDEFGHIJKLMNOP",
    "ASIAABCDEFGHIJKLMNOP",
    "xAKIAABCDEFGHIJKLMNOP",  # not a key: no word boundary before it
    "averyveryverylongidentifier_0123456789abcdefghijklmnopqrstu",
    "AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW",
    "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.abc",
    "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXX",
    "redis://:s3cretPw@cache:6379/0",
    "https://user:pw@host/x",
    "mail me@example.com",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEabc\n-----END RSA PRIVATE KEY-----",
    "averyveryverylongidentifier_0123456789",
    # the agent's own JSON (json.dumps escapes Chinese) and URLs (percent-encoded)
    '{"note": "\\u5bc6\\u7801\\u662f EscapedZh1"}',
    '{"\\u4ee4\\u724c": "EscapedZh2"}',
    '"\\u5BC6\\u94A5\\uff1aEscapedZh3"',
    "\\u4e2d\\u6587 \\ud83d\\ude00 \\u0041 plain escapes",
    "login?%E5%AF%86%E7%A0%81=PercentZh4",
    "100%25 %E4%B8%AD%E6%96%87 %FF%FE %E5%AF",
    "next=%2Flogin%3Fpassword%3DPercentEq5 and 100%20%3a%3D",
    "x" * 520,
]
KEYS = ["note", "password", "api_key", "max_tokens", "说明", "args", "output", "db.password"]


# Secrets that need a command or a statement around them, in the runs that compare the guards
# with every pattern (kept out of the payloads that count what is stored as it came: most of
# these are redacted).
SHAPES = [
    "CREATE USER app WITH PASSWORD 'Zq8vK2mN'",
    "mysql -u root -pZq8vK2mN db",
    "curl -u admin:Zq8vK2mN https://x",
    "curl -s https://x/login",
    "Cookie: _ga=GA1.2.3; sessionid=Zq8vK2mN",
    'alter user x identified by "pw1234"',
    "the Password is 'not sql'",
]


def _value(rng: random.Random, depth: int = 0, pool: list[str] = FRAGMENTS) -> Any:
    roll = rng.random()
    if depth < 3 and roll < 0.25:
        return {rng.choice(KEYS): _value(rng, depth + 1, pool) for _ in range(rng.randint(1, 3))}
    if depth < 3 and roll < 0.35:
        return [_value(rng, depth + 1, pool) for _ in range(rng.randint(1, 3))]
    if roll < 0.42:
        return rng.choice([0, -7, 2**62, 1.5, True, None])
    return " ".join(rng.choice(pool) for _ in range(rng.randint(1, 4)))


def test_guarded_redaction_equals_every_pattern_run(guards: str) -> None:
    rng = random.Random(13)
    changed = 0
    for _ in range(3000):
        blob = orjson.dumps(
            {
                rng.choice(KEYS): _value(rng, pool=FRAGMENTS + SHAPES)
                for _ in range(rng.randint(1, 4))
            }
        )
        for secret_key in (None, False, True):
            want = _every_pattern(blob, secret_key=secret_key)
            assert redact(blob, secret_key=secret_key) == want, blob
            # orjson's output escapes every control character: the guards that look for one
            # may be skipped for it, and nothing changes.
            assert redact(blob, secret_key=secret_key, escaped=True) == want, blob
            changed += want != blob
    assert changed > 1000  # the inputs do hold secrets


def test_guarded_redaction_of_raw_text_equals_every_pattern_run() -> None:
    """Log lines: raw text with tabs, newlines and bytes that are not UTF-8."""
    rng = random.Random(7)
    for _ in range(2000):
        parts = [rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 5))]
        sep = rng.choice([" ", "\t", "\n", "\r\n", "\x0b", "\x0c"])
        blob = sep.join(parts).encode("utf-8") + rng.choice([b"", b"\xff\xfe", b"\xe5\xaf"])
        assert redact(blob) == _every_pattern(blob, secret_key=None), blob


def _deep(levels: int, kind: type = dict) -> Any:
    value: Any = "bottom password=DeepSecret1"
    for _ in range(levels):
        value = {"token": value, "n": 1} if kind is dict else [value, 1]
    return value


ODD: list[Any] = [
    {"long": "word " * 400 + "api_key=sk-abcdefghijklmnopqrstuvwx"},
    {"config": {"client_secret": {"prod": "prodSecretValue1", "dev": ["devSecret2"]}}},
    {"output": '{"password":"QuotedJson1"}', "list": ['{"secret":"QuotedJson4"}']},
    {"text": "账号 admin 密码 Zh8Secret", "中文": "销售报表 " * 200},
    {"bad": "lone \ud800 surrogate", "ok": "fine"},
    {"nan": float("nan"), "inf": float("-inf"), "big": 2**70, "neg": -(2**80)},
    {"deep": _deep(25), "lists": _deep(25, list)},
    {"items": list(range(600)), "pem": "-----BEGIN PRIVATE KEY-----\n" + "A" * 700},
    {"type": "action_executed", "task_id": "t", "input": {"password": "x"}},
]


def test_stored_bodies_of_odd_values_equal_the_unguarded_pipeline(
    tmp_path: Path, guards: str
) -> None:
    """The writer's body for each odd payload: sanitized (secret-named keys redacted at any
    depth, long text redacted then cut, surrogates and NaN replaced), serialized, then
    redacted by every pattern: the same bytes as the guarded writer stores."""
    rec = Recorder(lambda rows: None, dead_letter=tmp_path / "dl.jsonl", start=False)
    for i, payload in enumerate(ODD):
        row = rec._row(("t", i, 1_700_000_000_000_000_000, "action_executed", payload, "e"))
        sanitizer = _Sanitizer(rec.max_text)
        try:
            clean = sanitizer.value(payload)
            if "type" in clean or "task_id" in clean:
                clean = {k: v for k, v in clean.items() if k not in R.WIRE_SCALARS}
            body = orjson.dumps(clean)
        except orjson.JSONEncodeError:
            body = orjson.dumps(sanitizer.strict(clean))
        assert row[5] == _every_pattern(body, secret_key=sanitizer.secret_key), payload


def test_every_chinese_assignment_sign_is_looked_for(guards: str) -> None:
    for sign in R._ZH_ASSIGN:
        blob = orjson.dumps({"t": f"plain {sign} text"})
        assert R._may_assign(blob, True), sign
        for text in (f"token{sign}abc123", f"密码{sign} abc123", f"{sign}令牌 abc123"):
            blob = orjson.dumps({"t": text})
            assert redact(blob, escaped=True) == _every_pattern(blob, secret_key=None), text
    assert not R._may_assign(orjson.dumps({"t": "销售报表 plain text"}), True)


def test_every_vendor_key_holds_where_the_one_pass_guard_looks() -> None:
    """Each match of each vendor pattern holds a match of ``_VENDOR_STARTS`` (the one-pass
    guard runs them only then), and each pattern matches some fragment above: a vendor added
    to ``_VENDOR`` without a start and a sample key fails here."""
    for _needle, pattern, _repl in R._VENDOR:
        matches = [m.group(0) for f in FRAGMENTS for m in pattern.finditer(f.encode())]
        assert matches, pattern.pattern
        for key in matches:
            assert re.search(R._VENDOR_STARTS, key) is not None, (pattern.pattern, key)


def test_a_secret_right_after_an_escape_is_redacted(guards: str) -> None:
    """A key or a ``--password`` flag after a newline, a tab or another control character in
    the agent's text is one letter after a backslash in the JSON (``"done\\nsk-…"``), where
    there is no word boundary: it is redacted all the same, as it is after a space."""
    keys = [
        m.group(0) for _n, p, _r in R._VENDOR for f in FRAGMENTS for m in p.finditer(f.encode())
    ]
    secrets = [(key.decode(), key) for key in keys]
    secrets += [("--password Hunter2xyz", b"Hunter2xyz"), ("--api-key=Hunter2xyz", b"Hunter2xyz")]
    for said, secret in secrets:
        for before in ("\n", "\t", "\r", "\b", "\f", "\x1b", "\x00", " "):
            for text in ("done" + before + said, "a\n" + before + said + "\nb"):
                blob = orjson.dumps({"out": text})
                out = redact(blob, escaped=True)
                assert secret not in out, (guards, blob, out)
                assert out == _every_pattern(blob, secret_key=None), blob
    nested = orjson.dumps({"out": orjson.dumps({"log": "line\n" + keys[0].decode()}).decode()})
    assert keys[0] not in redact(nested, escaped=True), nested


def test_the_one_pass_guards_are_the_python_guards() -> None:
    """Each Hyperscan guard holds exactly where its pure-Python twin does (so the one pass
    runs the same patterns, no more), on the generated events above."""
    scanner = _load()
    if scanner is None:
        pytest.skip("hyperscan is not installed: pip install 'hindsight-loop[hyperscan]'")
    S = redact_scan
    rng = random.Random(5)
    seen = set()
    for _ in range(3000):
        blob = orjson.dumps(
            {
                rng.choice(KEYS): _value(rng, pool=FRAGMENTS + SHAPES)
                for _ in range(rng.randint(1, 4))
            }
        )
        hits = set(scanner.scan(blob))
        low = blob.lower()
        python = {
            S.PEM: b"PRIVATE KEY-----" in blob,
            S.DASHES: R._DASHES.search(blob) is not None,
            S.WORDS: R._WORD_CORES.search(low) is not None,
            S.AUTHORIZATION: b"authorization" in low,
            S.BEARER: R._BEARER_GUARD.search(low) is not None,
            S.VENDOR: re.search(R._VENDOR_STARTS, blob) is not None,
            S.CARD: R._CARD_SHAPE.search(blob.translate(R._CARD_TABLE)) is not None,
            S.SQL_PASSWORD: R._may_set_sql_password(blob),
            S.COMMAND: R._may_pass_a_command_secret(blob),
        }
        for guard, held in python.items():
            assert (guard in hits) == held, (guard, blob)
        assign = bool(hits & {S.EQUALS, S.INNER_COLON, S.ESCAPED_KEY, S.IS, S.ZH_ASSIGN})
        assert assign == R._may_assign(blob, True), blob
        userinfo = S.AT in hits and S.SCHEME in hits
        assert userinfo == (b"@" in blob and b"://" in blob), blob
        seen |= hits
    assert seen == set(range(16))  # every guard was seen holding


def _agent_payloads(rng: random.Random) -> list[Any]:
    """Payloads as an agent hands them over: the generated ones above, the odd ones orjson
    takes as they are, and values whose JSON text could be written more than one way."""
    import dataclasses
    import enum
    import uuid
    from datetime import UTC, datetime

    import numpy as np

    class Color(enum.Enum):
        RED = "red"

    @dataclasses.dataclass
    class Point:
        x: int
        y: float

    odd: list[Any] = [
        {"floats": [1e300, -0.0, 5e-324, 0.1 + 0.2, 1e16, 1e-7, 123456789.125, -1.5e-300]},
        {"np": np.float32(0.1), "np64": np.float64(1 / 3), "ints": np.arange(3, dtype=np.int64)},
        {"f32": np.array([1e-7, 3.4028235e38, 0.30000001], dtype=np.float32)},
        {"when": datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC), "id": uuid.UUID(int=7)},
        {"color": Color.RED, "point": Point(x=1, y=2.5), "tuple": (1, "a")},
        {"esc": 'q"b\\s/\n\t\r\x00\x1f\u2028\u2029 é 中文 😀', 'key\n"x': "v"},
        {},
        {"nested": [[[]], [{}], {"a": [None, True, False]}]},
        {"ints": [0, -1, 2**63 - 1, -(2**63), 2**64 - 1]},
    ]
    odd += [p for p in ODD if _orjson_takes(p)]
    return odd + [
        {rng.choice(KEYS): _value(rng) for _ in range(rng.randint(1, 4))} for _ in range(3000)
    ]


def _orjson_takes(payload: Any) -> bool:
    try:
        orjson.dumps(payload)
    except orjson.JSONEncodeError:
        return False
    return True


def test_the_payload_bytes_in_the_agents_line_equal_a_second_serialization(
    tmp_path: Path, guards: str
) -> None:
    """The writer process stores the payload's bytes from the agent's line when sanitizing
    changed nothing, instead of serializing the decoded payload again: they must be the bytes
    that second serialization gives, and the row (body, redaction, projection) the same."""
    from hindsight_loop import writer as W

    rng = random.Random(29)
    rec = Recorder(lambda rows: None, dead_letter=tmp_path / "dl.jsonl", start=False)
    heads = [
        ("tsk_a", 1, None, 1_700_000_000_123_456_789, "action_executed", None),
        ('t"],{"x', 2, 5, 1.7e9, "user_input", 'e,"]}'),
        ("任务", 3, None, "2024-11-20T14:32:10.882Z", "feedback", "evt_],"),
        ("t", 4, -7, "not a time", "state_change", ""),
    ]
    found = kept = 0
    for i, payload in enumerate(_agent_payloads(rng)):
        task_id, own, seq, ts, etype, event_id = heads[i % len(heads)]
        line = orjson.dumps(
            (task_id, own, seq, ts, etype, event_id, payload),
            option=W._OPT,
            default=W._datetime_text,  # as the agent serializes it (ProcessRecorder.emit)
        )
        for frame in (line, line[:-1]):  # as queued, and as split off the pipe
            raws: list[bytes | None] = []
            item = W.frame_item(frame, "s", raws)
            raw = raws[0]
            if raw is None:
                continue
            found += 1
            assert raw == orjson.dumps(item[4]), frame
            with_raw = rec._row(item, _Sanitizer(rec.max_text, check_utf8=False), raw=raw)
            without = rec._row(item, _Sanitizer(rec.max_text, check_utf8=False))
            # (an unreadable timestamp becomes "now": the two calls' clocks may differ)
            assert with_raw[:3] + with_raw[4:] == without[:3] + without[4:], frame
            assert with_raw[3] == without[3] or ts == "not a time"
            kept += with_raw[5] is raw
    # a line that is not laid out as its head says: no bytes, the payload serialized again
    head = ("tsk_a", 1, None, 5, "user_input", None)
    assert W.payload_json(b"[1]", head) is None
    assert W.payload_json(b'["tsk_b",1,null,5,"user_input",null,{}]', head) is None
    assert W.payload_json(b'["tsk_a",1,null,5,"user_input",null,{}]', head) == b"{}"
    assert found > 6000  # the line's layout is found for every payload but the odd
    assert kept > 100  # and its bytes stored as they are where nothing was redacted


# Bodies that begin or end with what a guard looks for, or hold half of it: joined in a batch,
# two halves side by side must not make a guard hold in either.
EDGES = [
    "IDENTIFIED",
    "curl",
    "cur",
    "IDENTIFIE",
    "assword",
    "sword",
    ":",
    ":x",
    "x:",
    '":',
    "-",
    "--",
    "-x",
    "x-",
    "=",
    "@",
    "://",
    ":/",
    "/",
    " is",
    "is ",
    "abcdefgh",
    "abcdefghijklmnop",
    "0123456789",
    "0123",
    "4567",
    "0123-",
    "0123456789012",
    "PRIVATE KEY---",
    "--",
    "auth",
    "orization",
    "pass",
    "bear",
    "er",
    "密",
    "：",
]


def _batch_scanner() -> redact_scan.Scanner:
    scanner = _load()
    if scanner is None:
        pytest.skip("hyperscan is not installed: pip install 'hindsight-loop[hyperscan]'")
    return scanner


def test_a_batch_scan_finds_in_each_body_what_its_own_scan_finds() -> None:
    """``scan_many`` over bodies side by side gives each body the guards ``scan`` gives it
    alone: on generated events, on raw fragments that begin or end with a guard's text or
    half of one (first, last, adjacent), and on each of them alone in a batch of one."""
    scanner = _batch_scanner()
    rng = random.Random(17)
    pieces = [f for f in FRAGMENTS if not any(ord(c) < 0x20 for c in f)] + EDGES
    bodies = [p.encode() for p in pieces] + [
        orjson.dumps({rng.choice(KEYS): _value(rng) for _ in range(rng.randint(1, 4))})
        for _ in range(2000)
    ]
    bodies += [orjson.dumps(p) for p in pieces]  # JSON strings: a quote at each end
    assert all(redact_scan.SEPARATOR not in body for body in bodies)
    alone = {body: set(scanner.scan(body)) for body in bodies}
    batches = [[body] for body in bodies]
    edges = [p.encode() for p in EDGES]
    batches += [[a, b] for a in edges for b in edges]  # every pair of edges, in both orders
    for _ in range(300):
        batches.append(rng.sample(bodies, rng.randint(2, 60)))
    seen: set[int] = set()
    for batch in batches:
        found = scanner.scan_many(batch)
        assert len(found) == len(batch)
        for body, hits in zip(batch, found, strict=True):
            assert hits == alone[body], (body, batch)
            seen |= hits
    # One report per guard per body, however often the guard's text occurs in it: the
    # reports (Python calls that retake the GIL) are as few as one scan per event makes.
    reports: list[tuple[int, int]] = []
    scanner._batch_db.scan(
        b"\n".join(bodies) + b"\n", match_event_handler=redact_scan._found, context=reports
    )
    assert len(reports) == sum(len(alone[body]) for body in bodies)
    assert seen == set(range(16))  # every guard was seen holding
    assert scanner.scan_many([]) == []


def test_batch_redaction_equals_every_pattern_run() -> None:
    """Each body redacted with the guards of a batch scan: the reference's bytes."""
    scanner = _batch_scanner()
    rng = random.Random(23)
    blobs = [
        orjson.dumps({rng.choice(KEYS): _value(rng) for _ in range(rng.randint(1, 4))})
        for _ in range(3000)
    ]
    blobs += [orjson.dumps(f) for f in FRAGMENTS + EDGES]
    changed = 0
    for start in range(0, len(blobs), 500):
        batch = blobs[start : start + 500]
        for blob, hits in zip(batch, scanner.scan_many(batch), strict=True):
            for secret_key in (None, False, True):
                want = _every_pattern(blob, secret_key=secret_key)
                assert R._redact_scanned(blob, secret_key, hits) == want, blob
                changed += want != blob
    assert changed > 1000  # the inputs do hold secrets


def test_a_batch_prepared_in_one_scan_is_the_batch_prepared_event_by_event(
    tmp_path: Path,
) -> None:
    """The writer thread's ``_prepare`` with one scan per batch stores the rows (bodies,
    redaction, projections) and hands the hook the payloads that the Python guards give,
    odd payloads included."""
    _batch_scanner()
    rng = random.Random(31)
    items = [
        ("t", i, 1_700_000_000_000_000_000 + i, "action_executed", payload, f"e{i}")
        for i, payload in enumerate(_agent_payloads(rng) + ODD)
    ]
    batched = Recorder(lambda rows: None, dead_letter=tmp_path / "a.jsonl", start=False)
    python = Recorder(
        lambda rows: None, dead_letter=tmp_path / "b.jsonl", start=False, batch_guards=False
    )
    assert batched._batch_scanner() is not None
    assert python._batch_scanner() is None
    keep_a: list[Any] = []
    keep_b: list[Any] = []
    with pytest.warns(R.HindsightWarning):
        rows_a, raw_a = batched._prepare(items, keep_a)  # type: ignore[arg-type]
    with pytest.warns(R.HindsightWarning):
        rows_b, raw_b = python._prepare(items, keep_b)  # type: ignore[arg-type]
    assert raw_a == raw_b == []
    assert rows_a == rows_b
    assert keep_a == keep_b
    assert sum(a[5] != orjson.dumps(b[0]) for a, b in zip(rows_a, keep_a, strict=True) if b) > 100


# -- the compiled databases kept between processes ----------------------------------------------


def _cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pytest.importorskip("hyperscan")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "hindsight"


def _finds_every_guard(scanner: redact_scan.Scanner | None) -> None:
    assert scanner is not None
    for blob in (
        b'{"api_key": "x"}',
        b"Authorization: Bearer abcdefghijklmnopqrstu",
        R.__doc__.encode() if R.__doc__ else b"",
    ):
        assert sorted(scanner.scan(blob)) == sorted(_reference_guards(blob))
    assert scanner.check()


def _reference_guards(blob: bytes) -> list[int]:
    """The guards a freshly compiled database finds in ``blob``."""
    import hyperscan

    db, batch = redact_scan._compile(hyperscan, R._WORD_CORES.pattern, R._VENDOR_STARTS)
    return redact_scan.Scanner(hyperscan, db, batch).scan(blob)


def test_compiled_guards_are_kept_for_the_user_and_loaded_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first load compiles and keeps the databases in the user's cache directory (only
    the user may read or write them); the next load takes them as they are (the file is not
    written again) and finds every guard the compiled ones find."""
    folder = _cached(tmp_path, monkeypatch)
    _finds_every_guard(_load())
    (kept,) = folder.iterdir()
    assert folder.stat().st_mode & 0o777 == 0o700
    assert kept.stat().st_mode & 0o777 == 0o600
    first = kept.stat().st_ino, kept.stat().st_mtime_ns
    _finds_every_guard(_load())
    assert (kept.stat().st_ino, kept.stat().st_mtime_ns) == first  # loaded, not compiled again


@pytest.mark.parametrize("damage", ["cut short", "garbage", "finds less", "others can write"])
def test_a_kept_database_that_is_not_whole_or_not_the_users_is_compiled_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    """A database that fails to load, or loads and misses a guard (planted: it would let
    secrets through), or sits where others can write, is not used: the guards are compiled
    again and find everything."""
    import hyperscan

    folder = _cached(tmp_path, monkeypatch)
    _load()
    (kept,) = folder.iterdir()
    data = kept.read_bytes()
    if damage == "cut short":
        kept.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        kept.write_bytes(b"\0" * len(data))
    elif damage == "finds less":  # a valid pair of databases that knows only the PEM guard
        db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        db.compile(expressions=[rb"PRIVATE KEY-----"], ids=[0], elements=1, flags=[0])
        one = hyperscan.dumpb(db)
        kept.write_bytes(len(one).to_bytes(8, "little") + one + one)
    else:
        kept.chmod(0o666)
    if damage == "others can write":
        assert redact_scan._load_cached(hyperscan, kept) is None
    _finds_every_guard(_load())


def test_no_cache_where_the_folder_is_not_the_users_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache folder others can write is left alone: the guards are compiled each time."""
    folder = _cached(tmp_path, monkeypatch)
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    assert redact_scan._cache_dir() is None
    _finds_every_guard(_load())
    assert list(folder.iterdir()) == []
