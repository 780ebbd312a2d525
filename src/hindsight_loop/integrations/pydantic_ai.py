"""pydantic-ai: its own OpenTelemetry GenAI spans recorded, and lessons in its instructions.

pydantic-ai already emits ``invoke_agent`` / ``chat`` / ``execute_tool`` spans with arguments and
results, so recording is the OpenTelemetry exporter's job (``integrations.otel``); this module
only plugs that exporter into an agent and puts the recalled advice where pydantic-ai reads
instructions::

    exporter = HindsightSpanExporter(hs, task_type="csv_report")
    agent = Agent(
        model,
        instructions=["You summarize CSV files.", hindsight_instructions(exporter)],
        capabilities=[instrumentation(exporter)],
    )

Recall runs once per agent run (pydantic-ai asks for instructions on every model request), and
the lessons it hands over are credited to that run's task.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hindsight_loop.integrations import missing
from hindsight_loop.integrations.otel import HindsightSpanExporter

try:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from pydantic_ai import RunContext
    from pydantic_ai.capabilities import Instrumentation
    from pydantic_ai.models.instrumented import InstrumentationSettings
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise missing("pydantic-ai-slim", "pydantic-ai") from exc


def instrumentation(
    exporter: HindsightSpanExporter, *, include_content: bool = True
) -> Instrumentation:
    """A pydantic-ai capability that sends the agent's spans to ``exporter`` (and only there).

    ``include_content`` must stay True for Hindsight to see arguments, results and messages.
    To keep your own tracing, add the exporter to your ``TracerProvider`` instead
    (``provider.add_span_processor(SimpleSpanProcessor(exporter))``).
    """
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    settings = InstrumentationSettings(tracer_provider=provider, include_content=include_content)
    return Instrumentation(settings=settings)


def hindsight_instructions(
    exporter: HindsightSpanExporter,
    *,
    task_type: str | None = None,
    tools: Sequence[str] | None = None,
    intent: str | None = None,
) -> Callable[[RunContext[Any]], str]:
    """Dynamic pydantic-ai instructions: the lessons recalled for this run, as advice.

    Args:
        exporter: The exporter recording the agent's spans (it credits the lessons to the run).
        task_type: Recall for this task type (default: the exporter's, else the agent's name,
            which is also what the exporter records when it has no task type).
        tools: The agent's tool names (default: the tools of the run).
        intent: Recall only lessons for this intent.
    """

    def instructions(ctx: RunContext[Any]) -> str:
        prompt = ctx.prompt
        query = (
            prompt
            if isinstance(prompt, str)
            else " ".join(p for p in prompt or () if isinstance(p, str))
        )
        agent_name = ctx.agent.name if ctx.agent is not None else None
        names = list(tools) if tools is not None else _run_tools(ctx)
        lessons = exporter.recall(
            query=query,
            tools=names,
            task_type=task_type or exporter.task_type or agent_name,
            intent=intent,
        )
        return lessons.as_prompt()

    return instructions


def _run_tools(ctx: RunContext[Any]) -> list[str]:
    manager = ctx.tool_manager
    return sorted(manager.tools) if manager is not None and manager.tools else []


__all__ = ["HindsightSpanExporter", "hindsight_instructions", "instrumentation"]
