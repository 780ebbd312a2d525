"""``hindsight serve``'s JSON API over real HTTP: the real command on a free port, a real store."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("starlette")
pytest.importorskip("jinja2")

from hindsight_loop import Hindsight  # noqa: E402
from hindsight_loop.models import Lesson  # noqa: E402

TOKEN = "test-token-not-secret"
HINDSIGHT = str(Path(sys.executable).with_name("hindsight"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def conflict_pair(hs: Hindsight) -> tuple[str, str]:
    """Two lessons that contradict each other, both waiting for a person (a restore)."""
    a = Lesson(
        lesson_id="les_keep",
        task_type="csv_cleaning",
        advice="You should read GBK files with encoding='gbk'.",
        status="needs_review",
        conflicts=["les_drop"],
        created_at="2026-01-01T00:00:00.000Z",
        valid_until="2099-01-01T00:00:00.000Z",
    )
    b = Lesson(
        lesson_id="les_drop",
        task_type="csv_cleaning",
        advice="你不要用 gbk 编码读取文件。",
        language="zh",
        status="needs_review",
        conflicts=["les_keep"],
        created_at="2026-01-02T00:00:00.000Z",
        valid_until="2099-01-01T00:00:00.000Z",
    )
    hs.save_lesson(a)
    hs.save_lesson(b)
    return a.lesson_id, b.lesson_id


def near_pair(hs: Hindsight, second: str) -> None:
    """``les_one`` (active) and ``les_two`` (``second``, waiting): near text the rules could not
    read either way, marked as a pair for a person to settle."""
    for mine, theirs, advice, status in (
        ("les_one", "les_two", "Add a LIMIT clause to exploratory SELECT queries.", "active"),
        ("les_two", "les_one", second, "needs_review"),
    ):
        hs.save_lesson(
            Lesson(
                lesson_id=mine,
                task_type="sql",
                advice=advice,
                status=status,
                conflicts=[theirs],
                created_at="2026-01-03T00:00:00.000Z",
                valid_until="2099-01-01T00:00:00.000Z",
            )
        )


@pytest.fixture
def server(tmp_path: Path, http_process: Any) -> Any:
    from hindsight_loop.demo.run import run_demo

    db = tmp_path / "serve.db"
    run_demo(str(db), seed=7, files=12)
    with Hindsight(db, background=False) as hs:
        conflict_pair(hs)
    port = free_port()
    env = {**os.environ, "HINDSIGHT_TOKEN": TOKEN}
    http_process(HINDSIGHT, ["serve", "--db", str(db), "--port", str(port)], port, env=env)
    base = f"http://127.0.0.1:{port}"
    with (
        httpx.Client(base_url=base, timeout=30) as anon,
        httpx.Client(
            base_url=base, timeout=30, headers={"Authorization": f"Bearer {TOKEN}"}
        ) as agent,
    ):
        yield {"db": db, "anon": anon, "agent": agent, "base": base}


def test_access_rules(server: Any) -> None:
    anon, agent = server["anon"], server["agent"]
    # A read from this machine needs no token; a write does, and says how to send it.
    assert anon.get("/api/tasks").status_code == 200
    refused = anon.post("/api/events", json={"type": "task_start", "task_type": "t"})
    assert refused.status_code == 401
    assert "Authorization: Bearer" in refused.json()["error"]
    wrong = anon.post(
        "/api/events",
        json={"type": "task_start", "task_type": "t"},
        headers={"Authorization": "Bearer nope"},
    )
    assert wrong.status_code == 401
    # DNS rebinding: a page of another site reaching the loopback server names its own host.
    assert anon.get("/api/tasks", headers={"Host": "evil.example:80"}).status_code == 421
    # A browser's session cookie alone does not make a write: the CSRF token must come too.
    login = anon.post("/login", data={"token": TOKEN, "name": "ana"}, follow_redirects=False)
    assert login.status_code == 303
    assert "httponly" in login.headers["set-cookie"].lower()
    assert "samesite=strict" in login.headers["set-cookie"].lower()
    no_csrf = anon.post("/review/les_keep/pin")
    assert no_csrf.status_code == 403
    assert anon.get("/api/lessons/les_keep").json()["pinned"] is False
    bad_login = httpx.post(server["base"] + "/login", data={"token": "guess"})
    assert bad_login.status_code == 401
    assert agent.get("/api/health").json() == {"ok": True}


def test_a_bad_batch_records_nothing(server: Any) -> None:
    agent = server["agent"]
    batch = [
        {"type": "task_start", "task_id": "tsk_half", "task_type": "csv_cleaning", "goal": "g"},
        {"type": "action_executed", "task_id": "tsk_half", "input": {"tool": "read_csv"}},
        {"type": "no_such_type", "task_id": "tsk_half"},
        {"type": "user_input", "task_id": "tsk_half", "input": "not an object"},
    ]
    answer = agent.post("/api/events", json=batch)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert "nothing was recorded" in error
    assert "event 2" in error and "event 3" in error
    assert agent.get("/api/tasks/tsk_half").status_code == 404
    for body, words in (
        (b"{not json", "not valid JSON"),
        (b"", "empty"),
        (b"42", "one event object"),
        (b"[]", "no events"),
    ):
        answer = agent.post("/api/events", content=body)
        assert answer.status_code == 400, body
        assert words in answer.json()["error"]


def test_record_a_run_and_read_it_back(server: Any) -> None:
    agent = server["agent"]
    events = [
        {"type": "task_start", "task_type": "报表整理", "goal": "整理销售数据 <script>x</script>"},
        {
            "type": "action_executed",
            "input": {"tool": "read_csv", "args": {"path": "a.csv"}},
            "result": {"status": "failed", "error_type": "UnicodeDecodeError"},
        },
        {
            "type": "action_executed",
            "input": {"tool": "read_csv", "args": {"path": "a.csv", "encoding": "gbk"}},
            "result": {"status": "succeeded"},
        },
        {"type": "feedback", "input": {"text": "太慢了，不对", "score": -1}},
    ]
    answer = agent.post("/api/events", json={"events": events})
    assert answer.status_code == 201, answer.text
    task_id = answer.json()["task_id"]
    assert answer.json()["recorded"] == 4
    ended = agent.post(f"/api/tasks/{task_id}/end", json={"status": "succeeded"})
    assert ended.status_code == 200
    run = agent.get(f"/api/tasks/{task_id}").json()
    assert run["task"]["goal"].startswith("整理销售数据")
    assert run["task"]["status"] == "succeeded"
    kinds = {node["kind"] for node in run["chronicle"]["key_nodes"]}
    assert {"first_failure", "recovery"} <= kinds
    listed = agent.get("/api/tasks", params={"task_type": "报表整理"}).json()
    assert [t["task_id"] for t in listed["tasks"]] == [task_id]
    # The page shows the Chinese goal as text: the recorded markup is escaped, never run.
    page = server["anon"].get(f"/runs/{task_id}").text
    assert "整理销售数据 &lt;script&gt;x&lt;/script&gt;" in page
    assert "<script>x</script>" not in page
    assert "首次失败" in server["anon"].get(f"/runs/{task_id}?lang=zh").text


def test_a_long_run_page_counts_the_like_key_nodes_it_leaves_out(server: Any) -> None:
    agent = server["agent"]
    events: list[dict[str, Any]] = [{"type": "task_start", "task_type": "etl", "goal": "load"}]
    for k in range(300):  # 300 like recoveries: their steps alone overflow a chronicle
        call = {"tool": "read_csv", "args": {"path": f"{k}.csv"}}
        events.append(
            {
                "type": "action_executed",
                "input": call,
                "result": {"status": "failed", "error_type": "UnicodeDecodeError"},
            }
        )
        fixed = {"tool": "read_csv", "args": {"path": f"{k}.csv", "encoding": "gbk"}}
        events.append(
            {"type": "action_executed", "input": fixed, "result": {"status": "succeeded"}}
        )
    answer = agent.post("/api/events", json={"events": events})
    assert answer.status_code == 201, answer.text
    task_id = answer.json()["task_id"]
    nodes = agent.get(f"/api/tasks/{task_id}").json()["chronicle"]["key_nodes"]
    [first, *_] = [n for n in nodes if n["kind"] == "recovery"]
    left_out = first["repeats"]
    assert left_out > 0  # 300 like recoveries do not fit: some are counted, not listed
    assert (
        f"(+{left_out} more like it later in the run)"
        in server["anon"].get(f"/runs/{task_id}").text
    )
    zh = server["anon"].get(f"/runs/{task_id}?lang=zh").text
    assert f"之后还有 {left_out} 个同类节点未列出" in zh


def test_start_recall_and_outcome(server: Any) -> None:
    agent = server["agent"]
    recalled = agent.post(
        "/api/recall",
        json={"task_type": "csv_cleaning", "tools": ["read_csv"], "query": "encoding error"},
    ).json()
    assert 1 <= len(recalled["lessons"]) <= 3
    assert recalled["advice"]
    via_get = (
        server["anon"]
        .get(
            "/api/recall",
            params={"task_type": "csv_cleaning", "tools": "read_csv", "query": "encoding error"},
        )
        .json()
    )
    assert [x["lesson_id"] for x in via_get["lessons"]] == [
        x["lesson_id"] for x in recalled["lessons"]
    ]
    started = agent.post(
        "/api/tasks",
        json={
            "task_type": "csv_cleaning",
            "goal": "clean",
            "tools": ["read_csv"],
            "query": "encoding error",
        },
    )
    assert started.status_code == 201
    body = started.json()
    ids = [x["lesson_id"] for x in body["lessons"]]
    assert ids and body["advice"]
    task = agent.get(f"/api/tasks/{body['task_id']}").json()["task"]
    assert task["injected_lesson_ids"] == ids
    # The run's page lists the lessons injected into it.
    run_page = server["anon"].get(f"/runs/{body['task_id']}").text
    assert all(f'id="lesson-{x}"' in run_page for x in ids)
    before = agent.get(f"/api/lessons/{ids[0]}").json()["helpful"]
    ended = agent.post(
        f"/api/tasks/{body['task_id']}/end", json={"status": "succeeded", "helpful": [ids[0]]}
    )
    assert ended.status_code == 200
    assert ids[0] in ended.json()["lessons_updated"]
    assert agent.get(f"/api/lessons/{ids[0]}").json()["helpful"] == before + 1
    for path, payload, words in (
        ("/api/tasks", {"goal": "no type"}, "'task_type' is required"),
        ("/api/recall", {"intent": "dance"}, "intent must be one of"),
        ("/api/recall", {"scope": "team"}, "scope"),
        ("/api/recall", {"limit": 9}, "limit must be"),
        ("/api/tasks/tsk_nope/end", {"status": "succeeded"}, "no task"),
        (f"/api/tasks/{body['task_id']}/end", {"status": "fine"}, "status must be"),
        (f"/api/tasks/{body['task_id']}/feedback", {"score": 3}, "score must be"),
    ):
        answer = agent.post(path, json=payload)
        assert answer.status_code in (400, 404), (path, answer.text)
        assert words in answer.json()["error"], (path, answer.text)


def test_review_actions_change_what_recall_returns(server: Any) -> None:
    agent = server["agent"]
    query = {"task_type": "csv_cleaning", "tools": ["read_csv"], "query": "encoding error"}
    top = agent.post("/api/recall", json=query).json()["lessons"][0]["lesson_id"]
    # A bad edit is refused whole: the lesson is as it was.
    before = agent.get(f"/api/lessons/{top}").json()
    bad = agent.post(
        f"/api/lessons/{top}/edit", json={"by": "ana", "changes": {"advice": "x", "helpful": 99}}
    )
    assert bad.status_code == 400 and "cannot edit 'helpful'" in bad.json()["error"]
    assert agent.get(f"/api/lessons/{top}").json() == before
    assert agent.post(f"/api/lessons/{top}/frobnicate", json={"by": "ana"}).status_code == 400
    assert agent.post(f"/api/lessons/{top}/pin", json={}).status_code == 400
    assert agent.post("/api/lessons/les_none/pin", json={"by": "ana"}).status_code == 404
    edited = agent.post(
        f"/api/lessons/{top}/edit", json={"by": "ana", "changes": {"advice": "You 先检查编码。"}}
    ).json()
    assert edited["advice"] == "You 先检查编码。"
    # The edit is ana's; a reworded lesson is read against the book again, and the curator
    # may record what its new words contradict after it.
    assert [e for e in edited["history"] if e["action"] == "edit"][-1]["by"] == "ana"
    rejected = agent.post(f"/api/lessons/{top}/reject", json={"by": "ana", "reason": "wrong"})
    assert rejected.json()["status"] == "rejected"
    # The page's cached book follows the change (patched in place, not re-read).
    listed = agent.get("/api/lessons", params={"status": "rejected", "limit": 500}).json()
    assert top in [x["lesson_id"] for x in listed["lessons"]]
    assert agent.get("/api/lessons", params={"q": "先检查编码"}).json()["lessons"][0]["status"] == (
        "rejected"
    )
    after = agent.post("/api/recall", json=query).json()["lessons"]
    assert top not in [x["lesson_id"] for x in after]
    # The same answer from the facade on the same file.
    with Hindsight(server["db"], background=False) as hs:
        assert top not in hs.recall(**query).ids
    # The review queue shows the conflict; settling it confirms one side and rejects the other.
    queue = agent.get("/api/review").json()["queue"]
    pair = next(i for i in queue if i["lesson"]["lesson_id"] in ("les_keep", "les_drop"))
    assert {pair["lesson"]["lesson_id"], pair["conflicts_with"][0]["lesson_id"]} == {
        "les_keep",
        "les_drop",
    }
    assert (
        agent.post(
            "/api/conflicts/resolve", json={"keep": "les_keep", "reject": top, "by": "ana"}
        ).status_code
        == 400
    )
    settled = agent.post(
        "/api/conflicts/resolve", json={"keep": "les_keep", "reject": "les_drop", "by": "ana"}
    ).json()
    assert settled["kept"]["status"] == "active"
    assert settled["rejected"]["status"] == "rejected"
    queue = agent.get("/api/review").json()["queue"]
    assert not {"les_keep", "les_drop"} & {i["lesson"]["lesson_id"] for i in queue}
    # A near pair that says one thing: settled as the same, the kept one takes the other's
    # support and wording, the other is rejected with a note.
    with Hindsight(server["db"], background=False) as hs:
        near_pair(hs, "Always put a LIMIT on exploratory SELECTs you send.")
    bad = {"keep": "les_one", "reject": "les_two", "by": "ana", "same": "yes"}
    assert agent.post("/api/conflicts/resolve", json=bad).status_code == 400
    same = agent.post("/api/conflicts/resolve", json={**bad, "same": True}).json()
    assert same["kept"]["support"] == 2 and same["kept"]["conflicts"] == []
    assert same["kept"]["advice"].startswith("Add a LIMIT")
    assert same["rejected"]["status"] == "rejected"
    assert same["rejected"]["history"][-1]["reason"] == "same as les_one"
    listed = agent.get("/api/lessons", params={"status": "rejected", "limit": 500}).json()
    assert "les_two" in [x["lesson_id"] for x in listed["lessons"]]


def test_lists_paginate_and_filter(server: Any) -> None:
    agent = server["agent"]
    first = agent.get("/api/tasks", params={"limit": 5}).json()
    second = agent.get("/api/tasks", params={"limit": 5, "page": 2}).json()
    assert len(first["tasks"]) == 5 and first["next"] is True
    assert not {t["task_id"] for t in first["tasks"]} & {t["task_id"] for t in second["tasks"]}
    failed = agent.get("/api/tasks", params={"status": "failed", "limit": 500}).json()["tasks"]
    assert failed and all(t["status"] == "failed" for t in failed)
    assert agent.get("/api/tasks", params={"since": "2999-01-01"}).json()["tasks"] == []
    assert agent.get("/api/tasks", params={"until": "2000-01-01"}).json()["tasks"] == []
    newest = first["tasks"][0]["started_at"]
    assert agent.get("/api/tasks", params={"since": newest, "limit": 1}).json()["tasks"] == [
        first["tasks"][0]
    ]
    for params, words in (
        ({"status": "happy"}, "status must be one of"),
        ({"page": "0"}, "page must be"),
        ({"since": "yesterday"}, "since must be a date"),
    ):
        answer = agent.get("/api/tasks", params=params)
        assert answer.status_code == 400 and words in answer.json()["error"]
    lessons = agent.get("/api/lessons", params={"q": "gbk", "limit": 2}).json()
    assert lessons["total"] >= 1
    assert all("gbk" in x["advice"].lower() or "gbk" in str(x).lower() for x in lessons["lessons"])
    zh = agent.get("/api/lessons", params={"q": "编码"}).json()["lessons"]
    assert [x["lesson_id"] for x in zh] == ["les_drop"]
    assert agent.get("/api/reflections", params={"limit": 3}).json()["reflections"]
    assert agent.get("/api/nowhere").status_code == 404


def test_openapi_describes_every_route(server: Any) -> None:
    spec = server["anon"].get("/openapi.json").json()
    assert spec["openapi"].startswith("3.")
    from hindsight_loop.serve.api import Api

    for route in Api.routes(Api.__new__(Api)):
        assert route.path in spec["paths"], route.path
        for method in route.methods or ():
            if method != "HEAD":
                assert method.lower() in spec["paths"][route.path], (route.path, method)


def _outward_address() -> str | None:
    """An address of this machine that is not loopback, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET: no packet is sent for a UDP connect
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_bound_to_the_network_every_request_needs_the_token(
    tmp_path: Path, http_process: Any
) -> None:
    address = _outward_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to bind")
    db = tmp_path / "net.db"
    with Hindsight(db, background=False) as hs:
        conflict_pair(hs)
    port = free_port()
    env = {**os.environ, "HINDSIGHT_TOKEN": TOKEN}
    http_process(
        HINDSIGHT,
        ["serve", "--db", str(db), "--host", "0.0.0.0", "--port", str(port)],
        port,
        env=env,
    )
    remote = f"http://{address}:{port}"
    # From a non-loopback address even a read needs the token; from loopback it does not.
    assert httpx.get(f"{remote}/api/lessons").status_code == 401
    assert httpx.get(f"{remote}/runs").status_code == 401
    with_token = httpx.get(f"{remote}/api/lessons", headers={"Authorization": f"Bearer {TOKEN}"})
    assert with_token.status_code == 200
    assert httpx.get(f"http://127.0.0.1:{port}/api/lessons").status_code == 200


