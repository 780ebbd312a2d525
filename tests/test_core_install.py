"""The core install works alone: no extra (openai, anthropic, mcp, server, st) is imported by
the library, the CLI or the demo, and a missing extra is named with its install command."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

# Runs in a fresh interpreter where importing any extra's package fails, as on a core install.
_BLOCKER = textwrap.dedent(
    """
    import importlib.abc, sys
    EXTRAS = {"openai", "anthropic", "mcp", "starlette", "uvicorn", "sentence_transformers",
              "torch", "httpx", "opentelemetry"}

    class NoExtras(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in EXTRAS:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
            return None

    sys.meta_path.insert(0, NoExtras())
    """
)


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _BLOCKER + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_demo_runs_with_no_extras(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    proc = _run(
        f"""
        sys.argv = ["hindsight", "demo", "--json", "--db", {str(db)!r}]
        from hindsight_loop.cli import main
        try:
            main()
        except SystemExit as exc:
            assert not exc.code, exc.code
        """
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    cold, warm = report["rounds"]
    assert warm["succeeded"] > cold["succeeded"]
    assert report["lessons"]


def test_missing_extra_names_the_install_command() -> None:
    proc = _run(
        """
        try:
            from hindsight_loop.mcp import build_server
        except ImportError as exc:
            print(exc)
        from hindsight_loop.llm import LLMConfig, connect
        try:
            connect(LLMConfig(provider="openai", model="m", api_key="k"))
        except ImportError as exc:
            print(exc)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'hindsight-loop[mcp]'" in proc.stdout
    assert "pip install 'hindsight-loop[openai]'" in proc.stdout
