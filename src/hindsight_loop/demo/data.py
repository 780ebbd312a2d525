"""Nightly CSV exports from several source systems, each with its own quirks, and their truth.

The demo needs files that are messy in the ways real exports are, and a ground truth to score
the agent against, so that "cleaned correctly" is a fact and not the agent's own opinion. Every
batch is generated from a seed (same seed, same bytes); two seeds give two nights with different
files but the same kinds of trouble, which is what lets lessons from one night help the next.
"""

from __future__ import annotations

import csv
import io
import random
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SOURCES", "CsvFile", "Source", "generate_batch"]


@dataclass(kw_only=True, frozen=True, slots=True)
class Source:
    """A system that drops a CSV export every night, with the quirks of its exporter."""

    name: str
    """The name the pipeline knows it by (recorded as the step's ``context.source``)."""
    description: str
    """What is peculiar about its files."""
    encoding: str
    """How the exporter encodes text (``utf-8-sig`` writes a byte-order mark)."""
    delimiter: str
    columns: tuple[str, ...]
    """The header the exporter writes, which is also the schema the file must match."""
    ragged: bool = False
    """The exporter drops trailing empty fields, so some rows are short."""
    newline: str = "\n"
    language: str = "en"
    """``zh`` when its people write job descriptions in Chinese."""


SOURCES: tuple[Source, ...] = (
    Source(
        name="pos_us",
        description="US point of sale: plain UTF-8, quoted commas",
        encoding="utf-8",
        delimiter=",",
        columns=("order_id", "store", "customer", "amount", "date"),
    ),
    Source(
        name="webstore",
        description="web shop: UTF-8 with a byte-order mark, gift notes over several lines",
        encoding="utf-8-sig",
        delimiter=",",
        columns=("order_id", "customer", "amount", "date", "gift_note"),
    ),
    Source(
        name="crm",
        description="CRM on Windows: UTF-16, CRLF, notes over several lines",
        encoding="utf-16",
        delimiter=",",
        columns=("contact_id", "name", "email", "phone", "notes"),
        newline="\r\n",
    ),
    Source(
        name="erp_cn",
        description="Chinese ERP: GBK, Chinese header and text",
        encoding="gbk",
        delimiter=",",
        columns=("订单号", "客户", "城市", "金额", "日期", "备注"),
        language="zh",
    ),
    Source(
        name="eu_shop",
        description="European shop: Latin-1, ';' delimiter, decimal commas",
        encoding="latin-1",
        delimiter=";",
        columns=("order_id", "customer", "city", "amount", "date"),
    ),
    Source(
        name="legacy_pos",
        description="legacy POS: UTF-8, drops trailing empty fields (ragged rows)",
        encoding="utf-8",
        delimiter=",",
        columns=("order_id", "store", "sku", "qty", "amount", "coupon", "note"),
        ragged=True,
    ),
)

_EN_NAMES = (
    "Alice Moore",
    "Smith, John",
    "Priya Patel",
    "Tom O'Neil",
    "Dana Lee",
    "Omar Haddad",
    "Grace Kim",
    "Lee, Ann",
    "Marco Rossi",
    "Ruth Adams",
)
_EU_NAMES = (
    "Jürgen Weiß",
    "Zoë Brontë",
    "Søren Dahl",
    "Hélène Lefèvre",
    "Åsa Berg",
    "Iñigo Núñez",
    "Françoise Roux",
    "Björn Ødegård",
    "Łukasz Nowak",
    "Ana Gómez",
)
_EU_CITIES = ("Köln", "Malmö", "Zürich", "Århus", "Besançon", "Málaga", "Linz", "Genève")
_CN_NAMES = ("张伟", "王芳", "李娜", "刘洋", "陈静", "杨磊", "赵敏", "黄勇", "周杰", "吴霞")
_CN_CITIES = ("北京", "上海", "广州", "深圳", "杭州", "成都", "武汉", "南京")
_CN_NOTES = ("", "加急", "已付款", "货到付款", "请开发票,抬头:华东贸易", "周末送货", "")
_GIFT_NOTES = (
    "",
    "Happy birthday!\nLove, Anna",
    "",
    "Congrats on the new job",
    "With thanks,\nthe team",
    "",
)
_CRM_NOTES = ("", "Prefers email.", "Called twice.\nAsked for a callback on Monday.", "VIP", "")
_STORES = ("NYC-01", "SF-02", "CHI-03", "AUS-04")

