"""Replay: turn one task's raw events into a chronicle a reflector can read.

A reflector (an LLM or the offline rules) must never be handed raw logs. It gets the run as
ordered, bounded steps plus the few key nodes worth thinking about (the first failure, a loop,
a recovery, the user getting annoyed …), each summarised in at most 50 characters, so even a long
run makes a small prompt. ``AnomalyWatch`` runs the live subset of the same rules one event at a
time in the recorder's writer thread, so a local review can start before the run ends.

Key nodes (``KeyNode.kind``), found in one linear pass:

- ``first_failure``: the first tool call that failed.
- ``consecutive_failures``: two tool calls in a row failed (one node per streak).
- ``recovery``: a call failed, then a different call (other tool or other arguments) succeeded
  at the same agent step; ``related`` is ``[failed, succeeded]``.
- ``loop``: the same tool with the same arguments ``LOOP_REPEATS`` (4) or more times, in a row
  or cycling with a few other calls between (one node per loop).
- ``hesitation``: at one step the agent left an action it had just weighed as an alternative,
  or went A, B, A (back to the same call, or away from a B that failed).
- ``anomaly``: an unusual result status, a result flagged ``anomaly`` / ``flagged``, or an
  output that is not the ``expected_type`` the result or the input named.
- ``dissatisfaction``: a negative feedback score, or complaint words (English or Chinese) in
  feedback or user input.

Everything here is a pure function of the events: no store, no clock, no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from itertools import islice
from operator import attrgetter
from typing import Any

import orjson

from hindsight_loop.models import (
    FAILED_STATUSES,
    KNOWN_STATUSES,
    OK_STATUSES,
    Chronicle,
    Event,
    KeyNode,
    KeyNodeKind,
    Step,
    Task,
    normal_status,
    parse_ts,
)

__all__ = [
    "LOOP_REPEATS",
    "NODE_SUMMARY_MAX",
    "STEP_SUMMARY_MAX",
    "AnomalyWatch",
    "looks_dissatisfied",
    "replay",
]

#: A step's one-line summary is at most this many characters.
STEP_SUMMARY_MAX = 80
#: A key node's summary is at most this many characters (a hard limit, checked by the tests).
NODE_SUMMARY_MAX = 50
#: The same action with the same arguments this many times is a loop ("more than three times").
LOOP_REPEATS = 4

# A compressed chronicle keeps this many steps at each end so the reflector sees how the run
# began and ended.
_HEAD_STEPS = 5
_TAIL_STEPS = 5
# A loop of 5,000 repetitions must not keep 5,000 steps alive through compression: a node keeps
# the first and last few of its related steps, which is all a reflector can use anyway.
_RELATED_MAX = 20
# Repetitions of one call form one loop while each comes at most this many actions after the
# previous: A,A,A,A and A,x,A,x,A,x,A are loops; a file read four times over a long run is not.
_LOOP_SPAN = 8

# Bounds of the input / output / context views on a step. Recording already cuts long text
# (max_text, default 500); these keep a chronicle of hundreds of steps prompt-sized.
_TEXT_MAX = 200
_ITEMS_MAX = 10
_KEYS_MAX = 20
_DEPTH_MAX = 3
_SMALL_JSON = 256  # bytes of JSON under which a value is kept whole


_KIND_ORDER: dict[str, int] = {
    kind: n
    for n, kind in enumerate(
        (
            "first_failure",
            "consecutive_failures",
            "recovery",
            "loop",
            "hesitation",
            "anomaly",
            "dissatisfaction",
        )
    )
}

# Complaint words. Look-behinds keep common praise and negations out ("nothing wrong",
# "不错了" = "pretty good", "对不对" / "行不行" = "right?" / "OK?", "没用过" = "never used").
_COMPLAINT = re.compile(
    "|".join(
        (
            # English
            # Look-behinds sit after the word they guard, so they run only where it matched
            # (before it, they ran at every position: ~70 us on a 150-character text).
            r"\bwrong\b(?<!nothing wrong)(?<!nothing is wrong)(?<!nothing's wrong)"
            r"(?<!nothing went wrong)(?<!not wrong)(?<!isn't wrong)(?<!anything wrong)"
            r"(?<!anything go wrong)(?<!can't go wrong)",
            r"\bnot what i (?:asked|wanted|meant|said|need)",
            r"\bagain\s*[?？!！]",
            r"\bnot (?:working|helpful|right|correct)\b",
            r"\b(?:doesn't|does not|didn't|did not|isn't|still not|won't|never) work",
            r"\b(?:useless|incorrect|nonsense|terrible|awful|garbage|frustrat\w*)\b",
            r"\bstill (?:broken|failing|fails|the same)\b",
            r"\bi (?:already )?told you\b",
            r"\bwhy (?:did|do|would) you\b",
            r"\bwaste of time\b",
            r"\bthat'?s not (?:it|right|what)\b",
            # Chinese
            r"错了(?<![不没]错了)",
            r"不对(?<!对不对)",
            r"不是我(?:要|想要)的",
            r"没用(?![过到上])",
            r"怎么又",
            r"又(?:错|失败|不|是这|来|搞|弄|出错|报错|卡)",
            r"还是不(?:行|对)",
            r"不行(?<!行不行)",
            r"[搞弄]错(?<!没[搞弄]错)",
            r"答非所问|不满意|浪费时间|白费|垃圾|没听懂|说过了",
        )
    ),
    re.IGNORECASE,
)

_SORT_OPTS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
_MISSING = object()
_WIRE_ORDER = attrgetter("timestamp", "seq")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# -- public API -------------------------------------------------------------------------------


def replay(task: Task, events: Sequence[Event], *, max_steps: int = 500) -> Chronicle:
    """Replay one task's events into a chronicle: ordered steps and the key nodes.

    Args:
        task: The task the events belong to.
        events: Its events, in any order; they are ordered by (timestamp, seq).
        max_steps: A run with more events than this is compressed: every key node, its related
            steps, its neighbours (while they fit) and the first and last few steps are kept, the
            rest dropped. Key nodes are always kept, so this is a target, not a hard cap.

    Returns:
        The chronicle. ``KeyNode.index``, ``KeyNode.related`` and ``Step.index`` are all
        positions in ``chronicle.steps`` (``chronicle.steps[i].index == i``), which reflectors
        rely on. Without compression that is also the position in the run; after compression,
        find a step of the run by its ``event_id``.
    """
    if max_steps < 1:
        raise ValueError(f"max_steps must be at least 1, got {max_steps}")
    ordered = _order(events)
    n = len(ordered)
    nodes = _detect(ordered)
    if n > max_steps:
        kept = _compress(n, nodes, max_steps)
        position = {old: new for new, old in enumerate(kept)}
        for node in nodes:
            node.index = position[node.index]
            node.related = [position[r] for r in node.related]
    else:
        kept = list(range(n))
    steps = [_step(new, ordered[old]) for new, old in enumerate(kept)]
    return Chronicle(
        task=task,
        steps=steps,
        key_nodes=nodes,
        event_count=len(events),
        compressed=len(steps) < n,
    )


class AnomalyWatch:
    """The live triggers of replay, fed one event at a time (one watch per task).

    ``observe`` returns the key nodes the event completes: ``consecutive_failures`` (two tool
    failures in a row), ``dissatisfaction`` (negative feedback score or complaint words in
    English or Chinese) and ``loop`` (the same action with the same arguments ``LOOP_REPEATS``
    times in a row). Each streak or loop is reported once, when it starts. Indices count the
    events observed so far (the first event is 0), which equals the step index of an
    uncompressed replay when events arrive in order. Constant work per call; not thread-safe
    (it is meant for the single writer thread).
    """

    __slots__ = (
        "_count",
        "_last_action",
        "_last_action_index",
        "_last_failed",
        "_streak_reported",
        "_run_sig",
        "_run",
        "_run_reported",
    )

    def __init__(self) -> None:
        self._count = 0
        self._last_action: str | None = None
        self._last_action_index = -1
        self._last_failed = False
        self._streak_reported = False
        self._run_sig: tuple[str, str] | None = None
        self._run: list[int] = []
        self._run_reported = False

    @property
    def count(self) -> int:
        """How many events the watch has observed."""
        return self._count

    def observe(self, event: Event) -> list[KeyNode]:
        """Take the next event of the task; return the anomalies it completes (usually none)."""
        i = self._count
        self._count += 1
        etype = event.type
        found: list[KeyNode] = []
        if etype == "action_executed":
            failed = _status(event.result) in FAILED_STATUSES
            name = event.action
            if failed:
                if self._last_failed and not self._streak_reported:
                    found.append(
                        _failures_node(event, i, self._last_action, self._last_action_index, name)
                    )
                    self._streak_reported = True
            else:
                self._streak_reported = False
            sig = (name, _args_key(event.input)) if name is not None else None
            if sig is not None and sig == self._run_sig:
                if not self._run_reported:
                    self._run.append(i)
                    if len(self._run) >= LOOP_REPEATS:
                        found.append(_loop_node(event, i, name, self._run, LOOP_REPEATS, True))
                        self._run_reported = True
            else:
                self._run_sig = sig
                self._run = [i]
                self._run_reported = False
            self._last_failed = failed
            self._last_action = name
            self._last_action_index = i
        elif etype == "feedback" or etype == "user_input":
            reason = _dissatisfaction(event)
            if reason is not None:
                found.append(
                    _dissatisfaction_node(
                        event, i, reason, self._last_action, self._last_action_index
                    )
                )
        return found


def looks_dissatisfied(text: str) -> bool:
    """True when user text complains ("wrong", "not what I asked", "错了", "不是我要的" …)."""
    return bool(text) and _complaint(text) is not None


# Literal cores of the complaint patterns: the regex (with its look-behinds, about 60 µs on a
# 150-character text) runs only on text that contains at least one of them.
_COMPLAINT_HINTS = (
    "wrong",
    "not ",
    "n't",
    "n’t",
    "again",
    "never",
    "work",
    "useless",
    "incorrect",
    "nonsense",
    "terrible",
    "awful",
    "garbage",
    "frustrat",
    "still",
    "told you",
    "why",
    "waste",
    "错",
    "不对",
    "不是我",
    "没用",
    "又",
    "不行",
    "答非所问",
    "不满意",
    "浪费",
    "白费",
    "垃圾",
    "没听懂",
    "说过",
)


def _complaint(text: str) -> re.Match[str] | None:
    low = text.lower()
    if not any(hint in low for hint in _COMPLAINT_HINTS):
        return None
    return _COMPLAINT.search(text.replace("’", "'"))  # same length, so match offsets hold


# -- ordering ---------------------------------------------------------------------------------


def _order(events: Sequence[Event]) -> list[Event]:
    """Events by (timestamp, seq); stable, so exact ties keep the order they came in."""
    # Wire timestamps (``2024-11-20T14:32:10.882Z``) sort correctly as strings, which is far
    # cheaper than parsing; anything else (offsets, missing milliseconds) is parsed.
    for ev in events:
        ts = ev.timestamp
        if len(ts) != 24 or ts[23] != "Z" or ts[19] != ".":
            return sorted(events, key=_parsed_order)
    return sorted(events, key=_WIRE_ORDER)


def _parsed_order(ev: Event) -> tuple[datetime, int]:
    try:
        return parse_ts(ev.timestamp), ev.seq
    except (ValueError, TypeError, OverflowError):
        # An unreadable timestamp should not sink the whole replay; such a step goes first.
        return _EPOCH, ev.seq


# -- key nodes --------------------------------------------------------------------------------


def _detect(events: list[Event]) -> list[KeyNode]:
    """One pass over the ordered events finding every key node (indices into ``events``)."""
    nodes: list[KeyNode] = []
    seen_failure = False
    # consecutive_failures: the previous tool call
    prev_failed = False
    prev_name: str | None = None
    prev_index = -1
    streak_reported = False
    # loop: per (action, args), the current chain of repetitions as [last action ordinal,
    # step indices …]; a chain breaks when more than _LOOP_SPAN other actions pass.
    chains: dict[tuple[str, str], list[int]] = {}
    rows: set[tuple[str, str]] = set()  # chains that repeated LOOP_REPEATS times in a row
    loops: list[tuple[str, list[int], bool]] = []
    ordinal = 0
    run_sig: tuple[str, str] | None = None
    run_len = 0
    # hesitation and recovery work per agent step label
    weighing: dict[Any, dict[str, Any]] = {}  # per label, a decision that had alternatives
    # per label, the last two different actions run there (plain tuples: this is the hot path)
    # as (name, index, sig, failed, previous name, previous index, previous sig)
    last_at: dict[Any, tuple[str, int, Any, bool, str | None, int, Any]] = {}
    hesitations: dict[tuple[Any, frozenset[str]], KeyNode] = {}
    unresolved: dict[Any, _Unresolved] = {}

    for i, ev in enumerate(events):
        etype = ev.type
        result = ev.result
        status = result.get("status") if result else None
        if status is not None and not isinstance(status, str):
            status = None
        if etype == "action_executed":
            failed = status in FAILED_STATUSES
            inp = ev.input
            name = inp.get("tool") if inp else None
            if not isinstance(name, str):
                name = ev.action
            state = ev.agent_state
            label = state.get("current_step") if state else None
            if label is not None and not isinstance(label, str):
                label = _hashable(label)

            if failed:
                if not seen_failure:
                    seen_failure = True
                    nodes.append(_first_failure_node(ev, i, name))
                if prev_failed and not streak_reported:
                    nodes.append(_failures_node(ev, i, prev_name, prev_index, name))
                    streak_reported = True
            else:
                streak_reported = False
            prev_failed, prev_name, prev_index = failed, name, i

            sig: tuple[str, str] | None = None
            if name is not None:
                sig = (name, _args_key(inp))
                ordinal += 1
                chain = chains.get(sig)
                if chain is not None and ordinal - chain[0] <= _LOOP_SPAN:
                    chain[0] = ordinal
                    chain.append(i)
                else:
                    if chain is not None and len(chain) > LOOP_REPEATS:
                        loops.append((name, chain, sig in rows))
                    if rows:
                        rows.discard(sig)
                    chains[sig] = [ordinal, i]
                if sig == run_sig:
                    run_len += 1
                    if run_len == LOOP_REPEATS:
                        rows.add(sig)
                else:
                    run_sig, run_len = sig, 1

                weighed = weighing.pop(label, None) if weighing else None
                if ev.decision and ev.decision.get("alternatives"):
                    weighed = ev.decision
                last = last_at.get(label)
                if last is None:
                    last_at[label] = (name, i, sig, failed, None, -1, None)
                elif last[0] == name:
                    last_at[label] = (name, i, sig, failed, last[4], last[5], last[6])
                else:
                    last_name, last_index, _, last_failed, before, before_index, before_sig = last
                    related: list[int] | None = None
                    if weighed is not None and _wavered(weighed, last_name, name):
                        related = [last_index, i]
                    elif before == name and (sig == before_sig or last_failed):
                        related = [before_index, last_index, i]  # A, B, A
                    if related is not None:
                        _hesitation(hesitations, nodes, ev, i, label, last_name, name, related)
                    last_at[label] = (name, i, sig, failed, last_name, last_index, last[2])
            else:
                run_sig = None

            if failed:
                pending = unresolved.get(label)
                if pending is None:
                    unresolved[label] = _Unresolved(i, sig)
                elif pending.other_index < 0 and sig != pending.sig:
                    pending.other_index, pending.other_sig = i, sig
            elif status in OK_STATUSES and unresolved:
                pending = unresolved.pop(label, None)
                if pending is not None:
                    fixed = -1
                    if sig != pending.sig:
                        fixed = pending.index
                    elif pending.other_index >= 0 and sig != pending.other_sig:
                        fixed = pending.other_index
                    if fixed >= 0:
                        nodes.append(_recovery_node(events, fixed, i))
        elif etype == "llm_decision":
            decision = ev.decision
            if decision and decision.get("alternatives"):
                weighing[_label(ev)] = decision
        elif etype == "feedback" or etype == "user_input":
            reason = _dissatisfaction(ev)
            if reason is not None:
                nodes.append(_dissatisfaction_node(ev, i, reason, prev_name, prev_index))

        # Most results are plain successes and failures: only look closer at the rest.
        if result and (
            (status is not None and status not in KNOWN_STATUSES)
            or "anomaly" in result
            or "flagged" in result
            or "expected_type" in result
            or (ev.input and "expected_type" in ev.input)
        ):
            reason = _anomaly(ev, result)
            if reason is not None:
                nodes.append(
                    _node(
                        "anomaly", i, ev, reason, action=ev.action, error_type=_error_type(result)
                    )
                )

    for sig, chain in chains.items():
        if len(chain) > LOOP_REPEATS:
            loops.append((sig[0], chain, sig in rows))
    for name, chain, row in loops:
        seen = chain[1:]
        at = seen[LOOP_REPEATS - 1]
        nodes.append(_loop_node(events[at], at, name, seen, len(seen), row))
    for node in nodes:
        if len(node.related) > _RELATED_MAX:
            half = _RELATED_MAX // 2
            node.related = node.related[:half] + node.related[-half:]
    nodes.sort(key=lambda k: (k.index, _KIND_ORDER[k.kind]))
    return nodes


class _Unresolved:
    """Failures at one step label not yet followed by a success there (for recovery)."""

    __slots__ = ("index", "sig", "other_index", "other_sig")

    def __init__(self, index: int, sig: tuple[str, str] | None) -> None:
        self.index, self.sig = index, sig
        # The first failure with other arguments, for when the success repeats the first call.
        self.other_index = -1
        self.other_sig: tuple[str, str] | None = None


def _wavered(decision: dict[str, Any], before: str, after: str) -> bool:
    """Did the agent leave an action it had just weighed, or run an alternative it had not chosen?

    A decision with alternatives followed by the next tool of a pipeline is not wavering, so
    the switch has to involve the actions the decision was about.
    """
    alternatives = decision.get("alternatives")
    if not isinstance(alternatives, list):
        return False
    chosen = decision.get("chosen_action")
    return before == chosen or before in alternatives or (after in alternatives and after != chosen)


def _hesitation(
    found: dict[tuple[Any, frozenset[str]], KeyNode],
    nodes: list[KeyNode],
    ev: Event,
    i: int,
    label: Any,
    before: str,
    after: str,
    related: list[int],
) -> None:
    # One node per pair of actions the agent wavered between at a step; a longer A,B,A,B …
    # grows the node instead of repeating it.
    key = (label, frozenset((before, after)))
    node = found.get(key)
    if node is not None:
        node.related.append(i)
        return
    where = f" at {label}" if label is not None else ""
    text = f"wavered {_name(before, 15)} ↔ {_name(after, 15)}{where}"
    node = _node("hesitation", i, ev, text, action=after, related=related)
    found[key] = node
    nodes.append(node)


def _first_failure_node(ev: Event, i: int, name: str | None) -> KeyNode:
    result = ev.result or {}
    why = _error_type(result) or _text(result.get("error_message")) or "error"
    return _node(
        "first_failure",
        i,
        ev,
        f"{_name(name)} failed: {why}",
        action=name,
        error_type=_error_type(result),
    )


def _failures_node(
    ev: Event, i: int, prev_name: str | None, prev_index: int, name: str | None
) -> KeyNode:
    if prev_name == name:
        text = f"{_name(name)} failed twice in a row"
    else:
        text = f"{_name(prev_name, 15)}, {_name(name, 15)} failed in a row"
    return _node(
        "consecutive_failures",
        i,
        ev,
        text,
        action=name,
        error_type=_error_type(ev.result or {}),
        related=[prev_index, i],
    )


def _loop_node(
    ev: Event, i: int, name: str | None, seen: list[int], times: int, row: bool
) -> KeyNode:
    how = "in a row" if row else "in the run"
    return _node(
        "loop",
        i,
        ev,
        f"{_name(name)} ×{times} same args {how}",
        action=name,
        error_type=_error_type(ev.result or {}),
        related=list(seen),
    )


def _recovery_node(events: list[Event], failed_index: int, i: int) -> KeyNode:
    bad, good = events[failed_index], events[i]
    bad_name, good_name = bad.action, good.action
    if bad_name == good_name:
        changed = _changed_args(bad.input, good.input)
        text = f"{_name(good_name)} ok with {changed}" if changed else f"{_name(good_name)} ok"
    else:
        text = f"{_name(good_name, 18)} ok after {_name(bad_name, 18)} failed"
    return _node(
        "recovery",
        i,
        good,
        text,
        action=good_name,
        error_type=_error_type(bad.result or {}),
        related=[failed_index, i],
    )


def _dissatisfaction_node(
    ev: Event, i: int, reason: str, last_action: str | None, last_index: int
) -> KeyNode:
    return _node(
        "dissatisfaction",
        i,
        ev,
        reason,
        action=last_action,
        related=[last_index, i] if last_index >= 0 else [],
    )


def _node(
    kind: KeyNodeKind,
    index: int,
    ev: Event,
    summary: str,
    *,
    action: str | None = None,
    error_type: str | None = None,
    related: list[int] | None = None,
) -> KeyNode:
    return KeyNode(
        kind=kind,
        index=index,
        event_id=ev.event_id,
        summary=_clip(summary, NODE_SUMMARY_MAX),
        action=action,
        error_type=error_type,
        related=related if related is not None else [],
    )


def _dissatisfaction(ev: Event) -> str | None:
    """A short reason when a user input or feedback shows the user is unhappy."""
    inp = ev.input or {}
    text = _user_text(inp)
    if ev.type == "feedback":
        score = _score(inp.get("score", ev.extra.get("score")))
        if score is not None:
            if score >= 0:
                return None  # an explicit score says more than the words around it
            return f"feedback {score:g}: {text}" if text else f"feedback score {score:g}"
    if text and _complaint(text) is not None:
        return "user: " + _around(text, NODE_SUMMARY_MAX - len("user: "))
    return None


def _around(text: str, limit: int) -> str:
    """At most ``limit`` characters of a long message that keep its complaint in view."""
    text = " ".join(text.split())
    match = _complaint(text)
    if len(text) <= limit or match is None:
        return text
    head, after = text[: match.end()], text[match.end() :]
    if len(head) > limit - 2:  # keep room for a "…" on each side
        head = "…" + head[len(head) - (limit - 3) :]
    room = limit - len(head)
    if len(after) > room:
        after = after[: room - 1] + "…"
    return head + after


def _user_text(inp: dict[str, Any]) -> str:
    for key in ("text", "message", "content", "comment"):
        value = inp.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def _score(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        score = float(value)
    except (TypeError, ValueError):
        return None
    return score if math.isfinite(score) else None


_EXPECTED: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "string": (str,),
    "text": (str,),
    "int": (int,),
    "integer": (int,),
    "float": (int, float),
    "number": (int, float),
    "bool": (bool,),
    "boolean": (bool,),
    "list": (list, tuple),
    "array": (list, tuple),
    "dict": (dict,),
    "object": (dict,),
    "mapping": (dict,),
    "null": (type(None),),
    "none": (type(None),),
}
_JSON_NAMES = {
    dict: "object",
    list: "array",
    tuple: "array",
    str: "string",
    bool: "boolean",
    int: "integer",
    float: "number",
    type(None): "null",
}


def _anomaly(ev: Event, result: dict[str, Any]) -> str | None:
    """Why a result looks anomalous, or None."""
    status = _status(result)
    what = _name(ev.action or ev.type)
    if status is not None and status not in KNOWN_STATUSES:
        return f"{what} returned status {status}"
    flag = result.get("anomaly")
    if flag or result.get("flagged"):
        return f"{what} flagged: {flag}" if isinstance(flag, str) else f"{what} result flagged"
    if status in FAILED_STATUSES:
        return None  # a failure is its own key node, not also a type mismatch
    expected = result.get("expected_type")
    if expected is None and ev.input:
        expected = ev.input.get("expected_type")
    if not expected:
        return None
    wanted = [expected] if isinstance(expected, str) else expected
    if not isinstance(wanted, list):
        return None
    output = result.get("output")
    known = False
    for name in wanted:
        types = _EXPECTED.get(name.lower()) if isinstance(name, str) else None
        if types is None:
            continue
        known = True
        # bool is an int in Python but never a number in JSON.
        if isinstance(output, types) and not (isinstance(output, bool) and bool not in types):
            return None
    if not known:
        return None  # a type name we do not understand is no evidence of anything
    got = _JSON_NAMES.get(type(output), type(output).__name__)
    return f"{what} gave {got}, expected {'|'.join(map(str, wanted))}"


# -- compression ------------------------------------------------------------------------------


def _compress(n: int, nodes: list[KeyNode], max_steps: int) -> list[int]:
    """Indices of the steps a compressed chronicle keeps, ascending (linear in the run)."""
    keep = bytearray(n)
    for i in range(min(_HEAD_STEPS, n)):
        keep[i] = 1
    for i in range(max(0, n - _TAIL_STEPS), n):
        keep[i] = 1
    for node in nodes:
        keep[node.index] = 1
        for r in node.related:
            keep[r] = 1
    count = keep.count(1)
    # Neighbours give each node its immediate context; they are the first thing to go when
    # the key nodes alone already fill the budget.
    for node in nodes:
        if count >= max_steps:
            break
        for j in (node.index - 1, node.index + 1):
            if 0 <= j < n and not keep[j]:
                keep[j] = 1
                count += 1
    return [i for i, k in enumerate(keep) if k]


# -- steps ------------------------------------------------------------------------------------


def _step(index: int, ev: Event) -> Step:
    result = ev.result
    label = ev.agent_state.get("current_step") if ev.agent_state else None
    return Step(
        index=index,
        event_id=ev.event_id,
        type=ev.type,
        action=ev.action,
        status=_status(result),
        step=None if label is None else str(label),
        summary=_summarize(ev),
        error_type=_error_type(result) if result else None,
        input=_bound(ev.input) if ev.input is not None else None,
        context=_bound(ev.context) if ev.context is not None else None,
        output=_bound(result.get("output")) if result else None,
    )


def _summarize(ev: Event) -> str:
    """One line of at most ``STEP_SUMMARY_MAX`` characters."""
    etype = ev.type
    inp = ev.input or {}
    result = ev.result or {}
    if etype == "action_executed":
        status = _text(result.get("status"))
        tail = ""
        if status:
            why = _error_type(result)
            if not why and status in FAILED_STATUSES:
                why = _text(result.get("error_message"))
            tail = " " + _clip(f"-> {status} {why}" if why else f"-> {status}", 39)
        name = _clip(ev.action or "action", 30)
        budget = STEP_SUMMARY_MAX - len(tail) - len(name) - 2
        head = f"{name}({_args_text(_args(inp), budget)})"
        return _clip(head, STEP_SUMMARY_MAX - len(tail)) + tail
    if etype == "llm_decision":
        decision = ev.decision or {}
        text = f"decide {_short(decision.get('chosen_action'), 30)}"
        alternatives = decision.get("alternatives")
        if isinstance(alternatives, list) and alternatives:
            text += " over " + ", ".join(_short(a, 20) for a in alternatives[:3])
        confidence = decision.get("confidence")
        if isinstance(confidence, int | float) and not isinstance(confidence, bool):
            text += f" ({confidence:.2f})"
        return _clip(text, STEP_SUMMARY_MAX)
    if etype == "user_input":
        return _clip(f"user: {_user_text(inp)}", STEP_SUMMARY_MAX)
    if etype == "feedback":
        score = _score(inp.get("score", ev.extra.get("score")))
        head = f"feedback {score:+g}" if score is not None else "feedback"
        text = _user_text(inp)
        return _clip(f"{head}: {text}" if text else head, STEP_SUMMARY_MAX)
    if etype == "state_change":
        state = ev.agent_state or {}
        return _clip("state: " + _args_text(state) if state else "state change", STEP_SUMMARY_MAX)
    if etype == "task_start":
        goal = ev.extra.get("goal") or (ev.context or {}).get("goal") or ev.extra.get("task_type")
        return _clip(f"start: {goal}" if goal else "start", STEP_SUMMARY_MAX)
    if etype == "task_end":
        status = _text(result.get("status")) or "ended"
        why = (
            _error_type(result) or _text(result.get("error_message")) or _text(result.get("reason"))
        )
        return _clip(f"end: {status} {why}" if why else f"end: {status}", STEP_SUMMARY_MAX)
    return _clip(str(etype), STEP_SUMMARY_MAX)


def _args(inp: dict[str, Any]) -> Any:
    """A tool call's arguments: ``input["args"]``, or the input without its ``tool`` key."""
    args = inp.get("args", _MISSING)
    if args is _MISSING:
        return {k: v for k, v in inp.items() if k != "tool"}
    return args


