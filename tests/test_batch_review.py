"""The worker reviews the runs of a task type together: imported transcripts of several runs that
fail the same way teach one lesson about the pattern, with none of one run's values."""

from __future__ import annotations

import json
from pathlib import Path

from hindsight_loop import Hindsight


def _run(n: int, pages: int, asked: int) -> dict:
    """One OpenAI-format run: the agent asks for a page past the end, reads the error, retries
    with the last page, and succeeds."""
    doc = f"report_{n:04d}.pdf"
    return {
        "task_id": f"extract-{n}",
        "reward": 1.0,
        "messages": [
            {"role": "user", "content": f"Extract page {asked} of {doc}, please."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "a",
                        "type": "function",
                        "function": {
                            "name": "extract_page",
                            "arguments": json.dumps({"document": doc, "page": asked}),
                        },
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "a",
                "content": f"Error: page {asked} out of range, document has {pages} pages",
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "b",
                        "type": "function",
                        "function": {
                            "name": "extract_page",
                            "arguments": json.dumps({"document": doc, "page": pages}),
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "b", "content": "page text ..."},
            {"role": "assistant", "content": "Here is the last page; yours was out of range."},
        ],
    }


def test_imported_runs_are_reviewed_together_into_one_pattern_lesson(tmp_path: Path) -> None:
    runs = [_run(n, pages=10 + n, asked=20 + 3 * n) for n in range(4)]
    with Hindsight(tmp_path / "h.db", background=False) as hs:
        report = hs.import_transcript(runs, task_type="pdf_extraction")
        assert report.runs == 4 and not report.problems
        assert hs.drain()
        lessons = hs.lessons(task_type="pdf_extraction")
        patterns = [x for x in lessons if x.structured and x.structured.when.get("error_template")]
        assert len(patterns) == 1, [x.advice for x in lessons]
        # Each run's own review quoted that run's pages: none of that reached the book.
        assert lessons == patterns, [x.advice for x in lessons]
        [lesson] = patterns
        assert lesson.structured is not None
        assert lesson.structured.when["tool"] == "extract_page"
        assert "out of range" in lesson.advice
        # No value of one run reaches the advice: documents, pages asked, page counts.
        for n in range(4):
            for value in (f"report_{n:04d}", f"page {20 + 3 * n}", f"has {10 + n}"):
                assert value not in lesson.advice
        assert len(lesson.source_task_ids) == 4
        # Recall before the call on a new task finds it.
        found = hs.recall(
            task_type="pdf_extraction",
            tools=["extract_page"],
            query="Extract page 31 of report_0099.pdf, please.",
        )
        assert lesson.lesson_id in found.ids
