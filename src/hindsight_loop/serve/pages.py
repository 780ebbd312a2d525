"""The web page for people: runs with their key nodes, the lesson book, the review queue, trends.

Server-rendered with Jinja2 (autoescape on for every template, undefined names are errors);
htmx, vendored in ``static/``, swaps a review card in place after an action. Recorded text
(goals, arguments, errors, advice) is only ever inserted as escaped text: no template marks it
safe. The only markup built in Python is the SVG of ``charts``, which escapes its labels.

Every label is in English and Chinese (``?lang=zh`` / ``?lang=en``, kept in a cookie; the
browser's Accept-Language decides the first time).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlencode

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from hindsight_loop import lessons as book_ops
from hindsight_loop.replay import step_detail
from hindsight_loop.serve import book, charts
from hindsight_loop.serve.access import CSRF_FIELD, SESSION_COOKIE, Access
from hindsight_loop.serve.book import BadInput, NotFound

if TYPE_CHECKING:
    from hindsight_loop.hindsight import Hindsight

HERE = Path(__file__).parent
LANG_COOKIE = "hindsight_lang"
USER_COOKIE = "hindsight_user"

# One table of labels per language; a missing key is an error in the tests, never a blank.
TEXT: dict[str, dict[str, str]] = {
    "en": {
        "title": "Hindsight",
        "runs": "Runs",
        "lessons": "Lesson book",
        "review": "Review queue",
        "trends": "Trends",
        "login": "Log in",
        "logout": "Log out",
        "logged_in_as": "Reviewing as",
        "read_only": "Read-only: log in with the server's token to review lessons.",
        "token": "Token (printed by 'hindsight serve')",
        "your_name": "Your name (kept in each lesson's history)",
        "task_type": "Task type",
        "status": "Status",
        "since": "From",
        "until": "To",
        "filter": "Filter",
        "any": "any",
        "task": "Task",
        "goal": "Goal",
        "events": "Events",
        "started": "Started",
        "prev": "← Newer",
        "next": "Older →",
        "prev_page": "← Previous",
        "next_page": "Next →",
        "page": "Page",
        "no_runs": "No runs match.",
        "key_nodes": "Key nodes",
        "no_key_nodes": "No key nodes: nothing in this run stood out.",
        "repeats": "(+{n} more like it later in the run)",
        "timeline": "Timeline",
        "injected": "Lessons injected into this run",
        "none_injected": "No lessons were injected into this run.",
        "reflections": "Reviews",
        "compressed": "Long run: steps without a key node were left out.",
        "search": "Search",
        "advice": "Advice",
        "support": "Support",
        "helpful": "Helpful",
        "harmful": "Harmful",
        "value": "Value",
        "sources": "Source runs",
        "history": "History",
        "scope": "Scope",
        "tools": "Tools",
        "root_cause": "Root cause",
        "general_rule": "General rule",
        "suggestions": "Suggestions",
        "valid_until": "Valid until",
        "pinned": "pinned",
        "no_lessons": "No lessons match.",
        "nothing_to_review": "Nothing needs review.",
        "confirm": "Confirm",
        "reject": "Reject",
        "pin": "Pin",
        "unpin": "Unpin",
        "edit": "Edit",
        "save": "Save",
        "conflict": "Conflict: which one is right?",
        "keep_this": "Keep this one",
        "same_keep_this": "Same advice: merge into this one",
        "merged_by_model": "Merged on the model's word",
        "split": "Not the same: split out",
        "done_split": "split: what the model merged waits for review on its own",
        "done_confirm": "confirmed",
        "done_reject": "rejected",
        "done_pin": "pinned",
        "done_unpin": "unpinned",
        "done_edit": "edited",
        "done_resolve": "conflict settled: kept",
        "success_rate": "Success rate per task type",
        "lesson_flow": "Lessons created, confirmed and rejected per day",
        "outcomes": "Helpful vs harmful outcomes per task type",
        "created": "created",
        "confirmed": "confirmed",
        "rejected": "rejected",
        "no_data": "Not enough data yet.",
        "error": "Error",
        "wrong_token": "That is not this server's token: copy it from what 'hindsight serve' printed.",
        "total": "matching",
        "kind_first_failure": "first failure",
        "kind_hesitation": "hesitation",
        "kind_anomaly": "anomaly",
        "kind_loop": "loop",
        "kind_consecutive_failures": "failures in a row",
        "kind_dissatisfaction": "dissatisfaction",
        "kind_recovery": "recovery",
        "status_running": "running",
        "status_succeeded": "succeeded",
        "status_failed": "failed",
        "status_active": "active",
        "status_needs_review": "needs review",
        "status_rejected": "rejected",
        "status_expired": "expired",
    },
    "zh": {
        "title": "Hindsight 经验记忆",
        "runs": "运行记录",
        "lessons": "经验库",
        "review": "审核队列",
        "trends": "趋势",
        "login": "登录",
        "logout": "退出",
        "logged_in_as": "审核人",
        "read_only": "只读：使用服务器令牌登录后才能审核经验。",
        "token": "令牌（由 'hindsight serve' 打印）",
        "your_name": "你的名字（记入每条经验的历史）",
        "task_type": "任务类型",
        "status": "状态",
        "since": "起始日期",
        "until": "截止日期",
        "filter": "筛选",
        "any": "全部",
        "task": "任务",
        "goal": "目标",
        "events": "事件数",
        "started": "开始时间",
        "prev": "← 较新",
        "next": "较早 →",
        "prev_page": "← 上一页",
        "next_page": "下一页 →",
        "page": "第几页",
        "no_runs": "没有符合条件的运行。",
        "key_nodes": "关键节点",
        "no_key_nodes": "没有关键节点：这次运行没有值得注意的地方。",
        "repeats": "（之后还有 {n} 个同类节点未列出）",
        "timeline": "时间线",
        "injected": "注入本次运行的经验",
        "none_injected": "本次运行没有注入经验。",
        "reflections": "复盘",
        "compressed": "运行较长：省略了没有关键节点的步骤。",
        "search": "搜索",
        "advice": "建议",
        "support": "支持次数",
        "helpful": "有帮助",
        "harmful": "有害",
        "value": "价值分",
        "sources": "来源运行",
        "history": "历史",
        "scope": "范围",
        "tools": "工具",
        "root_cause": "根本原因",
        "general_rule": "通用规则",
        "suggestions": "改进建议",
        "valid_until": "有效期至",
        "pinned": "已置顶",
        "no_lessons": "没有符合条件的经验。",
        "nothing_to_review": "没有需要审核的内容。",
        "confirm": "确认",
        "reject": "拒绝",
        "pin": "置顶",
        "unpin": "取消置顶",
        "edit": "编辑",
        "save": "保存",
        "conflict": "冲突：哪一条是对的？",
        "keep_this": "保留这一条",
        "same_keep_this": "说的是一回事：合并到这一条",
        "merged_by_model": "按模型判断合并进来的说法",
        "split": "说的不是一回事：拆分出来",
        "done_split": "已拆分：模型合并进来的说法单独等待审核",
        "done_confirm": "已确认",
        "done_reject": "已拒绝",
        "done_pin": "已置顶",
        "done_unpin": "已取消置顶",
        "done_edit": "已编辑",
        "done_resolve": "冲突已解决：保留",
        "success_rate": "各任务类型的成功率",
        "lesson_flow": "每天新建、确认和拒绝的经验",
        "outcomes": "各任务类型的有益与有害结果",
        "created": "新建",
        "confirmed": "确认",
        "rejected": "拒绝",
        "no_data": "数据还不够。",
        "error": "错误",
        "wrong_token": "令牌不对：请从 'hindsight serve' 打印的内容中复制。",
        "total": "条符合",
        "kind_first_failure": "首次失败",
        "kind_hesitation": "犹豫",
        "kind_anomaly": "异常",
        "kind_loop": "循环",
        "kind_consecutive_failures": "连续失败",
        "kind_dissatisfaction": "用户不满",
        "kind_recovery": "恢复",
        "status_running": "运行中",
        "status_succeeded": "成功",
        "status_failed": "失败",
        "status_active": "生效",
        "status_needs_review": "待审核",
        "status_rejected": "已拒绝",
        "status_expired": "已过期",
    },
}


def language(request: Request) -> str:
    asked = request.query_params.get("lang") or request.cookies.get(LANG_COOKIE)
    if asked in TEXT:
        return asked
    accept = request.headers.get("accept-language", "").lower()
    return "zh" if accept.startswith("zh") else "en"


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every template, whatever its name
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals["step_detail"] = step_detail
    return env


class Pages:
    """The page routes over one facade."""

    def __init__(self, hs: Hindsight, cache: book.BookCache, access: Access) -> None:
        self.hs = hs
        self.cache = cache
        self.access = access
        self.env = environment()

    # -- rendering ---------------------------------------------------------------------------
    def render(self, request: Request, name: str, status: int = 200, **context: Any) -> Response:
        lang = language(request)
        text = TEXT[lang]

        def t(key: str) -> str:
            return text[key]

        def url(**changes: Any) -> str:
            """This page's URL with some query parameters changed (None drops one)."""
            params = dict(request.query_params)
            params.pop("lang", None)
            params.update({k: v for k, v in changes.items() if v is not None})
            for k, v in changes.items():
                if v is None:
                    params.pop(k, None)
            return request.url.path + ("?" + urlencode(params) if params else "")

        logged_in = request.scope.get("state", {}).get("auth") is not None
        html = self.env.get_template(name).render(
            t=t,
            lang=lang,
            url=url,
            path=request.url.path,
            logged_in=logged_in,
            csrf=self.access.csrf if logged_in else "",
            csrf_field=CSRF_FIELD,
            user=self._who(request),
            **context,
        )
        response = HTMLResponse(html, status_code=status)
        if request.query_params.get("lang") in TEXT:
            response.set_cookie(LANG_COOKIE, lang, samesite="strict", max_age=31_536_000)
        return response

    def _who(self, request: Request) -> str:
        return unquote(request.cookies.get(USER_COOKIE) or "").strip()[:80] or "web"

    def problem(self, request: Request, status: int, message: str) -> Response:
        return self.render(request, "error.html", status=status, message=message)

    # -- runs --------------------------------------------------------------------------------
    def runs(self, request: Request) -> Response:
        q = request.query_params
        page = book.runs_page(
            self.hs,
            page=book.page_number(q.get("page")),
            task_type=q.get("task_type") or None,
            status=q.get("status") or None,
            since=book.day_bound(q.get("since"), "from"),
            until=book.day_bound(_end_of_day(q.get("until")), "to"),
        )
        types = sorted(
            {x.task_type for x in self.cache.get(self.hs)} | {t.task_type for t in page.items}
        )
        return self.render(
            request,
            "runs.html",
            page=page,
            types=types,
            statuses=book.TASK_STATUSES,
            filters={k: q.get(k, "") for k in ("task_type", "status", "since", "until")},
        )

    def run(self, request: Request) -> Response:
        view = book.run_view(self.hs, request.path_params["task_id"])
        return self.render(request, "run.html", **view)

    # -- lessons -----------------------------------------------------------------------------
    def lessons(self, request: Request) -> Response:
        q = request.query_params
        every = self.cache.get(self.hs)
        page = book.lessons_page(
            every,
            page=book.page_number(q.get("page")),
            q=q.get("q") or "",
            status=q.get("status") or None,
            task_type=q.get("task_type") or None,
            scope=q.get("scope") or None,
        )
        return self.render(
            request,
            "lessons.html",
            page=page,
            types=sorted({x.task_type for x in every}),
            statuses=book_ops.STATUSES,
            filters={k: q.get(k, "") for k in ("q", "status", "task_type", "scope")},
        )

    def lesson(self, request: Request) -> Response:
        lesson_id = request.path_params["lesson_id"]
        lesson = self.hs.lesson(lesson_id)
        if lesson is None:
            raise NotFound(f"no lesson {lesson_id!r}; see the lesson book at /lessons")
        return self.render(request, "lesson.html", lesson=lesson)

    # -- review ------------------------------------------------------------------------------
    def review(self, request: Request) -> Response:
        queue = book.review_queue(self.cache.get(self.hs))
        return self.render(request, "review.html", queue=queue)

    async def act(self, request: Request) -> Response:
        form = await request.form()
        lesson_id = request.path_params["lesson_id"]
        action = request.path_params["action"]
        changes = None
        if action == "edit":
            advice = str(form.get("advice") or "")
            changes = {"advice": advice}
        by = self._who(request)
        reason = str(form.get("reason") or "")
        from starlette.concurrency import run_in_threadpool

        lesson = await run_in_threadpool(
            lambda: book.act(
                self.hs, lesson_id, action, by=by, reason=reason, changes=changes, cache=self.cache
            )
        )
        if request.headers.get("hx-request") != "true":
            return RedirectResponse("/review", status_code=303)
        return self.render(request, "_done.html", lesson=lesson, action=action)

    async def resolve(self, request: Request) -> Response:
        form = await request.form()
        keep, drop = str(form.get("keep") or ""), str(form.get("reject") or "")
        same = form.get("same") == "1"
        by = self._who(request)
        from starlette.concurrency import run_in_threadpool

        kept, _ = await run_in_threadpool(
            lambda: book.resolve_conflict(self.hs, keep, drop, by=by, cache=self.cache, same=same)
        )
        if request.headers.get("hx-request") != "true":
            return RedirectResponse("/review", status_code=303)
        return self.render(request, "_done.html", lesson=kept, action="resolve")

    # -- trends ------------------------------------------------------------------------------
    def trends(self, request: Request) -> Response:
        text = TEXT[language(request)]
        data = book.trends(self.hs, self.cache.get(self.hs))
        success = {
            tt: [(day, rate) for day, rate, _ in points] for tt, points in data["success"].items()
        }
        flow = data["lessons"]
        outcomes = data["outcomes"]
        figures = []
        if success:
            figures.append(charts.line_chart(text["success_rate"], success))
        if flow:
            figures.append(
                charts.bar_chart(
                    text["lesson_flow"],
                    [d for d, *_ in flow],
                    {
                        text["created"]: [c for _, c, _, _ in flow],
                        text["confirmed"]: [c for _, _, c, _ in flow],
                        text["rejected"]: [c for _, _, _, c in flow],
                    },
                )
            )
        if outcomes:
            figures.append(
                charts.bar_chart(
                    text["outcomes"],
                    [tt for tt, _, _ in outcomes],
                    {
                        text["helpful"]: [h for _, h, _ in outcomes],
                        text["harmful"]: [h for _, _, h in outcomes],
                    },
                )
            )
        return self.render(request, "trends.html", figures=figures, data=data)

    # -- login -------------------------------------------------------------------------------
    async def login(self, request: Request) -> Response:
        if request.method == "GET" and "token" not in request.query_params:
            return self.render(request, "login.html", failed=False)
        if request.method == "GET":
            given, name = (
                request.query_params.get("token", ""),
                request.query_params.get("name", ""),
            )
        else:
            form = await request.form()
            given, name = str(form.get("token") or ""), str(form.get("name") or "")
        if not self.access.token_ok(given):
            return self.render(request, "login.html", status=401, failed=True)
        response = RedirectResponse("/review", status_code=303)
        # HttpOnly: no script reads it; Strict: no other site's page can make the browser send it.
        response.set_cookie(SESSION_COOKIE, self.access.session, httponly=True, samesite="strict")
        if name.strip():
            # Percent-encoded: a cookie is Latin-1 on the wire, a name may be Chinese.
            response.set_cookie(USER_COOKIE, quote(name.strip()[:80]), samesite="strict")
        return response

    def logout(self, request: Request) -> Response:
        response = RedirectResponse("/runs", status_code=303)
        response.delete_cookie(SESSION_COOKIE)
        return response

    def routes(self) -> list[Route]:
        return [
            Route("/", lambda r: RedirectResponse("/runs", status_code=307)),
            Route("/runs", self.runs),
            Route("/runs/{task_id}", self.run),
            Route("/lessons", self.lessons),
            Route("/lessons/{lesson_id}", self.lesson),
            Route("/review", self.review),
            Route("/review/resolve", self.resolve, methods=["POST"]),
            Route("/review/{lesson_id}/{action}", self.act, methods=["POST"]),
            Route("/trends", self.trends),
            Route("/login", self.login, methods=["GET", "POST"]),
            Route("/logout", self.logout, methods=["POST"]),
        ]


def _end_of_day(raw: str | None) -> str | None:
    """A bare date as an upper bound means the whole of that day."""
    if raw and len(raw.strip()) == 10:
        return raw.strip() + "T23:59:59.999Z"
    return raw


__all__ = ["TEXT", "BadInput", "Pages"]
