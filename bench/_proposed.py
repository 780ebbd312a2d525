"""A change to ``SQLiteStore.write_event_batch`` proposed by the benchmarks, measured beside it.

The shipped statement hands SQLite one JSON array of whole rows, bodies included, so SQLite's
JSON parser (3.40 here: no JSONB, no parse cache) reads every body once in ``json_each`` and
again for ``value->>5``. Here the bodies travel as one BLOB and only a small JSON array of
(scalars, offset, length) is parsed; ``substr`` on a BLOB counts bytes, so each body is cut out
in O(1) and stored as TEXT, exactly as before. Still one statement per batch, so a CPU-busy
agent thread cannot starve the writer.

This module exists only so ``bench/ingest.py`` can show what the change buys; the store itself
is not modified by the benchmarks.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

INSERT_BATCH_BLOB = """
INSERT INTO events(event_id, task_id, seq, ts, type, body)
SELECT value->>0, value->>1, value->>2, value->>3, value->>4,
       CAST(substr(?2, value->>5, value->>6) AS TEXT)
FROM json_each(?1)
"""


def write_event_batch(
    store: object, rows: Sequence[tuple[str, str, int, str, str, bytes]]
) -> list[str]:
    """``SQLiteStore.write_event_batch`` with the bodies passed as one BLOB."""
    if not rows:
        return []
    index = []
    offset = 1  # substr() counts from 1
    for r in rows:
        n = len(r[5])
        index.append((r[0], r[1], r[2], r[3], r[4], offset, n))
        offset += n
    bodies = b"".join(r[5] for r in rows)
    db = store._db  # type: ignore[attr-defined]
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute(INSERT_BATCH_BLOB, (orjson.dumps(index), bodies))
        unknown = store._adopt_unknown_tasks(db, rows)  # type: ignore[attr-defined]
        store._apply_task_events(db, rows)  # type: ignore[attr-defined]
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return unknown