# Nobody writes names like "Łukasz" in Latin-1; those rows fall back to ASCII there.
_LATIN1_SAFE = tuple(n for n in _EU_NAMES if all(ord(c) < 256 for c in n))


@dataclass(kw_only=True, slots=True)
class CsvFile:
    """One generated export and what a correct cleaning of it must produce."""

    path: Path
    source: str
    columns: list[str]
    """The expected header (schema)."""
    rows: list[list[str]]
    """The ground truth: every data row with exactly ``len(columns)`` fields."""

    @property
    def name(self) -> str:
        return self.path.name


def _row(source: Source, rng: random.Random, n: int) -> list[str]:
    amount = f"{rng.randint(1, 4999)}.{rng.randint(0, 99):02d}"
    date = f"2024-11-{rng.randint(1, 28):02d}"
    match source.name:
        case "pos_us":
            return [f"P{n:05d}", rng.choice(_STORES), rng.choice(_EN_NAMES), amount, date]
        case "webstore":
            return [f"W{n:05d}", rng.choice(_EN_NAMES), amount, date, rng.choice(_GIFT_NOTES)]
        case "crm":
            name = rng.choice(_EN_NAMES)
            email = name.split()[-1].strip(",").lower().replace("'", "") + f"{n}@example.com"
            phone = f"+1-555-{rng.randint(100, 999)}-{rng.randint(1000, 9999)}"
            return [f"C{n:05d}", name, email, phone, rng.choice(_CRM_NOTES)]
        case "erp_cn":
            return [
                f"CN{n:06d}",
                rng.choice(_CN_NAMES),
                rng.choice(_CN_CITIES),
                amount,
                date,
                rng.choice(_CN_NOTES),
            ]
        case "eu_shop":
            # European exporters write decimal commas and day-first dates.
            eu_amount = amount.replace(".", ",")
            eu_date = f"{rng.randint(1, 28):02d}.11.2024"
            return [
                f"E{n:05d}",
                rng.choice(_LATIN1_SAFE),
                rng.choice(_EU_CITIES),
                eu_amount,
                eu_date,
            ]
        case "legacy_pos":
            coupon = rng.choice(("", "", "", "SAVE10", "BF24"))
            note = rng.choice(("", "", "", "void after close", "manager override"))
            return [
                f"L{n:05d}",
                rng.choice(_STORES),
                f"SKU-{rng.randint(1000, 9999)}",
                str(rng.randint(1, 12)),
                amount,
                coupon,
                note,
            ]
    raise ValueError(f"unknown source {source.name!r}")


def _encode(source: Source, rows: list[list[str]]) -> bytes:
    buf = io.StringIO()
    writer = csv.writer(buf, delimiter=source.delimiter, lineterminator=source.newline)
    writer.writerow(source.columns)
    for row in rows:
        out = list(row)
        if source.ragged:
            while out and out[-1] == "":
                out.pop()
        writer.writerow(out)
    return buf.getvalue().encode(source.encoding)


def generate_batch(
    directory: Path, *, seed: int, files: int = 24, night: str = "night"
) -> list[CsvFile]:
    """Write one night's exports into ``directory`` and return them with their ground truth.

    Sources take turns (in a seeded order), so a batch of ``6 * k`` files has ``k`` from each.

    Args:
        directory: Where to write (created if missing).
        seed: Same seed, same files, byte for byte.
        files: How many files.
        night: A label for the file names (``crm_<night>_03.csv``).
    """
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    kinds = [SOURCES[i % len(SOURCES)] for i in range(files)]
    rng.shuffle(kinds)
    batch: list[CsvFile] = []
    for i, source in enumerate(kinds):
        count = rng.randint(8, 24)
        base = rng.randint(1, 90_000)
        rows = [_row(source, rng, base + j) for j in range(count)]
        if source.ragged and not any(r[-1] == "" for r in rows):
            rows[0][-1] = ""  # every legacy file shows its quirk at least once
        path = directory / f"{source.name}_{night}_{i:03d}.csv"
        path.write_bytes(_encode(source, rows))
        batch.append(
            CsvFile(path=path, source=source.name, columns=list(source.columns), rows=rows)
        )
    return batch
