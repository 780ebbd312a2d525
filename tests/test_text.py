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


def test_error_templates_mask_run_specific_values() -> None:
    from hindsight_loop.text import error_template, mask_values

    a = error_template("Error: payment amount does not add up, total price is 374, but paid 299")
    b = error_template("Error: payment amount does not add up, total price is 1203, but paid 833")
    assert a == b == "Error: payment amount does not add up, total price is <num>, but paid <num>"
    assert error_template("flight HAT030 not available on date 2024-05-13") == (
        "flight <id> not available on date <date>"
    )
    assert error_template("no such file: '/tmp/a b.csv'") == "no such file: <value>"
    assert error_template("timeout after 30s at 12:03:04") == "timeout after <num> at <time>"
    template, found = mask_values("order 7f3a2b9c-1234-4567-89ab-cdef01234567 of a@b.com")
    assert template == "order <id> of <email>" and [k for k, _ in found] == ["id", "email"]


def test_error_templates_work_in_chinese() -> None:
    from hindsight_loop.text import error_template

    assert error_template("航班HAT030在2024年5月13日不可用") == "航班<id>在<date>不可用"
    assert error_template("余额不足：礼品卡 gift_card_123456 只剩 20 元") == error_template(
        "余额不足：礼品卡 gift_card_998877 只剩 7 元"
    )


def test_value_shape_keeps_options_and_abstracts_instances() -> None:
    from hindsight_loop.text import value_shape

    assert value_shape("certificate_8998287") == "certificate_*"
    assert value_shape("2024-05-13") == "<date>"
    assert value_shape(299) == "<num>"
    assert value_shape("HAT030") == "<id>"
    for option in ("gbk", "utf-8", "business", True, "v2"):
        assert value_shape(option) is None
