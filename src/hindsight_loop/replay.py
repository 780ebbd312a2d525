"""Replay: turn one task's raw events into a chronicle a reflector can read.

A reflector (an LLM or the offline rules) must never be handed raw logs. It gets the run as
ordered, bounded steps plus the few key nodes worth thinking about (the first failure, a loop,
a recovery, the user getting annoyed …), each summarised in at most 50 characters, so even a long
run makes a small prompt. ``AnomalyWatch`` runs the live subset of the same rules one event at a
time in the recorder's writer thread, so a local review can start before the run ends.

Key nodes (``KeyNode.kind``) are found in one linear pass by one small detector per kind, each
holding the per-run state it needs (``Detector``: ``observe(seen)``, ``finish()``):

- ``FirstFailure``: the first tool call that failed.
- ``ConsecutiveFailures``: two tool calls in a row failed (one node per streak).
- ``Recovery``: a call failed, then a different call (other tool or other arguments) succeeded
  at the same agent step; ``related`` is ``[failed, succeeded]``.
- ``Loop``: the same tool with the same arguments ``LOOP_REPEATS`` (4) or more times, in a row
  or cycling with a few other calls between (one node per loop).
- ``Hesitation``: at one step the agent left an action it had just weighed as an alternative,
  or went A, B, A (back to the same call, or away from a B that failed).
- ``Anomaly``: an unusual result status, a result flagged ``anomaly`` / ``flagged``, or an
  output that is not the ``expected_type`` the result or the input named.
- ``Dissatisfaction``: a negative feedback score, or complaint words (English or Chinese) in
  feedback or user input.
- ``Handoff``: in a run of many agents (events naming ``agent_state.agent``), the turn passing
  from one agent to another; ``related`` is ``[the last step of the one who handed over, the
  first step of the one who took over]``, so a reviewer reads what was asked and what came back.

A run where more than one agent speaks replays into a ``TeamChronicle``: the same chronicle plus
each step's agent and each agent's key nodes (``agents``); its step summaries start with the
agent's name. A single-agent run's chronicle is a
plain ``Chronicle``, exactly as before.

``replay`` runs them all; ``AnomalyWatch`` runs the ``LIVE_KINDS`` among them. Whether a call
failed is ``models.is_failure``, the one rule for it. ``local_window`` says which steps a local
review of a key node reads.

Each step carries a one-line ``summary`` and a bounded ``detail``: the user's words, the agent's
reply, a tool's arguments and the gist of its result, an error message in full. The summary is
what a list shows; the detail is what a reviewer reads.

Everything here is a pure function of the events: no store, no clock, no I/O.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import islice
from operator import attrgetter
from typing import Any, Protocol

import orjson

from hindsight_loop.models import (
    KNOWN_STATUSES,
    Chronicle,
    Event,
    KeyNode,
    KeyNodeKind,
    Step,
    Task,
    is_failure,
    is_success,
    normal_status,
    parse_ts,
)
from hindsight_loop.text import detect_language

__all__ = [
    "DETAIL_ARGS_MAX",
    "DETAIL_OUTPUT_MAX",
    "DETAIL_TEXT_MAX",
    "DETECTORS",
    "LIVE_KINDS",
    "LOCAL_WINDOW_AFTER",
    "LOCAL_WINDOW_BEFORE",
    "LOOP_REPEATS",
    "LOOP_SPAN",
    "NODE_SUMMARY_MAX",
    "STEP_SUMMARY_MAX",
    "AnomalyWatch",
    "Detector",
    "Seen",
    "TeamChronicle",
    "local_window",
    "run_language",
    "looks_dissatisfied",
    "replay",
]

#: A step's one-line summary is at most this many characters.
STEP_SUMMARY_MAX = 80
#: A key node's summary is at most this many characters (a hard limit, checked by the tests).
NODE_SUMMARY_MAX = 50
#: The same action with the same arguments this many times is a loop ("more than three times").
LOOP_REPEATS = 4
#: Repetitions of one call form one loop while each comes at most this many actions after the
#: previous: A,A,A,A and A,x,A,x,A,x,A are loops; a file read four times over a long run is not.
LOOP_SPAN = 8
#: A local review reads the steps of its key node plus this many steps before them …
LOCAL_WINDOW_BEFORE = 3
#: … and this many after (what the agent did next), within the run.
LOCAL_WINDOW_AFTER = 3
#: A step's ``detail`` keeps a user's words, an agent's reply or an error message up to this
#: many characters (recording usually cut them shorter already).
DETAIL_TEXT_MAX = 1000
#: A tool call's arguments in a step's ``detail``, as compact JSON, up to this many characters.
DETAIL_ARGS_MAX = 400
#: The gist of a tool's output in a step's ``detail``: this many characters.
DETAIL_OUTPUT_MAX = 300

# A compressed chronicle keeps this many steps at each end so the reflector sees how the run
# began and ended.
_HEAD_STEPS = 5
_TAIL_STEPS = 5
# A loop of 5,000 repetitions must not keep 5,000 steps alive through compression: a node keeps
# the first and last few of its related steps, which is all a reflector can use anyway.
_RELATED_MAX = 20

# Bounds of the input / output / context views on a step. Recording already cuts long text
# (max_text, default 500); these keep a chronicle of hundreds of steps prompt-sized.
_TEXT_MAX = 200
_ITEMS_MAX = 10
_KEYS_MAX = 20
_DEPTH_MAX = 3
_SMALL_JSON = 256  # bytes of JSON under which a value is kept whole


# Complaint words. Look-behinds keep common praise and negations out ("nothing wrong",
# "不错了" = "pretty good", "对不对" / "行不行" = "right?" / "OK?", "没用过" = "never used").
_COMPLAINT = re.compile(
    "|".join(
        (
            # English
            # Look-behinds sit after the word they guard, so they run only where it matched
            # (before it, they would run at every position).
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
    if any(node.kind == "handoff" for node in nodes):
        # Only a run whose turn passed between agents pays for the per-agent view.
        return _team_chronicle(
            task, steps, nodes, [ordered[old] for old in kept], len(events), len(steps) < n
        )
    return Chronicle(
        task=task,
        steps=steps,
        key_nodes=nodes,
        event_count=len(events),
        compressed=len(steps) < n,
    )


class AnomalyWatch:
    """The live detectors of replay, fed one event at a time (one watch per task).

    ``observe`` returns the key nodes the event completes, of the ``LIVE_KINDS``:
    ``consecutive_failures`` (two tool failures in a row), ``loop`` (the same action with the
    same arguments ``LOOP_REPEATS`` times, reported at that call) and ``dissatisfaction``
    (negative feedback score or complaint words in English or Chinese). They are the very
    detectors ``replay`` runs, so the watch and a replay of the same events agree on kind,
    index and event. Indices count the events observed so far (the first event is 0), which
    equals the step index of an uncompressed replay when events arrive in order. Constant work
    per call; not thread-safe (it is meant for the single writer thread).
    """

    __slots__ = ("_count", "_observers")

    def __init__(self) -> None:
        self._count = 0
        detectors: list[Detector] = [
            Loop(live=True) if factory is Loop else factory()
            for factory in DETECTORS
            if _KIND_OF[factory] in LIVE_KINDS
        ]
        self._observers = [d.observe for d in detectors]

    @property
    def count(self) -> int:
        """How many events the watch has observed."""
        return self._count

    def observe(self, event: Event) -> list[KeyNode]:
        """Take the next event of the task; return the anomalies it completes (usually none)."""
        seen = Seen(self._count, event)
        self._count += 1
        found: list[KeyNode] = []
        for observe in self._observers:
            nodes = observe(seen)
            if nodes:
                found.extend(nodes)
        return found


def run_language(chronicle: Chronicle, steps: Iterable[Step] | None = None) -> str:
    """The language a run was in (``en`` or ``zh``): the one rule every reflector follows.

    Read from the people's words (the goal, what the user said, their feedback), not from tool
    names and arguments, which are English identifiers in a Chinese run too.

    Args:
        chronicle: The run.
        steps: Only these steps (a local review's window); default every step.
    """
    texts = [chronicle.task.goal or ""]
    for step in chronicle.steps if steps is None else steps:
        if step.type in ("user_input", "feedback"):
            texts.append(str((step.input or {}).get("text") or step.summary or ""))
    return detect_language(" ".join(t for t in texts if t))


def local_window(steps: Iterable[int], *, last: int | None = None) -> tuple[int, int]:
    """The steps a local review of a key node reads: its own steps and a few on each side.

    Args:
        steps: The node's step indices (``[node.index, *node.related]``).
        last: The last step of the run, when known: the window stops there.

    Returns:
        ``(first, last)`` step indices, inclusive: ``LOCAL_WINDOW_BEFORE`` steps before the
        node's first step to ``LOCAL_WINDOW_AFTER`` steps after its last one.
    """
    involved = [i for i in steps if i >= 0]
    if not involved:
        raise ValueError("local_window needs at least one step index")
    hi = max(involved) + LOCAL_WINDOW_AFTER
    if last is not None:
        hi = max(min(hi, last), max(involved))
    return max(0, min(involved) - LOCAL_WINDOW_BEFORE), hi


def looks_dissatisfied(text: str) -> bool:
    """True when user text complains ("wrong", "not what I asked", "错了", "不是我要的" …)."""
    return bool(text) and _complaint(text) is not None


# Literal cores of the complaint patterns: the regex (with its look-behinds, slow) runs only on
# text that contains at least one of them.
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


# -- key nodes: one detector per kind ---------------------------------------------------------


class Seen:
    """One event as the detectors read it, worked out once per event and shared by them all."""

    __slots__ = ("index", "event", "type", "status", "name", "label", "sig", "failed")

    def __init__(self, index: int, event: Event) -> None:
        self.index = index
        self.event = event
        etype = self.type = event.type
        result = event.result
        #: The result's status as the rule reads it (``normal_status``), or None.
        self.status = normal_status(result.get("status")) if result else None
        #: The tool a call ran (``input.tool``, else the decision's chosen action).
        self.name: str | None = None
        #: The agent's ``current_step``, usable as a dict key.
        self.label: Any = None
        #: ``(tool, canonical arguments)``: equal calls have equal signatures.
        self.sig: tuple[str, str] | None = None
        self.failed = False
        if etype == "action_executed":
            self.failed = is_failure(self.status)
            inp = event.input
            name = inp.get("tool") if inp else None
            if not isinstance(name, str):
                name = event.action
            self.name = name
            self.label = _label(event)
            if name is not None:
                self.sig = (name, _args_key(inp))
        elif etype == "llm_decision":
            self.label = _label(event)


class Detector(Protocol):
    """Finds the key nodes of one kind in one run, fed its events in order."""

    kind: KeyNodeKind

    def observe(self, seen: Seen) -> Sequence[KeyNode]:
        """The key nodes this event completes (usually none)."""
        ...

    def finish(self) -> Sequence[KeyNode]:
        """The key nodes only the end of the run settles (a loop's full length)."""
        ...


_NONE: tuple[KeyNode, ...] = ()


class FirstFailure:
    """``first_failure``: the first tool call that failed."""

    kind: KeyNodeKind = "first_failure"
    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen = False

    def observe(self, seen: Seen) -> Sequence[KeyNode]:
        if not seen.failed or self._seen:
            return _NONE
        self._seen = True
        ev = seen.event
        result = ev.result or {}
        why = _error_type(result) or _text(result.get("error_message")) or "error"
        return (
            _node(
                "first_failure",
                seen.index,
                ev,
                f"{_name(seen.name)} failed: {why}",
                action=seen.name,
                error_type=_error_type(result),
            ),
        )

    def finish(self) -> Sequence[KeyNode]:
        return _NONE


class ConsecutiveFailures:
    """``consecutive_failures``: two tool calls in a row failed (one node per streak)."""

    kind: KeyNodeKind = "consecutive_failures"
    __slots__ = ("_prev_failed", "_prev_name", "_prev_index", "_reported")

    def __init__(self) -> None:
        self._prev_failed = False
        self._prev_name: str | None = None
        self._prev_index = -1
        self._reported = False

    def observe(self, seen: Seen) -> Sequence[KeyNode]:
        if seen.type != "action_executed":
            return _NONE
        found = _NONE
        name, i = seen.name, seen.index
        if not seen.failed:
            self._reported = False
        elif self._prev_failed and not self._reported:
            self._reported = True
            prev = self._prev_name
            if prev == name:
                text = f"{_name(name)} failed twice in a row"
            else:
                text = f"{_name(prev, 15)}, {_name(name, 15)} failed in a row"
            ev = seen.event
            found = (
                _node(
                    "consecutive_failures",
                    i,
                    ev,
                    text,
                    action=name,
                    error_type=_error_type(ev.result or {}),
                    related=[self._prev_index, i],
                ),
            )
        self._prev_failed, self._prev_name, self._prev_index = seen.failed, name, i
        return found

    def finish(self) -> Sequence[KeyNode]:
        return _NONE


class Recovery:
    """``recovery``: a call failed, then a different call succeeded at the same agent step.

    "Different" is another tool or other arguments; ``related`` is ``[failed, succeeded]``,
    pointing at the first failure that differs from the call that worked.
    """

    kind: KeyNodeKind = "recovery"
    __slots__ = ("_unresolved",)

    def __init__(self) -> None:
        self._unresolved: dict[Any, _Unresolved] = {}

    def observe(self, seen: Seen) -> Sequence[KeyNode]:
        if seen.type != "action_executed":
            return _NONE
        unresolved = self._unresolved
        if seen.failed:
            pending = unresolved.get(seen.label)
            if pending is None:
                unresolved[seen.label] = _Unresolved(seen.index, seen.event, seen.sig)
            elif pending.other is None and seen.sig != pending.sig:
                pending.other, pending.other_sig = (seen.index, seen.event), seen.sig
            return _NONE
        if not unresolved or not is_success(seen.status):
            return _NONE
        pending = unresolved.pop(seen.label, None)
        if pending is None:
            return _NONE
        if seen.sig != pending.sig:
            fixed = (pending.index, pending.event)
        elif pending.other is not None and seen.sig != pending.other_sig:
            fixed = pending.other
        else:
            return _NONE  # the same call that failed, now working: no change of course
        return (_recovery_node(fixed[1], fixed[0], seen),)

    def finish(self) -> Sequence[KeyNode]:
        return _NONE


class _Unresolved:
    """Failures at one step label not yet followed by a success there."""

    __slots__ = ("index", "event", "sig", "other", "other_sig")

    def __init__(self, index: int, event: Event, sig: tuple[str, str] | None) -> None:
        self.index, self.event, self.sig = index, event, sig
        # The first failure with other arguments, for when the success repeats the first call.
        self.other: tuple[int, Event] | None = None
        self.other_sig: tuple[str, str] | None = None


class Loop:
    """``loop``: the same tool with the same arguments ``LOOP_REPEATS`` or more times.

    In a row, or cycling with a few other calls between (at most ``LOOP_SPAN`` actions from
    one repetition to the next): A,A,A,A and A,x,A,x,A,x,A are loops; a file read four times
    over a long run is not. One node per loop, at its ``LOOP_REPEATS``-th call.

    Args:
        live: Report a loop as soon as its ``LOOP_REPEATS``-th call comes (the live watch)
            rather than when the run ends (replay, which then knows how long it ran).
    """

    kind: KeyNodeKind = "loop"
    __slots__ = ("live", "_chains", "_ended", "_ordinal", "_run_sig", "_run_len")

    def __init__(self, *, live: bool = False) -> None:
        self.live = live
        self._chains: dict[tuple[str, str], _Chain] = {}
        self._ended: list[_Chain] = []
        self._ordinal = 0  # actions so far
        self._run_sig: tuple[str, str] | None = None
        self._run_len = 0

    def observe(self, seen: Seen) -> Sequence[KeyNode]:
        if seen.type != "action_executed":
            return _NONE
        sig = seen.sig
        if sig is None:
            self._run_sig = None
            return _NONE
        self._ordinal += 1
        chain = self._chains.get(sig)
        if chain is not None and self._ordinal - chain.last <= LOOP_SPAN:
            chain.last = self._ordinal
            chain.indices.append(seen.index)
        else:
            if chain is not None and chain.at is not None:
                self._ended.append(chain)
            chain = self._chains[sig] = _Chain(sig[0], self._ordinal, seen.index)
        if sig == self._run_sig:
            self._run_len += 1
            if self._run_len == LOOP_REPEATS:
                chain.row = True
        else:
            self._run_sig, self._run_len = sig, 1
        if len(chain.indices) == LOOP_REPEATS:
            chain.at = seen.event
            if self.live:
                return (_loop_node(chain, LOOP_REPEATS),)
        return _NONE

    def finish(self) -> Sequence[KeyNode]:
        if self.live:
            return _NONE  # each loop was reported when it began
        chains = [*self._ended, *(c for c in self._chains.values() if c.at is not None)]
        return [_loop_node(chain, len(chain.indices)) for chain in chains]


class _Chain:
    """Repetitions of one call close enough together to be one loop."""

    __slots__ = ("name", "last", "indices", "row", "at")

    def __init__(self, name: str, ordinal: int, index: int) -> None:
        self.name = name
        self.last = ordinal  # the action ordinal of the latest repetition
        self.indices = [index]
        self.row = False  # LOOP_REPEATS of them came in a row
        self.at: Event | None = None  # the repetition that made it a loop


class Hesitation:
    """``hesitation``: the agent wavered between two actions at one step.

    It left an action it had just weighed as an alternative, or went A, B, A (back to the same
    call, or away from a B that failed). One node per pair of actions at a step; a longer
    A,B,A,B … grows the node instead of repeating it.
    """

    kind: KeyNodeKind = "hesitation"
    __slots__ = ("_weighing", "_last_at", "_found")

    def __init__(self) -> None:
        # per label, a decision that had alternatives
        self._weighing: dict[Any, dict[str, Any]] = {}
        # per label, the last two different actions run there (plain tuples: the hot path)
        # as (name, index, sig, failed, previous name, previous index, previous sig)
        self._last_at: dict[Any, tuple[str, int, Any, bool, str | None, int, Any]] = {}
        self._found: dict[tuple[Any, frozenset[str]], KeyNode] = {}

    def observe(self, seen: Seen) -> Sequence[KeyNode]:
        etype = seen.type
        if etype == "llm_decision":
            decision = seen.event.decision
            if decision and decision.get("alternatives"):
                self._weighing[seen.label] = decision
            return _NONE
        name = seen.name
        if etype != "action_executed" or name is None:
            return _NONE
        label, i, sig = seen.label, seen.index, seen.sig
        weighed = self._weighing.pop(label, None) if self._weighing else None
        decision = seen.event.decision
        if decision and decision.get("alternatives"):
            weighed = decision
        last = self._last_at.get(label)
        if last is None:
            self._last_at[label] = (name, i, sig, seen.failed, None, -1, None)
            return _NONE
        if last[0] == name:
            self._last_at[label] = (name, i, sig, seen.failed, last[4], last[5], last[6])
            return _NONE
        last_name, last_index, last_sig, last_failed, before, before_index, before_sig = last
        self._last_at[label] = (name, i, sig, seen.failed, last_name, last_index, last_sig)
        related: list[int] | None = None
        if weighed is not None and _wavered(weighed, last_name, name):
            related = [last_index, i]
        elif before == name and (sig == before_sig or last_failed):
            related = [before_index, last_index, i]  # A, B, A
        if related is None:
            return _NONE
        key = (label, frozenset((last_name, name)))
        node = self._found.get(key)
        if node is not None:
            node.related.append(i)
            return _NONE
        where = f" at {label}" if label is not None else ""
        text = f"wavered {_name(last_name, 15)} ↔ {_name(name, 15)}{where}"
        node = self._found[key] = _node(
            "hesitation", i, seen.event, text, action=name, related=related
        )
        return (node,)

    def finish(self) -> Sequence[KeyNode]:
        return _NONE


class Anomaly:
    """``anomaly``: an unusual status, a result flagged as odd, or output of an unexpected type.

    The type is the ``expected_type`` the result or the input named.
    """

    kind: KeyNodeKind = "anomaly"
    __slots__ = ()

    def observe(self, seen: Seen) -> Sequence[KeyNode]:
        ev = seen.event
        result = ev.result
        # Most results are plain successes and failures: only look closer at the rest.
        if not result or not (
            (seen.status is not None and seen.status not in KNOWN_STATUSES)
            or "anomaly" in result
            or "flagged" in result
            or "expected_type" in result
            or (ev.input and "expected_type" in ev.input)
        ):
            return _NONE
        reason = _anomaly(ev, result)
        if reason is None:
            return _NONE
        return (
            _node(
                "anomaly",
                seen.index,
                ev,
                reason,
                action=ev.action,
                error_type=_error_type(result),
            ),
        )

    def finish(self) -> Sequence[KeyNode]:
        return _NONE


class Dissatisfaction:
    """``dissatisfaction``: a negative feedback score, or complaint words in English or Chinese.

    In feedback or user input; ``related`` is ``[the last tool call, this event]``.
    """

    kind: KeyNodeKind = "dissatisfaction"
    __slots__ = ("_last_action", "_last_index")

    def __init__(self) -> None:
        self._last_action: str | None = None
        self._last_index = -1

    def observe(self, seen: Seen) -> Sequence[KeyNode]:
        etype = seen.type
        if etype == "action_executed":
            self._last_action, self._last_index = seen.name, seen.index
            return _NONE
        if etype != "feedback" and etype != "user_input":
            return _NONE
        reason = _dissatisfaction(seen.event)
        if reason is None:
            return _NONE
        i, last = seen.index, self._last_index
        return (
            _node(
                "dissatisfaction",
                i,
                seen.event,
                reason,
                action=self._last_action,
                related=[last, i] if last >= 0 else [],
            ),
        )

    def finish(self) -> Sequence[KeyNode]:
        return _NONE


class Handoff:
    """``handoff``: the turn passed from one agent to another (who asked whom, what came back).

    Agents are read from ``agent_state.agent`` of the events where an agent speaks (a
    decision or a user input); a run that never names two agents has none.
    """

    kind: KeyNodeKind = "handoff"
    __slots__ = ("_agent", "_index")

    def __init__(self) -> None:
        self._agent: str | None = None
        self._index = -1

    def observe(self, seen: Seen) -> Sequence[KeyNode]:
        etype = seen.type
        if etype != "llm_decision" and etype != "user_input":
            return _NONE
        state = seen.event.agent_state
        agent = state.get("agent") if state else None
        if not isinstance(agent, str) or not agent:
            return _NONE
        before, i = self._agent, seen.index
        self._agent = agent
        prev, self._index = self._index, i
        if before is None or before == agent:
            return _NONE
        return (
            _node(
                "handoff",
                i,
                seen.event,
                f"{_name(before, 22)} → {_name(agent, 22)}",
                action=seen.name,
                related=[prev, i],
            ),
        )

    def finish(self) -> Sequence[KeyNode]:
        return _NONE


#: Every detector replay runs, in the order its nodes are listed at one step.
DETECTORS: tuple[Callable[[], Detector], ...] = (
    FirstFailure,
    ConsecutiveFailures,
    Recovery,
    Loop,
    Hesitation,
    Anomaly,
    Dissatisfaction,
    Handoff,
)
#: The kinds the live watch reports during the run: each can start a local review (most
#: telling first: a review of several names the first).
LIVE_KINDS: tuple[KeyNodeKind, ...] = ("consecutive_failures", "dissatisfaction", "loop")

_KIND_OF: dict[Callable[[], Detector], KeyNodeKind] = {f: f().kind for f in DETECTORS}
_KIND_ORDER: dict[str, int] = {kind: n for n, kind in enumerate(_KIND_OF.values())}


def _detect(events: list[Event]) -> list[KeyNode]:
    """One pass over the ordered events running every detector (indices into ``events``)."""
    detectors = [factory() for factory in DETECTORS]
    observers = [d.observe for d in detectors]
    nodes: list[KeyNode] = []
    for i, ev in enumerate(events):
        seen = Seen(i, ev)
        for observe in observers:
            found = observe(seen)
            if found:
                nodes.extend(found)
    for detector in detectors:
        nodes.extend(detector.finish())
    for node in nodes:
        if len(node.related) > _RELATED_MAX:
            half = _RELATED_MAX // 2
            node.related = node.related[:half] + node.related[-half:]
    nodes.sort(key=lambda k: (k.index, _KIND_ORDER[k.kind]))
    return nodes


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


def _loop_node(chain: _Chain, times: int) -> KeyNode:
    how = "in a row" if chain.row else "in the run"
    ev = chain.at
    assert ev is not None
    return _node(
        "loop",
        chain.indices[LOOP_REPEATS - 1],
        ev,
        f"{_name(chain.name)} ×{times} same args {how}",
        action=chain.name,
        error_type=_error_type(ev.result or {}),
        related=list(chain.indices),
    )


def _recovery_node(bad: Event, failed_index: int, seen: Seen) -> KeyNode:
    good = seen.event
    bad_name, good_name = bad.action, good.action
    if bad_name == good_name:
        changed = _changed_args(bad.input, good.input)
        text = f"{_name(good_name)} ok with {changed}" if changed else f"{_name(good_name)} ok"
    else:
        text = f"{_name(good_name, 18)} ok after {_name(bad_name, 18)} failed"
    return _node(
        "recovery",
        seen.index,
        good,
        text,
        action=good_name,
        error_type=_error_type(bad.result or {}),
        related=[failed_index, seen.index],
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


_USER_TEXT_KEYS = ("text", "message", "content", "comment")


def _user_text(inp: dict[str, Any]) -> str:
    for key in _USER_TEXT_KEYS:
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
    if is_failure(status):
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


# -- many agents ------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class TeamChronicle(Chronicle):
    """The chronicle of a run where several agents took turns: who did each step, and what
    each agent's key nodes are."""

    step_agents: list[str | None] = field(default_factory=list)
    """The agent of each step (parallel to ``steps``): who spoke, or whose tool call it was."""
    agents: dict[str, list[KeyNode]] = field(default_factory=dict)
    """Each agent (in order of first appearance) -> the key nodes at its steps; a handoff is
    listed under the agent who took over."""
    roles: dict[str, str] = field(default_factory=dict)
    """Agent -> role, for events that named one (``agent_state.role``)."""


def _team_chronicle(
    task: Task,
    steps: list[Step],
    nodes: list[KeyNode],
    events: list[Event],
    count: int,
    compressed: bool,
) -> TeamChronicle:
    step_agents: list[str | None] = []
    roles: dict[str, str] = {}
    agents: dict[str, list[KeyNode]] = {}
    for ev in events:
        state = ev.agent_state or {}
        agent = state.get("agent")
        agent = agent if isinstance(agent, str) and agent else None
        step_agents.append(agent)
        if agent is not None:
            agents.setdefault(agent, [])
            role = state.get("role")
            if isinstance(role, str) and role:
                roles.setdefault(agent, role)
    for node in nodes:
        owner = step_agents[node.index]
        if owner is not None:
            agents[owner].append(node)
    # A reviewer reading the steps must see who did each one: the agent leads the summary.
    for step, agent in zip(steps, step_agents, strict=True):
        if agent is not None:
            step.summary = _clip(f"{agent}: {step.summary}", STEP_SUMMARY_MAX)
    return TeamChronicle(
        task=task,
        steps=steps,
        key_nodes=nodes,
        event_count=count,
        compressed=compressed,
        step_agents=step_agents,
        agents=agents,
        roles=roles,
    )


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
    etype = ev.type
    inp = ev.input
    if inp is not None:
        inp = _said(inp) if etype == "user_input" or etype == "feedback" else _bound(inp)
    return Step(
        index=index,
        event_id=ev.event_id,
        type=etype,
        action=ev.action,
        status=_status(result),
        step=None if label is None else str(label),
        summary=_summarize(ev),
        error_type=_error_type(result) if result else None,
        input=inp,
        context=_bound(ev.context) if ev.context is not None else None,
        output=_output(ev),
    )


def _said(inp: dict[str, Any]) -> dict[str, Any]:
    """A user input or feedback, bounded, its words kept up to ``DETAIL_TEXT_MAX``."""
    out = _bound(inp)
    for key in _USER_TEXT_KEYS:
        value = inp.get(key)
        if isinstance(value, str) and len(value) > _TEXT_MAX:
            out[key] = _cut(value, DETAIL_TEXT_MAX)
    return out


def _output(ev: Event) -> Any:
    """What came out of a step: a decision's text, a tool's output, its error message.

    A decision's output is the text the model wrote (its reply). A call that did not succeed
    and carries an ``error_message`` has ``{"error_message": …}`` as its output (with
    ``"output"`` beside it when it also returned one): the error is what came out of it.
    """
    if ev.type == "llm_decision" and ev.decision:
        text = _decision_text(ev.decision)
        if text:
            return _cut(text, DETAIL_TEXT_MAX)
    result = ev.result
    if not result:
        return None
    out = result.get("output")
    message = result.get("error_message")
    if isinstance(message, str) and message and not is_success(result.get("status")):
        error = _cut(message, DETAIL_TEXT_MAX)
        if out is None:
            return {"error_message": error}
        return {"output": _bound(out), "error_message": error}
    return None if out is None else _bound(out)


def step_detail(step: Step) -> str:
    """What a reviewer reads of a step beyond its summary; ``""`` when the summary says it all.

    One or more lines: the user's words, the agent's reply, a tool call's arguments
    (``args: …``), its error message in full (``error: …``) or the gist of its output
    (``output: …``), each bounded (``DETAIL_TEXT_MAX``, ``DETAIL_ARGS_MAX``,
    ``DETAIL_OUTPUT_MAX``).
    """
    lines: list[str] = []
    etype = step.type
    if etype == "user_input" or etype == "feedback":
        text = _user_text(step.input or {})
        if text:
            lines.append(_cut(text, DETAIL_TEXT_MAX))
    elif etype == "llm_decision":
        if isinstance(step.output, str) and step.output:
            lines.append(_cut(step.output, DETAIL_TEXT_MAX))
    else:
        if step.input and (step.action or "args" in step.input):
            args = _args(step.input)
            if args not in (None, "", {}, []):
                lines.append("args: " + _compact(args, DETAIL_ARGS_MAX))
        out = step.output
        if isinstance(out, dict) and "error_message" in out and not is_success(step.status):
            error = _cut(str(out["error_message"]), DETAIL_TEXT_MAX)
            lines.append(
                f"error: {step.error_type}: {error}" if step.error_type else f"error: {error}"
            )
            out = out.get("output")
        if out not in (None, "", {}, []):
            lines.append("output: " + _compact(out, DETAIL_OUTPUT_MAX))
    detail = "\n".join(lines)
    if detail and " ".join(detail.split()) in step.summary:
        return ""  # short enough to be in the summary whole
    return detail


def _decision_text(decision: dict[str, Any]) -> str:
    """The text a model wrote with its decision: its reply, or its reasons."""
    for key in ("message", "content", "text", "reasoning", "rationale"):
        value = decision.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return ""


def _compact(value: Any, limit: int) -> str:
    """A value as text of at most ``limit`` characters: text as is, the rest as compact JSON."""
    if isinstance(value, str):
        return _cut(value, limit)
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):  # circular, or keys JSON cannot hold
        text = repr(value)
    return _cut(text, limit)


def _cut(text: str, limit: int) -> str:
    """At most ``limit`` characters of ``text``, lines kept, ending in "…" when cut."""
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


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
            if not why and is_failure(status):
                why = _text(result.get("error_message"))
            tail = " " + _clip(f"-> {status} {why}" if why else f"-> {status}", 39)
        name = _clip(ev.action or "action", 30)
        budget = STEP_SUMMARY_MAX - len(tail) - len(name) - 2
        head = f"{name}({_args_text(_args(inp), budget)})"
        return _clip(head, STEP_SUMMARY_MAX - len(tail)) + tail
    if etype == "llm_decision":
        decision = ev.decision or {}
        chosen = decision.get("chosen_action")
        if chosen is None or chosen == "reply":
            said = _decision_text(decision)
            if said:
                return _clip(f"reply: {said}", STEP_SUMMARY_MAX)
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
        # Decoded at once: keeping thousands of orjson's bytes objects alive costs more than
        # the dumps itself.
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
