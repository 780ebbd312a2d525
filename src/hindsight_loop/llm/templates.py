"""Review prompts: templates kept as package data, rendered strictly, fed a bounded chronicle.

The templates live in ``hindsight_loop/prompts/*.md`` so they can be read and edited as text. They
use ``string.Template`` placeholders (``$name``); a placeholder without a value, or a value
without a placeholder, is an error, so a renamed variable cannot silently reach a model. The
date is passed in at call time, never baked in at import.

The chronicle is rendered into lines, each step's summary with its detail under it, and cut to a
token budget from the middle of the run out: ordinary steps lose their detail, then go; the key
nodes, the steps they involve, the user's request and the first and last steps stay.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from importlib.resources import files
from string import Template
from typing import Any

from hindsight_loop.llm import estimate_tokens
from hindsight_loop.models import Chronicle, KeyNode, Step
from hindsight_loop.replay import step_detail

LANGUAGE_INSTRUCTIONS = {
    "en": "Write every text value in English.",
    "zh": "所有文本值都用中文书写（工具名、参数名和错误类型保持原样）。",
}
DEFAULT_BUDGET_TOKENS = 6000
#: Steps always kept at each end, so the model sees how the run started and how it ended.
EDGE_STEPS = 2
#: A step's line (its summary and labels) is cut at this many characters.
LINE_CHARS = 240
#: A step's detail lines are indented by this under its line.
DETAIL_INDENT = "    "


class TemplateError(KeyError):
    """A template and the values given to it do not match."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


@cache
def load(name: str) -> Template:
    """The template ``hindsight_loop/prompts/<name>.md``."""
    resource = files("hindsight_loop").joinpath("prompts", f"{name}.md")
    return Template(resource.read_text(encoding="utf-8"))


def render(name: str, **values: Any) -> str:
    """Fill template ``name``; raises ``TemplateError`` on a missing or an unused value."""
    template = load(name)
    wanted = set(template.get_identifiers())
    missing = sorted(wanted - values.keys())
    unused = sorted(values.keys() - wanted)
    if missing or unused:
        raise TemplateError(
            f"template {name!r}: missing values {missing or 'none'}, unknown values {unused or 'none'}"
        )
    return template.substitute({k: str(v) for k, v in values.items()})


def language_instruction(language: str) -> str:
    return LANGUAGE_INSTRUCTIONS.get(
        language, f"Write every text value in the language {language!r}."
    )


# -- the chronicle as the model reads it ------------------------------------------------------


