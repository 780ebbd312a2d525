"""How alike curation finds each kind of pair: can similarity alone tell a rewording?

For every labelled pair of every split (``run.py``'s data), the similarity curation compares
with its merge thresholds (``lessons.text_similarity``: the embedder's cosine, rescaled from its
floor for a model, mixed with the shared terms), and the cosine alone. Reported per kind
(rewording, unrelated, opposite) and language: the 10th, 50th and 90th percentile, and the
share of each kind at or above the plain merge threshold (``MERGE_THRESHOLD``; a shared step or
error type lowers it to ``MERGE_THRESHOLD_SAME_SCENARIO``, reported beside).

What it shows: where rewordings and unrelated pairs overlap in similarity, no threshold merges
90% of rewordings without merging unrelated advice; where opposites score above rewordings (a
model's cosine does), only the stance rules keep them apart.

Run: ``python bench/curation/similarity.py`` (``--embedder hash|e5|…``, repeatable; ``--json``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from run import SPLITS, load_pairs, make_embedder  # noqa: E402

from hindsight_loop.embed import cosine_floor, is_model_floor, rescale_cosines  # noqa: E402
from hindsight_loop.lessons import (  # noqa: E402
    MERGE_THRESHOLD,
    MERGE_THRESHOLD_SAME_SCENARIO,
    MODEL_COSINE_WEIGHT,
    text_similarity,
)

KINDS = ("rewording", "unrelated", "opposite")


def measure(spec: str) -> dict[str, Any]:
    embedder = make_embedder(spec)
    floor = cosine_floor(embedder)
    weight = MODEL_COSINE_WEIGHT if is_model_floor(floor) else 0.5
    values: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for split in SPLITS:
        for pair in load_pairs(split):
            vecs = np.asarray(embedder.embed([pair["b"], pair["a"]]), dtype=np.float32)
            cosine = float(rescale_cosines(np.asarray([vecs[1] @ vecs[0]]), floor)[0])
            sims, cosines = values.setdefault((pair["kind"], pair["lang"]), ([], []))
            sims.append(text_similarity(pair["b"], pair["a"], cosine, weight))
            cosines.append(cosine)
    rows = []
    for kind in KINDS:
        for lang in ("en", "zh"):
            sims, cosines = values.get((kind, lang), ([], []))
            if not sims:
                continue
            s, c = np.asarray(sims), np.asarray(cosines)
            rows.append(
                {
                    "kind": kind,
                    "lang": lang,
                    "pairs": len(sims),
                    "similarity": [float(np.percentile(s, q)) for q in (10, 50, 90)],
                    "cosine": [float(np.percentile(c, q)) for q in (10, 50, 90)],
                    "at_merge_threshold": float(np.mean(s >= MERGE_THRESHOLD)),
                    "at_same_scenario_threshold": float(
                        np.mean(s >= MERGE_THRESHOLD_SAME_SCENARIO)
                    ),
                }
            )
    return {"embedder": embedder.name, "rows": rows}


def render(result: dict[str, Any]) -> str:
    lines = [
        f"embedder {result['embedder']}: every split's pairs; similarity as curation computes it "
        f"(p10 / p50 / p90), the cosine alone, share >= {MERGE_THRESHOLD} "
        f"(>= {MERGE_THRESHOLD_SAME_SCENARIO} with a shared step or error type)",
        "| kind | lang | pairs | similarity | cosine | >= merge | >= same-scenario |",
        "|---|---|---:|---|---|---:|---:|",
    ]
    for r in result["rows"]:
        sim = " / ".join(f"{v:.2f}" for v in r["similarity"])
        cos = " / ".join(f"{v:.2f}" for v in r["cosine"])
        lines.append(
            f"| {r['kind']} | {r['lang']} | {r['pairs']} | {sim} | {cos} | "
            f"{r['at_merge_threshold']:.0%} | {r['at_same_scenario_threshold']:.0%} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--embedder", action="append", help="hash (default), e5, st:MODEL, ...")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = [measure(spec) for spec in args.embedder or ["hash"]]
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        print("\n\n".join(render(r) for r in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
