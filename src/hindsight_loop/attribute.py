"""Attribution: in a run of many agents that failed, which agent caused it, and at which step.

A team's lesson book is only useful when each lesson reaches the agent that needs it, so a
failed multi-agent run first has to be blamed on someone. ``attribute(chronicle)`` answers
"who, where, why" as an ``Attribution``:

- offline (no model): rules read off what the run shows. The code whose execution failed
  first is the strongest sign (the author wrote it, whoever ran it); a turn that makes up its
  inputs (assumes, simulates, uses placeholder or hypothetical data) is the next; failing both,
  the first agent that did real work after the task was handed out is the likeliest culprit,
  since later agents mostly build on and confirm what it said. The rules were designed from
  reading Who&When logs (the first half of its Algorithm-Generated set) and are measured on all
  of it by ``bench/who_when.py``.
- with an LLM: the steps (each with its agent) are shown to the model within a token budget
  and it names the agent, the step and the reason, either at once (``all_at_once``, one call)
  or by halving the run until one step is left (``binary_search``, about log2(steps) calls).
  A model that fails or answers nonsense falls back to the offline answer, never an error.

``scopes_for(agent, team)`` is where lessons of a team live: an agent's own lessons under
``agent:<role>``, the team's under ``team:<name>``; recall for an agent reads both (plus the
global ones, which recall always reads).

Everything here is a function of the chronicle (and the model's answers): no store, no clock.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from hindsight_loop.models import (
    Chronicle,
    Event,
    Reflection,
    Step,
    is_failure,
    iso,
    new_id,
    utcnow,
)
from hindsight_loop.replay import TeamChronicle

if TYPE_CHECKING:
    from hindsight_loop.llm import LLM

__all__ = [
    "AGENT_SCOPE",
    "DEFAULT_BUDGET_TOKENS",
    "TEAM_SCOPE",
    "Attribution",
    "attribute",
    "scopes_for",
]

#: Prefix of the scope of an agent's own lessons: ``agent:<role>``.
AGENT_SCOPE = "agent:"
#: Prefix of the scope of a team's collaboration lessons: ``team:<task type or team name>``.
TEAM_SCOPE = "team:"
#: Upper bound on the estimated prompt tokens of one attribution request.
DEFAULT_BUDGET_TOKENS = 4000
#: A step's text in an attribution prompt, at most this many characters before the budget
#: trims it further.
STEP_TEXT_MAX = 900

#: Each offline rule's confidence: the share of the Who&When logs the rules were designed on
#: (Algorithm-Generated 1-63) where the rule, when it decided, named the right agent.
RULE_CONFIDENCE = {"failed_execution": 0.6, "made_up_input": 0.57, "first_worker": 0.67}

Method = Literal["offline", "all_at_once", "binary_search"]


@dataclass(kw_only=True, slots=True)
class Attribution:
    """Who caused a run to fail, at which step, and why."""

    agent: str | None
    """The agent blamed (its ``agent_state.agent``), or None when the run names no agent."""
    step: int | None
    """Index of the decisive step in the chronicle's ``steps``."""
    event_id: str | None = None
    """The event of that step (stable when the chronicle was compressed)."""
    reason: str = ""
    """Why, in a sentence."""
    confidence: float = 0.0
    """0..1: for an offline rule, the share of Who&When logs 1-63 (the ones the rules were
    designed on) where that rule named the right agent; for a model, what it said (clamped)."""
    method: str = "offline"
    """``offline:<rule>``, or ``<llm name>:all_at_once`` / ``<llm name>:binary_search``."""
    tokens_in: int = 0
    """Prompt tokens the model was sent (0 offline)."""
    tokens_out: int = 0
    """Answer tokens it returned."""
    calls: int = 0
    """Model calls made."""
    error: str | None = None
    """What went wrong with the model, when the answer fell back to the offline one."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attribution:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def to_reflection(self, task_id: str, model: str | None) -> Reflection:
        """The answer kept beside the task's reflections (``trigger="attribution"``, the
        attribution in ``parsed["attribution"]``); ``suspect`` when the model failed."""
        return Reflection(
            reflection_id=new_id("ref"),
            task_id=task_id,
            status="ok" if self.error is None else "suspect",
            reflector=self.method,
            model=model,
            tokens_in=self.tokens_in or None,
            tokens_out=self.tokens_out or None,
            parsed={"attribution": self.to_dict()},
            error=self.error,
            created_at=iso(utcnow()),
            trigger="attribution",
        )


def scopes_for(agent: str | None = None, team: str | None = None) -> list[str]:
    """The scopes an agent of a team recalls from: its role's and its team's (global is implied).

    Pass the result as ``scope=`` to ``Hindsight.recall``. A lesson about one role is stored
    with ``scope=f"agent:{role}"``, a lesson about how the team works together with
    ``scope=f"team:{team}"`` (the task type, or the team's name).
    """
    scopes: list[str] = []
    if agent:
        scopes.append(agent if agent.startswith(AGENT_SCOPE) else AGENT_SCOPE + agent)
    if team:
        scopes.append(team if team.startswith(TEAM_SCOPE) else TEAM_SCOPE + team)
    return scopes


def attribute(
    chronicle: Chronicle,
    *,
    events: Sequence[Event] | None = None,
    llm: LLM | None = None,
    method: Method = "all_at_once",
    budget_tokens: int = DEFAULT_BUDGET_TOKENS,
) -> Attribution:
    """Say which agent caused the run to fail, at which step, and why.

    Args:
        chronicle: The replayed run (a ``TeamChronicle`` for a run of many agents).
        events: The run's events, when at hand: a single-agent run is then blamed on the agent
            its events name (a plain ``Chronicle`` does not keep agents).
        llm: A model to review the run; None for the offline rules.
        method: With a model: ``all_at_once`` (one call) or ``binary_search``.
        budget_tokens: Upper bound on each prompt's estimated tokens.
    """
    agents = _step_agents(chronicle, events)
    offline = _offline(chronicle, agents)
    if llm is None:
        return offline
    from hindsight_loop.llm import LLMError

    try:
        if method == "binary_search":
            return _binary_search(chronicle, agents, llm, budget_tokens, offline)
        return _all_at_once(chronicle, agents, llm, budget_tokens, offline)
    except LLMError as exc:
        return dataclasses.replace(offline, error=f"{type(exc).__name__}: {exc}")


# -- offline ----------------------------------------------------------------------------------

# Words of an agent that makes up what it should have looked up or measured (English, Chinese).
_MADE_UP = re.compile(
    r"hypothetic|\bassum(?:e|ed|ing|ption)|\bsimulat|\bsample (?:data|dataset|values)|\bmock"
    r"|\bdummy\b|placeholder|for (?:demonstration|illustration)|\billustrative|\bpretend"
    r"|\bfictional|\bmade[- ]up|\bsynthetic|\bexample (?:data|values)"
    r"|假设|假定|模拟|虚构|示例数据|占位|编造",
    re.IGNORECASE,
)


def _offline(chronicle: Chronicle, agents: list[str | None]) -> Attribution:
    steps = chronicle.steps
    turns = [s.index for s in steps if s.type in ("llm_decision", "user_input") and agents[s.index]]
    if not turns:
        return Attribution(agent=None, step=None, reason="no agent spoke in this run")

    # The code that failed first: blame the turn that wrote it (the author, not the executor).
    failed = next((s for s in steps if s.type == "action_executed" and _failed(s)), None)
    author = None
    if failed is not None:
        author = next((i for i in reversed(turns) if i < failed.index), None)
    made_up = next((i for i in turns if i > turns[0] and _MADE_UP.search(_text(steps[i]))), None)

    if author is not None and (made_up is None or author <= made_up):
        why = failed.error_type if failed is not None and failed.error_type else "an error"
        return _blame(
            chronicle,
            agents,
            author,
            "failed_execution",
            f"its code was the first to fail ({why}); the run built on that",
            RULE_CONFIDENCE["failed_execution"],
        )
    if made_up is not None:
        word = _MADE_UP.search(_text(steps[made_up]))
        said = word.group(0) if word else "made-up data"
        return _blame(
            chronicle,
            agents,
            made_up,
            "made_up_input",
            f"it worked from made-up input ({said!r}) instead of finding the real data",
            RULE_CONFIDENCE["made_up_input"],
        )
    first = _first_work(steps, turns)
    return _blame(
        chronicle,
        agents,
        first,
        "first_worker",
        "it did the first real work on the task; the others built on what it said",
        RULE_CONFIDENCE["first_worker"],
    )


def _first_work(steps: Sequence[Step], turns: list[int]) -> int:
    """The first turn that did work: the opening turn if its code ran, else the next one."""
    opening = turns[0]
    ran = next(
        (s for s in steps[opening + 1 :] if s.type != "state_change"),
        None,
    )
    if ran is not None and ran.type == "action_executed":
        return opening
    return turns[1] if len(turns) > 1 else opening


def _blame(
    chronicle: Chronicle,
    agents: list[str | None],
    index: int,
    rule: str,
    why: str,
    confidence: float,
) -> Attribution:
    agent = agents[index]
    return Attribution(
        agent=agent,
        step=index,
        event_id=chronicle.steps[index].event_id,
        reason=f"{agent} at step {index}: {why}",
        confidence=confidence,
        method=f"offline:{rule}",
    )


def _failed(step: Step) -> bool:
    return is_failure(step.status)


def _step_agents(chronicle: Chronicle, events: Sequence[Event] | None) -> list[str | None]:
    """Each step's agent: a team chronicle's own, else the agent its event names, else
    ``"agent"`` (a run that names none has one anonymous agent)."""
    if isinstance(chronicle, TeamChronicle):
        return list(chronicle.step_agents)
    named: dict[str, str] = {}
    for ev in events or ():
        agent = (ev.agent_state or {}).get("agent")
        if isinstance(agent, str) and agent:
            named[ev.event_id] = agent
    return [
        None if s.type in ("task_start", "task_end") else named.get(s.event_id, "agent")
        for s in chronicle.steps
    ]


def _text(step: Step) -> str:
    out = step.output
    if isinstance(out, str):
        return out
    if step.input:
        text = step.input.get("text")
        if isinstance(text, str):
            return text
    return "" if out is None else json.dumps(out, ensure_ascii=False, default=str)


# -- with a model -----------------------------------------------------------------------------


def _view(
    chronicle: Chronicle, agents: list[str | None], lo: int, hi: int, budget_tokens: int
) -> str:
    """Steps lo..hi as numbered lines with their agent, cut evenly to fit the budget."""
    from hindsight_loop.llm import estimate_tokens

    steps = [s for s in chronicle.steps[lo : hi + 1] if s.type not in ("task_start", "task_end")]
    if not steps:
        return ""
    limit = STEP_TEXT_MAX
    while True:
        lines = [_line(s, agents[s.index], limit) for s in steps]
        text = "\n".join(lines)
        if estimate_tokens(text) <= budget_tokens or limit <= 60:
            return text
        limit = int(limit * 0.7)


def _line(step: Step, agent: str | None, limit: int) -> str:
    who = agent or "?"
    if step.type == "action_executed":
        state = "FAILED" if _failed(step) else (step.status or "done")
        body = f"[{step.action or 'tool'} {state}] {_text(step) or step.summary}"
    elif step.type == "state_change":
        body = f"[note] {_text(step) or step.summary}"
    else:
        body = _text(step) or step.summary
    body = " ".join(body.split())
    if len(body) > limit:
        body = body[: limit - 1] + "…"
    return f"step {step.index} | {who}: {body}"


def _ask(llm: LLM, prompt: str, tally: Attribution) -> dict[str, Any] | None:
    from hindsight_loop.llm import templates
    from hindsight_loop.llm.parse import canonical_keys, extract_json

    answer = llm.complete(prompt, system=templates.ATTRIBUTION_SYSTEM, json_mode=True)
    tally.calls += 1
    tally.tokens_in += answer.tokens_in or 0
    tally.tokens_out += answer.tokens_out or 0
    found = extract_json(answer.text)
    return canonical_keys(found) if found is not None else None


def _goal(chronicle: Chronicle) -> str:
    goal = " ".join((chronicle.task.goal or "").split())
    return goal[:1500]


def _all_at_once(
    chronicle: Chronicle,
    agents: list[str | None],
    llm: LLM,
    budget: int,
    offline: Attribution,
) -> Attribution:
    from hindsight_loop.llm import templates

    tally = Attribution(agent=None, step=None, method=f"{llm.name}:all_at_once")
    last = len(chronicle.steps) - 1
    prompt = templates.ATTRIBUTION_ALL_AT_ONCE.substitute(
        goal=_goal(chronicle),
        agents=", ".join(sorted({a for a in agents if a})),
        steps=_view(chronicle, agents, 0, last, budget),
    )
    data = _ask(llm, prompt, tally)
    step = _step_of(data, chronicle) if data else None
    if data is None or step is None:
        return dataclasses.replace(
            offline,
            tokens_in=tally.tokens_in,
            tokens_out=tally.tokens_out,
            calls=tally.calls,
            error="the model's answer named no step of the run",
        )
    named = data.get("agent")
    agent = named if isinstance(named, str) and named in agents else agents[step]
    return dataclasses.replace(
        tally,
        agent=agent,
        step=step,
        event_id=chronicle.steps[step].event_id,
        reason=str(data.get("reason") or data.get("root_cause") or "")[:500],
        confidence=_confidence(data.get("confidence")),
    )


def _binary_search(
    chronicle: Chronicle,
    agents: list[str | None],
    llm: LLM,
    budget: int,
    offline: Attribution,
) -> Attribution:
    from hindsight_loop.llm import templates

    tally = Attribution(agent=None, step=None, method=f"{llm.name}:binary_search")
    turns = [s.index for s in chronicle.steps if s.type not in ("task_start", "task_end")]
    if not turns:
        return offline
    lo, hi = 0, len(turns) - 1
    reason = ""
    while lo < hi:
        mid = (lo + hi) // 2
        prompt = templates.ATTRIBUTION_BISECT.substitute(
            goal=_goal(chronicle),
            steps=_view(chronicle, agents, turns[lo], turns[hi], budget),
            first=f"{turns[lo]}-{turns[mid]}",
            second=f"{turns[mid + 1]}-{turns[hi]}",
        )
        data = _ask(llm, prompt, tally)
        half = str((data or {}).get("half") or "").strip().lower()
        if half not in ("first", "second"):
            return dataclasses.replace(
                offline,
                tokens_in=tally.tokens_in,
                tokens_out=tally.tokens_out,
                calls=tally.calls,
                error="the model's answer named neither half",
            )
        reason = str((data or {}).get("reason") or reason)[:500]
        if half == "first":
            hi = mid
        else:
            lo = mid + 1
    step = turns[lo]
    return dataclasses.replace(
        tally,
        agent=agents[step],
        step=step,
        event_id=chronicle.steps[step].event_id,
        reason=reason,
        confidence=0.5,
    )


def _step_of(data: dict[str, Any], chronicle: Chronicle) -> int | None:
    raw = data.get("step")
    if isinstance(raw, str):
        digits = re.search(r"\d+", raw)
        raw = int(digits.group(0)) if digits else None
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return None
    step = int(raw)
    return step if 0 <= step < len(chronicle.steps) else None


def _confidence(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.5
    return min(1.0, max(0.0, number / 100 if number > 1 else number))
