"""Review prompts: templates kept as package data, rendered strictly, fed a bounded chronicle.

The templates live in ``hindsight_loop/prompts/*.md`` so they can be read and edited as text. They
use ``string.Template`` placeholders (``$name``); a placeholder without a value, or a value
without a placeholder, is an error, so a renamed variable cannot silently reach a model. The
date is passed in at call time, never baked in at import.

The chronicle is rendered into lines and cut to a token budget: first the arguments and outputs of
ordinary steps go, then ordinary steps from the middle of the run; the key nodes, the steps they
involve, and the first and last steps always stay.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from importlib.resources import files
from string import Template
from typing import Any

from hindsight_loop.llm import estimate_tokens
from hindsight_loop.models import Chronicle, KeyNode, Step

LANGUAGE_INSTRUCTIONS = {
    "en": "Write every text value in English.",
    "zh": "所有文本值都用中文书写（工具名、参数名和错误类型保持原样）。",
}
DEFAULT_BUDGET_TOKENS = 6000
# Always kept, so the model sees how the run started and how it ended.
EDGE_STEPS = 2
ARG_CHARS = 160
OUTPUT_CHARS = 120
LINE_CHARS = 240


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

    # 1. everything, with arguments and outputs
    lines = [_step_line(s, detail=True) for s in steps]
    text = _assemble(lines, set(), node_text, chronicle)
    if estimate_tokens(text) <= budget_tokens:
        return text
    # 2. details only where the key nodes are
    lines = [_step_line(s, detail=s.index in anchors) for s in steps]
    text = _assemble(lines, set(), node_text, chronicle)
    if estimate_tokens(text) <= budget_tokens:
        return text
    # 3. drop ordinary steps, farthest from any kept step first, the middle of the run first;
    # the fewest drops that fit, by bisection (the estimate shrinks as more steps go).
    kept_pos = [i for i, s in enumerate(steps) if s.index in anchors]
    middle = (len(steps) - 1) / 2
    order = sorted(
        (i for i, s in enumerate(steps) if s.index not in anchors),
        key=lambda i: (-min((abs(i - k) for k in kept_pos), default=0), abs(i - middle)),
    )
    for candidate in (lines, [_step_line(s, detail=False) for s in steps]):
        lines = candidate
        if estimate_tokens(_assemble(lines, set(order), node_text, chronicle)) > budget_tokens:
            continue  # even with every ordinary step gone: try again without any details
        lo, hi = 0, len(order)
        while lo < hi:
            mid = (lo + hi) // 2
            if (
                estimate_tokens(_assemble(lines, set(order[:mid]), node_text, chronicle))
                <= budget_tokens
            ):
                hi = mid
            else:
                lo = mid + 1
        return _assemble(lines, set(order[:hi]), node_text, chronicle)
    # 4. the key nodes alone are over budget: cut the middle of the steps, keep the key-node list
    nodes_part = _cut("\n".join(_nodes_header(node_text)), budget_tokens // 2)
    steps_part = _assemble(lines, set(order), [], chronicle, with_nodes=False)
    steps_part = _cut(steps_part, budget_tokens - estimate_tokens(nodes_part) - 1, middle=True)
    return f"{steps_part}\n{nodes_part}"


def _step_line(step: Step, *, detail: bool) -> str:
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
    # A user's text is already the summary; only tool calls have arguments worth showing.
    if detail and step.input and (step.action or "args" in step.input):
        args = step.input.get("args", step.input)
        if args:
            line += f" | args {_compact(args, ARG_CHARS)}"
    if detail and step.output not in (None, "", {}, []):
        line += f" | output {_compact(step.output, OUTPUT_CHARS)}"
    return line[:LINE_CHARS]


def _node_lines(nodes: Sequence[KeyNode]) -> list[str]:
    out = []
    for node in nodes:
        what = ", ".join(x for x in (node.action, node.error_type) if x)
        line = f"- #{node.index} {node.kind}: {node.summary}"
        if what:
            line += f" ({what})"
        if node.related:
            line += f" steps {', '.join(f'#{i}' for i in node.related)}"
        out.append(line)
    return out


def _assemble(
    lines: Sequence[str],
    dropped: set[int],
    node_lines: Sequence[str],
    chronicle: Chronicle,
    *,
    with_nodes: bool = True,
) -> str:
    out: list[str] = []
    if chronicle.compressed:
        out.append(f"(replay kept {len(chronicle.steps)} steps of {chronicle.event_count} events)")
    gap = 0
    for pos, line in enumerate(lines):
        if pos in dropped:
            gap += 1
            continue
        if gap:
            out.append(f"… ({gap} steps omitted) …")
            gap = 0
        out.append(line)
    if gap:
        out.append(f"… ({gap} steps omitted) …")
    if with_nodes:
        out.append("")
        out.extend(_nodes_header(node_lines))
    return "\n".join(out)


def _nodes_header(node_lines: Sequence[str]) -> list[str]:
    return ["Key nodes:", *node_lines] if node_lines else ["Key nodes: none flagged"]


def _compact(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
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
