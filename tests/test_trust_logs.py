"""Secrets never reach Hindsight's log lines or stored errors (issue: trust, redaction).

A reflector (or a tool, or a model endpoint) fails with a message that carries a secret; the
warning, the ``log.exception`` traceback and the failed reflection in the store are redacted
like a recorded event.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hindsight_loop import Hindsight
from hindsight_loop.logs import LOGGERS

SECRET = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"
PASSWORD = "hunter2-Xq9"


class LeakyReflector:
    name = "leaky"

    def reflect(self, chronicle, *, kind="full", window=None):  # noqa: ANN001, ANN201
        raise RuntimeError(f"upstream refused api_key={SECRET} (password: {PASSWORD})")


def _run(hs: Hindsight) -> str:
    with hs.task("billing", goal="charge the card", recall=False) as task:
        task.record_action("charge", {"amount": 5}, output={"ok": True})
    hs.flush()
    return task.task_id


def test_a_failed_reflection_is_logged_and_stored_without_its_secret(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hs = Hindsight(tmp_path / "hs.db", background=False, triggers=False)
    try:
        task_id = _run(hs)
        with caplog.at_level(logging.WARNING, logger="hindsight_loop"):
            reflection = hs.reflect(task_id, reflector=LeakyReflector())
        assert reflection.status == "failed"
        assert "upstream refused" in caplog.text  # the line is kept, only the secret goes
        stored = hs.reflections(task_id)[0]
        for text in (caplog.text, reflection.error or "", stored.error or ""):
            assert SECRET not in text and PASSWORD not in text, text
    finally:
        hs.close()
    assert SECRET not in (tmp_path / "hs.db").read_bytes().decode("utf-8", "replace")


def test_a_traceback_logged_by_hindsight_is_redacted(caplog: pytest.LogCaptureFixture) -> None:
    for name in LOGGERS:
        log = logging.getLogger(name)
        with caplog.at_level(logging.ERROR, logger=name):
            try:
                raise ValueError(f"connect redis://:{PASSWORD}@cache:6379 failed")
            except ValueError:
                log.exception("hindsight: %s failed for %s", "a job", f"token={SECRET}")
        assert "ValueError" in caplog.text and "Traceback" in caplog.text
        assert SECRET not in caplog.text and PASSWORD not in caplog.text, name
        caplog.clear()