def test_serve_cli_reports_a_taken_port_and_a_generated_token(
    tmp_path: Path, http_process: Any
) -> None:
    import subprocess

    db = tmp_path / "cli.db"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "HINDSIGHT_TOKEN"}
    proc = http_process(HINDSIGHT, ["serve", "--db", str(db), "--port", str(port)], port, env=env)
    taken = subprocess.run(
        [HINDSIGHT, "serve", "--db", str(db), "--port", str(port)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert taken.returncode == 1
    assert "already in use" in taken.stderr and "--port" in taken.stderr
    proc.terminate()
    proc.wait(timeout=30)
    notice = proc.stderr.read().decode()
    assert "generated one for this run" in notice
    token = notice.split("Authorization: Bearer ", 1)[1].split()[0]
    assert f"/login?token={token}" in notice


def test_a_change_by_another_instance_shows_on_the_next_page(server: Any) -> None:
    from hindsight_loop import lessons as book_ops

    anon = server["anon"]
    # The server has read (and cached) the book.
    first = anon.get("/lessons", params={"q": "gbk"})
    assert first.status_code == 200 and "les_keep" in first.text
    assert "les_drop" in anon.get("/review").text
    # Another Hindsight instance, as a worker or a second server would, changes the book.
    with Hindsight(server["db"], background=False) as other:
        other.change_lesson(
            "les_keep",
            lambda x: book_ops.edit(x, by="other", advice="Read GBK files as 'gb18030'."),
        )
        other.change_lesson("les_drop", lambda x: book_ops.reject(x, by="other", reason="wrong"))
        other.save_lesson(
            Lesson(
                lesson_id="les_new_elsewhere",
                task_type="csv_cleaning",
                advice="你应该先检查文件编码再读取。",
                language="zh",
                valid_until="2099-01-01T00:00:00.000Z",
            )
        )
    page = anon.get("/lessons", params={"q": "gb18030"}).text
    assert "les_keep" in page and "gb18030" in page
    assert "les_new_elsewhere" in anon.get("/lessons", params={"q": "检查文件编码"}).text
    # The rejected lesson has left the review queue and the book's active lessons.
    assert "les_drop" not in anon.get("/review").text
    active = anon.get("/api/lessons", params={"status": "active", "limit": 500}).json()
    assert "les_drop" not in {x["lesson_id"] for x in active["lessons"]}
    rejected = anon.get("/api/lessons", params={"status": "rejected", "limit": 500}).json()
    assert "les_drop" in {x["lesson_id"] for x in rejected["lessons"]}


def test_a_merge_on_the_models_word_is_shown_for_review_and_split_back_out(server: Any) -> None:
    """The model's "same" merged a wording that says the opposite: the review page and the API
    show it under the lesson, and a person takes it back out as a lesson of its own."""
    from hindsight_loop.embed import HashEmbedder
    from hindsight_loop.lessons import curate
    from hindsight_loop.models import Features, LessonDraft

    def draft(advice: str) -> LessonDraft:
        return LessonDraft(
            task_type="weather_query", advice=advice, features=Features(tools=["get_weather"])
        )

    wrong = "Call get_weather(city='Beijing') straight away when no city is given."
    emb = HashEmbedder()
    kept = curate(draft("Confirm which city the user means before calling get_weather."), [],
                  embedder=emb).lesson  # fmt: skip
    kept = curate(draft(wrong), [kept], embedder=emb, judge=lambda a, b: "same").lesson
    with Hindsight(server["db"], background=False) as hs:
        hs.save_lesson(kept)
    anon, agent = server["anon"], server["agent"]
    [item] = [i for i in agent.get("/api/review").json()["queue"]
              if i["lesson"]["lesson_id"] == kept.lesson_id]  # fmt: skip
    assert [m["wording"] for m in item["judged_merges"]] == [wrong]
    assert "merged on the model's word alone" in item["reasons"][0]
    # The page, for a person logged in: the wording under the lesson, and a button to split it.
    assert anon.post("/login", data={"token": TOKEN, "name": "ana"}).status_code == 303
    page = anon.get("/review").text
    assert "Merged on the model&#39;s word" in page and "straight away when no city" in page
    assert f'action="/review/{kept.lesson_id}/split"' in page
    csrf = page.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    done = anon.post(f"/review/{kept.lesson_id}/split", data={"csrf": csrf},
                     headers={"HX-Request": "true"})  # fmt: skip
    assert done.status_code == 200 and "split: what the model merged" in done.text
    back = agent.get(f"/api/lessons/{kept.lesson_id}").json()
    [split] = [e for e in back["history"] if e["action"] == "split"]
    assert back["support"] == 1 and split["by"] == "ana"
    [part_id] = split["changes"]["lessons"]
    part = agent.get(f"/api/lessons/{part_id}").json()
    assert part["advice"] == wrong and part["status"] == "needs_review"
    # The part is read against the book as a new lesson: it says the opposite of the lesson it
    # was merged into, and the pair is recorded (before, confirming it served both).
    assert part["conflicts"] == [kept.lesson_id] and back["conflicts"] == [part_id]
    queue = {i["lesson"]["lesson_id"]: i for i in agent.get("/api/review").json()["queue"]}
    assert part_id in queue
    [reason] = queue[kept.lesson_id]["reasons"]
    assert reason.startswith(f"repeats or contradicts {part_id}")  # near text, for a person
    again = agent.post(f"/api/lessons/{kept.lesson_id}/split", json={"by": "ana"})
    assert again.status_code == 400 and "no merge made on the model's word" in again.json()["error"]
    assert agent.post("/api/lessons/les_none/split", json={"by": "ana"}).status_code == 404


def test_settling_a_conflict_leaves_the_models_merges_for_a_person(server: Any) -> None:
    from hindsight_loop.embed import HashEmbedder
    from hindsight_loop.lessons import curate
    from hindsight_loop.models import Features, LessonDraft

    def draft(advice: str) -> LessonDraft:
        return LessonDraft(
            task_type="weather_query", advice=advice, features=Features(tools=["get_weather"])
        )

    emb = HashEmbedder()
    kept = curate(draft("Confirm which city the user means before calling get_weather."), [],
                  embedder=emb).lesson  # fmt: skip
    kept = curate(draft("Mind the amber quota at night."), [kept], embedder=emb,
                  judge=lambda a, b: "same").lesson  # fmt: skip
    kept.conflicts = ["les_rival"]
    rival = Lesson(
        lesson_id="les_rival",
        task_type="weather_query",
        advice="Call get_weather for Beijing when no city is given.",
        status="needs_review",
        conflicts=[kept.lesson_id],
        valid_until="2099-01-01T00:00:00.000Z",
    )
    with Hindsight(server["db"], background=False) as hs:
        hs.save_lesson(kept)
        hs.save_lesson(rival)
    anon, agent = server["anon"], server["agent"]
    anon.post("/login", data={"token": TOKEN, "name": "ana"})
    page = anon.get("/review").text
    assert f'action="/review/{kept.lesson_id}/split"' in page  # on the side-by-side card too
    refused = agent.post(f"/api/lessons/{kept.lesson_id}/confirm", json={"by": "curator"})
    assert refused.status_code == 400 and "names a person" in refused.json()["error"]
    settled = agent.post(
        "/api/conflicts/resolve", json={"keep": kept.lesson_id, "reject": "les_rival", "by": "ana"}
    )
    assert settled.status_code == 200 and settled.json()["kept"]["status"] == "active"
    queue = {i["lesson"]["lesson_id"]: i for i in agent.get("/api/review").json()["queue"]}
    assert [m["wording"] for m in queue[kept.lesson_id]["judged_merges"]] == [
        "Mind the amber quota at night."
    ]
    # A confirmation of its own says they are the same.
    agent.post(f"/api/lessons/{kept.lesson_id}/confirm", json={"by": "ana"})
    queue = {i["lesson"]["lesson_id"] for i in agent.get("/api/review").json()["queue"]}
    assert kept.lesson_id not in queue


def test_recall_of_no_task_type_keeps_apart_opposites_of_two_task_types(server: Any) -> None:
    """Opposite lessons of two task types, never compared by curation: a recall naming no task
    type returns one of them, not both."""
    from hindsight_loop.models import Features, LessonDraft

    ask = "You should ask the user for the city before calling get_weather."
    dont = "You should not ask the user for the city before calling get_weather."
    with Hindsight(server["db"], background=False) as other:
        for task_type, advice in (("weather_query", ask), ("trip_planning", dont)):
            change = other.curate(
                LessonDraft(
                    task_type=task_type, advice=advice, features=Features(tools=["get_weather"])
                )
            )
            assert change.action == "add"
    params = {"tools": "get_weather", "query": "ask the city before get_weather"}
    for extra in ({}, {"task_type": "*"}):
        got = server["anon"].get("/api/recall", params={**params, **extra}).json()
        said = [x["advice"] for x in got["lessons"]]
        assert (ask in said) != (dont in said), said
        assert (ask in got["advice"]) != (dont in got["advice"])
