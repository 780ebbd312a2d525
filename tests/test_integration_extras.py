"""Each integration needs its framework only when it is imported, and says how to install it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# In a fresh interpreter where the frameworks cannot be imported, as on a core install.
_BLOCKER = textwrap.dedent(
    """
    import importlib.abc, sys
    BLOCKED = {"opentelemetry", "pydantic_ai", "langchain_core", "agents", "litellm"}

    class NoFrameworks(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
            return None

    sys.meta_path.insert(0, NoFrameworks())
    import hindsight_loop.integrations  # the package itself needs nothing
    """
)


@pytest.mark.parametrize(
    ("module", "extra"),
    [
        ("otel", "otel"),
        ("pydantic_ai", "otel"),  # it needs the exporter's extra first
        ("langchain", "langchain"),
        ("openai_agents", "openai-agents"),
        ("litellm", "litellm"),
    ],
)
def test_a_missing_framework_names_the_install_command(module: str, extra: str) -> None:
    code = _BLOCKER + textwrap.dedent(
        f"""
        try:
            import hindsight_loop.integrations.{module}
        except ImportError as exc:
            print(exc)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"pip install 'hindsight-loop[{extra}]'" in proc.stdout
