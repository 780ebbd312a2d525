"""The review page in a real browser: Debian's chromium driven by Playwright, against the real
``hindsight serve`` on a store the demo wrote. Each action is checked through the facade too."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("jinja2")
CHROMIUM = "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip(
        f"{CHROMIUM} is absent: run 'bash scripts/setup-browser.sh' to install chromium and "
        "fonts-wqy-microhei",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api")

from hindsight_loop import Hindsight  # noqa: E402
from tests.test_serve_api import HINDSIGHT, conflict_pair, free_port, near_pair  # noqa: E402

TOKEN = "browser-test-token"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: The README's screenshot is refreshed only when asked (HINDSIGHT_SCREENSHOT=1): the demo's
#: ids differ on every run, so writing it always would leave the checkout modified.
DOCS_SHOT = Path(__file__).resolve().parents[1] / "docs" / "serve.png"
QUERY = {"task_type": "csv_cleaning", "tools": ["read_csv"], "query": "encoding error"}


@pytest.fixture
def site(tmp_path: Path, http_process: Any) -> Any:
    from hindsight_loop.demo.run import run_demo

    db = tmp_path / "demo.db"
    run_demo(str(db), seed=7, files=24)
    with Hindsight(db, background=False) as hs:
        conflict_pair(hs)
        # A lesson recall returns, flagged for a look: the one the test rejects from the queue.
        doubtful = hs.recall(**QUERY).ids[0]
        hs.change_lesson(doubtful, lambda x: _suspect(x))
        assert doubtful in hs.recall(**QUERY).ids
    port = free_port()
    env = {**os.environ, "HINDSIGHT_TOKEN": TOKEN}
    http_process(HINDSIGHT, ["serve", "--db", str(db), "--port", str(port)], port, env=env)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 860})
        try:
            yield {"db": db, "page": page, "base": f"http://127.0.0.1:{port}", "doubtful": doubtful}
        finally:
            browser.close()


def _suspect(lesson: Any) -> Any:
    from hindsight_loop import lessons as book_ops

    return book_ops.edit(lesson, by="test", quality="suspect")


def test_runs_page_and_a_run_with_its_key_nodes(site: Any, tmp_path: Path) -> None:
    page, base = site["page"], site["base"]
    page.goto(f"{base}/runs?lang=en")
    rows = page.locator("#runs tbody tr")
    assert rows.count() == 48  # two nights of 24 files
    page.screenshot(path=str(tmp_path / "runs.png"), full_page=True)
    page.select_option("select[name=status]", "failed")
    page.click("form.filters button")
    page.wait_for_url("**status=failed**")
    failed = page.locator("#runs tbody tr")
    assert failed.count() >= 1
    assert all("failed" in failed.nth(i).inner_text() for i in range(failed.count()))
    failed.first.locator("a.id").click()
    page.wait_for_selector("#timeline")
    kinds = page.locator("#key-nodes .badge").evaluate_all("els => els.map(e => e.dataset.kind)")
    assert "first_failure" in kinds
    # The same key nodes are marked on the timeline's steps.
    marked = page.locator("#timeline li.marked .badge").evaluate_all(
        "els => els.map(e => e.dataset.kind)"
    )
    assert set(kinds) == set(marked)
    page.screenshot(path=str(tmp_path / "run.png"), full_page=True)
    # Chinese labels render with a CJK font (fonts-wqy-microhei), not as boxes.
    page.goto(page.url.split("?")[0] + "?lang=zh")
    assert page.locator("h2").first.inner_text() == "关键节点"
    assert "首次失败" in page.locator("#key-nodes").inner_text()
    assert page.evaluate("document.fonts.check('16px \"WenQuanYi Micro Hei\"', '关键节点')")
    page.screenshot(path=str(tmp_path / "run-zh.png"), full_page=True)


def test_reject_from_the_queue_and_settle_a_conflict(site: Any, tmp_path: Path) -> None:
    page, base, doubtful = site["page"], site["base"], site["doubtful"]
    page.goto(f"{base}/review?lang=en")
    # Not logged in: the queue is readable, there is nothing to press.
    assert page.locator(f"#card-{doubtful}").is_visible()
    assert page.locator("button[data-action]").count() == 0
    page.goto(f"{base}/login?lang=en")
    page.fill("input[name=token]", TOKEN)
    page.fill("input[name=name]", "Ana 安娜")
    page.click("form.stack button")
    page.wait_for_url("**/review")
    card = page.locator(f"#card-{doubtful}")
    assert "suspect quality" in card.inner_text()
    # The conflict is shown side by side, both texts readable (English and Chinese).
    pair = page.locator(".card", has=page.locator(".side-by-side"))
    assert pair.locator(".choice").count() == 2
    assert "你不要用 gbk 编码读取文件。" in pair.inner_text()
    page.screenshot(path=str(tmp_path / "review.png"), full_page=True)
    page.screenshot(path=str(tmp_path / "serve.png"))
    if os.environ.get("HINDSIGHT_SCREENSHOT"):
        DOCS_SHOT.parent.mkdir(exist_ok=True)
        shutil.copyfile(tmp_path / "serve.png", DOCS_SHOT)

    # A refused edit changes nothing and says why on the page.
    card.locator("details.edit summary").click()
    card.locator("textarea[name=advice]").fill("   ")
    card.locator("button[data-action=edit]").click()
    page.wait_for_selector("#flash:not([hidden])")
    assert "'advice' must be non-empty text" in page.locator("#flash").inner_text()
    with Hindsight(site["db"], background=False) as hs:
        unchanged = hs.lesson(doubtful)
        assert unchanged is not None and unchanged.advice.strip()
    card.locator("button[data-action=reject]").click()
    page.wait_for_selector(f"#card-{doubtful}.done")
    assert "rejected" in page.locator(f"#card-{doubtful}").inner_text()
    page.locator("button.keep[data-keep=les_keep]").click()
    page.wait_for_selector("#card-les_keep.done")
    with Hindsight(site["db"], background=False) as hs:
        assert doubtful not in hs.recall(**QUERY).ids
        rejected = hs.lesson(doubtful)
        assert rejected is not None and rejected.status == "rejected"
        assert rejected.history[-1]["by"] == "Ana 安娜"
        kept, dropped = hs.lesson("les_keep"), hs.lesson("les_drop")
        assert kept is not None and kept.status == "active"
        assert dropped is not None and dropped.status == "rejected"
    page.reload()
    assert page.locator(f"#card-{doubtful}").count() == 0
    assert page.locator("#card-les_keep, #card-les_drop").count() == 0
    # A near pair held for review that says one thing: "same advice" merges it into the one kept.
    with Hindsight(site["db"], background=False) as hs:
        near_pair(hs, "探索性的 SELECT 查询一律加上 LIMIT。")
    page.reload()
    page.locator("button.same[data-same=les_one]").first.click()
    page.wait_for_selector(".card.done")
    with Hindsight(site["db"], background=False) as hs:
        one, two = hs.lesson("les_one"), hs.lesson("les_two")
        assert one is not None and one.status == "active" and one.support == 2
        assert two is not None and two.status == "rejected"
        assert two.history[-1]["reason"] == "same as les_one"
    page.goto(f"{base}/trends?lang=en")
    assert page.locator("figure.chart svg").count() == 3
    page.screenshot(path=str(tmp_path / "trends.png"), full_page=True)
