"""The ``hindsight`` command: one group, a sub-group per noun (tasks, lessons, mcp, …)."""

from __future__ import annotations

from hindsight_loop.cli.app import app, main

__all__ = ["app", "main"]