def _args_key(inp: dict[str, Any] | None) -> str:
    """Canonical text of a call's arguments, so equal calls compare equal whatever key order."""
    if not inp:
        return ""
    args = inp.get("args", _MISSING)
    if args is _MISSING:
        if len(inp) == 1 and "tool" in inp:
            return ""
        args = {k: v for k, v in inp.items() if k != "tool"}
    try:
        # Decoded at once: keeping thousands of orjson's bytes objects alive costs ten times
        # more than the dumps itself.
        return orjson.dumps(args, default=repr, option=_SORT_OPTS).decode()
    except TypeError:  # orjson.JSONEncodeError: nesting too deep, odd keys …
        return repr(args)


def _args_text(args: Any, budget: int = 72) -> str:
    """``k=v, k=v`` in about ``budget`` characters: short values whole, long ones share the rest."""
    if isinstance(args, dict):
        if len(args) <= 3:
            plain = ", ".join(f"{k}={v}" for k, v in args.items())
            if (
                len(plain) <= budget
                and plain.isprintable()
                and "{" not in plain
                and "[" not in plain
            ):
                return plain  # it all fits: nothing to share out
        shown = [
            (str(k), v if isinstance(v, str) else _short(v, 40)) for k, v in islice(args.items(), 3)
        ]
        if not shown:
            return ""
        more = len(args) > 3
        # Cutting the longest values beats cutting the line's end: the last argument
        # (encoding=gbk) is often the one that matters.
        left = budget - 2 * (len(shown) - 1) - (3 if more else 0)
        limits: dict[int, int] = {}
        for count, n in enumerate(sorted(range(len(shown)), key=lambda j: len(shown[j][1]))):
            key, value = shown[n]
            fair = left // (len(shown) - count) - len(key) - 1
            limits[n] = min(len(value), max(4, fair))
            left -= len(key) + 1 + limits[n]
        parts = [f"{k}={_short(v, limits[n])}" for n, (k, v) in enumerate(shown)]
        if more:
            parts.append("…")
        return ", ".join(parts)
    if args is None:
        return ""
    return _short(args, max(4, budget))