def render_chronicle(
    chronicle: Chronicle,
    *,
    budget_tokens: int = DEFAULT_BUDGET_TOKENS,
    window: tuple[int, int] | None = None,
) -> str:
    """The chronicle's steps and key nodes as text of at most ``budget_tokens`` (estimated).

    Each step is its one-line summary followed by its detail (``replay.step_detail``: what the
    user asked, what the agent replied, a call's arguments, its full error or the gist of its
    output). Over budget, the run is trimmed from the middle out: ordinary steps lose their
    detail and then go, each gap saying how many steps it stands for; the key nodes, the steps they point at, the first user request and the first
    and last ``EDGE_STEPS`` steps stay whole as long as anything can. English and Chinese are
    both counted (``estimate_tokens``: one token per CJK character).

    Args:
        chronicle: The replayed run.
        budget_tokens: Upper bound on the estimated tokens of the result.
        window: ``(first, last)`` step indices (inclusive) to keep, for a local review.
    """
    steps = list(chronicle.steps)
    nodes = list(chronicle.key_nodes)
    if window is not None:
        lo, hi = window
        steps = [s for s in steps if lo <= s.index <= hi]
        nodes = [k for k in nodes if lo <= k.index <= hi]
    node_text = _node_lines(nodes)
    anchors = {k.index for k in nodes} | {i for k in nodes for i in k.related}
    anchors |= {s.index for s in steps[:EDGE_STEPS]} | {s.index for s in steps[-EDGE_STEPS:]}
    request = next((s for s in steps if s.type == "user_input"), None)
    if request is not None:
        anchors.add(request.index)

    heads = [_step_line(s) for s in steps]
    details = [_detail_lines(s) for s in steps]
    view = _View(heads, details, node_text, chronicle)
    # Trimming moves, applied in order: (position, level) with 1 = summary only, 0 = left out.
    middle = (len(steps) - 1) / 2
    ordinary = sorted(
        (p for p, s in enumerate(steps) if s.index not in anchors), key=lambda p: abs(p - middle)
    )
    kept = sorted(
        (p for p, s in enumerate(steps) if s.index in anchors), key=lambda p: abs(p - middle)
    )
    # Ordinary steps go from the middle out, each losing its detail before it goes itself;
    # only then do the kept steps lose their details, also from the middle out.
    moves = [move for p in ordinary for move in (((p, 1), (p, 0)) if details[p] else ((p, 0),))]
    moves += [(p, 1) for p in kept if details[p]]
    # The fewest moves that fit, by bisection (the estimate shrinks as moves are applied).
    lo, hi = 0, len(moves)
    if view.tokens(moves[:hi]) <= budget_tokens:
        while lo < hi:
            mid = (lo + hi) // 2
            if view.tokens(moves[:mid]) <= budget_tokens:
                hi = mid
            else:
                lo = mid + 1
        return view.text(moves[:hi])
    # The key nodes alone are over budget: cut the middle of the steps, keep the key-node list.
    nodes_part = _cut("\n".join(_nodes_header(node_text)), budget_tokens // 2)
    steps_part = view.text(moves, with_nodes=False)
    steps_part = _cut(steps_part, budget_tokens - estimate_tokens(nodes_part) - 1, middle=True)
    return f"{steps_part}\n{nodes_part}"


class _View:
    """The chronicle's text at some level of trimming, and its estimated size."""

    def __init__(
        self,
        heads: list[str],
        details: list[str],
        node_lines: list[str],
        chronicle: Chronicle,
    ) -> None:
        self.heads, self.details, self.node_lines = heads, details, node_lines
        self.chronicle = chronicle
        # Per-piece estimates (each line with its newline): their sum bounds the estimate of
        # the joined text from above, so a view that fits by the sum fits for real.
        self.head_tokens = [estimate_tokens(h + "\n") for h in heads]
        self.detail_tokens = [estimate_tokens(d + "\n") if d else 0 for d in details]
        self.fixed_tokens = estimate_tokens(
            "\n".join(self._preamble(0)) + "\n\n" + "\n".join(_nodes_header(node_lines))
        )

    def _levels(self, moves: Sequence[tuple[int, int]]) -> list[int]:
        levels = [2] * len(self.heads)
        for pos, level in moves:
            levels[pos] = level
        return levels

    def _preamble(self, dropped: int) -> list[str]:
        out = []
        chronicle = self.chronicle
        if chronicle.compressed:
            out.append(
                f"(replay kept {len(chronicle.steps)} steps of {chronicle.event_count} events)"
            )
        if dropped:
            out.append(
                f"({dropped} of {len(self.heads)} steps left out from the middle of the run to fit;"
                " key nodes are whole)"
            )
        return out

    def tokens(self, moves: Sequence[tuple[int, int]]) -> int:
        levels = self._levels(moves)
        total = self.fixed_tokens
        gap = dropped = 0
        for pos, level in enumerate(levels):
            if level == 0:
                gap += 1
                dropped += 1
                continue
            if gap:
                total += estimate_tokens(_gap_line(gap) + "\n")
                gap = 0
            total += self.head_tokens[pos]
            if level == 2:
                total += self.detail_tokens[pos]
        if gap:
            total += estimate_tokens(_gap_line(gap) + "\n")
        if dropped:
            total += estimate_tokens("\n".join(self._preamble(dropped)) + "\n")
        return total

    def text(self, moves: Sequence[tuple[int, int]], *, with_nodes: bool = True) -> str:
        levels = self._levels(moves)
        out = self._preamble(levels.count(0))
        gap = 0
        for pos, level in enumerate(levels):
            if level == 0:
                gap += 1
                continue
            if gap:
                out.append(_gap_line(gap))
                gap = 0
            out.append(self.heads[pos])
            if level == 2 and self.details[pos]:
                out.append(self.details[pos])
        if gap:
            out.append(_gap_line(gap))
        if with_nodes:
            out.append("")
            out.extend(_nodes_header(self.node_lines))
        return "\n".join(out)


def _gap_line(count: int) -> str:
    return f"… ({count} step{'s' if count > 1 else ''} omitted) …"


def _step_line(step: Step) -> str:
    parts = [f"#{step.index} {step.type}"]
    if step.action:
        parts.append(step.action)
    if step.step:
        parts.append(f"[{step.step}]")
    if step.status:
        parts.append(step.status)
    if step.error_type:
        parts.append(step.error_type)
    line = " ".join(parts)
    if step.summary:
        line += f": {step.summary}"
    return _cut_chars(line, LINE_CHARS)


def _detail_lines(step: Step) -> str:
    """The step's detail, indented under its line."""
    detail = step_detail(step)
    if not detail:
        return ""
    return "\n".join(DETAIL_INDENT + line for line in detail.splitlines() if line.strip())


def _node_lines(nodes: Sequence[KeyNode]) -> list[str]:
    out = []
    for node in nodes:
        what = ", ".join(x for x in (node.action, node.error_type) if x)
        line = f"- #{node.index} {node.kind}: {node.summary}"
        if what:
            line += f" ({what})"
        if node.related:
            line += f" steps {', '.join(f'#{i}' for i in node.related)}"
        if node.repeats:
            line += f"; {node.repeats} more like it later in the run (not shown)"
        out.append(line)
    return out


def _nodes_header(node_lines: Sequence[str]) -> list[str]:
    return ["Key nodes:", *node_lines] if node_lines else ["Key nodes: none flagged"]


def _cut_chars(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _cut(text: str, budget_tokens: int, *, middle: bool = False) -> str:
    """The longest head (or head and tail, with ``middle``) of ``text`` within the budget."""
    marker = "\n… (cut to fit the token budget) …\n"

    def shortened(n: int) -> str:
        if not middle:
            return text[:n] + marker.rstrip()
        return text[: n - n // 2] + marker + (text[-(n // 2) :] if n // 2 else "")

    if estimate_tokens(text) <= budget_tokens:
        return text
    lo, hi = 0, len(text)
    while lo < hi:  # the most characters whose estimate fits
        mid = (lo + hi + 1) // 2
        if estimate_tokens(shortened(mid)) <= budget_tokens:
            lo = mid
        else:
            hi = mid - 1
    return shortened(lo)


# -- failure attribution (hindsight_loop.attribute) -------------------------------------------
# Kept here beside the review prompts; rendered with ``Template.substitute``, so a missing value
# is an error, as for the prompt files.

ATTRIBUTION_SYSTEM = (
    "You review a failed run of a team of AI agents and find the one decisive mistake: the "
    "earliest step whose error made the team's final answer wrong. Answer with one JSON object "
    "and nothing else."
)
ATTRIBUTION_ALL_AT_ONCE = Template(
    """The team worked on this task and its final answer was wrong.

Task: $goal

Agents: $agents

The run, one step a line (a code execution is shown under the agent whose code it ran):
$steps

Which agent made the decisive mistake, and at which step? Prefer the earliest step whose
error the run never recovered from (wrong facts, made-up data, a wrong plan, buggy code, a
false claim of success) over later steps that only repeated or confirmed it.

Answer: {"agent": "<agent name>", "step": <step number>, "reason": "<one sentence>",
"confidence": <0..1>}"""
)
ATTRIBUTION_BISECT = Template(
    """The team worked on this task and its final answer was wrong.

Task: $goal

Part of the run, one step a line:
$steps

Is the decisive mistake (the earliest error the run never recovered from) in steps $first or
in steps $second?

Answer: {"half": "first" or "second", "reason": "<one sentence>"}"""
)
