"""Tokenizing and language detection for English and Chinese text."""

from __future__ import annotations

from hindsight_loop.text import detect_language, is_cjk, tokenize


def test_latin_words_are_lowercased_and_plurals_folded() -> None:
    assert tokenize("Confirm the Cities before Calling") == ["confirm", "city", "before", "calling"]
    assert tokenize("files") == tokenize("file") == ["file"]
    # Words that only look plural stay whole.
    assert tokenize("status analysis class") == ["status", "analysis", "class"]


def test_stopwords_are_dropped_unless_asked_to_keep() -> None:
    assert tokenize("the city of the user") == ["city", "user"]
    assert tokenize("the city", drop_stopwords=False) == ["the", "city"]


def test_compound_names_also_yield_their_parts() -> None:
    assert tokenize("read_csv") == ["read_csv", "read", "csv"]
    assert tokenize("EncodingError") == ["encodingerror", "encoding", "error"]
    assert tokenize("HTTPServerError") == ["httpservererror", "http", "server", "error"]
    tokens = tokenize("encoding=utf-8-sig")
    assert tokens[:2] == ["encoding", "utf-8-sig"] and "sig" in tokens


def test_chinese_runs_yield_characters_and_bigrams() -> None:
    assert tokenize("确认城市") == ["确", "认", "确认", "城", "认城", "市", "城市"]
    # Particles are dropped as single characters but kept inside bigrams.
    tokens = tokenize("城市的天气")
    assert "的" not in tokens and "市的" in tokens and "天气" in tokens


def test_mixed_chinese_and_english() -> None:
    tokens = tokenize("使用 read_csv 时指定 encoding")
    assert {"使用", "read_csv", "csv", "指定", "encoding"} <= set(tokens)
    # A query and a lesson that share a Chinese word meet on it.
    assert set(tokenize("明天北京的天气")) & set(tokenize("查询天气前先确认城市")) >= {"天气"}


def test_full_width_forms_are_folded() -> None:
    assert tokenize("ＣＳＶ　ｆｉｌｅ") == ["csv", "file"]
    assert tokenize("") == [] and tokenize("   ,;!") == []


def test_detect_language() -> None:
    assert detect_language("Confirm the city before calling get_weather") == "en"
    assert detect_language("查询天气前先确认城市") == "zh"
    # Chinese carrying English identifiers is still Chinese.
    assert detect_language("使用 read_csv 时指定 encoding=utf-8-sig") == "zh"
    # A Chinese name in an English sentence does not make it Chinese.
    assert detect_language("Remember that 北京 has two airports") == "en"
    assert detect_language("") == "en"


def test_is_cjk() -> None:
    assert is_cjk("天") and is_cjk("カ") and is_cjk("한")
    assert not is_cjk("a") and not is_cjk("1")