def _changed_args(before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
    """``key=value`` of the arguments that differ between two calls of one tool."""
    old, new = _args(before or {}), _args(after or {})
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return _short(new, 30)
    diff = {k: v for k, v in new.items() if old.get(k, _MISSING) != v}
    return _args_text(diff)


def _short(value: Any, limit: int) -> str:
    """A value as a few characters: text as is, containers as their size."""
    if isinstance(value, str):
        if len(value) <= limit:
            return value  # the whole line is made one-line by the caller's _clip
        if "/" in value:
            return "…" + value[-(limit - 1) :]  # the end of a path says more than its start
        return _clip(value, limit)
    if isinstance(value, dict):
        return f"{{{len(value)} keys}}"
    if isinstance(value, list | tuple):
        return f"[{len(value)} items]"
    return _clip(str(value), limit)


def _bound(value: Any, depth: int = 0) -> Any:
    """A JSON-safe copy of a value with long text, long lists and deep nesting cut."""
    if depth == 0 and isinstance(value, dict | list) and len(value) <= _KEYS_MAX:
        # Most inputs and outputs are small: one round trip through orjson copies them, in C,
        # and proves they are JSON; only the big or odd ones need the walk below.
        try:
            raw = orjson.dumps(value)
        except TypeError:
            pass
        else:
            if len(raw) <= _SMALL_JSON:
                return orjson.loads(raw)
    if isinstance(value, str):
        return value if len(value) <= _TEXT_MAX else value[: _TEXT_MAX - 1] + "…"
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, dict):
        if depth >= _DEPTH_MAX:
            return f"{{{len(value)} keys}}"
        out: dict[str, Any] = {}
        for k, v in value.items():
            if len(out) == _KEYS_MAX:
                out["…"] = f"{len(value) - _KEYS_MAX} more keys"
                break
            if not isinstance(k, str):
                k = str(k)
            # Short text and numbers, the bulk of any input, need no recursion.
            if (isinstance(v, str) and len(v) <= _TEXT_MAX) or isinstance(v, int | float | None):
                out[k] = v
            else:
                out[k] = _bound(v, depth + 1)
        return out
    if isinstance(value, list | tuple):
        if depth >= _DEPTH_MAX:
            return f"[{len(value)} items]"
        items = [_bound(v, depth + 1) for v in value[:_ITEMS_MAX]]
        if len(value) > _ITEMS_MAX:
            items.append(f"… {len(value) - _ITEMS_MAX} more items")
        return items
    return _clip(repr(value), _TEXT_MAX)  # bytes, objects …: text is all a reflector can read


def _status(result: dict[str, Any] | None) -> str | None:
    """The result's status when it is text (anything else is treated as no status)."""
    if not result:
        return None
    return normal_status(result.get("status"))


def _label(ev: Event) -> Any:
    """The agent's ``current_step``, usable as a dict key."""
    label = ev.agent_state.get("current_step") if ev.agent_state else None
    return label if label is None or isinstance(label, str) else _hashable(label)


def _hashable(label: Any) -> Any:
    return label if isinstance(label, int | float | bool) else str(label)


def _name(action: str | None, limit: int = 22) -> str:
    """An action's name cut short, so the rest of a 50-character node summary still fits."""
    return _clip(action, limit) if action else "action"


def _error_type(result: dict[str, Any]) -> str | None:
    value = result.get("error_type")
    return None if value is None else str(value)


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _clip(text: str, limit: int) -> str:
    """One line of at most ``limit`` characters (code points, so CJK counts one per glyph)."""
    if not text.isprintable() or "  " in text:  # newlines, tabs, wide spaces, runs of spaces
        text = " ".join(text.split())
    if len(text) <= limit:
        return text
    return text[: limit - 1].rstrip() + "…"
