"""Batch review: lessons from the failure patterns that recur across the runs of one task type.

One run shows what went wrong once, with that run's ids, amounts and dates. Many runs show which
failures recur and what made the retry work each time, and only that transfers to the next task.
So ``review_runs`` groups the failed tool calls of many runs by (task type, tool, error template),
describes what the retry that worked changed with each argument value abstracted to its kind (a
``certificate_*`` id, numbers that add up to the figure the error named), keeps only what at least
two runs did (a value of one run never enters advice), contrasts the runs that used the tool
without the error (what did they call first?), and counts its evidence.

The advice is rendered from the structured form (``Structured.prefer`` / ``avoid``) by one
function, so the two always say the same thing. Nothing here knows any domain: tools, arguments
and error texts are whatever the runs recorded, in English or Chinese.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hindsight_loop.models import (
    Chronicle,
    Features,
    LessonDraft,
    Step,
    Structured,
    is_failure,
    is_success,
)
from hindsight_loop.text import STOPWORDS, detect_language, mask_values, tokenize, value_shape

__all__ = ["error_message", "identifying_context", "render_pattern", "review_runs"]

#: A pattern needs this many runs that failed the same way (one run is an anecdote).
MIN_RUNS = 2
#: Keywords kept on a lesson's features.
MAX_KEYWORDS = 12
#: Source task ids kept on a draft (the evidence counts say how many there were).
MAX_SOURCES = 50
#: Context keys that hold free text or identify one run, never the kind of situation a lesson is
#: about: a lesson conditioned on them would never match again.
NON_IDENTIFYING = frozenset(
    {
        "goal",
        "subtask",
        "last_user_input",
        "text",
        "message",
        "prompt",
        "task_id",
        "event_id",
        "request_id",
        "run_id",
        "trace_id",
        "span_id",
        "timestamp",
        "time",
        "date",
        "path",
        "file",
        "file_path",
        "filename",
        "url",
        "uri",
    }
)
_MAX_CONTEXT_VALUE = 64
_LITERAL_MAX = 24
_WORD_RE = re.compile(r"[^\W\d_]+")
_SUMMARY_ERROR_RE = re.compile(r"->\s*(?:failed|failure|error|errored)\s+(.*)$", re.IGNORECASE)


def error_message(step: Step, event: Any = None) -> str:
    """The error a failed step reported: its message, else its output, else its error type.

    ``event`` (the step's event, as an ``Event`` or its wire dict) wins when given: a
    chronicle's step may carry a bounded view only.
    """
    result = _field(event, "result")
    raw = result.get("error_message") if isinstance(result, dict) else None
    if isinstance(raw, str) and raw.strip():
        return raw
    message = getattr(step, "error_message", None)
    if isinstance(message, str) and message.strip():
        return message
    out = step.output
    if isinstance(out, dict):
        out = out.get("error") or out.get("message") or out.get("error_message")
    if isinstance(out, str) and out.strip():
        return out
    if step.error_type:
        return step.error_type
    m = _SUMMARY_ERROR_RE.search(step.summary or "")
    return m.group(1) if m else ""


def _field(event: Any, name: str) -> Any:
    if event is None:
        return None
    return event.get(name) if isinstance(event, dict) else getattr(event, name, None)


def identifying_context(step: Step) -> dict[str, Any]:
    """Short scalar context fields that say which kind of situation this was (``source`` …)."""
    out: dict[str, Any] = {}
    for key in sorted(step.context or {}):
        value = (step.context or {})[key]
        if key.lower() in NON_IDENTIFYING or isinstance(value, dict | list) or value is None:
            continue
        if isinstance(value, str) and (
            len(value) > _MAX_CONTEXT_VALUE or "/" in value or "\\" in value or "\n" in value
        ):
            continue
        out[key] = value
    return out


def _args(step: Step, event: Any = None) -> dict[str, Any]:
    raw = _field(event, "input")
    data = raw if isinstance(raw, dict) else (step.input or {})
    args = data.get("args")
    if isinstance(args, dict):
        return args
    return {k: v for k, v in data.items() if k != "tool"}


def _flat(
    value: Any, path: str = "", out: dict[str, list[Any]] | None = None
) -> dict[str, list[Any]]:
    """Leaves of nested arguments by path: ``payment_methods[].amount -> [299, 75]``."""
    out = {} if out is None else out
    if isinstance(value, dict):
        for key, item in value.items():
            _flat(item, f"{path}.{key}" if path else str(key), out)
    elif isinstance(value, list | tuple):
        for item in value:
            _flat(item, f"{path}[]", out)
    else:
        out.setdefault(path, []).append(value)
    return out


def _leaf(path: str) -> str:
    return path.rsplit(".", 1)[-1].removesuffix("[]") or path


def _parent(path: str) -> str:
    head = path.rsplit(".", 1)[0] if "." in path else path
    return head.removesuffix("[]")


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    return None


def _slot_labels(template: str) -> list[str]:
    """For each ``<kind>`` placeholder, the words just before it (``total price is <num>`` ->
    ``total price``): what the masked value was."""
    labels: list[str] = []
    for m in re.finditer(r"<[a-z]+>", template):
        before = re.split(r"[,;:.!?，；：。！？()（）>]", template[: m.start()])[-1]
        if detect_language(before) == "zh":
            han = "".join(c for c in before if not c.isspace())[-4:]
            labels.append(han)
            continue
        words = [w for w in _WORD_RE.findall(before) if w.lower() not in STOPWORDS]
        labels.append(" ".join(words[-2:]))
    return labels


# -- what a recovery changed ----------------------------------------------------------------------


def _changes(failed: dict[str, Any], ok: dict[str, Any], message: str) -> list[tuple[Any, ...]]:
    """What the call that worked did differently, each value abstracted to its kind.

    Facts are tuples (compared across runs): ``("sum", path, label)``, ``("equals", path,
    label)``, ``("drop_named", parent)``, ``("switch", path, old_kind, new_kind)``, ``("another",
    path, kind)``, ``("use", path, literal)``.
    """
    template, found = mask_values(message)
    labels = _slot_labels(template)
    numbers: dict[float, str] = {}
    for (kind, raw), label in zip(found, labels, strict=False):
        if kind == "num" and label:
            with contextlib.suppress(ValueError):
                numbers.setdefault(float(raw.replace(",", "").rstrip("%")), label)
    named = {raw.strip("'\"`") for _, raw in found}
    fa, fb = _flat(failed), _flat(ok)
    facts: list[tuple[Any, ...]] = []
    dropped_parents: set[str] = set()
    for path in sorted(set(fa) | set(fb)):
        before, after = fa.get(path, []), fb.get(path, [])
        if before == after:
            continue
        nums = [_number(v) for v in after]
        if after and all(n is not None for n in nums):
            total = sum(n for n in nums if n is not None)
            if total in numbers:
                # One value that is the figure is "equal to" it; several add up to it.
                facts.append(("sum" if len(after) > 1 else "equals", path, numbers[total]))
                continue
            hit = next((numbers[n] for n in nums if n in numbers), None)
            if hit:
                facts.append(("equals", path, hit))
                continue
        removed = [v for v in before if v not in after]
        added = [v for v in after if v not in before]
        if any(str(v) in named for v in removed) and "[]" in path:
            parent = _parent(path)
            if parent not in dropped_parents:
                dropped_parents.add(parent)
                facts.append(("drop_named", parent))
            continue
        if not added:
            continue
        old_kinds = {_kind(v) for v in removed}
        for value in added[:1]:
            new = _kind(value)
            if new is None:
                facts.append(("use", path, value))
            elif new.startswith("<"):
                continue  # "another number / id": says nothing the agent can act on
            elif old_kinds and new not in old_kinds:
                old = sorted(k for k in old_kinds if k)
                facts.append(("switch", path, old[0] if old else None, new))
            else:
                facts.append(("another", path, new))
    return facts


def _kind(value: Any) -> str | None:
    """``None`` for a literal option worth quoting (short word, bool, small literal), else
    the value's shape."""
    if isinstance(value, str) and len(value) > _LITERAL_MAX:
        return "<text>"
    return value_shape(value)


# -- reading the runs -----------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class _Run:
    task_id: str
    task_key: str
    task_type: str
    scope: str
    lang: str
    first_words: set[str]
    tools_before: dict[str, set[str]]
    """For each tool, the tools this run called before its first call of it."""
    clean_tools: set[str]
    """Tools this run called that never failed in it (empty when the run itself failed)."""


@dataclass(kw_only=True, slots=True)
class _Group:
    task_type: str
    tool: str
    template: str
    context: dict[str, Any] = field(default_factory=dict)
    """The situation the runs shared (short scalar context fields such as a source)."""
    runs: dict[int, list[Step]] = field(default_factory=dict)
    """Run number -> the failed calls of this kind in that run, oldest first."""
    recoveries: dict[int, list[tuple[Any, ...]]] = field(default_factory=dict)
    """Run number -> the facts of the call that worked after the first failure."""
    error_types: Counter[str] = field(default_factory=Counter)
    steps: Counter[str] = field(default_factory=Counter)


def _first_user_text(chronicle: Chronicle) -> str:
    for step in chronicle.steps:
        if step.type == "user_input":
            text = (step.input or {}).get("text") or step.summary.removeprefix("user: ")
            return str(text)
    return chronicle.task.goal or ""


def _default_task_key(chronicle: Chronicle) -> str:
    task = chronicle.task
    return " ".join((task.goal or task.task_id).split()).casefold()


def _read(
    chronicles: Sequence[Chronicle],
    events: Mapping[str, Any],
    task_key: Callable[[Chronicle], str] = _default_task_key,
) -> tuple[list[_Run], dict[tuple[str, str, str, str], _Group]]:
    runs: list[_Run] = []
    groups: dict[tuple[str, str, str, str], _Group] = {}
    for number, chronicle in enumerate(chronicles):
        task = chronicle.task
        first = _first_user_text(chronicle)
        texts = [task.goal or "", first]
        actions = [
            s
            for s in chronicle.steps
            if s.type == "action_executed"
            and s.action
            and (is_failure(s.status) or is_success(s.status))
        ]
        before: dict[str, set[str]] = {}
        seen: set[str] = set()
        failed_tools: set[str] = set()
        for i, step in enumerate(actions):
            tool = step.action or ""
            before.setdefault(tool, set(seen))
            seen.add(tool)
            if not is_failure(step.status):
                continue
            failed_tools.add(tool)
            message = error_message(step, events.get(step.event_id))
            template = mask_values(message)[0][:160]
            # The situation is part of the pattern: the same error from two kinds of input may
            # need two different fixes (reflect.identifying_context says what a situation is).
            ctx = identifying_context(step)
            key = (task.task_type, tool, template, repr(sorted(ctx.items())))
            group = groups.setdefault(
                key, _Group(task_type=task.task_type, tool=tool, template=template, context=ctx)
            )
            if number in group.runs:
                group.runs[number].append(step)
                continue
            group.runs[number] = [step]
            if step.error_type:
                group.error_types[step.error_type] += 1
            if step.step:
                group.steps[step.step] += 1
            ok = next(
                (s for s in actions[i + 1 :] if s.action == tool and is_success(s.status)), None
            )
            if ok is not None:
                group.recoveries[number] = _changes(
                    _args(step, events.get(step.event_id)),
                    _args(ok, events.get(ok.event_id)),
                    message,
                )
        runs.append(
            _Run(
                task_id=task.task_id,
                task_key=task_key(chronicle),
                task_type=task.task_type,
                scope=task.scope,
                lang=detect_language(" ".join(texts)),
                first_words=set(tokenize(first)),
                tools_before=before,
                clean_tools=seen - failed_tools if is_success(task.status) else set(),
            )
        )
    return runs, groups


# -- wording ---------------------------------------------------------------------------------------


def _quote(value: Any) -> str:
    text = str(value)
    return repr(text[:_LITERAL_MAX]) if isinstance(value, str) else text


def _fact_text(fact: dict[str, Any], lang: str) -> str:
    rule, arg = fact["rule"], fact.get("arg", "")
    leaf = _leaf(arg)
    if lang == "zh":
        return {
            "sum": lambda: f"让各个 {leaf} 之和等于{fact['label']}",
            "equals": lambda: f"让 {leaf} 等于{fact['label']}",
            "drop_named": lambda: f"不带报错指出的那一项 {arg}",
            "switch": lambda: (
                f"用 {fact['kind']} 形式的 {leaf}"
                + (f"，不用 {fact['instead']} 形式的" if fact.get("instead") else "")
            ),
            "another": lambda: f"换一个 {fact['kind']} 形式的 {leaf}",
            "use": lambda: f"{leaf}={_quote(fact['value'])}",
        }[rule]()
    return {
        "sum": lambda: f"{leaf} values that add up to the {fact['label']}",
        "equals": lambda: f"{leaf} equal to the {fact['label']}",
        "drop_named": lambda: f"no {arg} item that the error named",
        "switch": lambda: (
            f"a {fact['kind']} {leaf}"
            + (f" rather than a {fact['instead']} one" if fact.get("instead") else "")
        ),
        "another": lambda: f"another {fact['kind']} {leaf}",
        "use": lambda: f"{leaf}={_quote(fact['value'])}",
    }[rule]()


def _join(items: list[str], lang: str) -> str:
    if lang == "zh":
        return "，".join(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def render_pattern(structured: Structured, lang: str = "en") -> str:
    """What to do, in the run's language, from a pattern lesson's structured form alone.

    The advice of every pattern lesson contains this sentence, so the structured form and the
    text cannot drift apart.
    """
    tool = structured.when.get("tool", "")
    template = structured.when.get("error_template", "")
    prefer = structured.prefer or {}
    facts = [_fact_text(f, lang) for f in prefer.get("changes", [])]
    first = prefer.get("call_first")
    if lang == "zh":
        parts = [f"先调用 {first}"] if first else []
        if facts:
            parts.append(f"调用 {tool} 时一开始就{_join(facts, 'zh')}")
        if not parts:
            return f"不要用同样的参数重试 {tool}：先弄清“{template}”指出的问题，改掉它再调用。"
        return "；".join(parts) + "。"
    parts = [f"call {first} first"] if first else []
    if facts:
        parts.append(f"call {tool} with {_join(facts, 'en')} from the start")
    if not parts:
        return (
            f'Do not retry {tool} with the same arguments: fix what "{template}" points at '
            "before calling it again."
        )
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "."


def _evidence(n_runs: int, n_tasks: int, n_recovered: int, how: str, lang: str) -> str:
    if lang == "zh":
        rec = f"其中 {n_recovered} 次重试后成功" + (
            f"（重试时{how}）" if how and n_recovered else ""
        )
        return f"在 {n_tasks} 个任务的 {n_runs} 次运行中以这种方式失败；{rec}"
    runs = "run" if n_runs == 1 else "runs"
    tasks = "task" if n_tasks == 1 else "tasks"
    rec = f"recovered in {n_recovered}" + (f" with {how}" if how and n_recovered else "")
    return f"failed this way in {n_runs} {runs} of {n_tasks} {tasks}; {rec}"


# -- the review ------------------------------------------------------------------------------------


def _distinct(group_runs: Iterable[int], runs: Sequence[_Run]) -> int:
    return len({runs[n].task_key for n in group_runs})


def _practice(group: _Group, runs: Sequence[_Run]) -> tuple[str | None, int, int]:
    """A tool that runs using ``group.tool`` without failing called first, unlike failing runs:
    ``(tool, clean runs that did, clean runs)``."""
    clean = [
        r
        for n, r in enumerate(runs)
        if n not in group.runs and r.task_type == group.task_type and group.tool in r.clean_tools
    ]
    if len(clean) < MIN_RUNS:
        return None, 0, len(clean)
    failing = [runs[n] for n in group.runs]
    counts = Counter(t for r in clean for t in r.tools_before.get(group.tool, set()))
    best: tuple[float, str, int] | None = None
    for tool, count in counts.items():
        if tool == group.tool or _distinct_tasks(clean, group.tool, tool) < MIN_RUNS:
            continue
        share = count / len(clean)
        fail_share = sum(tool in r.tools_before.get(group.tool, set()) for r in failing) / len(
            failing
        )
        lift = share - fail_share
        if share >= 0.5 and lift >= 0.3 and (best is None or lift > best[0]):
            best = (lift, tool, count)
    return (best[1], best[2], len(clean)) if best else (None, 0, len(clean))


def _distinct_tasks(clean: Sequence[_Run], tool: str, first: str) -> int:
    return len({r.task_key for r in clean if first in r.tools_before.get(tool, set())})


def _chosen_facts(group: _Group, runs: Sequence[_Run]) -> tuple[list[dict[str, Any]], int]:
    """Facts seen in at least two recovered runs (literals: in two tasks), most common first,
    one per argument; and how many recovered runs showed all of them."""
    fact_runs: dict[tuple[Any, ...], set[int]] = {}
    for number, facts in group.recoveries.items():
        for fact in set(map(_hashable, facts)):
            fact_runs.setdefault(fact, set()).add(number)
    chosen: list[tuple[Any, ...]] = []
    used_args: set[str] = set()
    for fact, numbers in sorted(fact_runs.items(), key=lambda kv: (-len(kv[1]), str(kv[0]))):
        if len(numbers) < MIN_RUNS or _distinct(numbers, runs) < (
            MIN_RUNS if fact[0] in ("use", "switch", "another") else 1
        ):
            continue
        if len(numbers) * 3 < len(group.recoveries):
            continue  # what a few of many recoveries did is not what worked
        if fact[1] in used_args:
            continue
        if fact[0] in ("switch", "another") and not _shape_recurs(fact, runs, numbers):
            continue
        used_args.add(fact[1])
        chosen.append(fact)
    support = sum(
        all(c in set(map(_hashable, facts)) for c in chosen) for facts in group.recoveries.values()
    )
    return [_fact_dict(f) for f in chosen[:3]], support if chosen else 0


def _shape_recurs(fact: tuple[Any, ...], runs: Sequence[_Run], numbers: set[int]) -> bool:
    # A shape like ``mia_li_*`` is one person's id: shapes must come from two tasks.
    return _distinct(numbers, runs) >= MIN_RUNS


def _hashable(fact: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(
        v if isinstance(v, str | int | float | bool | type(None)) else repr(v) for v in fact
    )


def _fact_dict(fact: tuple[Any, ...]) -> dict[str, Any]:
    rule = fact[0]
    if rule in ("sum", "equals"):
        return {"rule": rule, "arg": fact[1], "label": fact[2]}
    if rule == "drop_named":
        return {"rule": rule, "arg": fact[1]}
    if rule == "switch":
        return {"rule": rule, "arg": fact[1], "kind": fact[3], "instead": fact[2]}
    if rule == "another":
        return {"rule": rule, "arg": fact[1], "kind": fact[2]}
    return {"rule": "use", "arg": fact[1], "value": fact[2]}


def _keywords(group: _Group, facts: list[dict[str, Any]], runs: Sequence[_Run]) -> list[str]:
    """Terms of the error template, the arguments involved, and words of the users' first
    requests that are typical of the runs that failed this way (in at least two tasks)."""
    words: list[str] = [group.tool, *(str(v) for v in group.context.values())]
    words += [t for t in tokenize(re.sub(r"<[a-z]+>", " ", group.template)) if len(t) > 1]
    words += [_leaf(f["arg"]) for f in facts]
    same_type = [r for r in runs if r.task_type == group.task_type]
    failing = [runs[n] for n in group.runs]
    df_all = Counter(w for r in same_type for w in r.first_words)
    df_fail = Counter(w for r in failing for w in r.first_words)
    typical = []
    for word, count in df_fail.items():
        tasks = len({r.task_key for r in failing if word in r.first_words})
        if tasks < MIN_RUNS or len(word) < 2 or any(c.isdigit() for c in word):
            continue
        lift = (count / len(failing)) / (df_all[word] / len(same_type))
        if count / len(failing) >= 0.3 and lift >= 1.5:
            typical.append((-lift, -count, word))
    words += [w for _, _, w in sorted(typical)[:4]]
    return list(dict.fromkeys(w for w in words if w))[:MAX_KEYWORDS]


def review_runs(
    chronicles: Sequence[Chronicle],
    *,
    language: str | None = None,
    min_runs: int = MIN_RUNS,
    events: Mapping[str, Any] | None = None,
    task_key: Callable[[Chronicle], str] | None = None,
) -> list[LessonDraft]:
    """Review many runs together into lessons about the failures that recur among them.

    Failed tool calls are grouped by (task type, tool, error template); a group of at least
    ``min_runs`` runs becomes one lesson that names the tool, quotes the template, says what the
    retries that worked did (values abstracted to their kind; what fewer than two runs did is
    left out), what runs that used the tool without this error called first, and counts its
    evidence. A pure function: the same runs always give the same drafts.

    Args:
        chronicles: Replayed runs, usually of one task type (several types are kept apart).
        language: ``en`` or ``zh`` for every lesson; by default each lesson takes the language
            most of its runs were in.
        min_runs: A failure must recur in this many runs to become a lesson.
        events: The runs' events by ``event_id`` (``Event`` values or wire dicts), optional: a
            chronicle bounds long or deeply nested arguments and error messages for prompts,
            and when an action's event is given its full arguments and error message are read.
        task_key: Which task a run was an attempt at (runs of one task share ids and values);
            default: its goal. Evidence counts tasks by it, and a value must come from two
            tasks to be quoted.

    Returns:
        Drafts, the most widespread failure first; each has ``structured.when =
        {"tool", "error_template"[, "error_type"]}``.
    """
    runs, groups = _read(chronicles, events or {}, task_key or _default_task_key)
    drafts: list[tuple[int, str, LessonDraft]] = []
    for group in groups.values():
        n_runs = len(group.runs)
        if n_runs < max(min_runs, 1):
            continue
        failing = [runs[n] for n in group.runs]
        n_tasks = _distinct(group.runs, runs)
        langs = Counter(r.lang for r in failing)
        lang = language or ("zh" if langs["zh"] > langs["en"] else "en")
        facts, support = _chosen_facts(group, runs)
        first, first_count, clean_count = _practice(group, runs)
        if not facts and not first and not group.recoveries:
            # Never recovered and nothing to contrast: all a lesson could say is "do not retry",
            # which the per-run review already says with the attempts that failed.
            continue
        when: dict[str, Any] = {"tool": group.tool, "error_template": group.template}
        if group.context:
            when["context"] = group.context
        error_type = _only(group.error_types, n_runs)
        if error_type:
            when["error_type"] = error_type
        prefer: dict[str, Any] | None = None
        if facts or first:
            prefer = {"tool": group.tool, "changes": facts}
            if first:
                prefer["call_first"] = first
        avoid: dict[str, Any] | None = {"tool": group.tool}
        switches = {
            f["arg"]: f["instead"] for f in facts if f["rule"] == "switch" and f.get("instead")
        }
        if switches:
            avoid = {"tool": group.tool, "args": switches}
        elif prefer is None:
            avoid = {"tool": group.tool, "repeat": "same arguments"}
        else:
            avoid = None
        structured = Structured(when=when, prefer=prefer, avoid=avoid)
        do = render_pattern(structured, lang)
        how = _join([_fact_text(f, lang) for f in facts], lang) if facts and support else ""
        evidence = _evidence(n_runs, n_tasks, len(group.recoveries), how, lang)
        practice = ""
        if first:
            practice = (
                f"使用 {group.tool} 而没有出错的 {clean_count} 次运行中有 {first_count} 次先调用了 {first}。"
                if lang == "zh"
                else f"{first_count} of {clean_count} runs that used {group.tool} without this "
                f"error called {first} first."
            )
        where = ", ".join(f"{k} {_quote(v)}" for k, v in group.context.items())
        if lang == "zh":
            at = f"在 {where} 的情况下，" if where else ""
            advice = f"{at}{group.tool} 报错“{group.template}”：{evidence}。{do}"
            rule = "调用曾以同样方式失败的工具之前，先照着让重试成功的做法准备参数。"
            suggestions = [do, "如果仍然报同样的错，改掉报错指出的那一项，不要原样重试。"]
        else:
            at = f" for {where}" if where else ""
            advice = f'{group.tool} can fail with "{group.template}"{at}: it {evidence}. {do}'
            rule = (
                "Before calling a tool that failed the same way in earlier runs, prepare its "
                "arguments the way the retries that worked did."
            )
            suggestions = [
                do,
                "If it still fails this way, change what the error names instead of retrying "
                "the same call.",
            ]
        if practice:
            suggestions.append(practice)
        scopes = {r.scope for r in failing}
        steps = _only(group.steps, n_runs)
        drafts.append(
            (
                n_runs,
                group.tool + group.template,
                LessonDraft(
                    task_type=group.task_type,
                    advice=advice,
                    features=Features(
                        tools=[group.tool],
                        step=steps,
                        error_type=error_type,
                        keywords=_keywords(group, facts, runs),
                    ),
                    root_cause=f"{group.tool}: {evidence}."
                    if lang == "en"
                    else f"{group.tool}：{evidence}。",
                    suggestions=suggestions,
                    general_rule=rule,
                    structured=structured,
                    kind="full_review",
                    scope=scopes.pop() if len(scopes) == 1 else "global",
                    source_task_ids=[r.task_id for r in failing][:MAX_SOURCES],
                    language=lang,
                ),
            )
        )
    drafts.sort(key=lambda d: (-d[0], d[1]))
    return [d for _, _, d in drafts]


def _only(counter: Counter[str], total: int) -> str | None:
    """The one value every run agreed on, else None."""
    if len(counter) == 1:
        value, count = next(iter(counter.items()))
        return value if count == total else None
    return None
