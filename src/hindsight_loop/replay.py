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

import gc
import json
import math
import re
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import groupby, islice
from operator import attrgetter
from typing import Any, Protocol

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
    "PROJECTION_VERSION",
    "STEP_SUMMARY_MAX",
    "AnomalyWatch",
    "Detector",
    "Seen",
    "StoredRun",
    "TeamChronicle",
    "local_window",
    "run_language",
    "looks_dissatisfied",
    "no_gc",
    "project",
    "event_projection",
    "project_body",
    "project_json",
    "projected",
    "read_projection",
    "stored_projection",
    "unstored",
    "wire_timestamp",
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
# When a compressed chronicle's key nodes alone would overflow its budget (hundreds of the same
# recovery or complaint), each group of like nodes keeps as many of its first occurrences as fit
# (at least ``_FOLD_FIRST``) and its last; the first counts the others (``repeats``). A reviewer
# learns nothing from the 300th copy, and keeping them all kept thousands of steps.
_FOLD_FIRST = 2
#: Kinds never folded: there is one of each per run, or each one matters (a turn passing).
_NEVER_FOLD = frozenset({"first_failure", "handoff"})

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
    # Every pattern below starts with one of these characters: checked first, the lookahead
    # turns most positions away at once instead of trying each pattern there (several times
    # faster on a line of text; the same matches, at the same places).
    "(?=[wnadisutgf错不没怎又还搞弄答浪白垃说])(?:"
    + "|".join(
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
    )
    + ")",
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
        events: Its events, in any order; they are ordered by (timestamp, seq). A ``StoredRun``
            (``store.stored_run(task_id)``) is read from its projection: only the bodies of the
            steps the chronicle shows are decoded.
        max_steps: A run with more events than this is compressed: every key node, its related
            steps, its neighbours (while they fit) and the first and last few steps are kept, the
            rest dropped. Key nodes are kept, so this is a target, not a hard cap; only when
            their steps alone overflow it does each group of like nodes (the same kind, tool,
            error, agent and, for a recovery, failed tool) keep as many of its first as fit (two
            at least) and its last, the first counting the others (``KeyNode.repeats``).

    Returns:
        The chronicle. ``KeyNode.index``, ``KeyNode.related`` and ``Step.index`` are all
        positions in ``chronicle.steps`` (``chronicle.steps[i].index == i``), which reflectors
        rely on. Without compression that is also the position in the run; after compression,
        find a step of the run by its ``event_id``.
    """
    if max_steps < 1:
        raise ValueError(f"max_steps must be at least 1, got {max_steps}")
    with no_gc():
        return _replay(task, events, max_steps)


@contextmanager
def no_gc() -> Iterator[None]:
    """The cyclic garbage collector paused for a replay (or a store's read of a run).

    A replay allocates tens of thousands of containers (projections, decoded bodies, steps)
    that all live until it returns and form no cycles: every collection they trigger on the way
    only walks them again (and a full one walks the whole process). Reference counting frees
    what they drop as before; collection resumes at the end. Left as it was when the caller had
    paused it (a pause another thread makes meanwhile ends with the replay's: the collector is
    one per process).
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _replay(task: Task, events: Sequence[Event], max_steps: int) -> Chronicle:
    if isinstance(events, StoredRun) and events.ordered():
        run = events
    else:
        # Events in memory (or a stored run whose timestamps the store cannot order): their
        # projections are worked out here, by the same function the store uses at write time.
        run = StoredRun.of(_order(list(events)))
    n = len(run)
    nodes = _detect(run)
    if n > max_steps:
        nodes = _fold(n, nodes, max_steps, run)
        kept = _compress(n, nodes, max_steps)
    else:
        kept = list(range(n))
    run.prefetch(kept)  # one read for the bodies of every step shown
    for node in nodes:
        if not node.event_id:  # found from the projection alone: its id is in the body
            node.event_id = run[node.index].event_id
    if n > max_steps:
        position = {old: new for new, old in enumerate(kept)}
        for node in nodes:
            node.index = position[node.index]
            node.related = [position[r] for r in node.related]
    steps = [_step(new, run[old]) for new, old in enumerate(kept)]
    chronicle: Chronicle
    if any(node.kind == "handoff" for node in nodes):
        # Only a run whose turn passed between agents pays for the per-agent view.
        events_kept = [run[old] for old in kept]
        chronicle = _team_chronicle(task, steps, nodes, events_kept, n, len(steps) < n)
    else:
        chronicle = Chronicle(
            task=task, steps=steps, key_nodes=nodes, event_count=n, compressed=len(steps) < n
        )
    # Freed now, while collection is paused: the caller still holds the run, and the first
    # collection after the pause would otherwise walk its thousands of projections and bodies.
    run.release()
    if isinstance(events, StoredRun) and events is not run:
        events.release()
    return chronicle


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

    __slots__ = ("_count", "_routes")

    def __init__(self) -> None:
        self._count = 0
        detectors: list[Detector] = [
            Loop(live=True) if factory is Loop else factory()
            for factory in DETECTORS
            if _KIND_OF[factory] in LIVE_KINDS
        ]
        self._routes = _Routes(detectors)

    @property
    def count(self) -> int:
        """How many events the watch has observed."""
        return self._count

    def observe(
        self,
        event: Event | None,
        projection: list[Any] | None = None,
        *,
        source: EventSource | None = None,
    ) -> list[KeyNode]:
        """Take the next event of the task; return the anomalies it completes (usually none).

        ``projection``: the event's, when the caller has it (``read_projection`` of the row the
        recorder made): it is not worked out again. With it, ``event`` may be None and
        ``source`` give the event only if a rule reads more than the projection (to word a
        key node): the writer's live rules build no event for the calls that complete none.
        """
        if projection is None:
            assert event is not None, "observe needs an event or its projection"
            p = _event_projection(event) or _bare(event)
        else:
            p = projection
        seen = Seen(self._count, event, projection=p, run=source)
        self._count += 1
        found: list[KeyNode] = []
        etype, flags = p[1], p[7]
        observers = self._routes.get((etype, flags) if flags else etype)
        if observers is None:
            observers = self._routes.of(etype, flags)
        for observe in observers:
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
    "错了",
    "搞错",
    "弄错",
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


# The hints as one pattern of plain literals: one scan of the text instead of one per hint (the
# recorder runs it on every user turn). Grouped by first character ("n(?:'t|ever|ot )"): at each
# position of the text re tries one branch per first character rather than one per hint, 3.1 ->
# 2.0 µs over a 100-character turn. Only whether one matches is read.
_HINTED = re.compile(
    "|".join(
        re.escape(first) + "(?:" + "|".join(re.escape(h[1:]) for h in hints) + ")"
        for first, hints in groupby(sorted(_COMPLAINT_HINTS), key=lambda h: h[0])
    )
)


def _complaint(text: str) -> re.Match[str] | None:
    if _HINTED.search(text.lower()) is None:
        return None
    return _COMPLAINT.search(text.replace("’", "'"))  # same length, so match offsets hold


# -- ordering ---------------------------------------------------------------------------------


def _order(events: Sequence[Event]) -> list[Event]:
    """Events by (timestamp, seq); stable, so exact ties keep the order they came in."""
    # Wire timestamps (``2024-11-20T14:32:10.882Z``) sort correctly as strings, which is far
    # cheaper than parsing; anything else (offsets, missing milliseconds) is parsed.
    for ev in events:
        if not wire_timestamp(ev.timestamp):
            return sorted(events, key=_parsed_order)
    return sorted(events, key=_WIRE_ORDER)


def wire_timestamp(ts: Any) -> bool:
    """Whether a timestamp is in the wire format (``2024-11-20T14:32:10.882Z``): such timestamps
    sort correctly as text, so a store's order of them is replay's."""
    return type(ts) is str and len(ts) == 24 and ts[23] == "Z" and ts[19] == "."


def _parsed_order(ev: Event) -> tuple[datetime, int]:
    try:
        return parse_ts(ev.timestamp), ev.seq
    except (ValueError, TypeError, OverflowError):
        # An unreadable timestamp should not sink the whole replay; such a step goes first.
        return _EPOCH, ev.seq


# -- the projection: what replay reads of every event -----------------------------------------

#: Bumped whenever ``project`` would answer differently for some event (a rule changed): rows
#: stored with another version are read from their bodies, as if they had none.
PROJECTION_VERSION = 1

# Bits of a projection's flags.
_ODD = 1  # the Anomaly detector must read the body (unusual status, flagged, expected type)
_UNHAPPY = 2  # a user input or feedback the Dissatisfaction rule finds unhappy

_BODY_PARTS = ("agent_state", "context", "input", "decision", "result")


def project(etype: str, body: dict[str, Any]) -> list[Any] | None:
    """What the key-node detectors read of one event, as a small JSON-able list.

    ``[version, type, status, tool, step label, call signature, weighed alternatives, flags,
    agent, error type]``, or None for an event whose parts are not JSON objects (replay then
    reads its body). It is ``stored_projection`` with the type and the defaults it leaves out.

    Args:
        etype: The event's type.
        body: Its stored body: ``agent_state``, ``input``, ``decision``, ``result`` and any
            other top-level fields (``score``).
    """
    p = stored_projection(etype, body)
    return None if p is None else _unstored(etype, p)


# The projection's fields after the type, as ``stored_projection`` leaves them out at its end.
_TAIL = (None, None, None, None, None, 0, None, None)
_BARE_JSON = b"[%d]" % PROJECTION_VERSION
# _TAIL's end that completes a stored projection once its type is back in: by its length then.
_PAD = tuple(_TAIL[max(0, n - 2) :] for n in range(len(_TAIL) + 3))


def stored_projection(etype: str, body: dict[str, Any]) -> list[Any] | None:
    """``project`` as stored: without the type (the row has it) and the trailing fields that
    hold their defaults (``[version]`` alone for most state changes and user turns).

    The recorder computes it once, at write time, from the sanitized payload it has in hand
    (``Recorder._row``; stored only when redaction left the body as that payload, so it is
    the projection of the stored body); a store computes it from the decoded event for rows
    that come without one; replay computes it for events in memory and for rows stored
    without one. Always this one function, so a chronicle read from projections is the
    chronicle of the full events. On the writer's hot path: plain lookups, one checksum per
    tool call, the complaint rule on user turns only, every byte left out that can be.
    """
    get = body.get
    state, inp, decision, result = get("agent_state"), get("input"), get("decision"), get("result")
    if (
        (state is not None and type(state) is not dict)
        or (inp is not None and type(inp) is not dict)
        or (decision is not None and type(decision) is not dict)
        or (result is not None and type(result) is not dict)
    ):
        return None
    status = error_type = None
    flags = 0
    if result:
        raw = result.get("status")
        status = raw.strip().lower() if isinstance(raw, str) else None  # normal_status, inlined
        error = result.get("error_type")
        error_type = None if error is None else str(error)
        if (
            (status is not None and status not in KNOWN_STATUSES)
            or "anomaly" in result
            or "flagged" in result
            or "expected_type" in result
            or (inp and "expected_type" in inp)
        ):
            flags = _ODD
    name = label = sig = weigh = None
    if etype == "action_executed" or etype == "llm_decision":
        label = state.get("current_step") if state else None
        if label is not None and not isinstance(label, str):
            label = _hashable(label)
        if etype == "action_executed":
            name = inp.get("tool") if inp else None
            if not isinstance(name, str):
                chosen = decision.get("chosen_action") if decision else None
                name = chosen if isinstance(chosen, str) else None
            if name is not None:
                sig = _sig(name, inp)
        if decision:
            alternatives = decision.get("alternatives")
            if alternatives:
                # All the Hesitation rule compares: actions are names (text), so only text
                # can match.
                chosen = decision.get("chosen_action")
                weigh = [
                    chosen if isinstance(chosen, str) else None,
                    [a for a in alternatives if isinstance(a, str)]
                    if isinstance(alternatives, list)
                    else None,
                ]
    elif (etype == "feedback" or etype == "user_input") and _dissatisfaction(
        etype, inp, get("score")
    ):
        flags |= _UNHAPPY
    agent = state.get("agent") if state else None
    if not isinstance(agent, str) or not agent:
        agent = None
    v = PROJECTION_VERSION
    if error_type is not None:
        return [v, status, name, label, sig, weigh, flags, agent, error_type]
    if agent is not None:
        return [v, status, name, label, sig, weigh, flags, agent]
    if flags:
        return [v, status, name, label, sig, weigh, flags]
    if weigh is not None:
        return [v, status, name, label, sig, weigh]
    if sig is not None:
        return [v, status, name, label, sig]
    if label is not None:
        return [v, status, name, label]
    if name is not None:
        return [v, status, name]
    if status is not None:
        return [v, status]
    return [v]


def project_json(etype: str, body: dict[str, Any]) -> bytes | None:
    """``stored_projection`` as the JSON the store keeps beside the body; None when there is
    none."""
    return projected(etype, body)[1]


def projected(etype: str, body: dict[str, Any]) -> tuple[list[Any] | None, bytes | None]:
    """``stored_projection`` and ``project_json`` of one body, worked out once: the writer
    stores the JSON and hands the value to the live rules (``unstored`` of it is what
    ``read_projection`` reads back from the JSON)."""
    try:
        got = stored_projection(etype, body)
    except Exception:  # noqa: BLE001 - a body replay cannot project is read whole instead
        return None, None
    if got is None:
        return None, None
    return got, _BARE_JSON if len(got) == 1 else orjson.dumps(got)


def unstored(etype: str, p: list[Any]) -> list[Any]:
    """A stored projection with its type and trailing defaults back."""
    return [p[0], etype, *p[1:], *_TAIL[len(p) - 1 :]]


_unstored = unstored


def read_projection(etype: str, raw: bytes | str | None) -> list[Any] | None:
    """A stored projection (``project_json``) as ``project`` gives it; None for none, or one
    of another version."""
    if not raw:
        return None
    p = orjson.loads(raw)
    return _unstored(etype, p) if p[0] == PROJECTION_VERSION else None


def project_body(etype: str, body: bytes | str) -> bytes | None:
    """``project_json`` of a stored body (JSON text): for rows written without a projection."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return project_json(etype, data) if type(data) is dict else None


def _event_projection(ev: Event, *, stored: bool = False) -> list[Any] | None:
    body: dict[str, Any] = {
        "agent_state": ev.agent_state,
        "input": ev.input,
        "decision": ev.decision,
        "result": ev.result,
    }
    if ev.extra and "score" in ev.extra:
        body["score"] = ev.extra["score"]
    return stored_projection(ev.type, body) if stored else project(ev.type, body)


def event_projection(ev: Event) -> bytes | None:
    """``project_json`` of an event in memory (a store copy, an import)."""
    try:
        got = _event_projection(ev, stored=True)
        return None if got is None else orjson.dumps(got)
    except Exception:  # noqa: BLE001 - see project_json
        return None


def _sig(name: str, inp: dict[str, Any] | None) -> int:
    """A call's signature: equal for the same tool with equal arguments (whatever key order).

    Two checksums of ``(tool, _args_key)`` side by side, 64 bits: a cryptographic hash cost the
    writer ~4x more per call, and only equality within one run matters here.
    """
    # The arguments as _args_key reads them, in orjson's plain (faster) mode where it can.
    if not inp or ("args" not in inp and len(inp) == 1 and "tool" in inp):
        key = b""
    else:
        args = inp["args"] if "args" in inp else {k: v for k, v in inp.items() if k != "tool"}
        try:
            key = orjson.dumps(args, option=orjson.OPT_SORT_KEYS)
        except TypeError:  # keys JSON cannot hold, odd values (an event in memory)
            key = _args_key(inp).encode()
    seeds = _SIG_SEEDS.get(name)
    if seeds is None:
        head = name.encode() + b"\x00"
        seeds = (zlib.crc32(head), zlib.adler32(head))
        if len(_SIG_SEEDS) < 4096:  # a run's tool names: a handful (bounded all the same)
            _SIG_SEEDS[name] = seeds
    crc, adler = seeds
    if len(key) <= _SIG_CHUNK:
        return zlib.crc32(key, crc) << 32 | zlib.adler32(key, adler)
    # zlib lets go of the GIL over a buffer of more than 5 KB; the thread then waits its turn
    # to take it back behind every busy thread (the agent's spill under overload waited up to
    # 2 s over a batch of 14 KB events). Chunks below that keep it: the checksums chain.
    view = memoryview(key)
    for i in range(0, len(key), _SIG_CHUNK):
        part = view[i : i + _SIG_CHUNK]
        crc, adler = zlib.crc32(part, crc), zlib.adler32(part, adler)
    return crc << 32 | adler


# Each tool name's checksums, where a signature's start from (the name, then the arguments).
_SIG_SEEDS: dict[str, tuple[int, int]] = {}
_SIG_CHUNK = 4096  # under zlib's 5 KB threshold for releasing the GIL


class StoredRun(Sequence[Event]):
    """A task's events as replay reads them: every event's projection at once, bodies on demand.

    A store builds it from one cheap read of the projection column (``store.stored_run``);
    replay decodes only the bodies of the steps it shows. Indexing gives the full ``Event``
    (decoded once, then kept until ``release``, which replay calls when its chronicle is
    built), so it is also a plain sequence of the run's events.

    Args:
        keys: Each event's key in the store, in (timestamp, seq) order.
        types: Each event's type.
        projections: Each event's stored projection (``project_json``), or None (or "")
            where it has none (written before projections existed): those are decoded.
        load: Reads the events of some keys: ``{key: Event}``.

    A store keeps a projection only beside a timestamp in the wire format, so the store's
    (timestamp, seq) order of the events with one is replay's; the others are decoded, and one
    odd timestamp among them makes replay decode and order the whole run itself (``ordered``).
    """

    __slots__ = (
        "_keys",
        "_types",
        "_projections",
        "_load",
        "_events",
        "read_keys",
        "_later",
        "_read",
        "_ordered",
    )

    def __init__(
        self,
        keys: list[Any],
        types: list[str],
        projections: list[Any],
        load: Callable[[list[Any]], dict[Any, Event]],
    ) -> None:
        self._keys = keys
        self._types = types
        self._projections = projections
        self._load = load
        self._events: list[Event | None] = [None] * len(keys)
        #: The keys of every body decoded so far, in the order read.
        self.read_keys: list[Any] = []
        self._later: list[tuple[Sequence[int], Callable[[], None]]] = []
        self._read: list[list[Any]] | None = None
        self._ordered = True

    @classmethod
    def from_rows(cls, rows: list[Any], load: Callable[[list[Any]], dict[Any, Event]]) -> StoredRun:
        """A run from a store's ``(key, type, projection)`` rows, in (timestamp, seq) order."""
        keys, types, projections = zip(*rows, strict=True) if rows else ((), (), ())
        return cls(list(keys), list(types), list(projections), load)

    @classmethod
    def of(cls, events: list[Event]) -> StoredRun:
        """A run of events already in memory, in the order given."""
        run = cls(
            list(range(len(events))), [e.type for e in events], [None] * len(events), _no_load
        )
        run._events = list(events)
        return run

    def __len__(self) -> int:
        return len(self._keys)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        ev = self._events[i]
        if ev is None:
            self.prefetch([i])
            ev = self._events[i]
            if ev is None:
                raise LookupError(f"event {self._keys[i]!r} is no longer in the store")
        return ev

    def prefetch(self, positions: Iterable[int]) -> None:
        """Decode the events at these positions (those not decoded yet) in one read."""
        events = self._events
        missing = [i for i in positions if events[i] is None]
        if not missing:
            return
        keys = self._keys
        wanted = [keys[i] for i in missing]
        self.read_keys += wanted
        got = self._load(wanted)
        for i in missing:
            events[i] = got.get(keys[i])

    def ordered(self) -> bool:
        """Whether the store's order is replay's (every timestamp in the wire format)."""
        self.projections()
        return self._ordered

    def projections(self) -> list[list[Any]]:
        """Every event's projection, in order (computed from the body where none is stored);
        read once. Equal projections may be one shared list: read them, do not change them."""
        if self._read is not None:
            return self._read
        out: list[Any] = []
        append = out.append
        loads, version, events, pad = orjson.loads, PROJECTION_VERSION, self._events, _PAD
        missing = []
        # Decisions, user turns, state changes … repeat the same few projections over a run:
        # each is parsed once and shared (the detectors only read them). A tool call's carries
        # its call signature, and repeats far less.
        same: dict[tuple[str, Any], list[Any]] = {}
        for i, (etype, raw) in enumerate(zip(self._types, self._projections, strict=True)):
            if raw:
                shared = etype != "action_executed"
                if shared:
                    p = same.get((etype, raw))
                    if p is not None:
                        append(p)
                        continue
                p = loads(raw)
                if p is not None and p[0] == version:
                    # _unstored, in place (the list is this call's own): the type after the
                    # version, then the defaults the store left out.
                    p.insert(1, etype)
                    if len(p) < 11:
                        p += pad[len(p)]
                    if shared:
                        same[(etype, raw)] = p
                    append(p)
                    continue
            missing.append(i)
            append(None)
        if missing:
            self.prefetch(missing)
            for i in missing:
                ev = events[i]
                p = _event_projection(ev) if ev is not None else None
                # Not projectable (odd parts): the detectors see an event with nothing to
                # report but its type, as they did when they read such a body.
                out[i] = p if p is not None else _bare(ev)
                if ev is not None and not wire_timestamp(ev.timestamp):
                    self._ordered = False
        self._read = out
        return out

    def release(self) -> None:
        """Let go of the projections and of the bodies decoded from the store (read again if
        asked for again): a replay is done with them, and its chronicle keeps none of them."""
        self._read = None
        if self._load is not _no_load:
            self._events = [None] * len(self._keys)

    def event_id(self, i: int) -> str:
        ev = self._events[i]
        return ev.event_id if ev is not None else ""

    def when_read(self, positions: Sequence[int], then: Callable[[], None]) -> None:
        """Run ``then`` once the events at ``positions`` are decoded: now if they are, else at
        ``settle`` (which reads all that is waited for in one go, not one event at a time)."""
        events = self._events
        if all(events[i] is not None for i in positions):
            then()
        else:
            self._later.append((positions, then))

    def settle(self) -> None:
        """Decode what ``when_read`` waits for, and run what waited."""
        later, self._later = self._later, []
        self.prefetch(i for positions, _ in later for i in positions)
        for _, then in later:
            then()


def _no_load(keys: list[Any]) -> dict[Any, Event]:
    return {}


def _bare(ev: Event | None) -> list[Any]:
    etype = ev.type if ev is not None else "unknown"
    return [PROJECTION_VERSION, etype, None, None, None, None, None, 0, None, None]


# -- key nodes: one detector per kind ---------------------------------------------------------


class EventSource(Protocol):
    """Where a ``Seen`` without its event in hand reads it: a ``StoredRun`` (decoded from the
    store), or a row the writer just wrote (``triggers``)."""

    def __getitem__(self, i: int) -> Event:
        """The event at run position ``i``."""
        ...

    def event_id(self, i: int) -> str:
        """Its id, or "" until its body is read."""
        ...

    def when_read(self, positions: Sequence[int], then: Callable[[], None]) -> None:
        """Run ``then`` once the events at ``positions`` can be read."""
        ...


class Seen:
    """One event as the detectors read it: its projection, shared by them all.

    The full event (``event``) is decoded only when a detector needs more than the projection
    says, to word a key node.
    """

    __slots__ = (
        "index",
        "type",
        "status",
        "name",
        "label",
        "sig",
        "failed",
        "weigh",
        "flags",
        "agent",
        "error_type",
        "_event",
        "_run",
    )

    def __init__(
        self,
        index: int,
        event: Event | None = None,
        *,
        projection: list[Any] | None = None,
        run: EventSource | None = None,
    ) -> None:
        self.index = index
        self._event = event
        self._run = run
        p = projection
        if p is None:
            assert event is not None, "Seen needs an event or a projection"
            p = _event_projection(event) or _bare(event)
        #: The event's type.
        etype = self.type = p[1]
        #: The result's status as the rule reads it (``normal_status``), or None.
        self.status: str | None = p[2]
        #: The tool a call ran (``input.tool``, else the decision's chosen action).
        self.name: str | None = p[3]
        #: The agent's ``current_step``, usable as a dict key.
        self.label: Any = p[4]
        #: Equal calls (tool and arguments) have equal signatures.
        self.sig: int | None = p[5]
        #: ``[chosen, alternatives]`` of a decision that weighed alternatives.
        self.weigh: list[Any] | None = p[6]
        self.flags: int = p[7]
        #: The agent that spoke (``agent_state.agent``).
        self.agent: str | None = p[8]
        self.error_type: str | None = p[9]
        # The status is normal_status already: is_failure's own set, without normalizing twice.
        self.failed = etype == "action_executed" and p[2] in FAILED_STATUSES

    @property
    def event(self) -> Event:
        """The full event (decoded from the store on first use)."""
        ev = self._event
        if ev is None:
            assert self._run is not None
            ev = self._event = self._run[self.index]
        return ev

    def when_read(self, positions: Sequence[int], then: Callable[[], None]) -> None:
        """Run ``then`` once the events of the run at ``positions`` are decoded (now, for an
        event in hand)."""
        if self._run is None:
            then()
        else:
            self._run.when_read(positions, then)

    @property
    def event_id(self) -> str:
        """The event's id when its body is at hand, else "" (filled in once it is read)."""
        ev = self._event
        if ev is not None:
            return ev.event_id
        return self._run.event_id(self.index) if self._run is not None else ""


class Detector(Protocol):
    """Finds the key nodes of one kind in one run, fed its events in order."""

    kind: KeyNodeKind
    #: The event types it reads (None: all); it is fed only those, in order (``observe`` does
    #: not check them again: thousands of calls per run).
    types: frozenset[str] | None
    #: When not 0, it is fed only events whose projection has this flag.
    flag: int

    def observe(self, seen: Seen) -> Sequence[KeyNode]:
        """The key nodes this event completes (usually none)."""
        ...

    def finish(self) -> Sequence[KeyNode]:
        """The key nodes only the end of the run settles (a loop's full length)."""
        ...


_NONE: tuple[KeyNode, ...] = ()
_ACTION = frozenset({"action_executed"})


class FirstFailure:
    """``first_failure``: the first tool call that failed."""

    kind: KeyNodeKind = "first_failure"
    types: frozenset[str] | None = _ACTION
    flag: int = 0
    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen = False

    def observe(self, seen: Seen) -> Sequence[KeyNode]:
        if not seen.failed or self._seen:
            return _NONE
        self._seen = True
        why = seen.error_type or _text((seen.event.result or {}).get("error_message")) or "error"
        return (
            _node(
                "first_failure",
                seen,
                f"{_name(seen.name)} failed: {why}",
                action=seen.name,
                error_type=seen.error_type,
            ),
        )

    def finish(self) -> Sequence[KeyNode]:
        return _NONE


class ConsecutiveFailures:
    """``consecutive_failures``: two tool calls in a row failed (one node per streak)."""

    kind: KeyNodeKind = "consecutive_failures"
    types: frozenset[str] | None = _ACTION
    flag: int = 0
    __slots__ = ("_prev_failed", "_prev_name", "_prev_index", "_reported")

    def __init__(self) -> None:
        self._prev_failed = False
        self._prev_name: str | None = None
        self._prev_index = -1
        self._reported = False

    def observe(self, seen: Seen) -> Sequence[KeyNode]:
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
            found = (
                _node(
                    "consecutive_failures",
                    seen,
                    text,
                    action=name,
                    error_type=seen.error_type,
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
    types: frozenset[str] | None = _ACTION
    flag: int = 0
    __slots__ = ("_unresolved",)

    def __init__(self) -> None:
        self._unresolved: dict[Any, _Unresolved] = {}

    def observe(self, seen: Seen) -> Sequence[KeyNode]:
        unresolved = self._unresolved
        if seen.failed:
            pending = unresolved.get(seen.label)
            if pending is None:
                unresolved[seen.label] = _Unresolved(seen)
            elif pending.other is None and seen.sig != pending.first.sig:
                pending.other = seen
            return _NONE
        # The status is normal_status already: is_success's own set, without normalizing twice.
        if not unresolved or seen.status not in OK_STATUSES:
            return _NONE
        pending = unresolved.pop(seen.label, None)
        if pending is None:
            return _NONE
        if seen.sig != pending.first.sig:
            fixed = pending.first
        elif pending.other is not None and seen.sig != pending.other.sig:
            fixed = pending.other
        else:
            return _NONE  # the same call that failed, now working: no change of course
        return (_recovery_node(fixed, seen),)

    def finish(self) -> Sequence[KeyNode]:
        return _NONE


class _Unresolved:
    """Failures at one step label not yet followed by a success there."""

    __slots__ = ("first", "other")

    def __init__(self, first: Seen) -> None:
        self.first = first
        # The first failure with other arguments, for when the success repeats the first call.
        self.other: Seen | None = None


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
    types: frozenset[str] | None = _ACTION
    flag: int = 0
    __slots__ = ("live", "_chains", "_once", "_ended", "_ordinal", "_run_sig", "_run_len")

    def __init__(self, *, live: bool = False) -> None:
        self.live = live
        self._chains: dict[int, _Chain] = {}
        # A call not repeated (lately): a chain of one, as (ordinal, index, name) until it
        # repeats. Most calls of a run never do; they need no chain object.
        self._once: dict[int, tuple[int, int, str | None]] = {}
        self._ended: list[_Chain] = []
        self._ordinal = 0  # actions so far
        self._run_sig: int | None = None
        self._run_len = 0

    def observe(self, seen: Seen) -> Sequence[KeyNode]:
        sig = seen.sig
        if sig is None:
            self._run_sig = None
            return _NONE
        ordinal = self._ordinal = self._ordinal + 1
        chain = self._chains.get(sig)
        if chain is not None and ordinal - chain.last <= LOOP_SPAN:
            chain.last = ordinal
            chain.indices.append(seen.index)
        else:
            if chain is not None:  # too long ago: that chain has ended
                if chain.at is not None:
                    self._ended.append(chain)
                del self._chains[sig]
            first = self._once.get(sig)
            if first is None or ordinal - first[0] > LOOP_SPAN:
                self._once[sig] = (ordinal, seen.index, seen.name)
                # The call before this one was another (else it would be in a chain).
                self._run_sig, self._run_len = sig, 1
                return _NONE
            del self._once[sig]
            chain = self._chains[sig] = _Chain(first[2] or "", first[0], first[1])
            chain.last = ordinal
            chain.indices.append(seen.index)
        if sig == self._run_sig:
            self._run_len += 1
            if self._run_len == LOOP_REPEATS:
                chain.row = True
        else:
            self._run_sig, self._run_len = sig, 1
        if len(chain.indices) == LOOP_REPEATS:
            chain.at = seen
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
        self.at: Seen | None = None  # the repetition that made it a loop


class Hesitation:
    """``hesitation``: the agent wavered between two actions at one step.

    It left an action it had just weighed as an alternative, or went A, B, A (back to the same
    call, or away from a B that failed). One node per pair of actions at a step; a longer
    A,B,A,B … grows the node instead of repeating it.
    """

    kind: KeyNodeKind = "hesitation"
    types: frozenset[str] | None = frozenset({"action_executed", "llm_decision"})
    flag: int = 0
    __slots__ = ("_weighing", "_last_at", "_found")

    def __init__(self) -> None:
        # per label, the [chosen, alternatives] of a decision that had alternatives
        self._weighing: dict[Any, list[Any]] = {}
        # per label, the last two different actions run there (plain tuples: the hot path)
        # as (name, index, sig, failed, previous name, previous index, previous sig)
        self._last_at: dict[Any, tuple[str, int, Any, bool, str | None, int, Any]] = {}
        self._found: dict[tuple[Any, frozenset[str]], KeyNode] = {}

    def observe(self, seen: Seen) -> Sequence[KeyNode]:
        etype = seen.type
        if etype == "llm_decision":
            if seen.weigh is not None:
                self._weighing[seen.label] = seen.weigh
            return _NONE
        name = seen.name
        if name is None:  # (an action: the only other type it is fed)
            return _NONE
        label, i, sig = seen.label, seen.index, seen.sig
        weighed = self._weighing.pop(label, None) if self._weighing else None
        if seen.weigh is not None:
            weighed = seen.weigh
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
        node = self._found[key] = _node("hesitation", seen, text, action=name, related=related)
        return (node,)

    def finish(self) -> Sequence[KeyNode]:
        return _NONE


class Anomaly:
    """``anomaly``: an unusual status, a result flagged as odd, or output of an unexpected type.

    The type is the ``expected_type`` the result or the input named.
    """

    kind: KeyNodeKind = "anomaly"
    types: frozenset[str] | None = None
    flag: int = _ODD  # only the events whose projection says so
    __slots__ = ()

    def observe(self, seen: Seen) -> Sequence[KeyNode]:
        # Fed only the events whose projection flags them (most results are plain successes
        # and failures): the full event says what is odd.
        ev = seen.event
        reason = _anomaly(ev, ev.result or {})
        if reason is None:
            return _NONE
        return (_node("anomaly", seen, reason, action=ev.action, error_type=seen.error_type),)

    def finish(self) -> Sequence[KeyNode]:
        return _NONE


class Dissatisfaction:
    """``dissatisfaction``: a negative feedback score, or complaint words in English or Chinese.

    In feedback or user input; ``related`` is ``[the last tool call, this event]``.
    """

    kind: KeyNodeKind = "dissatisfaction"
    types: frozenset[str] | None = frozenset({"action_executed", "feedback", "user_input"})
    flag: int = 0
    __slots__ = ("_last_action", "_last_index")

    def __init__(self) -> None:
        self._last_action: str | None = None
        self._last_index = -1

    def observe(self, seen: Seen) -> Sequence[KeyNode]:
        etype = seen.type
        if etype == "action_executed":
            self._last_action, self._last_index = seen.name, seen.index
            return _NONE
        if not seen.flags & _UNHAPPY or (etype != "feedback" and etype != "user_input"):
            return _NONE
        ev = seen.event
        reason = _dissatisfaction(etype, ev.input, ev.extra.get("score"))
        if reason is None:
            return _NONE
        i, last = seen.index, self._last_index
        return (
            _node(
                "dissatisfaction",
                seen,
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
    types: frozenset[str] | None = frozenset({"llm_decision", "user_input"})
    flag: int = 0
    __slots__ = ("_agent", "_index")

    def __init__(self) -> None:
        self._agent: str | None = None
        self._index = -1

    def observe(self, seen: Seen) -> Sequence[KeyNode]:
        agent = seen.agent
        if agent is None:
            return _NONE
        before, i = self._agent, seen.index
        self._agent = agent
        prev, self._index = self._index, i
        if before is None or before == agent:
            return _NONE
        return (
            _node(
                "handoff",
                seen,
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


def _detect(run: StoredRun) -> list[KeyNode]:
    """One pass over a run's projections running every detector (indices into the run)."""
    projections = run.projections()
    # The bodies the projection says some detector will read, in one go.
    run.prefetch(i for i, p in enumerate(projections) if p[7])
    detectors = [factory() for factory in DETECTORS]
    route = _Routes(detectors)
    nodes: list[KeyNode] = []
    get, new, failed_statuses = route.get, Seen.__new__, FAILED_STATUSES
    for i, p in enumerate(projections):
        etype, flags = p[1], p[7]
        observers = get((etype, flags) if flags else etype)
        if observers is None:
            observers = route.of(etype, flags)
        if not observers:
            continue  # a step no detector reads (a state change, a plain task start …)
        # Seen(i, projection=p, run=run), inlined: thousands of events per run.
        seen = new(Seen)
        seen.index, seen._event, seen._run, seen.type, seen.flags = i, None, run, etype, flags
        seen.status, seen.name, seen.label, seen.sig, seen.weigh, seen.agent, seen.error_type = (
            p[2],
            p[3],
            p[4],
            p[5],
            p[6],
            p[8],
            p[9],
        )
        seen.failed = etype == "action_executed" and p[2] in failed_statuses
        for observe in observers:
            found = observe(seen)
            if found:
                nodes.extend(found)
    for detector in detectors:
        nodes.extend(detector.finish())
    run.settle()
    for node in nodes:
        if len(node.related) > _RELATED_MAX:
            half = _RELATED_MAX // 2
            node.related = node.related[:half] + node.related[-half:]
    nodes.sort(key=lambda k: (k.index, _KIND_ORDER[k.kind]))
    return nodes


class _Routes(dict[Any, list[Callable[[Seen], Sequence[KeyNode]]]]):
    """(event type, projection flags) -> the observers of the detectors that read such events:
    a run's thousands of events pay one lookup each, not one call per detector. Keyed by the
    type alone where the flags are 0 (most events: no tuple to build for the lookup)."""

    def __init__(self, detectors: Sequence[Detector]) -> None:
        super().__init__()
        self._detectors = detectors

    def of(self, etype: str, flags: int) -> list[Callable[[Seen], Sequence[KeyNode]]]:
        observers = self[(etype, flags) if flags else etype] = [
            d.observe
            for d in self._detectors
            if (d.types is None or etype in d.types) and (not d.flag or flags & d.flag)
        ]
        return observers


def _wavered(weighed: list[Any], before: str, after: str) -> bool:
    """Did the agent leave an action it had just weighed, or run an alternative it had not chosen?

    ``weighed`` is the decision's ``[chosen, alternatives]`` (``project``). A decision with
    alternatives followed by the next tool of a pipeline is not wavering, so the switch has to
    involve the actions the decision was about.
    """
    chosen, alternatives = weighed
    if alternatives is None:  # not a list
        return False
    return before == chosen or before in alternatives or (after in alternatives and after != chosen)


def _loop_node(chain: _Chain, times: int) -> KeyNode:
    how = "in a row" if chain.row else "in the run"
    at = chain.at
    assert at is not None
    return _node(
        "loop",
        at,
        f"{_name(chain.name)} ×{times} same args {how}",
        action=chain.name,
        error_type=at.error_type,
        related=list(chain.indices),
        index=chain.indices[LOOP_REPEATS - 1],
    )


def _recovery_node(bad: Seen, good: Seen) -> KeyNode:
    bad_name, good_name = bad.name, good.name
    same = bad_name == good_name
    node = _node(
        "recovery",
        good,
        "" if same else f"{_name(good_name, 18)} ok after {_name(bad_name, 18)} failed",
        action=good_name,
        error_type=bad.error_type,
        related=[bad.index, good.index],
    )
    if same:

        def word() -> None:  # what changed is in the two calls' arguments: their bodies
            changed = _changed_args(bad.event.input, good.event.input)
            text = f"{_name(good_name)} ok with {changed}" if changed else f"{_name(good_name)} ok"
            node.summary = _clip(text, NODE_SUMMARY_MAX)

        good.when_read([bad.index, good.index], word)
    return node


def _node(
    kind: KeyNodeKind,
    seen: Seen,
    summary: str,
    *,
    action: str | None = None,
    error_type: str | None = None,
    related: list[int] | None = None,
    index: int | None = None,
) -> KeyNode:
    return KeyNode(
        kind=kind,
        index=seen.index if index is None else index,
        event_id=seen.event_id,
        summary=_clip(summary, NODE_SUMMARY_MAX),
        action=action,
        error_type=error_type,
        related=related if related is not None else [],
    )


def _dissatisfaction(etype: str, inp: dict[str, Any] | None, extra_score: Any) -> str | None:
    """A short reason when a user input or feedback shows the user is unhappy.

    ``extra_score`` is a feedback's top-level ``score`` (used when its input has none).
    """
    inp = inp or {}
    text = _user_text(inp)
    if etype == "feedback":
        score = _score(inp.get("score", extra_score))
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


def _anchored(n: int, nodes: list[KeyNode]) -> bytearray:
    """The steps a compressed chronicle cannot drop (1 each): the first and last few, every
    key node and its related steps."""
    keep = bytearray(n)
    for i in range(min(_HEAD_STEPS, n)):
        keep[i] = 1
    for i in range(max(0, n - _TAIL_STEPS), n):
        keep[i] = 1
    for node in nodes:
        keep[node.index] = 1
        for r in node.related:
            keep[r] = 1
    return keep


def _fold(n: int, nodes: list[KeyNode], max_steps: int, run: StoredRun) -> list[KeyNode]:
    """The key nodes a compressed chronicle lists: all of them while their steps fit in
    ``max_steps``; past that, each group of like nodes (the same kind, tool, error, agent and,
    for a recovery, failed tool) keeps its first few and its last, as many as fit (at least
    ``_FOLD_FIRST`` and the last), and the first counts those left out (``KeyNode.repeats``)."""
    if _anchored(n, nodes).count(1) <= max_steps:
        return nodes
    projections = run.projections()
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, node in enumerate(nodes):  # in run order: a group's members are too
        if node.kind in _NEVER_FOLD:
            continue
        failed = (
            projections[node.related[0]][3] if node.kind == "recovery" and node.related else None
        )
        key = (node.kind, node.action, node.error_type, failed, projections[node.index][8])
        groups.setdefault(key, []).append(i)
    largest = max((len(m) for m in groups.values()), default=0)
    keep = largest
    while True:
        # The most of each group that fits: halved until the steps they need do.
        keep = max(keep // 2, _FOLD_FIRST + 1)
        dropped = {i for m in groups.values() for i in m[keep - 1 : -1]}
        listed = [node for i, node in enumerate(nodes) if i not in dropped]
        if keep == _FOLD_FIRST + 1 or _anchored(n, listed).count(1) <= max_steps:
            break
    for members in groups.values():
        if len(members) > keep:
            nodes[members[0]].repeats = len(members) - keep
    return listed


def _compress(n: int, nodes: list[KeyNode], max_steps: int) -> list[int]:
    """Indices of the steps a compressed chronicle keeps, ascending (linear in the run)."""
    keep = _anchored(n, nodes)
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
    if ev.type == "action_executed":
        return _call_step(index, ev)
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


def _call_step(index: int, ev: Event) -> Step:
    """``_step`` of a tool call, with ``_summarize`` and ``_output`` inlined: most steps a
    chronicle keeps are calls, and these are per-call function overheads on its hot path."""
    result = ev.result
    state = ev.agent_state
    label = state.get("current_step") if state else None
    inp = ev.input
    action = ev.action
    res = result or {}
    status = res.get("status")
    error_type = res.get("error_type")
    if error_type is not None:
        error_type = str(error_type)
    # The summary: name(args) -> status why
    tail = ""
    if status is not None:
        said = str(status)
        if said:
            why = error_type
            if not why and is_failure(said):
                message = res.get("error_message")
                why = "" if message is None else str(message)
            tail = " " + _clip(f"-> {said} {why}" if why else f"-> {said}", 39)
    name = _clip(action or "action", 30)
    budget = STEP_SUMMARY_MAX - len(tail) - len(name) - 2
    head = f"{name}({_args_text(_args(inp or {}), budget)})"
    # The output
    output = None
    if result:
        out = res.get("output")
        message = res.get("error_message")
        if isinstance(message, str) and message and not is_success(status):
            error = _cut(message, DETAIL_TEXT_MAX)
            output = (
                {"error_message": error}
                if out is None
                else {"output": _bound(out), "error_message": error}
            )
        elif out is not None:
            output = _bound(out)
    context = ev.context
    # Step(...) with its fields set one by one: see _new_step.
    step = _new_step(Step)
    step.index = index
    step.event_id = ev.event_id
    step.type = "action_executed"
    step.action = action
    step.status = normal_status(status) if result else None
    step.step = None if label is None else str(label)
    step.summary = _clip(head, STEP_SUMMARY_MAX - len(tail)) + tail
    step.error_type = error_type if result else None
    step.input = None if inp is None else _bound(inp)
    step.context = None if context is None else _bound(context)
    step.output = output
    return step


# Thousands of steps per replay: a dataclass's keyword __init__ costs ~4x setting its fields one
# by one (tests/test_replay_projection.py checks every field of a step is set).
_new_step = object.__new__


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
        size = len(args)
        if size <= 3:
            # A text value longer than the budget cannot fit whole (the usual long query or
            # text): no need to build and check the whole line first.
            for v in args.values():
                if type(v) is str and len(v) > budget:
                    break
            else:
                plain = ", ".join([f"{k}={v}" for k, v in args.items()])
                if (
                    len(plain) <= budget
                    and plain.isprintable()
                    and "{" not in plain
                    and "[" not in plain
                ):
                    return plain  # it all fits: nothing to share out
            items: Iterable[tuple[Any, Any]] = args.items()
        else:
            items = islice(args.items(), 3)
        keys: list[str] = []
        values: list[str] = []
        for k, v in items:
            keys.append(k if type(k) is str else str(k))
            values.append(v if type(v) is str or isinstance(v, str) else _short(v, 40))
        shown = len(keys)
        if not shown:
            return ""
        # Cutting the longest values beats cutting the line's end: the last argument
        # (encoding=gbk) is often the one that matters.
        left = budget - 2 * (shown - 1) - (3 if size > 3 else 0)
        lengths = [len(v) for v in values]
        limits = [0] * shown
        remaining = shown
        for n in (0,) if shown == 1 else sorted(range(shown), key=lengths.__getitem__):
            key_size = len(keys[n]) + 1
            # min(length, max(4, share - key_size)), spelled out: three calls per value
            limit = left // remaining - key_size
            if limit < 4:
                limit = 4
            if lengths[n] < limit:
                limit = lengths[n]
            limits[n] = limit
            left -= key_size + limit
            remaining -= 1
        parts = []
        for n in range(shown):
            value, limit = values[n], limits[n]
            if lengths[n] > limit:  # _short(value, limit), inlined
                value = "…" + value[-(limit - 1) :] if "/" in value else _clip(value, limit)
            parts.append(f"{keys[n]}={value}")
        if size > 3:
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
    kind = type(value)
    if kind is str:
        return value if len(value) <= _TEXT_MAX else value[: _TEXT_MAX - 1] + "…"
    if (
        depth == 0
        and (kind is dict or kind is list or isinstance(value, dict | list))
        and len(value) <= _KEYS_MAX
        and not (kind is dict and _long_text(value))
    ):
        # Most inputs and outputs are small: one round trip through orjson copies them, in C,
        # and proves they are JSON; only the big or odd ones need the walk below.
        try:
            raw = orjson.dumps(value)
        except TypeError:
            pass
        else:
            if len(raw) <= _SMALL_JSON:
                return orjson.loads(raw)
    if kind is dict or isinstance(value, dict):
        if depth >= _DEPTH_MAX:
            return f"{{{len(value)} keys}}"
        out: dict[str, Any] = {}
        # Exact types first (what a decoded body holds): the isinstance checks only for the
        # rest. Short text and numbers, the bulk of any input, need no recursion; nor does
        # long text, cut here as above.
        crowded = len(value) > _KEYS_MAX
        for k, v in value.items():
            if crowded and len(out) == _KEYS_MAX:
                out["…"] = f"{len(value) - _KEYS_MAX} more keys"
                break
            if type(k) is not str and not isinstance(k, str):
                k = str(k)
            kind = type(v)
            if kind is str:
                out[k] = v if len(v) <= _TEXT_MAX else v[: _TEXT_MAX - 1] + "…"
            elif kind is int or kind is float or v is None or kind is bool:
                out[k] = v
            elif isinstance(v, str):
                out[k] = v if len(v) <= _TEXT_MAX else v[: _TEXT_MAX - 1] + "…"
            elif isinstance(v, int | float):
                out[k] = v
            elif kind is list and len(v) <= _ITEMS_MAX and depth + 1 < _DEPTH_MAX:
                # _bound(v, depth + 1) of a short list (column names …), inlined
                out[k] = [
                    x
                    if (type(x) is str and len(x) <= _TEXT_MAX) or type(x) is int or x is None
                    else _bound(x, depth + 2)
                    for x in v
                ]
            else:
                out[k] = _bound(v, depth + 1)
        return out
    if value is None or kind is int or kind is float or kind is bool:
        return value
    if isinstance(value, str):
        return value if len(value) <= _TEXT_MAX else value[: _TEXT_MAX - 1] + "…"
    if isinstance(value, bool | int | float):
        return value
    if kind is list or isinstance(value, list | tuple):
        if depth >= _DEPTH_MAX:
            return f"[{len(value)} items]"
        # Short text and numbers need no recursion here either (a list of column names …).
        items = [
            v
            if (type(v) is str and len(v) <= _TEXT_MAX) or type(v) is int or v is None
            else _bound(v, depth + 1)
            for v in value[:_ITEMS_MAX]
        ]
        if len(value) > _ITEMS_MAX:
            items.append(f"… {len(value) - _ITEMS_MAX} more items")
        return items
    return _clip(repr(value), _TEXT_MAX)  # bytes, objects …: text is all a reflector can read


def _long_text(value: dict[str, Any]) -> bool:
    """Whether a dict holds text too long for its JSON to be small (a tool's output with its
    text, a call's input with a long argument: the usual cases): the round trip of ``_bound``
    would be wasted on it."""
    # Characters are a floor on JSON's bytes: text adding up past the limit, at the top or one
    # level down (a call's arguments under "args"), proves the JSON is not small.
    size = 0
    for v in value.values():
        kind = type(v)
        if kind is str:
            size += len(v)
        elif kind is dict:
            for w in v.values():
                if type(w) is str:
                    size += len(w)
    return size > _SMALL_JSON


def _status(result: dict[str, Any] | None) -> str | None:
    """The result's status when it is text (anything else is treated as no status)."""
    if not result:
        return None
    return normal_status(result.get("status"))


def _label(state: dict[str, Any] | None) -> Any:
    """The agent's ``current_step`` (from its ``agent_state``), usable as a dict key."""
    label = state.get("current_step") if state else None
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
    if len(text) > limit > 0:
        # A long text whose first limit + 1 characters are already one clean line (printable,
        # single spaces, no space at either end of them) is cut there whatever follows:
        # making the whole text one line would keep those characters as they are. Only they
        # are checked, not the whole (long) text.
        head = text[: limit + 1]
        if head.isprintable() and "  " not in head and head[0] != " " and head[-1] != " ":
            return text[: limit - 1].rstrip() + "…"
    if not text.isprintable() or "  " in text:  # newlines, tabs, wide spaces, runs of spaces
        text = " ".join(text.split())
    if len(text) <= limit:
        return text
    return text[: limit - 1].rstrip() + "…"
