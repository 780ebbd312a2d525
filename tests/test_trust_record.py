"""Issue 12, the recorder's part: nothing lost, nothing leaked, nothing crashes.

Each test feeds the recorder what a hostile but realistic user would and reads back the real
files it wrote: the store, the dead letter, its fallback in the user's state directory.
"""

from __future__ import annotations

import dataclasses
import decimal
import enum
import json
import math
import shutil
import subprocess
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from hindsight_loop import Hindsight, HindsightWarning
from hindsight_loop.record import Recorder, redact

# -- disk full ----------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MB filesystem (tmpfs), unmounted afterwards."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs for the disk-full case: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _dead_letter_lines(*paths: Path) -> list[dict[str, Any]]:
    out = []
    for p in paths:
        if p.exists():
            for line in p.read_bytes().splitlines():
                if line.strip():
                    out.append(orjson.loads(line))
    return out


def _fill_the_disk(hs: Hindsight, task_id: str, n: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HindsightWarning)
        hs.record({"type": "task_start", "task_id": task_id, "task_type": "t"})
        for i in range(n):
            hs.record(
                {
                    "type": "user_input",
                    "task_id": task_id,
                    "input": {"i": i, "text": f"{i:08d}" * 40},
                }
            )


def test_disk_full_keeps_every_event_in_the_fallback_and_stores_the_real_error(
    small_disk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    n = 6000  # ~2.5 MB of text: far more than the 1 MB disk holds
    hs = Hindsight(small_disk / "hindsight.db", background=False, triggers=False)
    try:
        _fill_the_disk(hs, "tsk_full", n)
        assert hs.flush(timeout=120) is True  # everything is durable somewhere
        stats = dict(hs.recorder.stats)
        stored = {e.input["i"] for e in hs.store.events("tsk_full") if e.type == "user_input"}
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HindsightWarning)
            hs.close()
    fallbacks = list((state / "hindsight").glob("*.jsonl"))
    assert fallbacks, "the dead letter did not fall back to the state directory"
    lines = _dead_letter_lines(hs.recorder.dead_letter, *fallbacks)
    kept = {x["input"]["i"] for x in lines if x.get("type") == "user_input"}
    assert stats["lost"] == 0
    assert stored | kept == set(range(n)), (
        f"{n - len(stored | kept)} events neither stored nor kept"
    )
    reasons = {x["_dead_letter_reason"] for x in lines}
    assert any("database or disk is full" in r for r in reasons), reasons
    assert not any("cannot rollback" in r for r in reasons), reasons


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_a_store_deleted_under_the_agent_keeps_what_comes_after_in_the_dead_letter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writer: str
) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    where = tmp_path / "store"
    hs = Hindsight(where / "hindsight.db", writer=writer, background=False, triggers=False)
    try:
        with hs.task("t", recall=False, task_id="tsk_before") as task:
            task.record_action("x", {"i": 0})
        assert hs.flush(timeout=60)
        shutil.rmtree(where)  # a cleanup script, a wrong rm -r
        with hs.task("t", recall=False, task_id="tsk_after") as task:
            for i in range(5):
                task.record_action("x", {"i": i})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HindsightWarning)
            assert hs.flush(timeout=60) is True  # durable: in the dead letter
            stats = dict(hs.stats)
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HindsightWarning)
            hs.close()
    # Before: written into the deleted file (flush True, 'written' counted), gone at close.
    assert stats["dead_lettered"] == 7 and stats["lost"] == 0
    lines = _dead_letter_lines(*(state / "hindsight").glob("*.jsonl"))
    assert sorted(x["input"]["args"]["i"] for x in lines if x.get("type") == "action_executed") == [
        0, 1, 2, 3, 4
    ]  # fmt: skip
    assert all("deleted or replaced while in use" in x["_dead_letter_reason"] for x in lines)


