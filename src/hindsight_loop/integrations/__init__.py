"""Live integrations: what agent frameworks already emit, recorded as Hindsight runs.

Each module wraps one framework and is installed with its extra; importing a module whose
framework is missing raises an ``ImportError`` that names the ``pip install`` command.

- ``otel``: an OpenTelemetry ``SpanExporter`` for GenAI-convention spans (pydantic-ai and any
  framework that emits ``invoke_agent`` / ``execute_tool`` / ``chat`` spans), mapped by the
  same code as ``hindsight import --format otlp`` (``hindsight-loop[otel]``);
- ``pydantic_ai``: recalled lessons as pydantic-ai instructions, next to the exporter
  (``hindsight-loop[pydantic-ai]``);
- ``langchain``: a LangChain / LangGraph callback handler (``hindsight-loop[langchain]``);
- ``openai_agents``: an OpenAI Agents SDK tracing processor and run hooks
  (``hindsight-loop[openai-agents]``);
- ``litellm``: a LiteLLM callback logger for completions with tool calls
  (``hindsight-loop[litellm]``).

Integrations are surfaces: they call the facade (``Hindsight``) and never the store.
"""

from __future__ import annotations


def missing(package: str, extra: str) -> ImportError:
    """The error raised when a framework is not installed: it names the install command."""
    return ImportError(
        f"this integration needs {package!r}; install it with: pip install 'hindsight-loop[{extra}]'"
    )