def test_disk_full_with_no_fallback_makes_flush_false_and_counts_the_loss(
    small_disk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the state directory should be")
    monkeypatch.setenv("XDG_STATE_HOME", str(blocker / "state"))
    n = 6000
    hs = Hindsight(small_disk / "hindsight.db", background=False, triggers=False)
    try:
        _fill_the_disk(hs, "tsk_lost", n)
        assert hs.flush(timeout=120) is False
        stats = dict(hs.recorder.stats)
        # Every event counts (task_start too): which batch the loss hits depends on timing.
        stored = len(list(hs.store.events("tsk_lost")))
        kept = sum(
            1 for x in _dead_letter_lines(hs.recorder.dead_letter) if x.get("task_id") == "tsk_lost"
        )
        assert stats["lost"] > 0
        # Every accepted event is stored, dead-lettered or counted as lost: none is unaccounted.
        assert stored + kept + stats["lost"] >= n + 1
        # Once the loss is reported, a later flush with nothing lost says True again.
        assert hs.flush(timeout=10) is True
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HindsightWarning)
            hs.close()


def test_a_loss_is_reported_by_a_flush_that_comes_after_the_writer_caught_up(
    small_disk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer process answers only a flush that asks, and a flush whose events are
    durable already does not: the loss must reach it (and the stats) all the same."""
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the state directory should be")
    monkeypatch.setenv("XDG_STATE_HOME", str(blocker / "state"))
    hs = Hindsight(small_disk / "hindsight.db", background=False, triggers=False, writer="process")
    try:
        _fill_the_disk(hs, "tsk_lost", 6000)
        deadline = time.monotonic() + 120
        while hs.recorder.pending and time.monotonic() < deadline:
            time.sleep(0.05)  # everything handled, nobody asked
        assert hs.recorder.pending == 0
        lost = hs.recorder.stats["lost"]
        assert lost > 0
        assert hs.flush(timeout=10) is False
        assert hs.flush(timeout=10) is True  # reported once
        assert hs.recorder.stats["lost"] == lost
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HindsightWarning)
            hs.close()


def test_a_failed_dead_letter_falls_back_before_anything_is_dropped(tmp_path: Path) -> None:
    fallback = tmp_path / "state"

    def refuse(rows: list[Any]) -> list[str]:
        raise OSError("no store today")

    rec = Recorder(
        refuse,
        dead_letter=tmp_path / "no_such_dir" / "dead.jsonl",  # cannot be created
        fallback_dir=fallback,
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HindsightWarning)
            for i in range(10):
                rec.emit("tsk_x", "user_input", {"input": {"i": i}})
            assert rec.flush(timeout=10) is True
    finally:
        rec.close()
    [path] = fallback.glob("*.jsonl")
    assert sorted(x["input"]["i"] for x in _dead_letter_lines(path)) == list(range(10))
    assert rec.stats["lost"] == 0


# -- secrets ------------------------------------------------------------------------------------

PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\n"
    + "\n".join(["MIIEpAIBAAKCAQEA7Vq3Yw0pemSecretBody0123456789abcdefghijklmnopqrs"] * 30)
    + "\n-----END RSA PRIVATE KEY-----"
)
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ"
    ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
# (what the agent passes, the secret that must not appear anywhere Hindsight writes)
SECRETS: list[tuple[Any, str]] = [
    ({"pem": PEM}, "SecretBody0123456789"),
    ({"cmd": "export AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY"}, "wJalrXUtn"),
    ({"headers": "Authorization: Token 9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b"}, "9944b0919"),
    ({"url": "redis://:s3cretRedisPw@cache.internal:6379/0"}, "s3cretRedisPw"),
    ({"config": {"client_secret": {"prod": "prodSecretValue1", "dev": ["devSecret2"]}}}, "Secret"),
    ({"auth": {"token": {"value": "nestedTokenValue9"}}}, "nestedTokenValue9"),
    ({"note": f"the session is {JWT}"}, "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV"),
    ({"note": "charge with sk_live_4eC39HqLyjWDarjtT1zdp7dc please"}, "4eC39HqLyjWDarjtT1zdp7dc"),
    ({"maps": "key AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW in the url"}, "SyA1b2C3d4E5f6G7h8I9"),
    ({"hub": "login with hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"}, "AbCdEfGhIjKlMnOpQrSt"),
    (
        {
            "hook": "post to https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX"
        },
        "XXXXXXXXXXXXXXXXXXXXXXXX",
    ),
    (
        {
            "conn": "DefaultEndpointsProtocol=https;AccountName=acme;"
            "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq==;"
            "EndpointSuffix=core.windows.net"
        },
        "Eby8vdM02xNOcqFlq",
    ),
    ({"pay": "card 4111 1111 1111 1111 exp 12/29"}, "1111 1111 1111"),
    ({"pay": "card 5555555555554444"}, "5555555555554444"),
    ({"argv": ["mysql", "-u", "root", "--password", "Hunter2Argv!"]}, "Hunter2Argv"),
    ({"cmd": "mysql -u root --password Hunter2Text"}, "Hunter2Text"),
    ({"text": "账号 admin 密码 Zh8Secret"}, "Zh8Secret"),
    ({"long": "x" * 480 + " password=AfterTheCut123"}, "AfterThe"),  # the cut splits it
    # a key on a line of its own, or after a terminal's colour code: a letter before it in the JSON
    ({"log": "started\nsk-proj-4fJ9kLmN2pQ8rS6tU1vW3xY5zA7bC9dE"}, "4fJ9kLmN2pQ8rS6t"),
    ({"log": "\x1b[1;33mAKIAIOSFODNN7EXAMPLE\x1b[0m"}, "IOSFODNN7EXAMPLE"),
    ({"log": "ok\n--password Hunter2Line"}, "Hunter2Line"),
    ({"cmd": "deploy --token 'Hunter2Quoted'"}, "Hunter2Quoted"),
    ({"reply": "Here you go:\n- **Password:** Hunter2Bold"}, "Hunter2Bold"),
    ({"env": "AZURE_OPENAI_KEY=0123456789abcdef0123456789abcdef"}, "0123456789abcdef0123"),
    ({"hmac_key": "hmacSecretValue7"}, "hmacSecretValue7"),
    ({"sql": "CREATE USER app WITH PASSWORD 'SqlSecretPw9';"}, "SqlSecretPw9"),
    ({"sql": "CREATE USER 'app'@'%' IDENTIFIED BY 'MySqlSecret8';"}, "MySqlSecret8"),
    ({"cmd": "mysqldump -h db -uroot -pDumpSecret7 app > app.sql"}, "DumpSecret7"),
    ({"argv": ["sshpass", "-p", "SshPassSecret6", "ssh", "me@host"]}, "SshPassSecret6"),
    ({"cmd": "redis-cli -h cache -a RedisCliSecret5 ping"}, "RedisCliSecret5"),
    ({"cmd": "docker login -u me -p RegistrySecret4 reg.example.com"}, "RegistrySecret4"),
    ({"cmd": "curl -s -u admin:CurlUserSecret3 https://api.example.com"}, "CurlUserSecret3"),
    (
        {"req": "GET / HTTP/1.1\r\nCookie: _ga=GA1.2.3; sessionid=CookieSecret2\r\n"},
        "CookieSecret2",
    ),
    ({"env": "DB_HOST=db\nDB_PASS=EnvPassSecret1"}, "EnvPassSecret1"),
    ({"smtp": {"host": "mail", "smtp_pass": "DictPassSecret0"}}, "DictPassSecret0"),
]


@pytest.mark.parametrize(("value", "secret"), SECRETS, ids=[s for _, s in SECRETS])
def test_secret_shapes_never_reach_the_store(hs: Hindsight, value: Any, secret: str) -> None:
    with hs.task("t", recall=False) as task:
        task.record_action("tool", value)
    hs.flush()
    raw = orjson.dumps([e.to_dict() for e in hs.store.events(task.task_id)]).decode()
    assert secret not in raw
    assert "REDACTED" in raw
    db = Path(str(hs.store.path))  # type: ignore[attr-defined]
    hs.close()
    for f in db.parent.iterdir():
        assert secret.encode() not in f.read_bytes(), f.name


# Text around a secret changes which guards of ``redact`` run (an all-ASCII event is pre-checked
# otherwise than one with Chinese in it): every shape is tried in both.
CHINESE_AROUND = {"说明": "销售报表文件的编码错误, 重试", "客户": "订单日期格式"}


@pytest.mark.parametrize(("value", "secret"), SECRETS, ids=[s for _, s in SECRETS])
def test_secret_shapes_never_reach_the_store_in_a_chinese_event(
    hs: Hindsight, value: Any, secret: str
) -> None:
    with hs.task("t", recall=False) as task:
        task.record_action("tool", {**value, **CHINESE_AROUND}, output={"预览": "销售 报表"})
    hs.flush()
    raw = orjson.dumps([e.to_dict() for e in hs.store.events(task.task_id)]).decode()
    assert secret not in raw
    assert "REDACTED" in raw
    assert "销售报表文件的编码错误" in raw  # the text around it is kept


# Secrets in text forms whose only sign is the form itself: JSON quoted inside a string value
# (a tool's output), Chinese assignments (：, 是, 为, a Chinese name and a space).
QUOTED_AND_CHINESE: list[tuple[Any, str]] = [
    ({"output": '{"password":"QuotedJson1"}'}, "QuotedJson1"),
    ({"output": 'reply {"api_key": "QuotedJson2"} done'}, "QuotedJson2"),
    ({"output": '{"db":{"token":"QuotedJson3"}}'}, "QuotedJson3"),
    ({"output": ['{"secret":"QuotedJson4"}']}, "QuotedJson4"),
    ({"text": "密码：ZhColon1"}, "ZhColon1"),
    ({"text": "token是ZhShi2"}, "ZhShi2"),
    ({"text": "api_key 为 ZhWei3"}, "ZhWei3"),
    ({"text": "口令 ZhKouling4"}, "ZhKouling4"),
    ({"text": "令牌 ZhLingpai5"}, "ZhLingpai5"),
    ({"text": "秘钥 ZhMiyao6"}, "ZhMiyao6"),
    ({"text": "密钥 ZhMiyao7"}, "ZhMiyao7"),
]


@pytest.mark.parametrize(
    ("value", "secret"), QUOTED_AND_CHINESE, ids=[s for _, s in QUOTED_AND_CHINESE]
)
def test_quoted_json_and_chinese_assignments_are_redacted(
    hs: Hindsight, value: Any, secret: str
) -> None:
    for around in ({}, CHINESE_AROUND, {"en": "plain ascii text"}):
        with hs.task("t", recall=False) as task:
            task.record_action("tool", {**value, **around})
        hs.flush()
        raw = orjson.dumps([e.to_dict() for e in hs.store.events(task.task_id)]).decode()
        assert secret not in raw, around
        assert "REDACTED" in raw


# Chinese secret words in text the agent encoded itself before handing it over: JSON it made with
# ``json.dumps`` (\\uXXXX escapes by default, once or twice over), a Chinese key inside such
# JSON, a percent-encoded URL.
ENCODED_CHINESE: list[tuple[Any, str]] = [
    ({"output": json.dumps({"note": "密码是 ZhEscaped1"})}, "ZhEscaped1"),
    ({"output": json.dumps({"note": "数据库口令：ZhEscaped2"})}, "ZhEscaped2"),
    ({"output": json.dumps({"密码": "ZhEscapedKey3"})}, "ZhEscapedKey3"),
    ({"output": json.dumps({"令牌": "ZhQuotedKey4"}, ensure_ascii=False)}, "ZhQuotedKey4"),
    ({"output": json.dumps(json.dumps({"note": "秘钥为ZhTwice5"}))}, "ZhTwice5"),
    ({"body": {"text": '"\\u5BC6\\u94A5 ZhEscaped6"'}}, "ZhEscaped6"),  # upper-case hex
    ({"url": "https://x.cn/login?user=a&%E5%AF%86%E7%A0%81=ZhPercent7"}, "ZhPercent7"),
    ({"url": "https://x.cn/cb?next=%2Flogin%3Fpassword%3DPercentEq8"}, "PercentEq8"),
]


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_secrets_in_text_the_agent_encoded_itself_are_redacted(db_path: Path, writer: str) -> None:
    with Hindsight(db_path, background=False, writer=writer) as hs:  # type: ignore[arg-type]
        ids = []
        for value, _secret in ENCODED_CHINESE:
            for around in ({}, CHINESE_AROUND):
                with hs.task("t", recall=False) as task:
                    task.record_action("tool", {**value, **around}, output=value)
                ids.append(task.task_id)
        assert hs.flush()
        raw = orjson.dumps([e.to_dict() for tid in ids for e in hs.store.events(tid)]).decode()
    for _value, secret in ENCODED_CHINESE:
        assert secret not in raw, secret
    assert raw.count("REDACTED") >= 4 * len(ENCODED_CHINESE)
    assert "销售报表文件的编码错误" in raw  # the text around it is kept
    # Where nothing was found the agent's escapes are stored as it wrote them.
    with Hindsight(db_path, background=False) as hs:
        with hs.task("t", recall=False) as task:
            task.record_action("tool", {"q": json.dumps({"城市": "北京"})})
        hs.flush()
        (event,) = [e for e in hs.store.events(task.task_id) if e.type == "action_executed"]
        assert event.input["args"]["q"] == json.dumps({"城市": "北京"})


def test_redact_finds_a_secret_in_a_raw_log_line_with_tabs_and_chinese() -> None:
    # Log messages are redacted as raw text, where ``\s`` may be a tab or a newline.
    for line in ("token\tis\tRawTab1 中文", "password\nis\nRawTab1", "密码\tRawTab1"):
        assert b"RawTab1" not in redact(line.encode()), line


def test_a_pem_key_longer_than_the_cut_is_redacted_whole(hs: Hindsight) -> None:
    assert len(PEM) > hs.recorder.max_text
    with hs.task("t", recall=False) as task:
        task.record_action("tool", {"key_material": PEM, "text": f"use this: {PEM}"})
    hs.flush()
    raw = orjson.dumps([e.to_dict() for e in hs.store.events(task.task_id)]).decode()
    assert "MIIEpAIBAAKCAQEA" not in raw
    assert "REDACTED PRIVATE KEY" in raw


def test_secrets_in_refused_events_are_redacted_in_the_dead_letter(hs: Hindsight) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HindsightWarning)
        assert (
            hs.record(
                {
                    "type": "action_execute",  # typo'd type: refused
                    "task_id": "tsk_typo",
                    "input": {"args": {"password": "TypoSecret1", "nested": {"api_key": "K9"}}},
                    "context": {"note": f"Bearer {JWT}", "pem": PEM},
                }
            )
            is False
        )
    raw = hs.recorder.dead_letter.read_bytes().decode()
    for secret in ("TypoSecret1", '"K9"', "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV", "MIIEpAIBAAKCAQEA"):
        assert secret not in raw
    assert "action_execute" in raw  # the event itself is kept


def test_spilled_events_are_redacted(db_path: Path) -> None:
    import sqlite3

    # The thread writer's queue; a writer process's spills: test_record_process.
    hs = Hindsight(db_path, background=False, triggers=False, queue_bound=20, writer="thread")
    try:
        hs.recorder.block_seconds = 0.0
        other = sqlite3.connect(db_path, isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HindsightWarning)
            hs.record({"type": "task_start", "task_id": "tsk_s", "task_type": "t"})
            for i in range(200):
                hs.record(
                    {
                        "type": "user_input",
                        "task_id": "tsk_s",
                        "input": {"i": i, "text": "password: SpillSecret7", "pem": PEM},
                    }
                )
            other.execute("ROLLBACK")
            other.close()
            assert hs.flush(timeout=30)
        assert hs.recorder.stats["spilled"] > 0
        raw = hs.recorder.dead_letter.read_bytes()
        assert b"SpillSecret7" not in raw and b"MIIEpAIBAAKCAQEA" not in raw
    finally:
        hs.close()


def test_secrets_never_reach_warnings_or_log_lines(hs: Hindsight) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hs.record(
            {
                "type": "user_input",
                "task_id": "tsk_w",
                "timestamp": "password=WarnSecret5",
                "input": {"text": "hi"},
            }
        )
        hs.flush()
    text = " ".join(str(w.message) for w in caught)
    assert "timestamp" in text
    assert "WarnSecret5" not in text


NOT_SECRETS = {
    "max_tokens": 4096,
    "maxTokens": 256,
    "tokenizer": "cl100k_base",
    "token_count": 17,
    "prompt_tokens": 12,
    "usage": {"completion_tokens": 5, "total_tokens": 17},
    "keyboard": "qwerty",
    "path": "/data/tokens.csv",
    "cli": "--max-tokens 100",
    "go_test": "--- PASS: TestLogin (0.00s)\nPASS\nok  \tapp/auth\t0.012s",
    "eval": {"pass_rate": 0.95, "pass_at_1": 0.7},
    "shell": "mysql -u root -p app; mkdir -p out; ssh me@login.host -p 2222; docker run -p 80:80 x",
    "report": "Prompt tokens: 120\nCompletion tokens: 80\nTotal tokens: 200, tokens=512",
    "keys": "primary_key=id; sort key: name; idempotency_key=abc",
    "order_id": "4111111111111112",  # not a Luhn number
    "epoch_us": 1732084333000123,
}


def test_names_that_merely_contain_token_are_not_redacted(hs: Hindsight) -> None:
    with hs.task("t", recall=False) as task:
        task.record_action("llm", NOT_SECRETS)
    hs.flush()
    action = next(e for e in hs.store.events(task.task_id) if e.type == "action_executed")
    assert action.input["args"] == NOT_SECRETS


def test_redact_alone_leaves_token_counts_and_redacts_shapes() -> None:
    assert redact(orjson.dumps(NOT_SECRETS)) == orjson.dumps(NOT_SECRETS)
    out = redact(orjson.dumps({"access_token": "abc12345", "n": 1}))
    assert b"abc12345" not in out


# -- values the standard library does not serialize ----------------------------------------------


class Color(enum.Enum):
    RED = "red"


class Mode(enum.StrEnum):
    FAST = "fast"


@dataclasses.dataclass
class Point:
    x: int
    y: float


def _np() -> Any:
    return pytest.importorskip("numpy")


def test_common_python_values_are_converted_not_wiped(hs: Hindsight) -> None:
    np = _np()
    import pydantic

    class Model(pydantic.BaseModel):
        name: str
        when: datetime

    deep: Any = "bottom"
    for _ in range(10_000):
        deep = [deep]
    args = {
        "f64": np.float64(0.93),
        "i64": np.int64(7),
        "b": np.bool_(True),
        "arr": np.arange(3),
        "mat": np.array([[1.5, 2.0], [3.0, 4.0]]),
        "color": Color.RED,
        Mode.FAST: "strenum key",
        "point": Point(1, 2.5),
        "model": Model(name="m", when=datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)),
        "dec": decimal.Decimal("1.25"),
        "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "dt": datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),
        "day": date(2024, 1, 2),
        "raw": b"hello",
        "set": {3, 1, 2},
        "frozen": frozenset({"a"}),
        "deep": deep,
        "plain": "kept",
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HindsightWarning)
        with hs.task("t", recall=False) as task:
            task.record_action("tool", args)
        hs.flush()
    action = next(e for e in hs.store.events(task.task_id) if e.type == "action_executed")
    got = action.input["args"]
    assert got["f64"] == 0.93
    assert got["i64"] == 7
    assert got["b"] is True
    assert got["arr"] == [0, 1, 2]
    assert got["mat"] == [[1.5, 2.0], [3.0, 4.0]]
    assert got["color"] == "red"
    assert got["fast"] == "strenum key"
    assert got["point"] == {"x": 1, "y": 2.5}
    assert got["model"]["name"] == "m" and got["model"]["when"].startswith("2024-01-02T03:04:05")
    assert got["dec"] == 1.25
    assert got["uuid"] == "12345678-1234-5678-1234-567812345678"
    assert got["dt"].startswith("2024-01-02T03:04:05")
    assert got["day"] == "2024-01-02"
    assert got["raw"] == "hello"
    assert got["set"] == [1, 2, 3]
    assert got["frozen"] == ["a"]
    assert isinstance(got["deep"], list)  # cut deep down, kept near the top
    assert got["plain"] == "kept"
    assert action.result["status"] == "succeeded"


def test_a_bad_value_spoils_only_itself(hs: Hindsight) -> None:
    class Broken:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    class NotAKey:
        def __str__(self) -> str:
            raise RuntimeError("no str")

        def __hash__(self) -> int:
            return 1

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HindsightWarning)
        with hs.task("t", recall=False) as task:
            task.record_action("tool", {"bad": Broken(), "good": "still here", NotAKey(): 1})
        hs.flush()
    action = next(e for e in hs.store.events(task.task_id) if e.type == "action_executed")
    assert action.input["args"]["good"] == "still here"
    assert action.input["tool"] == "tool"
    assert "Broken" in action.input["args"]["bad"]


def test_odd_text_and_numbers_are_still_sanitized_wherever_they_sit(hs: Hindsight) -> None:
    """The writer trusts short non-ASCII text and finite floats on its fast path; a lone
    surrogate or a NaN anywhere must still be replaced and warned about, the rest kept."""
    bad = "中文\udcff"  # a lone surrogate, as surrogateescape leaves undecodable bytes
    args = {
        "top": bad,
        "nested": {"deeper": {"s": bad, "ok": "好的"}},
        "list": ["好", bad, 1.5, math.nan],
        "nan": math.nan,
        "inf": math.inf,
        "f": 0.25,
        "中文键": "值",
    }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with hs.task("t", recall=False) as task:
            task.record_action("tool", args, output={"s": bad, "n": -math.inf})
        hs.flush()
    action = next(e for e in hs.store.events(task.task_id) if e.type == "action_executed")
    got = action.input["args"]
    assert got["top"] == "中文\ufffd"
    assert got["nested"] == {"deeper": {"s": "中文\ufffd", "ok": "好的"}}
    assert got["list"] == ["好", "中文\ufffd", 1.5, None]
    assert got["nan"] is None and got["inf"] is None and got["f"] == 0.25
    assert got["中文键"] == "值"
    assert action.result["output"] == {"s": "中文\ufffd", "n": None}
    text = " ".join(str(w.message) for w in caught)
    assert "invalid UTF-8 replaced" in text and "stored as null" in text


def test_numpy_in_succeed_keeps_the_task_succeeded(db_path: Path) -> None:
    np = _np()
    with Hindsight(db_path, background=False) as hs:
        with hs.task("t", recall=False) as t:
            t.succeed(auc=np.float64(0.93))
        hs.flush()
        task = hs.get_task(t.task_id)
        assert task is not None and task.status == "succeeded"
        end = hs.store.events(t.task_id)[-1]
        assert end.result == {"status": "succeeded", "auc": 0.93}


# -- timestamps ---------------------------------------------------------------------------------


def test_a_bad_timestamp_spoils_only_its_own_event(hs: Hindsight) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hs.record({"type": "task_start", "task_id": "tsk_ts", "task_type": "t"})
        for i in range(50):
            hs.record({"type": "user_input", "task_id": "tsk_ts", "input": {"i": i}})
        for bad in (10**30, "not a time", 1e300, "2024-13-45T99:99:99Z", float("nan")):
            hs.record(
                {"type": "user_input", "task_id": "tsk_ts", "timestamp": bad, "input": {"i": -1}}
            )
        assert hs.flush(timeout=10)
    events = hs.store.events("tsk_ts")
    assert sorted(e.input["i"] for e in events if e.type == "user_input" and e.input["i"] >= 0) == (
        list(range(50))
    )
    odd = [e for e in events if e.type == "user_input" and e.input["i"] == -1]
    assert len(odd) == 5
    originals = sorted(str(e.context["original_timestamp"]) for e in odd)
    assert "not a time" in originals and "2024-13-45T99:99:99Z" in originals
    assert hs.recorder.stats["dead_lettered"] == 0
    assert "timestamp" in " ".join(str(w.message) for w in caught)


def test_odd_but_valid_timestamps_are_normalized_to_utc_and_sort(hs: Hindsight) -> None:
    tid = "tsk_odd"
    stamps = {
        "a": "2024-06-01T08:00:00+08:00",  # 00:00 UTC
        "b": "2024-06-01T01:00:00Z",
        "c": "9999-06-01T00:00:00+05:00",
        "d": "9999-12-31T23:00:00-05:00",  # past 9999 in UTC: kept last, at the end of time
        "e": "0999-01-01T00:00:00Z",
    }
    hs.record({"type": "task_start", "task_id": tid, "task_type": "t", "timestamp": "2024-01-01"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HindsightWarning)
        for name, ts in stamps.items():
            hs.record({"type": "user_input", "task_id": tid, "timestamp": ts, "input": {"n": name}})
        hs.flush()
    events = [e for e in hs.store.events(tid) if e.type == "user_input"]
    by_name = {e.input["n"]: e.timestamp for e in events}
    assert by_name["a"] == "2024-06-01T00:00:00.000Z"
    assert by_name["c"] == "9999-05-31T19:00:00.000Z"
    assert by_name["d"] == "9999-12-31T23:59:59.999Z"
    assert by_name["e"] == "0999-01-01T00:00:00.000Z"
    assert [e.input["n"] for e in events] == ["e", "a", "b", "c", "d"]
    assert all(len(t) == 24 for t in by_name.values())


# -- overload -----------------------------------------------------------------------------------


def test_overload_blocks_about_block_seconds_spill_included(
    db_path: Path,
) -> None:
    import sqlite3

    # The thread writer's spill (the process writer's has its own test in test_record_process)
    hs = Hindsight(db_path, background=False, triggers=False, queue_bound=3000, writer="thread")
    agent = threading.get_ident()
    spill_threads: set[int] = set()
    rec = hs.recorder
    original = rec._append_dead_letter

    def spy(lines: Any, reason: str) -> Any:
        spill_threads.add(threading.get_ident())
        return original(lines, reason)

    rec._append_dead_letter = spy  # type: ignore[method-assign]
    try:
        rec.block_seconds = 0.3
        other = sqlite3.connect(db_path, isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")
        slowest = 0.0
        payload = {"text": "é" * 2000, "password": "x", "nested": [{"k": "v" * 600}] * 20}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HindsightWarning)
            with hs.task("t", recall=False, task_id="tsk_over") as task:
                for _ in range(12_000):
                    t0 = time.perf_counter()
                    task.record_action("tool", payload)
                    slowest = max(slowest, time.perf_counter() - t0)
                other.execute("ROLLBACK")
                other.close()
            assert hs.flush(timeout=60)
        assert rec.stats["spilled"] > 0
        # The spill is written on the agent's thread (that back-pressure keeps memory flat) in
        # chunks sized to fit the time left: even 14 KB events never hold the agent much past
        # block_seconds (one whole batch of them took 12 s to spill). The bound is loose on
        # purpose: a loaded machine must not fail it, a whole-batch spill always would.
        assert slowest < rec.block_seconds * 4, slowest
        assert spill_threads == {agent}
        stored = hs.store.event_count("tsk_over")
        assert stored + rec.stats["dead_lettered"] == 12_002
    finally:
        hs.close()
