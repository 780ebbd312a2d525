"""Recording from the agent's hot path.

The agent's thread does as little as possible: it takes a sequence number and a timestamp and
appends a tuple to a deque (both atomic under the GIL, no lock, no I/O, no serialization). A
background writer turns batches into rows (sanitizing, cutting long text, redacting secrets) and
writes each batch with one SQL statement. ``flush()`` returns once everything accepted before it
is durable. A batch the store refuses goes, with the reason, to a dead-letter file next to the
database, so nothing accepted is lost silently. The writer's work needs the GIL as the agent's
does: once a batch's worth waits to be durable, an agent's thread waits while the writer
prepares its batch (never while it waits on the disk), so a CPU-busy agent cannot outrun it.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import decimal
import enum
import hashlib
import logging
import math
import os
import queue
import re
import reprlib
import sqlite3
import sys
import threading
import time
import uuid
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from datetime import UTC, date, datetime, timedelta
from datetime import time as dt_time
from itertools import count, islice
from pathlib import Path, PurePath
from types import CodeType, FrameType
from typing import Any, ClassVar, Protocol

import orjson

from hindsight_loop import redact_scan
from hindsight_loop.models import (
    EPOCH_RANGE,
    EVENT_BODY_FIELDS,
    WIRE_SCALARS,
    new_id,
    parse_ts,
    reset_in_forked_child,
)
from hindsight_loop.replay import projected
from hindsight_loop.ring import COUNTERS

log = logging.getLogger("hindsight_loop")

DEFAULT_MAX_TEXT = 500
DEFAULT_QUEUE_BOUND = 50_000
BATCH_SIZE = 10_000
#: Accepted events not yet durable past which an agent's thread waits while the writer thread
#: prepares a batch (``Recorder._yield_to_writer``). One batch: with what arrives while the
#: committer writes, the backlog of a CPU-busy agent stays within two.
YIELD_AT = BATCH_SIZE
#: Events whose redaction guards the writer thread looks for in one Hyperscan scan
#: (``Recorder._prepare``): one release of the GIL per chunk rather than per event.
SCAN_CHUNK = 100
#: The first spill of an overload takes this many events (its cost sizes the next ones).
SPILL_FIRST = 16
#: A first guess of a spill's cost per event (seconds), before one was measured.
SPILL_COST_GUESS = 50e-6
#: How long ``close()`` waits while the writer (a thread, or a writer process) makes nothing
#: durable before it takes it for held up (a store call blocked on another process's lock or a
#: hung disk, a process stopped), stops waiting and keeps the rest in the dead letter, in
#: seconds: twice the store's busy timeout, the longest a healthy writer waits without a word.
CLOSE_STALL = 60.0


class HindsightWarning(UserWarning):
    """Something the agent handed Hindsight was changed or could not be used as it was."""


def warn(message: str) -> None:
    """Warn without ever raising into the caller (even when warnings are turned into errors).

    The message is redacted first: it may quote what the agent recorded."""
    with contextlib.suppress(Exception):
        message = redact(message.encode("utf-8", "replace")).decode("utf-8", "replace")
    log.debug(message)
    # A warnings filter set to "error" must not break the agent.
    with contextlib.suppress(Exception):
        warnings.warn(message, HindsightWarning, stacklevel=3)


# -- secrets ----------------------------------------------------------------------------------

REDACTED = "[REDACTED]"

# Literal cores of the names that may hold a secret; every candidate the patterns below find
# contains one, and ``_names_secret`` decides on the whole name (``max_tokens`` is not secret).
_SECRET_WORDS = (
    r"pass(?:word|wd|phrase)?|pwd|secret|api[_\-. ]?key|apikey|access[_\-. ]?key"
    r"|account[_\-. ]?key|private[_\-. ]?key|token|auth(?:orization)?|cookie|credential"
    # the last word of a name (AZURE_OPENAI_KEY=…, "hmac_key": …): the whole name decides
    r"|[_\-.]key"
)
_SECRET_WORDS_ZH = "密码|口令|密钥|令牌|秘钥"
# A JSON value: a string, a number, a literal, or a flat list (a list of tokens is secret too).
_JSON_VALUE = rb'(?:"(?:[^"\\]|\\.)*"|-?\d[\d.eE+\-]*|true|false|null|\[[^\[\]]*\])'
# What a free-text secret value is made of: up to a space, a quote, a separator.
_TEXT_VALUE = rb"(?!\[REDACTED)[^\s\"'\\,;&]+"
_ASSIGN = rb"(?:[:=]|\xef\xbc\x9a|\s+is\s+|\xe6\x98\xaf|\xe4\xb8\xba)"  # : = ： is 是 为
_IDENT_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")

# Whether a name holds a secret. Cores that are secret wherever they sit in the name (the name
# lowercased and stripped of separators: ``AWS_SECRET_ACCESS_KEY``, ``X-Api-Key``, ``AccountKey``).
_SECRET_CORES = (
    "password",
    "passwd",
    "passphrase",
    "secret",
    "credential",
    "apikey",
    "privatekey",
    "accesskey",
    "accountkey",
    "signingkey",
    "encryptionkey",
    "masterkey",
    "sessionkey",
    "openaikey",
    "stripekey",
    "hmackey",
    "licensekey",
    "subscriptionkey",
    "consumerkey",
    "authorization",
    "cookie",
)
# ``token`` names a secret (``access_token``, ``tokens``) except beside a word that makes it a
# count, a limit or a piece of text (``max_tokens``, ``prompt_tokens``, ``pad_token``).
_TOKEN_NOT_SECRET = frozenset(
    {
        "max",
        "min",
        "num",
        "n",
        "count",
        "counts",
        "limit",
        "limits",
        "total",
        "used",
        "usage",
        "budget",
        "prompt",
        "completion",
        "input",
        "output",
        "cached",
        "cache",
        "reasoning",
        "length",
        "len",
        "size",
        "remaining",
        "left",
        "type",
        "types",
        "url",
        "uri",
        "endpoint",
        "ids",
        "estimate",
        "estimated",
        "per",
        "window",
        "rate",
        "bucket",
        "kind",
        "position",
        "index",
        "idx",
        "offset",
        "offsets",
        "span",
        "logprob",
        "logprobs",
        "prob",
        "text",
        "str",
        "string",
        "vocab",
        "special",
        "pad",
        "eos",
        "bos",
        "unk",
        "sep",
        "cls",
        "mask",
        "start",
        "end",
        "stop",
        "new",
        "added",
        "audio",
        "image",
    }
)
# ``first_pass``: a pass over the data, not a password
_PASS_NOT_SECRET = frozenset({"first", "second", "third", "final", "last", "next", "one", "two"})
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NAME_SPLIT = re.compile(r"[^a-z]+")


def _secret_name(name: str) -> bool:
    if any(w in name for w in ("密码", "口令", "密钥", "令牌", "秘钥")):
        return True
    words = [w for w in _NAME_SPLIT.split(_CAMEL.sub("_", name).lower()) if w]
    joined = "".join(words)
    if any(core in joined for core in _SECRET_CORES):
        return True
    if joined in ("pass", "pwd") or "pwd" in words or (words and words[-1] == "auth"):
        return True
    # DB_PASS, smtpPass: the last word; a metric puts it first (pass_rate, pass_at_1)
    if len(words) > 1 and words[-1] == "pass" and words[-2] not in _PASS_NOT_SECRET:
        return True
    if any(w.endswith(("token", "tokens")) for w in words):
        return not any(w in _TOKEN_NOT_SECRET for w in words)
    return False


# Keys known not to name a secret: agents use few distinct keys, so one set lookup per dict
# replaces a pattern match per key. Keys made from data must not grow it forever: it is
# cleared past a bound.
_PLAIN_KEYS: set[str] = set()
_PLAIN_KEYS_BOUND = 10_000
_SECRET_NAMES: dict[str, bool] = {}


def _names_secret(key: str) -> bool:
    if len(_PLAIN_KEYS) > _PLAIN_KEYS_BOUND:
        _PLAIN_KEYS.clear()
    known = _SECRET_NAMES.get(key)
    if known is None:
        if len(_SECRET_NAMES) > _PLAIN_KEYS_BOUND:
            _SECRET_NAMES.clear()
        known = _SECRET_NAMES[key] = _secret_name(key)
    return known


def _ident_before(blob: bytes, start: int) -> bytes:
    """The identifier characters right before ``start`` (``max_`` of ``max_tokens=``)."""
    i = start
    while i > 0 and start - i < 40 and blob[i - 1] in _IDENT_CHARS:
        i -= 1
    return blob[i:start]


def _key_sub(m: re.Match[bytes]) -> bytes:
    key = m.group(2).decode("utf-8", "replace")
    return m.group(1) + b'"[REDACTED]"' if _names_secret(key) else m.group(0)


def _text_sub(m: re.Match[bytes]) -> bytes:
    word = m.group("w")
    if word is not None:
        name = (_ident_before(m.string, m.start()) + word).decode("ascii", "replace")
        if not _names_secret(name):
            return m.group(0)
        # "--- PASS: TestLogin (0.00s)", "PASS: 42": a test's result, written in capitals
        if name == "PASS" and b":" in m.group(1):
            return m.group(0)
        # "Total tokens: 200", "tokens=512": a count (its word is before a space, not in the
        # name); no secret named tokens is a bare number
        if word[-6:].lower() == b"tokens" and m.string[m.end(1) : m.end()].isdigit():
            return m.group(0)
    return m.group(1) + b"[REDACTED]"


def _flag_sub(m: re.Match[bytes]) -> bytes:
    if _names_secret(m.group(2).decode("ascii", "replace")):
        return m.group(1) + b"[REDACTED]"
    return m.group(0)


def _luhn(digits: bytes) -> bool:
    total = 0
    for i, c in enumerate(reversed(digits)):
        d = c - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


# Card networks by prefix and length: Visa, Mastercard, Amex, Discover/UnionPay, JCB, Diners.
_CARD_PREFIX = re.compile(rb"4|5[1-5]|2[2-7]|3[47]|6|35|3[0689]")


def _card_sub(m: re.Match[bytes]) -> bytes:
    start = m.start()
    if start and m.string[start - 1 : start] in b"0123456789.":
        return m.group(0)
    digits = m.group(0).replace(b" ", b"").replace(b"-", b"")
    if 13 <= len(digits) <= 19 and _CARD_PREFIX.match(digits) and _luhn(digits):
        return b"[REDACTED CARD]"
    return m.group(0)


_WORDS_B = _SECRET_WORDS.encode()
_KEY_PATTERN = re.compile(
    rb'("([^"\\]{0,80}?(?:' + _WORDS_B + rb')[^"\\]{0,80})"\s*:\s*)' + _JSON_VALUE, re.I
)


# Literal cores of the secret words: every match of the key and text patterns contains one.
# One regex over the lowercased event beats a substring test per core (one scan, not many).
_WORD_CORES = re.compile(
    b"pass|pwd|secret|key|token|auth|cookie|credential|" + _SECRET_WORDS_ZH.encode()
)


# What a Chinese assignment may be made of besides the ASCII ones: ：, 是, 为, or a Chinese secret
# word followed by a bare space (密码 hunter2), each word by a character it holds (密码 密钥 口令
# 令牌 秘钥). Looked for in the decoded text: a one-character search there is a fast memchr,
# a three-byte one in UTF-8 is not (the trailing bytes are common to most Chinese text).
_ZH_ASSIGN = "：是为密令秘"


# Two- to four-byte needles as compiled literals (see ``_may_assign``).
_IS = re.compile(rb" is ")
_DASHES = re.compile(rb"--")


def _may_assign(blob: bytes, escaped: bool = False) -> bool:
    """Whether some string value may hold ``word: value``, ``word=value`` or ``word is value``.

    A few C-level scans answer it. orjson writes no space after a key's colon, so a colon not
    right after a quote is inside a string; so is one after an escaped quote (JSON quoted in a
    string value, ``{\\"password\\":\\"x\\"}``), which is why those are not counted as keys.
    Text with Chinese in it may also assign with ：/是/为 or a Chinese secret word and a space.
    ``escaped``: ``blob`` is orjson's output, which escapes every control character.

    Needles of two to four bytes are searched with a compiled literal pattern or behind a
    one-byte ``in`` (a memchr): ``bytes.__contains__`` steps through such needles a byte or
    two at a time, several times slower over a kilobyte.
    """
    # Every key's colon is a colon, so "more colons than key colons" is "any colon inside".
    if (
        b"=" in blob
        or blob.count(b":") > blob.count(b'":')
        or (b"\\" in blob and b'\\":' in blob)
        or _IS.search(blob) is not None
        # ``\s+is\s+`` with a tab or a newline: never in orjson's output (one-byte searches
        # are a memchr each), but in a log message
        or (
            not escaped
            and (
                b"\n" in blob
                or b"\t" in blob
                or b"\r" in blob
                or b"\x0b" in blob
                or b"\x0c" in blob
            )
            and b"is" in blob
        )
    ):
        return True
    if blob.isascii():
        return False
    text = blob.decode("utf-8", "replace")
    # ``_ZH_ASSIGN`` spelled out: a generator over it cost several times the six searches.
    return (
        "：" in text or "是" in text or "为" in text or "密" in text or "令" in text or "秘" in text
    )


# Vendor keys are long runs of [A-Za-z0-9_-] (16 or more: every vendor pattern below needs
# one). One C-level translate (each byte of the class as "a", every other as a space) and one
# search find such a run; most events have none, and those that do then pay for the few
# literal-prefixed patterns. (The one-pass guards look for ``_VENDOR_STARTS`` instead.)
_RUN_TABLE = bytes(
    0x61 if chr(c).isascii() and (chr(c).isalnum() or chr(c) in "_-") else 0x20 for c in range(256)
)
_RUN = b"a" * 16
# Card numbers as the pattern below takes them: 13-19 digits in a row, 4-4-4-…, or 4-6-5; each
# shape holds 13 digits in a row or four digits, a space or dash, and four more.
_CARD_TABLE = bytes(
    0x30 if chr(c).isdigit() and c < 128 else c if chr(c) in " -" else 0x78 for c in range(256)
)
# 13 digits in a row, or four, a space or a dash, and four more: one compiled search (three
# ``in`` tests each stepped through the event a byte or two at a time).
_CARD_SHAPE = re.compile(rb"0000(?:0{9}|[ \-]0000)")

_PEM = re.compile(
    rb"-----BEGIN [A-Z ]*PRIVATE KEY-----"
    rb"(?:.*?-----END [A-Z ]*PRIVATE KEY-----|(?:[A-Za-z0-9+/=\s]|\\[nr])*)",
    re.S,
)
# Authorization: Token x (any scheme word)
_AUTHORIZATION = re.compile(
    rb"(?i)(authorization(?:\\\"|')?\s*[:=]\s*(?:\\?[\"'])?)(?:[A-Za-z]+\s+)?" + _TEXT_VALUE
)
_BEARER_GUARD = re.compile(rb"b(?:earer|asic)")  # on the lowercased event (2x faster than (?i))
_BEARER = re.compile(rb"(?i)(bearer|basic)\s+[A-Za-z0-9._~+/\-]{8,}=*")
# A letter before a key that does not end a JSON escape: ``"done\nsk-…"`` holds the key on a
# line of its own, though the n of \n is a letter (no \b before it). orjson writes control
# characters as \b \f \n \r \t or \u00XX; the other \uXXXX are read decoded (``_decoded``).
# A terminal's colour code ends in a letter too: ESC [ 1;33 m (``\u001b[1;33msk-…``).
_NOT_ESCAPE = rb"(?<!\\[bfnrt])(?<!\\u00[01][0-9a-fA-F])" + b"".join(
    rb"(?<!\\u001b\[" + rb"[0-9;]" * n + rb"m)" for n in range(9)
)
_WORD_BEFORE = rb"[A-Za-z0-9_]" + _NOT_ESCAPE


def _starts(*prefixes: bytes) -> bytes:
    """A key's first letters, one of ``prefixes``, where a key may start (see ``_WORD_BEFORE``).
    Looked behind after the letters, not before: a pattern that opens with its literal letters
    keeps ``re``'s fast prefix scan (an assertion first makes it 3-4x slower on 1 KB)."""
    return b"(?:%s)" % b"|".join(p + b"(?<!" + _WORD_BEFORE + p + b")" for p in prefixes)


_GITHUB = _starts(b"ghp", b"gho", b"ghs", b"ghu", b"github_pat", b"glpat")
_STRIPE = _starts(b"sk", b"rk", b"pk", b"whsec")
# (needle, pattern, replacement), each pattern's matches holding a 16-character run.
_VENDOR: list[tuple[bytes, re.Pattern[bytes], bytes]] = [
    (
        b"k-",
        re.compile(_starts(b"sk", b"pk", b"rk") + rb"-(?:[A-Za-z0-9_\-]{2,}-)?[A-Za-z0-9_\-]{16,}"),
        b"[REDACTED]",
    ),
    (b"_live_", re.compile(_STRIPE + rb"_live_[A-Za-z0-9]{10,}"), b"[REDACTED]"),  # Stripe
    (b"_test_", re.compile(_STRIPE + rb"_test_[A-Za-z0-9]{10,}"), b"[REDACTED]"),
    (b"AKIA", re.compile(_starts(b"AKIA") + rb"[0-9A-Z]{16}\b"), b"[REDACTED]"),
    (b"ASIA", re.compile(_starts(b"ASIA") + rb"[0-9A-Z]{16}\b"), b"[REDACTED]"),
    (b"g", re.compile(_GITHUB + rb"[_\-][A-Za-z0-9_\-]{16,}"), b"[REDACTED]"),
    (b"xox", re.compile(_starts(b"xox") + rb"[abpr][_\-][A-Za-z0-9_\-]{16,}"), b"[REDACTED]"),
    (b"AIza", re.compile(_starts(b"AIza") + rb"[0-9A-Za-z_\-]{30,}"), b"[REDACTED]"),  # Google
    (b"hf_", re.compile(_starts(b"hf_") + rb"[A-Za-z0-9]{30,}"), b"[REDACTED]"),  # Hugging Face
    (
        b"hooks.slack.com",
        re.compile(
            rb"(hooks\.slack\.com/)(?:services|workflows|triggers)/"
            rb"(?=[A-Za-z0-9_/\-]*[A-Za-z0-9_\-]{16})[A-Za-z0-9_/\-]+"
        ),
        rb"\1[REDACTED]",
    ),
    (
        b"eyJ",
        re.compile(_starts(b"eyJ") + rb"[A-Za-z0-9_\-]{13,}\.[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]*"),
        b"[REDACTED]",
    ),
]
# Where a match of some ``_VENDOR`` pattern starts, as one expression: each pattern's match
# begins with (or, for Stripe's, holds) one of these. The one-pass guards (``redact_scan``)
# look for it, not for the run of 16, which Hyperscan finds slowly and most text holds (ids,
# paths); tests/test_redact_guards.py runs it against each pattern on every vendor's keys.
_VENDOR_STARTS = (
    rb"_live_|_test_|hooks\.slack\.com/|(?:\b|\\[bfnrt]|\\u00[01][0-9a-fA-F]|\\u001b\[[0-9;]{0,8}m)"
    rb"(?:[spr]k-|A[KS]IA|(?:gh[posu]|github_pat|glpat)[_\-]|xox[abpr][_\-]|AIza|hf_|eyJ)"
)
# --password x in an argv list or a command line (the name decides: --max-tokens 9 stays), also
# at the start of a line ("…\n--password x")
# (the dashes first, then what is before them: ``re`` scans for a literal opening fast), its
# value quoted or not (--token "x")
_FLAG = re.compile(
    rb"(--(?<![\w\-]"
    + _NOT_ESCAPE
    + rb"--)([A-Za-z][A-Za-z0-9_.\-]{0,60})(?:\"\s*,\s*\"|\s+|=)(?:\\?[\"'])?)"
    + _TEXT_VALUE
)
# In free text: password=x, X-Api-Key: x, token is x, password='x', 密码：x, 密码 x
_TEXT_SECRET = re.compile(
    rb"(?i)((?:(?P<w>(?:"
    + _WORDS_B
    + rb")[A-Za-z0-9_.\-]{0,40})(?:\\\"|'|\*\*|__|`)?\s*"
    + _ASSIGN
    + rb"|(?:"
    + _SECRET_WORDS_ZH.encode()
    + rb")(?:\\\"|')?\s*(?:"
    + _ASSIGN
    + rb"|\s))\s*(?:\*\*|__|`)?\s*(?:\\?[\"'])?)"
    + _TEXT_VALUE
)
# A Cookie header in text: every pair of it (the session is rarely the first: _ga=…; sid=x),
# to the end of its line. In the cases headers are written, so a substring test guards it.
_COOKIE = re.compile(
    rb"((?:[Cc]ookie|COOKIE)(?<!"
    + _WORD_BEFORE
    + rb"[Cc][Oo][Oo][Kk][Ii][Ee])(?:\\?[\"'])?\s*:\s*(?:\\?[\"'])?)"
    + rb"(?!\[REDACTED)(?=[^\s=;\"'\\]+=)[^\"'\\\r\n]+"
)


def _may_hold_a_cookie(blob: bytes) -> bool:
    return b"ookie" in blob or b"OOKIE" in blob


# SQL that sets a password, with no sign of an assignment for the text pattern to find:
# CREATE USER app WITH PASSWORD 'x', ALTER USER … PASSWORD 'x', … IDENTIFIED BY 'x'. Written
# in the cases SQL is (so four substring tests find every match: no scan of a lowercased copy).
_SQL_PASSWORD = re.compile(
    rb"((?<![A-Za-z0-9_])(?:[Pp]assword|PASSWORD|[Ii]dentified\s+[Bb]y|IDENTIFIED\s+BY)\s+)"
    rb"(?:'(?:[^'\\]|'')*'|\\\"[^\"\\]*\\\")"
)


# A password a command takes in a short option or as user:password, which the --flag pattern
# cannot tell from any other: mysql -pX, sshpass -p X, redis-cli -a X, docker login -p X,
# curl -u user:X. The command's name says what the option means; a match reaches at most a
# few hundred characters past it (its own command line, or its argv list).
_ARGV_GAP = rb"(?:\"\s*,\s*\"|\s+)"  # between an option and its value: a command line, or argv
_QUOTE = rb"(?:\\?[\"'])?"
_LATER = rb"\b[^\n]{0,200}?(?<![\w\-])"  # later on the command's line (or in its argv)
# ``login`` of a registry client (docker login, podman login -u me -p x), on a line or in argv
_LOGIN = b"(?:%s)" % b"|".join(
    b"(?<=" + tool + gap + b"login)"
    for tool in (b"docker", b"podman", b"nerdctl", b"buildah")
    for gap in (b" ", b'\\",\\"')
)
# (needle, pattern): each pattern opens with its command's name, for ``re``'s literal scan
_COMMAND_SECRETS: list[tuple[bytes, re.Pattern[bytes]]] = [
    (
        needle,
        re.compile(b"(" + _starts(needle) + option + _QUOTE + b")" + _TEXT_VALUE),
    )
    for needle, option in (
        (b"mysql", rb"[a-z]*" + _LATER + rb"-p(?=[^\s\\\"])"),  # mysql, mysqldump, mysqladmin
        (b"mariadb", rb"[a-z\-]*" + _LATER + rb"-p(?=[^\s\\\"])"),
        (b"sshpass", _ARGV_GAP + rb"-p(?:" + _ARGV_GAP + rb")?"),
        (b"redis-cli", _LATER + rb"-a" + _ARGV_GAP),
        (b"login", _LOGIN + _LATER + rb"-p" + _ARGV_GAP),
        (b"curl", _LATER + rb"(?:-u|--user)(?:=|" + _ARGV_GAP + rb")" + _QUOTE + rb"[^\s:\"'\\]+:"),
    )
]


def _may_pass_a_command_secret(blob: bytes) -> bool:
    return any(needle in blob for needle, _ in _COMMAND_SECRETS)


def _command_secrets(blob: bytes) -> bytes:
    for needle, pattern in _COMMAND_SECRETS:
        if needle in blob:
            blob = pattern.sub(rb"\1[REDACTED]", blob)
    return blob


def _may_set_sql_password(blob: bytes) -> bool:
    return b"assword" in blob or b"ASSWORD" in blob or b"dentified" in blob or b"DENTIFIED" in blob


_USERINFO = re.compile(rb"(://[^/\s:@\"]*:)[^@\s/\"]+@")  # user:pw@host, redis://:pw@host
_CARD = re.compile(
    rb"[2-6]\d{12,18}(?!\d)|[2-6]\d{3}([ \-])\d{4}\1\d{4}(?:\1\d{1,7})?(?!\d)"
    rb"|3\d{3}([ \-])\d{6}\2\d{5}(?!\d)"
)


# Text the agent encoded before handing it over: JSON it serialized itself with ``ensure_ascii``
# (Python's ``json.dumps`` default) holds Chinese as \\uXXXX escapes, a URL holds it
# percent-encoded, while the secret words and signs above are the characters. Such an event is
# also read with those escapes written as the characters they stand for (``_decoded``).
_ESCAPED_CHAR = re.compile(rb"\\+u([0-9a-fA-F]{4})")
# (and the signs of an assignment in a URL inside a URL: ?next=%2Flogin%3Fpassword%3Dx)
_PERCENT_CHARS = re.compile(rb"(?:%[c-fC-F][0-9a-fA-F](?:%[89abAB][0-9a-fA-F]){1,3}|%3[dDaA]|%20)+")


def _escaped_char(m: re.Match[bytes]) -> bytes:
    code = int(m.group(1), 16)
    # ASCII (a quote, a backslash) would change what the JSON says; a lone surrogate is no
    # character: both stay escaped. The run of backslashes goes with the escape, whatever
    # nesting of JSON-in-a-string it took.
    if code < 0x80 or 0xD800 <= code <= 0xDFFF:
        return m.group(0)
    return chr(code).encode("utf-8")


def _percent_chars(m: re.Match[bytes]) -> bytes:
    try:
        return bytes.fromhex(m.group(0).replace(b"%", b"").decode("ascii")).decode().encode()
    except ValueError:  # not UTF-8: not a character
        return m.group(0)


def _decoded(blob: bytes) -> bytes | None:
    """``blob`` with escaped or percent-encoded characters beyond ASCII written as themselves
    (密码 for \\u5bc6\\u7801 or %E5%AF%86%E7%A0%81; percent-encoded =, : and space too), or
    None when it holds none. Two memchr for the usual event, which holds neither (``find`` of
    one byte is a memchr, ``in`` is not: 0.08 vs 0.2 µs over 600 bytes, 0.8 for two bytes)."""
    view = blob
    if blob.find(b"\\") != -1 and b"\\u" in blob:
        view = _ESCAPED_CHAR.sub(_escaped_char, view)
    if blob.find(b"%") != -1 and _PERCENT_CHARS.search(view) is not None:
        view = _PERCENT_CHARS.sub(_percent_chars, view)
    return None if view is blob or view == blob else view


#: Every guard in one pass, with Hyperscan (the ``[hyperscan]`` extra); None without it, False
#: until the first event asks (compiling the guards takes tens of milliseconds: not at import).
_SCANNER: redact_scan.Scanner | None | bool = False
# Reentrant, with ``_SCANNER_LOADING`` saying a load is under way: a signal handler that logs
# (Hindsight's log filter redacts) or records while its own thread is inside the load came in
# here and waited for good for a plain lock its thread held.
_SCANNER_LOCK = threading.RLock()
_SCANNER_LOADING = False


def _scanner() -> redact_scan.Scanner | None:
    global _SCANNER, _SCANNER_LOADING  # noqa: PLW0603 - loaded once, on first use
    with _SCANNER_LOCK:
        if _SCANNER is False:
            if _SCANNER_LOADING:
                # This thread's own load, interrupted (a signal handler): it cannot end before
                # the handler returns, so the handler's call takes the pure-Python guards,
                # which give the same result.
                return None
            _SCANNER_LOADING = True
            try:
                _SCANNER = redact_scan.load(_WORD_CORES.pattern, _VENDOR_STARTS)
            finally:
                _SCANNER_LOADING = False
    return _SCANNER  # type: ignore[return-value]


def _scanner_forked() -> None:
    """In a forked child: a lock of its own. Another thread of the parent inside the load at
    the fork held the child's copy for good, and the child's first redaction waited for it."""
    global _SCANNER_LOCK, _SCANNER_LOADING  # noqa: PLW0603 - the child's own
    _SCANNER_LOCK = threading.RLock()
    _SCANNER_LOADING = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_scanner_forked)


def guards_in_use() -> str:
    """Whether redaction's guards can run in one pass here: ``hyperscan`` or ``python``. The
    writer process scans each event; a writer thread in the agent's process scans a hundred
    at once (see ``Recorder``'s ``one_pass_guards`` and ``batch_guards``)."""
    return "python" if _scanner() is None else "hyperscan"


def _redact_scanned(blob: bytes, secret_key: bool | None, hits: Collection[int]) -> bytes:
    """``redact`` for orjson's output with the guards ``redact_scan`` found in one pass.

    The same decisions as ``redact``'s own guards, taken on the event as it came rather than
    after each replacement: a replacement ("[REDACTED]", "[REDACTED CARD]", …) holds nothing a
    later guard looks for, so a guard true after one was true before it."""
    view = _decoded(blob)
    if view is not None:
        # Rare (text the agent encoded itself), so the decoded text's own guards in Python.
        out = _redact(view, secret_key=secret_key, escaped=True, one_pass=False)
        if out != view:
            return out
    if not hits and not secret_key:
        return blob  # the usual event: no guard holds, and no key names a secret
    S = redact_scan
    if S.PEM in hits:
        blob = _PEM.sub(b"[REDACTED PRIVATE KEY]", blob)
    dash = S.DASHES in hits
    assign = (
        S.EQUALS in hits
        or S.INNER_COLON in hits
        or S.ESCAPED_KEY in hits
        or S.IS in hits
        or S.ZH_ASSIGN in hits
    )
    words = (dash or assign or secret_key is None) and S.WORDS in hits
    if words if secret_key is None else secret_key:
        blob = _KEY_PATTERN.sub(_key_sub, blob)
    if S.AUTHORIZATION in hits:
        blob = _AUTHORIZATION.sub(rb"\1[REDACTED]", blob)
    if S.BEARER in hits:
        blob = _BEARER.sub(rb"\1 [REDACTED]", blob)
    if S.VENDOR in hits:
        for needle, pattern, repl in _VENDOR:
            if needle in blob:
                blob = pattern.sub(repl, blob)
    if words and dash:
        blob = _FLAG.sub(_flag_sub, blob)
    if words and assign:
        if _may_hold_a_cookie(blob):
            blob = _COOKIE.sub(rb"\1[REDACTED]", blob)
        blob = _TEXT_SECRET.sub(_text_sub, blob)
    if S.SQL_PASSWORD in hits:
        blob = _SQL_PASSWORD.sub(rb"\1'[REDACTED]'", blob)
    if S.COMMAND in hits:
        blob = _command_secrets(blob)
    if S.AT in hits and S.SCHEME in hits:
        blob = _USERINFO.sub(rb"\1[REDACTED]@", blob)
    if S.CARD in hits:
        blob = _CARD.sub(_card_sub, blob)
    return blob


def redact(
    blob: bytes, *, secret_key: bool | None = None, escaped: bool = False, one_pass: bool = True
) -> bytes:
    """Remove secrets from serialized JSON; an event with no secret is only scanned by guards.

    Text the agent encoded itself (``json.dumps`` with its \\uXXXX escapes, percent-encoded
    URLs) is read decoded (``_decoded``): when that finds a secret, the decoded text, redacted,
    is what is returned (the same JSON once the agent's own JSON is read, minus the secret).
    """
    view = _decoded(blob)
    if view is not None:
        out = _redact(view, secret_key=secret_key, escaped=escaped, one_pass=one_pass)
        if out != view:
            return out
    return _redact(blob, secret_key=secret_key, escaped=escaped, one_pass=one_pass)


def _redact(blob: bytes, *, secret_key: bool | None, escaped: bool, one_pass: bool) -> bytes:
    """``redact`` of the text as it is.

    ``secret_key``: whether some key of the event names a secret (``"api_key"``), when the
    caller already knows (the writer learns it while sanitizing); None looks in ``blob``.
    ``escaped``: ``blob`` is orjson's output (no raw control character in it), which spares
    the guards that look for one.

    Running every pattern over every event is slow (Python's ``re`` tries each alternative at
    each position) and most events hold no secret. So each pattern runs only when a cheap test
    (a substring search on the event or its lowercased copy, a translate, a literal-prefixed
    scan) finds something all of its matches contain: each guard is a superset of its pattern,
    so the result is exactly that of running every pattern. Written out rather than as a table
    of guard functions: a Python call per guard per event shows in the writer's throughput.
    Order matters: whole blocks (PEM) first, then key/value, then shapes inside free text.
    A replacement that is a function checks the candidate (the whole name, Luhn) first.
    With the ``[hyperscan]`` extra, orjson's output is looked at in one pass instead, unless
    ``one_pass`` is False (see ``Recorder``'s ``one_pass_guards``).
    """
    if escaped and one_pass:
        scanner = _SCANNER if _SCANNER is not False else _scanner()
        if scanner is not None:
            return _redact_scanned(blob, secret_key, scanner.scan(blob))  # type: ignore[union-attr]
    low = blob.lower()
    # "--" first: the PEM marker holds it, and the flag pattern below needs it too.
    dash = b"-" in blob and _DASHES.search(blob) is not None
    if dash and b"PRIVATE KEY-----" in blob:
        blob = _PEM.sub(b"[REDACTED PRIVATE KEY]", blob)
        dash = _DASHES.search(blob) is not None  # the key's own dashes may be gone
    # The secret-word scan is the dearest guard (a regex over the whole event): it runs only
    # when a pattern that needs a word could match at all.
    assign = _may_assign(blob, escaped)
    words = (dash or assign or secret_key is None) and _WORD_CORES.search(low) is not None
    if words if secret_key is None else secret_key:
        blob = _KEY_PATTERN.sub(_key_sub, blob)  # "password": …, "db.password": …, "API Key": …
    if b"z" in low and b"authorization" in low:  # a memchr first: 'z' is rare in text
        blob = _AUTHORIZATION.sub(rb"\1[REDACTED]", blob)
    if _BEARER_GUARD.search(low) is not None:
        blob = _BEARER.sub(rb"\1 [REDACTED]", blob)
    if _RUN in blob.translate(_RUN_TABLE):
        for needle, pattern, repl in _VENDOR:
            if needle in blob:
                blob = pattern.sub(repl, blob)
    if words and dash:
        blob = _FLAG.sub(_flag_sub, blob)
    if words and assign:
        if _may_hold_a_cookie(blob):
            blob = _COOKIE.sub(rb"\1[REDACTED]", blob)
        blob = _TEXT_SECRET.sub(_text_sub, blob)
    if _may_set_sql_password(blob):
        blob = _SQL_PASSWORD.sub(rb"\1'[REDACTED]'", blob)
    if _may_pass_a_command_secret(blob):
        blob = _command_secrets(blob)
    if b"@" in blob and b"://" in blob:
        blob = _USERINFO.sub(rb"\1[REDACTED]@", blob)
    shape = blob.translate(_CARD_TABLE)
    if b"0000" in shape and _CARD_SHAPE.search(shape) is not None:
        blob = _CARD.sub(_card_sub, blob)
    return blob


def redact_text(text: str) -> str:
    """``redact`` for one string (free text: the key rule does not apply)."""
    blob = orjson.dumps(text)
    out = redact(blob, secret_key=False, escaped=True)
    return text if out == blob else orjson.loads(out)


# -- sanitizing -------------------------------------------------------------------------------

MAX_DEPTH = 20  # deeper nesting is kept as bounded text
_isfinite = math.isfinite  # a global name: looked up once per value in the hottest loops
_DEEP_REPR = reprlib.Repr()
_DEEP_REPR.maxlevel = 6
_DEEP_REPR.maxstring = _DEEP_REPR.maxother = 200


def _plain_dict(d: dict[Any, Any], depth: int, limit: int) -> bool:
    """Whether ``_Sanitizer.value`` (not checking UTF-8, ``max_text`` = ``limit``) would give
    ``d`` back as it is, with nothing to report and no key naming a secret: every key one it
    has already cleared (``_PLAIN_KEYS``), every value plain JSON it keeps (text within the
    limit, an exact int, bool or None, a finite float, such dicts and lists within the depth).

    The writer's fast path: a check only, no copy to make, no change to look for, no key to
    learn, about half the walk's cost. Where it says no, the walk runs and decides; the depth
    rules follow ``_dict``'s and ``_list``'s exactly (tests/test_record_fast.py holds them).

    Each key is looked up as its value is read, in one pass over the items: a subset test per
    dict (``_PLAIN_KEYS.issuperset(d)``) cost a set operation per dict on top of the walk, a
    good part of the check for small dicts."""
    plain = _PLAIN_KEYS
    for k, x in d.items():
        if k not in plain:
            return False
        t = type(x)
        if t is str:
            if len(x) > limit:
                return False
        elif t is dict:
            if depth >= MAX_DEPTH or not _plain_dict(x, depth + 1, limit):
                return False
        elif t is int or t is bool or x is None:
            continue
        elif t is float:
            if not _isfinite(x):
                return False
        elif t is list:
            if depth >= MAX_DEPTH or not _plain_list(x, depth + 1, limit):
                return False
        else:
            return False
    return True


def _plain_list(items: list[Any], depth: int, limit: int) -> bool:
    """``_plain_dict`` for a list at ``depth`` (``_Sanitizer._list``'s rules)."""
    return len(items) <= limit and _plain_values(items, depth, limit)


def _plain_values(values: Iterable[Any], depth: int, limit: int) -> bool:
    """The items of a list at ``depth``, as ``_plain_dict`` checks a dict's values."""
    for x in values:
        t = type(x)
        if t is str:
            if len(x) > limit:
                return False
        elif t is dict:
            if depth >= MAX_DEPTH or not _plain_dict(x, depth + 1, limit):
                return False
        elif t is int or t is bool or x is None:
            continue
        elif t is float:
            if not _isfinite(x):
                return False
        elif t is list:
            if depth >= MAX_DEPTH or not _plain_list(x, depth + 1, limit):
                return False
        else:
            return False
    return True


class _Sanitizer:
    """Makes any Python value storable JSON, cutting long text; collects what it had to change.

    Values under a key that names a secret are redacted here, at any depth (a regex over the
    serialized event cannot find the end of a nested object); long text is redacted before it
    is cut, so a secret is never cut in half and missed.

    ``check_utf8=False`` leaves text that fits as it is without checking that it encodes (a
    lone surrogate): for a caller that serializes the result with orjson, which refuses such
    text, and then sanitizes again with the check (the writer: encoding every non-ASCII string
    twice, once here and once in orjson, cost more than the rare second pass).
    """

    __slots__ = ("max_text", "problems", "secret_key", "check_utf8")

    def __init__(self, max_text: int, *, check_utf8: bool = True) -> None:
        self.max_text = max_text
        self.problems: list[str] = []
        self.secret_key = False  # some key names a secret: redact() must look at the keys
        self.check_utf8 = check_utf8

    def reset(self) -> None:
        """Ready for the next event (one sanitizer serves a batch: fewer objects for the GC)."""
        if self.problems:
            self.problems = []
        self.secret_key = False

    def text(self, s: str) -> str:
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            # Lone surrogates: bytes smuggled in by surrogateescape come back as U+FFFD.
            try:
                raw = s.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:
                raw = s.encode("utf-8", "surrogatepass")
            s = raw.decode("utf-8", "replace")
            self.problems.append("invalid UTF-8 replaced")
        if len(s) > self.max_text:
            s = redact_text(s)  # before the cut: a cut PEM key loses the END that marks it
            if len(s) > self.max_text:
                s = f"{s[: self.max_text]}…[cut {len(s) - self.max_text} chars]"
        return s

    def value(self, v: Any, depth: int = 0) -> Any:
        """``v`` as storable JSON: ``v`` itself (not a copy) when nothing in it had to change.

        Copying every event cost the writer ~15 µs per 1 KB event; most events are plain JSON
        already, so dicts and lists are checked in place and copied only from the first change.
        """
        t = type(v)
        if t is str:
            if len(v) <= self.max_text and (v.isascii() or not self.check_utf8):
                return v
            return self.text(v)
        if depth <= MAX_DEPTH:
            if t is dict:
                return self._dict(v, depth)
            if t is list and len(v) <= self.max_text:
                return self._list(v, depth)
        return self._other(v, depth)

    def _dict(self, d: dict[Any, Any], depth: int) -> dict[str, Any]:
        # One C-level subset test clears all the keys of a dict seen before.
        keys_ok = _PLAIN_KEYS.issuperset(d)
        secret = None if keys_ok else self._learn_keys(d)
        out: dict[str, Any] | None = None
        kept = 0
        limit, trust = self.max_text, not self.check_utf8
        for k, x in d.items():
            t = type(x)
            if t is str:
                y = x if len(x) <= limit and (trust or x.isascii()) else self.text(x)
            elif t is int or t is bool or x is None or (t is float and _isfinite(x)):
                y = x
            elif t is dict and depth < MAX_DEPTH:
                y = self._dict(x, depth + 1)
            else:
                y = self.value(x, depth + 1)
            if out is None:
                if y is x and (keys_ok or type(k) is str):
                    kept += 1
                    continue
                out = dict(islice(d.items(), kept))
            out[k if type(k) is str else self.key(k)] = y
        if secret:
            if out is None:
                out = dict(d)
            for k in secret:
                out[k if type(k) is str else self.key(k)] = REDACTED
        return d if out is None else out

    def key(self, k: Any) -> str:
        """A dict key as text (``StrEnum`` and ``Enum`` keys by value, ``3`` as ``"3"``)."""
        try:
            if isinstance(k, enum.Enum):
                k = k.value
            if isinstance(k, str):
                return str.__str__(k)
            return str(k)
        except Exception:  # noqa: BLE001 - a broken __str__ must not break recording
            self.problems.append(f"a {type(k).__name__} key could not be made text")
            return f"<key {type(k).__name__}>"

    def _learn_keys(self, d: dict[Any, Any]) -> list[Any] | None:
        """Remember plain keys; return those naming a secret (their values are redacted)."""
        secret = None
        for k in d:
            if _names_secret(k if type(k) is str else self.key(k)):
                self.secret_key = True
                if secret is None:
                    secret = [k]
                else:
                    secret.append(k)
            elif type(k) is str:
                _PLAIN_KEYS.add(k)
        return secret

    def _list(self, items: list[Any], depth: int) -> list[Any]:
        # The same per-value dispatch as _dict, inlined rather than shared: it runs once per
        # value in the writer's hottest loop, where a function call per value shows.
        out: list[Any] | None = None
        limit, trust = self.max_text, not self.check_utf8
        for i, x in enumerate(items):
            t = type(x)
            if t is str:
                y = x if len(x) <= limit and (trust or x.isascii()) else self.text(x)
            elif t is int or t is bool or x is None or (t is float and _isfinite(x)):
                y = x
            elif t is dict and depth < MAX_DEPTH:
                y = self._dict(x, depth + 1)
            else:
                y = self.value(x, depth + 1)
            if out is None:
                if y is x:
                    continue
                out = items[:i]
            out.append(y)
        return items if out is None else out

    def _other(self, v: Any, depth: int) -> Any:
        """Everything but plain str, dict and list: converted to the JSON it means, so a
        numpy number, an enum or a dataclass is kept as its value, not as a repr."""
        try:
            return self._convert(v, depth)
        except Exception as exc:  # noqa: BLE001 - a bad value spoils only itself
            self.problems.append(f"{type(v).__name__} could not be converted ({exc!r})")
            return self._marker(v)

    def _marker(self, v: Any) -> str:
        """A short text standing for a value that cannot be stored as it is."""
        try:
            return self.text(repr(v))
        except Exception:  # noqa: BLE001 - a broken __repr__ must not break recording
            return f"<unrepresentable {type(v).__name__}>"

    def _convert(self, v: Any, depth: int) -> Any:  # noqa: PLR0911, PLR0912, C901 - one rule per kind
        if v is None or v is True or v is False:
            return v
        if isinstance(v, enum.Enum):  # before int and str: IntEnum, StrEnum
            return self.value(v.value, depth + 1)
        if isinstance(v, int):
            return v if type(v) is int else int(v)
        if isinstance(v, str):
            if type(v) is not str:
                v = str.__str__(v)
            return self.text(v) if len(v) > self.max_text or not v.isascii() else v
        if isinstance(v, float):
            if math.isfinite(v):
                return v if type(v) is float else float(v)  # numpy.float64 is a float
            self.problems.append(f"{v!r} stored as null")
            return None
        if depth > MAX_DEPTH:
            self.problems.append(f"nesting deeper than {MAX_DEPTH} levels kept as text")
            return self.text(_DEEP_REPR.repr(v))
        if type(v).__module__ == "numpy" and hasattr(v, "tolist"):
            size = getattr(v, "size", 1)
            if getattr(v, "ndim", 0) and size > self.max_text:
                self.problems.append(f"array of {size} items cut to {self.max_text}")
                v = v.ravel()[: self.max_text]
            return self.value(v.tolist(), depth + 1)
        if isinstance(v, Mapping):
            out = {self.key(k): self.value(x, depth + 1) for k, x in v.items()}
            for k in out:
                if _names_secret(k):
                    self.secret_key = True
                    out[k] = REDACTED
            return out
        if isinstance(v, (set, frozenset)):
            try:
                v = sorted(v)
            except TypeError:
                v = list(v)
        if isinstance(v, (list, tuple, set, frozenset, deque)):
            items = list(v)
            if len(items) > self.max_text:
                self.problems.append(f"list of {len(items)} items cut to {self.max_text}")
                items = items[: self.max_text]
            return [self.value(x, depth + 1) for x in items]
        if isinstance(v, (bytes, bytearray, memoryview)):
            raw = bytes(v)
            try:
                return self.text(raw.decode("utf-8"))
            except UnicodeDecodeError:
                self.problems.append("bytes that are not UTF-8 stored as text")
                return self.text(raw.decode("utf-8", "replace"))
        if isinstance(v, (datetime, date, dt_time)):
            return v.isoformat()
        if isinstance(v, timedelta):
            return v.total_seconds()
        if isinstance(v, decimal.Decimal):
            if not v.is_finite():
                self.problems.append(f"{v!r} stored as null")
                return None
            f = float(v)
            return f if decimal.Decimal(repr(f)) == v else str(v)  # exact, or kept as text
        if isinstance(v, (uuid.UUID, PurePath)):
            return str(v)
        if isinstance(v, complex):
            return str(v)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            fields = {f.name: getattr(v, f.name) for f in dataclasses.fields(v)}
            return self._convert(fields, depth)
        dump = getattr(v, "model_dump", None)  # pydantic
        if callable(dump) and not isinstance(v, type):
            return self.value(dump(), depth + 1)
        self.problems.append(f"{type(v).__name__} is not JSON: stored as its repr")
        return self._marker(v)

    def strict(self, v: Any) -> Any:
        """Last resort when orjson still refuses ``v``: exact ``str`` keys, integers beyond 64
        bits as text, any other value it refuses replaced by its marker (only that value)."""
        if isinstance(v, dict):
            return {self.key(k) if type(k) is not str else k: self.strict(x) for k, x in v.items()}
        if isinstance(v, list):
            return [self.strict(x) for x in v]
        if isinstance(v, int) and not isinstance(v, bool) and not -(2**63) <= v < 2**64:
            self.problems.append("integer beyond 64 bits stored as text")
            return str(v)
        try:
            orjson.dumps(v)
        except Exception:  # noqa: BLE001
            self.problems.append(f"{type(v).__name__} could not be stored: kept as its repr")
            return self._marker(v)
        return v


# -- the recorder -----------------------------------------------------------------------------

# A queued item: (task_id, seq, timestamp (ns int, or caller's value), type, payload, event_id)
Item = tuple[str, int, Any, str, dict[str, Any], str | None]
# A row for the store: (event_id, task_id, seq, timestamp, type, body, projection), where the
# projection is ``replay.project_json`` of the payload (None: replay decodes the body instead).
Row = tuple[str, str, int, str, str, bytes, bytes | None]
# A batch on its way to the store: how many events, their rows, and, if they could not be
# prepared, the raw items and why. The items themselves are not kept once prepared: as Python
# objects an event takes several times the memory of its row.
# (items, rows, raw items that could not be prepared, the problem, sanitized payloads)
_Batch = tuple[int, list[Row], list[Item], str, list[Any]]
#: Event types whose sanitized payload and stored projection (``replay.projected``, None when
#: the row has none) are handed to ``on_batch`` as a pair (the live anomaly rules read them), so
#: the hook does not parse the JSON they were just made into.
WATCHED_TYPES = frozenset({"action_executed", "feedback", "user_input"})

# Caller timestamps as nanoseconds since the epoch, taken as they are from 1978-01-11 to 9999:
# the integers ``parse_ts`` reads as nanoseconds (below, a number is a valid microsecond one).
_NS_FAST = (EPOCH_RANGE[1] * 10**6 - 1, EPOCH_RANGE[1] * 10**9)
_END_OF_TIME = "9999-12-31T23:59:59.999Z"
_START_OF_TIME = "0001-01-01T00:00:00.000Z"


def state_dir() -> Path:
    """Where the dead letter falls back to when its own place cannot be written:
    ``$XDG_STATE_HOME/hindsight`` (by default ``~/.local/state/hindsight``)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return Path(base) / "hindsight"


def _root_error(exc: BaseException) -> BaseException:
    """The error that made the store fail, not the ROLLBACK that failed after it: SQLite rolls
    a transaction back by itself on a full disk, so the store's own ROLLBACK then raises
    ``cannot rollback - no transaction is active`` over the real reason."""
    while "cannot rollback" in str(exc) and exc.__context__ is not None:
        exc = exc.__context__
    return exc


def _utc_text(dt: datetime) -> str:
    """A datetime as the wire timestamp (UTC, milliseconds, four-digit year)."""
    return (
        f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}T{dt.hour:02d}:{dt.minute:02d}:"
        f"{dt.second:02d}.{dt.microsecond // 1000:03d}Z"
    )


class Checkpoints(Protocol):
    """A store that lets its event writer checkpoint when it chooses (``SQLiteStore``)."""

    def defer_checkpoints(self) -> None: ...
    def checkpoint_due(self, *, idle: bool) -> bool: ...
    def checkpoint(self) -> bool: ...
    def stop_checkpoint(self) -> None: ...


def flush_while_it_moves(flush: Callable[[float], bool], handled: Callable[[], int]) -> bool:
    """``flush(1.0)`` until it returns True, for as long as ``handled()`` (the events handled
    so far) keeps growing; False once it has not for ``CLOSE_STALL`` seconds. What ``close()``
    waits with: a writer held up for good made it, and the exit that calls it, wait for good."""
    last, since = handled(), time.monotonic()
    while not flush(1.0):
        now = handled()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= CLOSE_STALL:
            return False
    return True


#: Why ``close()`` kept events in the dead letter rather than wait on (``Recorder._give_up``).
HELD_UP = (
    "close(): the writer made nothing durable for {:.0f} s (a store call held up: another "
    "process's lock, a hung disk); an event whose store call returns later may be stored too "
    "('hindsight import' skips what is stored)"
)

#: The recorders of this process, reset in a child forked from it (``Recorder._forked``).
_RECORDERS: weakref.WeakSet[Recorder] = weakref.WeakSet()
reset_in_forked_child(_RECORDERS, "recorder")
#: Seconds a forked child's last flush may take at its exit (``Recorder._flush_at_exit``).
FORK_WAIT = 5.0


class Recorder:
    """Accepts events from any thread without blocking and writes them in batches.

    Nothing accepted is dropped silently: an event is stored, or dead-lettered with the reason
    (in ``dead_letter``, or when that cannot be written in ``fallback_dir``), or counted in
    ``stats["lost"]`` and reported by ``flush()`` returning False.
    """

    def __init__(
        self,
        write: Callable[[list[Row]], list[str] | None],
        *,
        dead_letter: str | Path,
        max_text: int = DEFAULT_MAX_TEXT,
        queue_bound: int = DEFAULT_QUEUE_BOUND,
        on_batch: Callable[[list[Row], list[Any]], None] | None = None,
        block_seconds: float = 2.0,
        fallback_dir: str | Path | None = None,
        on_done: Callable[[int], None] | None = None,
        on_written: Callable[[], None] | None = None,
        start: bool = True,
        one_pass_guards: bool = False,
        batch_guards: bool = True,
        checkpoints: Checkpoints | None = None,
    ) -> None:
        self._write = write
        #: The store's checkpoints, run by the committer once a batch is acknowledged (not in
        #: the COMMIT a flush waits for), and stopped by a flush; None: the store's own.
        self._checkpoints = checkpoints
        #: Redaction's guards in one Hyperscan pass (when installed). Only where no agent's
        #: thread shares the GIL (the writer process): each scan, and each of its match
        #: callbacks, lets go of the GIL, which wakes a CPU-busy thread's wait for it without
        #: the switch that wait asks for; the writer thread then lost the GIL at every event
        #: and fell far behind such an agent (``bench/ingest.py --busy-only``).
        self.one_pass_guards = one_pass_guards
        #: Otherwise (the writer thread) the guards of ``SCAN_CHUNK`` events in one Hyperscan
        #: pass (``redact_scan.Scanner.scan_many``): one release of the GIL per chunk, not one
        #: per event, and at most one match report per guard per event, as before; False keeps
        #: the Python guards. ``_row`` alone (one event) uses the Python guards here.
        self.batch_guards = batch_guards
        #: Called after each batch is durable with the count of events handled so far, in
        #: order (the writer process acknowledges with it what the agent may forget).
        self._on_done = on_done
        #: Called as soon as a batch is committed, before ``on_batch`` (whose reviews may wait
        #: on a busy store): the writer process says what it wrote before anything can kill it.
        self._on_written = on_written
        self.dead_letter = Path(dead_letter)
        where = str(self.dead_letter.absolute()).encode("utf-8", "replace")
        stem = self.dead_letter.name.removesuffix(".jsonl")
        #: Where dead letters go when ``dead_letter`` cannot be written (a full or read-only
        #: disk): one file per store in the user's state directory.
        self.fallback_dead_letter = Path(fallback_dir or state_dir()) / (
            f"{stem}.{hashlib.sha1(where).hexdigest()[:8]}.jsonl"  # noqa: S324 - a name
        )
        self.max_text = max_text
        self._queue_bound = queue_bound
        self._in_flight = 0  # taken from the queue by the writer, not yet durable
        self._preparing = False  # the writer thread is preparing a batch (Python: the GIL)
        self._room = queue_bound  # see _set_room
        self.block_seconds = block_seconds
        self._on_batch = on_batch
        self._queue: deque[Item] = deque()
        self._seq = count(1)
        self._flush_marks = 0  # seqs taken by flush() itself rather than by an event
        # Reentrant: a signal handler's flush may come in (``flush`` takes no call under it).
        self._mark_lock = threading.RLock()
        self._done = 0  # items handled by the writer (written, dead-lettered or lost)
        # One entry per event whose seq was taken by an emit() interrupted before it queued the
        # event (``emit``): flush() counts them as handled. A list, as appending is one C call.
        self._forgone: list[None] = []
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stop = False
        # Written, batches (the store's transactions that wrote them: how well writes are
        # grouped), dead-lettered, spilled, warnings, lost: the names a writer process's ring
        # holds them under too.
        self.stats = dict.fromkeys(COUNTERS, 0)
        self._lost_reported = 0  # what flush() has already reported
        self._dead_letter_lock = threading.Lock()
        self._stamp: tuple[int, str, int, str] = (-1, "", -1, "")  # see _iso
        self._commits: queue.Queue[_Batch | None] = queue.Queue(maxsize=1)
        # Spills under overload are written by their own thread (started at the first one), so
        # the agent only hands them over; two may wait, which keeps memory bounded.
        # Seconds a spill takes per event, measured at each spill (chunks are sized by it).
        self._spill_cost = SPILL_COST_GUESS
        self._spilling = 0
        # The batch the committer is writing (its count, rows and raw items), and whether
        # close() gave up on the writer (``_give_up``): then it holds this batch, and every
        # batch after it goes to the dead letter rather than to the store.
        self._writing: tuple[int, list[Row], list[Item]] | None = None
        self._given_up = False
        # A signal handler's close() left to the exit (``_close_later``).
        self._close_owed = False
        # Calls to make once no thread of this recorder can use the store (``on_released``).
        self._released = False
        self._on_release: list[Callable[[], None]] = []
        self._release_lock = threading.Lock()
        self._new_threads()
        #: A forked child's recorder whose threads stayed in the parent: its first event
        #: starts threads of its own (``_child_starts``).
        self._child_idle = False
        self._child_lock = threading.Lock()
        _RECORDERS.add(self)
        if start:
            self.start()

    def _new_threads(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hindsight-writer", daemon=True)
        self._committer = threading.Thread(
            target=self._commit, name="hindsight-committer", daemon=True
        )

    def start(self) -> None:
        """Start the writer threads (a recorder made with ``start=False`` only dead-letters until
        then: the process writer keeps one ready as its in-process fallback)."""
        if self._child_idle:
            self._child_idle = self._stop = False
        if not self._thread.is_alive() and self._thread.ident is None:
            self._thread.start()
            self._committer.start()

    @property
    def started(self) -> bool:
        return self._thread.ident is not None

    @property
    def queue_bound(self) -> int:
        """Events the queue holds at most; past it ``emit`` waits, then spills (``_overload``)."""
        return self._queue_bound

    @queue_bound.setter
    def queue_bound(self, value: int) -> None:
        with self._cond:
            self._queue_bound = value
            self._set_room()

    def _set_room(self) -> None:
        """The queue length at which ``emit`` leaves its fast path: ``queue_bound``, or, while
        the writer thread prepares a batch, what keeps the events accepted and not yet durable
        under ``YIELD_AT`` (past it the agent yields to the writer). One comparison on the hot
        path; the writer and the committer move it (under ``_cond``) whenever ``_in_flight`` or
        ``_preparing`` changes."""
        room = self._queue_bound
        if self._preparing:
            room = max(0, min(room, YIELD_AT - self._in_flight))
        self._room = room

    # -- signal handlers ---------------------------------------------------------------------
    #: A flush from a signal handler that interrupted a call of the recorder (``calls_beneath``)
    #: returns False once nothing became durable for this many seconds: what is left waits for
    #: the interrupted call, which goes on only after the handler returns.
    BENEATH_STALL: ClassVar[float] = 0.5
    #: The code of each recorder class's methods (``calls_beneath``), made on first use.
    _CODES: ClassVar[dict[type, frozenset[CodeType]]] = {}

    @staticmethod
    def calls_beneath(owner: object, *, every: bool = False) -> list[FrameType]:
        """The frames of ``owner``'s calls that the current call into ``owner`` interrupted:
        the nearest, or ``every`` one.

        Python runs a signal handler in the main thread between two bytecodes, also inside a
        call into the recorder that holds one of its locks; a handler that records, flushes or
        closes calls in again, and waiting for such a lock would wait for good. Empty on any
        other thread (no handler runs there). A walk of the stack: only where a lock is found
        busy, a flush and a close, never on the hot path's way.
        """
        if threading.current_thread() is not threading.main_thread():
            return []
        cls = type(owner)
        codes = Recorder._CODES.get(cls)
        if codes is None:
            own = (f.__code__ for f in vars(cls).values() if hasattr(f, "__code__"))
            # close() flushes through ``flush_while_it_moves``: one call of the recorder's
            codes = Recorder._CODES[cls] = frozenset(own) | {flush_while_it_moves.__code__}
        frame = sys._getframe(1)
        while frame is not None and frame.f_code in codes:  # the current call's own frames
            frame = frame.f_back  # type: ignore[assignment]
        beneath = []
        while frame is not None:  # past the handler (and the facade), a call it interrupted
            if frame.f_code in codes and frame.f_locals.get("self") is owner:
                beneath.append(frame)
                if not every:  # handlers interrupted by handlers: no walk to the bottom each
                    break
            frame = frame.f_back  # type: ignore[assignment]
        return beneath

    # -- hot path --------------------------------------------------------------------------
    def emit_event(self, event: dict[str, Any]) -> None:
        """Queue a wire-format event that passed ``models.wire_event_problem`` (its scalars
        become columns, the rest its body)."""
        event_id = event.get("event_id")
        seq = event.get("seq")
        # The writer reads the event a few milliseconds later. The event itself is copied, so
        # a caller that fills the same dict with new objects for its next call cannot rewrite
        # this one; the objects inside are handed over as they are (copying them too doubled
        # this call's cost): do not change them in place after recording.
        self.emit(
            event["task_id"],
            event["type"],
            event.copy(),
            timestamp=event.get("timestamp"),
            event_id=event_id if isinstance(event_id, str) else None,
            seq=seq if type(seq) is int and -(2**63) <= seq < 2**63 else None,  # not a bool
        )

    def emit(
        self,
        task_id: str,
        etype: str,
        payload: dict[str, Any],
        *,
        timestamp: Any = None,
        event_id: str | None = None,
        seq: int | None = None,
    ) -> int:
        """Accept one event; returns its seq. Never blocks on I/O; under overload it waits
        about ``block_seconds`` for the writer and to spill the oldest events.

        ``seq`` is the caller's own sequence number (imports); by default the recorder's.
        """
        # An event's seq is either queued with it, or counted as forgone (``_forgone``), or
        # every later flush() (and close(), and the exit) would wait for it for good. A signal
        # handler's exception (Ctrl-C, a SIGTERM handler's exit) can come after any call, a
        # loop's jump back or a function's start, and nowhere else: the seq is taken by a
        # loop's first step (no check after it, as there is after next()), and nothing
        # between building the item and queueing it is a call.
        own = 0
        handled = False
        try:
            for own in self._seq:  # noqa: B007 - the loop takes it (see above)
                break
            if self._stop:
                if self._child_idle:  # a forked child's first event: its own threads start
                    self._child_starts()
                if self._stop:
                    self._after_close(task_id, own, timestamp, etype, payload, event_id)
                    with self._cond:
                        handled = True
                        self._done += 1  # handled: a flush after close() waits for it no more
                    return own
            q = self._queue
            if len(q) >= self._room:
                self._make_room()
            item = (
                task_id,
                own if seq is None else seq,
                timestamp or time.time_ns(),
                etype,
                payload,
                event_id,
            )
        except BaseException:
            # Interrupted before the event was queued (Ctrl-C while it waited for room): not
            # accepted. One C call before any other, so a second signal cannot come between.
            if own and not handled:
                self._forgone.append(None)
            raise
        q.append(item)
        return own

    def emit_items(self, items: list[Item]) -> None:
        """Queue items already in the queue's shape, in order (the writer process hands over
        what it read from the agent's pipe; its reader bounds the queue, not this call)."""
        if items and self._stop:  # closed: nothing will write them
            for item in items:
                self._after_close(*item)
            return
        if items:
            # Each takes a seq, as emit() would: flush() counts what it waits for by seqs.
            next(islice(self._seq, len(items) - 1, None))
            self._queue.extend(items)
            self._wake.set()  # once per chunk read from the pipe, not per event

    def _after_close(self, *item: Any) -> None:
        """An event recorded after close(): nothing will write it, so keep it in the dead letter."""
        rows, raw = self._prepare([item], project=False)  # type: ignore[list-item]
        reason = "recorded after close(): not written to the store"
        self._dead_letter(rows, reason)
        self._dead_letter_raw(raw, reason)

    def _make_room(self) -> None:
        """The queue is full (``_overload``), or the writer is behind (``_yield_to_writer``)."""
        if len(self._queue) >= self._queue_bound:
            self._overload()
        elif self._preparing:
            self._yield_to_writer()

    def _yield_to_writer(self) -> None:
        """More than ``YIELD_AT`` events wait to be durable and the writer thread is preparing a
        batch: wait until it has (at most ``block_seconds``).

        Preparing is Python under the GIL, which a CPU-busy agent's thread keeps taking back:
        the writer falls behind an agent it does not slow enough, the more so as each C call of
        its own that lets go of the GIL lets the agent take it. Waiting here gives the writer
        the GIL until its batch is ready. Never a wait
        on I/O: while the writer waits for the committer (the store's write) the agent goes
        on, up to ``queue_bound``."""
        me = threading.get_ident()
        if me == self._thread.ident or me == self._committer.ident or self.block_seconds <= 0:
            return  # the writer's own threads (a warning logged into a recorder) never wait
        if self.calls_beneath(self):
            # A signal handler's event while the call it interrupted may wait on ``_cond``
            # itself: a wait on it within a wait on it, in one thread, hung for good.
            return
        deadline = time.monotonic() + self.block_seconds
        with self._cond:
            while (
                self._preparing
                and len(self._queue) + self._in_flight >= YIELD_AT
                and not self._stop
                and self._thread.is_alive()
            ):
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(left)

    def _overload(self) -> None:
        """The queue is full: wait for the writer, then spill the oldest events to the
        dead-letter file (``hindsight import`` reads it back), all within ``block_seconds``.

        The spill is written on the agent's thread: that back-pressure is what keeps memory
        bounded and flat (a spill thread let the agent run on: +80% peak memory and a growing
        high-water mark in bench/overload.py). To stay within ``block_seconds`` it spills in
        chunks sized by the measured cost of spilling one event, starting small, so a burst of
        huge events costs a short wait too, not a long spill.

        A signal handler's event while the call it interrupted spills (the dead letter's lock
        held) goes past the bound instead.
        """
        if self.calls_beneath(self):
            return
        self._wake.set()
        started = time.monotonic()
        deadline = started + self.block_seconds
        # Half the time for the writer to catch up, the rest for the spill.
        wait_until = started + self.block_seconds / 2
        while len(self._queue) >= self.queue_bound and time.monotonic() < wait_until:
            time.sleep(0.001)
        if len(self._queue) < self.queue_bound:
            return
        # Up to a batch, as before, but only as much as fits in the time left (at least one
        # small chunk, so the queue always makes room).
        spilled = 0
        while spilled < BATCH_SIZE and self._queue:
            left = deadline - time.monotonic()
            if spilled and left <= 0:
                break
            take = int(max(left, 0.0) / self._spill_cost) if spilled else SPILL_FIRST
            take = max(SPILL_FIRST, min(BATCH_SIZE - spilled, take, len(self._queue)))
            spill: list[Item] = []
            try:
                for _ in range(take):
                    try:
                        spill.append(self._queue.popleft())
                    except IndexError:
                        break
            except BaseException:
                # Interrupted (Ctrl-C) between taking events and spilling them: back to the
                # front of the queue, in their order, rather than neither written nor counted.
                self._queue.extendleft(spill[::-1])  # one call: a second signal waits
                raise
            if not spill:
                break
            with self._cond:
                self._spilling += len(spill)
            t0 = time.perf_counter()
            self._spill(spill)
            self._spill_cost = max((time.perf_counter() - t0) / len(spill), 1e-7)
            spilled += len(spill)

    def _spill(self, spill: list[Item]) -> None:
        try:
            rows, raw = self._prepare(spill, project=False)
            reason = "queue full: spilled under overload"
            self._dead_letter(rows, reason)
            self._dead_letter_raw(raw, reason)
            self.stats["spilled"] += len(spill)
        finally:
            with self._cond:
                self._spilling -= len(spill)
                self._done += len(spill)
                self._cond.notify_all()

    # -- writer ----------------------------------------------------------------------------
    def _iso(self, ns: int) -> str:
        """Nanoseconds since the epoch as the wire timestamp, the last millisecond's text cached
        (a busy agent records dozens of events per millisecond) and the seconds part too
        (formatting it is most of an event's timestamp cost)."""
        ms = ns // 1_000_000
        last_ms, text, secs, prefix = self._stamp  # one tuple: the spilling thread may call this
        if ms == last_ms:
            return text
        if ms // 1000 != secs:
            secs = ms // 1000
            prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs))
        text = f"{prefix}.{ms % 1000:03d}Z"
        self._stamp = (ms, text, secs, prefix)
        return text

    def _odd_stamp(self, ts: Any, sanitizer: _Sanitizer) -> tuple[str, str | None]:
        """A caller's timestamp that is not plain nanoseconds, as UTC; with the original text
        when it could not be kept as it was (unreadable: now; beyond year 9999: the end)."""
        try:
            dt = parse_ts(ts)
        except Exception:  # noqa: BLE001 - one bad timestamp spoils only its own event
            original = ts if type(ts) is str else repr(ts)
            sanitizer.problems.append(
                f"timestamp {original[:80]!r} unreadable: replaced by now, the original kept "
                "in context.original_timestamp"
            )
            return self._iso(time.time_ns()), original[:200]
        try:
            return _utc_text(dt.astimezone(UTC)), None
        except (OverflowError, ValueError):
            # Valid where it was written, outside years 1-9999 in UTC: pinned to the edge.
            offset = dt.utcoffset()
            late = offset is None or offset.total_seconds() <= 0 or dt.year > 1
            sanitizer.problems.append(f"timestamp {ts!r} is outside years 1-9999 in UTC")
            return (_END_OF_TIME if late else _START_OF_TIME), str(ts)[:200]

    def _row(
        self,
        item: Item,
        sanitizer: _Sanitizer | None = None,
        keep: list[Any] | None = None,
        *,
        project: bool = True,
        raw: bytes | None = None,
    ) -> Row:
        """Turn a queued item into a row; with ``keep``, also collect its sanitized payload
        (secret-named keys redacted, free text not: only for the in-process hook, never stored)
        and its stored projection, as ``WATCHED_TYPES`` says.
        ``project=False``: no replay projection (a row bound for the dead letter, which keeps
        the body alone). ``raw``: the payload as orjson serialized it in the agent's process
        (the writer process decoded the payload from it): when sanitizing changed nothing,
        ``orjson.dumps`` of the payload would give these bytes again, so they are the body
        (redacted like any body)."""
        return self._finish(self._serialize(item, sanitizer, raw), None, keep, project=project)

    def _serialize(
        self, item: Item, sanitizer: _Sanitizer | None, raw: bytes | None
    ) -> tuple[Any, ...]:
        """``_row``'s first half: the item sanitized and serialized, not yet redacted."""
        task_id, seq, ts, etype, payload, event_id = item
        if sanitizer is None:
            sanitizer = _Sanitizer(self.max_text)
        else:
            sanitizer.reset()
        original = None
        if type(ts) is int and _NS_FAST[0] < ts < _NS_FAST[1]:
            stamp = self._iso(ts)
        else:
            stamp, original = self._odd_stamp(ts, sanitizer)
        clean = None
        try:
            if (
                type(payload) is dict
                and not sanitizer.check_utf8
                and _plain_dict(payload, 0, sanitizer.max_text)
            ):
                clean = payload  # what the walk would give back, with nothing to report
            else:
                clean = sanitizer.value(payload)
            if "type" in clean or "task_id" in clean:
                # A wire-format event handed over whole: its scalars are columns, not body.
                clean = {k: v for k, v in clean.items() if k not in WIRE_SCALARS}
            if original is not None:
                context = clean.get("context")
                context = dict(context) if isinstance(context, dict) else {"value": context}
                context["original_timestamp"] = original
                clean = {**clean, "context": context}
            try:
                body = raw if raw is not None and clean is payload else orjson.dumps(clean)
            except orjson.JSONEncodeError:
                if not sanitizer.check_utf8:
                    # Perhaps a lone surrogate the trusting pass let through: once more with
                    # the check, which replaces it (and warns) as the sanitizer always did.
                    return self._serialize(item, _Sanitizer(self.max_text), raw)
                # orjson refuses what the sanitizer let through (a StrEnum key, an integer
                # beyond 64 bits): rare, so handled here rather than checked on every value.
                clean = sanitizer.strict(clean)
                body = orjson.dumps(clean)
        except Exception as exc:  # noqa: BLE001 - never lose the event for its content
            clean = None
            body = orjson.dumps({"unserializable": sanitizer.text(repr(exc))})
            sanitizer.problems.append(f"could not be stored as JSON ({exc!r}): kept as its error")
        problems = sorted(set(sanitizer.problems)) if sanitizer.problems else None
        return (event_id, task_id, seq, stamp, etype, body, clean, sanitizer.secret_key, problems)

    def _finish(
        self,
        parts: tuple[Any, ...],
        hits: Collection[int] | None,
        keep: list[Any] | None,
        *,
        project: bool,
    ) -> Row:
        """``_row``'s second half: redact the body, with ``hits`` the guards a batch scan found
        in it (``redact_scan.Scanner.scan_many``), or None to look for them here."""
        event_id, task_id, seq, stamp, etype, serialized, clean, secret_key, problems = parts
        if hits is None:
            body = redact(
                serialized, secret_key=secret_key, escaped=True, one_pass=self.one_pass_guards
            )
        else:
            body = _redact_scanned(serialized, secret_key, hits)
        # What replay's detectors read, worked out here where the payload is already decoded.
        # Only when redaction left the body as it was: then it is the projection of the stored
        # body, and nothing a redaction removed can reach the store through it.
        if project and clean is not None and (body is serialized or body == serialized):
            stored, projection = projected(etype, clean)
        else:
            stored = projection = None
        if problems:
            self.stats["warnings"] += 1
            warn(f"event {seq} of task {task_id!r}: " + "; ".join(problems))
        if keep is not None:
            # The live rules read the projection as this value: decoding its JSON again cost
            # them a parse per watched event.
            keep.append((clean, stored) if etype in WATCHED_TYPES else None)
        return (event_id or new_id("evt"), task_id, seq, stamp, etype, body, projection)

    def _prepare(
        self,
        items: list[Item],
        keep: list[Any] | None = None,
        *,
        project: bool = True,
        payloads: list[bytes | None] | None = None,
    ) -> tuple[list[Row], list[Item]]:
        """Rows for ``items``; an item that cannot become a row spoils only itself (it is
        returned apart, for the dead letter). ``project=False`` for rows bound for the dead
        letter: a spill runs on the agent's thread, where the projection would be wasted work.
        ``payloads``: each item's payload as orjson wrote it, where known (see ``_row``)."""
        sanitizer = _Sanitizer(self.max_text, check_utf8=False)
        rows: list[Row] = []
        raw: list[Item] = []
        if payloads is None or len(payloads) != len(items):
            payloads = [None] * len(items)
        scanner = self._batch_scanner() if len(items) > 1 else None
        if scanner is None:
            for item, payload in zip(items, payloads, strict=True):
                try:
                    rows.append(self._row(item, sanitizer, keep, project=project, raw=payload))
                except Exception:  # noqa: BLE001 - keep the writer alive whatever happens
                    log.exception("hindsight: could not prepare an event")
                    raw.append(item)
            return rows, raw
        # Serialize a chunk of events, look for every guard of all of them in one Hyperscan
        # pass, then redact each with its own guards: the same bytes as one scan per event.
        # In chunks, not the whole batch at once: a chunk's events are still in the CPU's
        # caches when they are redacted (a chunk of 1,000 cost 1-2 µs more per event than one
        # scan per event; 100 about as much), and a hundred releases of the GIL per batch are
        # a hundredth of one per event.
        for start in range(0, len(items), SCAN_CHUNK):
            serialized = self._serialize_chunk(
                items[start : start + SCAN_CHUNK],
                payloads[start : start + SCAN_CHUNK],
                sanitizer,
                raw,
            )
            found: list[Collection[int]] | list[None]
            try:
                found = scanner.scan_many([parts[5] for _, parts in serialized])
            except Exception:  # noqa: BLE001 - each event then looks for its own guards
                log.exception("hindsight: the batch scan failed")
                found = [None] * len(serialized)
            for (item, parts), hits in zip(serialized, found, strict=True):
                try:
                    rows.append(self._finish(parts, hits, keep, project=project))
                except Exception:  # noqa: BLE001 - keep the writer alive whatever happens
                    log.exception("hindsight: could not prepare an event")
                    raw.append(item)
        return rows, raw

    def _serialize_chunk(
        self,
        items: list[Item],
        payloads: list[bytes | None],
        sanitizer: _Sanitizer,
        raw: list[Item],
    ) -> list[tuple[Item, tuple[Any, ...]]]:
        """``_serialize`` of each item, with its parts (an item it fails on goes to ``raw``),
        inlined for the usual event: a timestamp in nanoseconds, a payload the sanitizer's walk
        would give back as it is (``_plain_dict``) and orjson takes. The rest go through
        ``_serialize``, which gives the usual event these very parts too."""
        out: list[tuple[Item, tuple[Any, ...]]] = []
        fast = not sanitizer.check_utf8  # _plain_dict answers for a sanitizer that trusts UTF-8
        limit = sanitizer.max_text
        low, high = _NS_FAST
        dumps, iso = orjson.dumps, self._iso
        for item, given in zip(items, payloads, strict=True):
            try:
                task_id, seq, ts, etype, payload, event_id = item
                parts = None
                if (
                    fast
                    and type(ts) is int
                    and low < ts < high
                    and type(payload) is dict
                    and "type" not in payload
                    and "task_id" not in payload
                    and _plain_dict(payload, 0, limit)
                ):
                    try:
                        body = dumps(payload) if given is None else given
                    except Exception:  # noqa: BLE001 - _serialize handles what orjson refuses
                        pass
                    else:
                        parts = (event_id, task_id, seq, iso(ts), etype, body, payload, False, None)
                if parts is None:
                    parts = self._serialize(item, sanitizer, given)
                out.append((item, parts))
            except Exception:  # noqa: BLE001 - keep the writer alive whatever happens
                log.exception("hindsight: could not prepare an event")
                raw.append(item)
        return out

    def _batch_scanner(self) -> redact_scan.Scanner | None:
        """The scanner ``_prepare`` looks for a batch's guards with, or None: no Hyperscan, or
        ``batch_guards`` off. The writer process scans each piece it reads in one pass too: a
        Python call chain per event (``_row``, ``redact``, ``Scanner.scan``) cost it more than
        the scan itself."""
        if not self.batch_guards:
            return None
        return _SCANNER if _SCANNER is not False else _scanner()  # type: ignore[return-value]

    def _run(self) -> None:
        """Prepare batches (sanitize, cut, redact) and hand them to the committer thread.

        Preparing is Python and holds the GIL; the store's write is SQLite and releases it. In
        two threads the next batch is prepared while the store writes this one, so their times
        overlap instead of adding up.
        """
        try:
            while True:
                # Take nothing from the queue while a prepared batch still waits for the
                # committer: at most two batches are out of the queue (one being written, one
                # ready), so queue_bound alone bounds the memory.
                self._commits.join()
                if not self._queue:
                    if self._stop:
                        return
                    # Poll rather than have the agent signal every event: setting an Event costs
                    # the agent's thread more than the whole append.
                    self._wake.wait(0.005)
                    self._wake.clear()
                    continue
                items = []
                q = self._queue
                for _ in range(min(BATCH_SIZE, len(q))):
                    try:
                        items.append(q.popleft())
                    except IndexError:
                        break
                self.commit_items(items)
                del items
        finally:
            self._commits.put(None)

    def commit_items(self, items: list[Item], payloads: list[bytes | None] | None = None) -> None:
        """Prepare ``items`` (sanitize, cut, redact) on the calling thread and hand them to the
        committer thread; waits while a prepared batch still waits for it.

        The writer thread calls it for each batch it takes from the queue (the writer process
        prepares piece by piece and hands them over with ``commit_prepared``). ``payloads``:
        each payload's JSON as the agent serialized it, where known (see ``_row``)."""
        with self._cond:
            self._in_flight += len(items)
            self._preparing = True
            self._set_room()
        cleans: list[Any] = []
        keep = cleans if self._on_batch is not None else None
        try:
            rows, raw = self._prepare(items, keep, payloads=payloads)
        finally:
            with self._cond:
                self._preparing = False
                self._set_room()
                self._cond.notify_all()  # agents waiting in _yield_to_writer
        if raw and keep is not None:
            cleans = []  # out of step with the rows: the hook reads the rows alone
        batch = (len(items), rows, raw, "could not prepare", cleans)
        with self._cond:  # with ``_give_up``: no batch is left in ``_commits`` after it
            if not self._given_up:
                # Empty here: the writer thread waits for that before it takes items from the
                # queue (``_run``); a caller that did not waits outside the lock.
                with contextlib.suppress(queue.Full):
                    self._commits.put_nowait(batch)
                    return
        if not self._given_up:
            self._commits.put(batch)
            return
        self._keep_held_up(len(items), rows, raw)

    def commit_prepared(self, n: int, rows: list[Row], raw: list[Item], cleans: list[Any]) -> None:
        """Hand the committer ``n`` items the caller prepared itself (``_prepare``, in pieces:
        the writer process prepares each piece it reads while its events are still in the
        CPU's caches, and commits many pieces in one transaction); waits while a prepared
        batch still waits for it. ``cleans``: the hook's payloads, one per row, in order."""
        with self._cond:
            self._in_flight += n
            self._set_room()
        if raw or len(cleans) != len(rows):
            cleans = []  # out of step with the rows: the hook reads the rows alone
        self._commits.put((n, rows, raw, "could not prepare", cleans))

    @property
    def committer_id(self) -> int | None:
        """The committer thread's id as the system knows it (None before it starts)."""
        return self._committer.native_id

    def start_committer(self) -> None:
        """Start only the committer: the caller hands it batches (``commit_items``,
        ``commit_prepared``) and ends with ``finish()``."""
        self._committer.start()

    def finish(self, timeout: float | None = None) -> None:
        """Stop a committer started alone, once it has written every batch handed to it."""
        self._commits.put(None)
        self._committer.join(timeout)

    def _commit(self) -> None:
        """Write prepared batches in order; what the store refuses goes to the dead letter."""
        checkpoints = self._checkpoints
        if checkpoints is not None:
            try:
                checkpoints.defer_checkpoints()
            except Exception:  # noqa: BLE001 - then the store checkpoints as it always did
                log.exception("hindsight: could not take over the store's checkpoints")
                checkpoints = self._checkpoints = None
        while (batch := self._commits.get()) is not None:
            self._commits.task_done()  # taken: the writer may prepare the next batch
            n, rows, raw, problem, cleans = batch
            del batch
            with self._cond:
                self._writing = writing = (n, rows, raw)
                given_up = self._given_up
            try:
                if given_up:  # close() gave up on this thread once, it may be held up again
                    self._dead_letter(rows, HELD_UP.format(CLOSE_STALL))
                    self._dead_letter_raw(raw, HELD_UP.format(CLOSE_STALL))
                else:
                    if raw:
                        self._dead_letter_raw(raw, problem)
                    if rows:
                        self._write_batch(rows, cleans)
            except Exception:  # noqa: BLE001 - this thread must outlive any one batch
                log.exception("hindsight: committing a batch failed")
            del rows, raw, cleans
            with self._cond:
                if self._writing is not writing:
                    continue  # close() gave up waiting for it and kept it (``_give_up``)
                self._writing = None
                self._in_flight -= n
                self._set_room()
                self._done += n
                done = self._done
                self._cond.notify_all()
            del writing
            if self._on_done is not None:
                try:
                    self._on_done(done)
                except Exception:  # noqa: BLE001
                    log.exception("hindsight: the done hook failed")
            if checkpoints is not None:
                try:
                    if checkpoints.checkpoint_due(idle=self._commits.empty()):
                        checkpoints.checkpoint()
                except Exception:  # noqa: BLE001 - the next batch's COMMIT is what matters
                    log.exception("hindsight: a checkpoint failed")
        if self._on_batch is not None:
            # The writer stops: a batch of nothing lets the hook try once more with what it
            # kept for the next batch (reviews the store refused), as no next batch will come.
            try:
                self._on_batch([], [])
            except Exception:  # noqa: BLE001
                log.exception("hindsight: batch hook failed")
        if self._stop:
            # Closed: this thread was the last of ours to use the store (a call close() gave
            # up on has returned, or close() stopped waiting for this thread's end).
            self._release()

    def _write_batch(self, rows: list[Row], cleans: list[Any]) -> None:
        try:
            unknown = self._write(rows)
        except sqlite3.OperationalError as exc:
            if self._writing is None and self._given_up:
                return  # close() gave up waiting for this call and kept the batch already
            # Locked, full or unreadable: the whole batch waits in the dead letter.
            self._dead_letter(rows, f"store refused the batch: {_root_error(exc)!r}")
            return
        except Exception as exc:  # noqa: BLE001
            if self._writing is None and self._given_up:
                return
            if len(rows) == 1:
                self._dead_letter(rows, f"store refused the event: {_root_error(exc)!r}")
                return
            # Something in the data: write row by row so one bad event does not take the
            # batch's thousands of good ones to the dead letter.
            for i, row in enumerate(rows):
                self._write_batch([row], cleans[i : i + 1])
            return
        self.stats["written"] += len(rows)
        self.stats["batches"] += 1
        if self._on_written is not None:
            try:
                self._on_written()
            except Exception:  # noqa: BLE001
                log.exception("hindsight: the written hook failed")
        if unknown:
            self.stats["warnings"] += 1
            warn(
                f"events for unknown task id(s) {', '.join(map(repr, unknown[:5]))}: "
                "kept under a placeholder task; start tasks with hs.task() or a "
                "task_start event"
            )
        if self._on_batch is not None and len(cleans) == len(rows):
            try:
                self._on_batch(rows, cleans)
            except Exception:  # noqa: BLE001
                log.exception("hindsight: batch hook failed")

    def _dead_letter(self, rows: Iterable[Row], reason: str) -> None:
        def line(row: Row) -> bytes:
            event_id, task_id, seq, ts, etype, body = row[:6]
            try:
                event = orjson.loads(body)
                event.update(event_id=event_id, task_id=task_id, seq=seq, timestamp=ts, type=etype)
                return orjson.dumps({**event, "_dead_letter_reason": reason}, default=str)
            except Exception:  # noqa: BLE001 - the dead letter must take anything
                return redact(
                    orjson.dumps({"row": repr(row)[:100_000], "_dead_letter_reason": reason})
                )

        self._append_dead_letter(map(line, rows), reason)

    def _dead_letter_raw(self, items: list[Item], reason: str) -> None:
        """Items that could not become rows: kept as their repr, redacted like everything."""
        if not items:
            return

        def line(i: Item) -> bytes:
            try:
                text = repr(i[4])[:10_000]
            except Exception:  # noqa: BLE001
                text = f"<unrepresentable {type(i[4]).__name__}>"
            return redact(
                orjson.dumps(
                    {
                        "task_id": str(i[0]),
                        "seq": i[1] if type(i[1]) is int else None,
                        "type": str(i[3]),
                        "repr": text,
                        "_dead_letter_reason": reason,
                    }
                )
            )

        self._append_dead_letter(map(line, items), reason)

    def _forked(self) -> None:
        """In a child forked from this process (multiprocessing, a pre-forking server): new
        locks (a thread of the parent may have held one at the fork, and none of the child's
        would ever let go), and counters from nothing (what the parent counted is the parent's).

        The writer threads stay in the parent, and so do the events waiting for them: the
        parent writes those. A started recorder starts threads of its own with the child's
        first event (a child that never records, a pool worker or a ``preexec_fn``, gets
        none); before, the child's events waited in a queue no thread read, and were lost."""
        self._mark_lock = threading.RLock()
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._dead_letter_lock = threading.Lock()
        self._child_lock = threading.Lock()
        self._release_lock = threading.Lock()
        self._on_release = []  # the parent's, for its store: its threads stayed there
        self.stats = dict.fromkeys(self.stats, 0)
        self._lost_reported = 0
        self._close_owed = False  # the parent's: its exit hook finds nothing to do here
        if not self.started:
            return
        self._queue = deque()
        self._seq = count(1)
        self._flush_marks = self._done = self._in_flight = self._spilling = 0
        self._forgone = []
        self._preparing = False
        self._writing = None
        self._given_up = False
        self._set_room()
        self._commits = queue.Queue(maxsize=1)
        self._new_threads()
        # A closed recorder stays closed; an open one waits, stopped, for its first event.
        self._child_idle = not self._stop
        self._stop = True

    def _child_starts(self) -> None:
        """A forked child's first event: the recorder's threads start (once, whichever of the
        child's threads gets here first)."""
        with self._child_lock:
            if self._child_idle:
                self.start()
                # A child that ends with os._exit (a multiprocessing worker) runs no atexit
                # hook, and its daemon writer threads die with what they hold (740 of 801 events
                # in a Pool's workers). It runs threading's own exit hooks (Process._bootstrap
                # ends with threading._shutdown): what is left is written there.
                register = getattr(threading, "_register_atexit", None)
                if register is not None:
                    with contextlib.suppress(Exception):
                        register(self._flush_at_exit)

    def _flush_at_exit(self) -> None:
        try:
            self.flush(timeout=FORK_WAIT * 2)
        except Exception:  # noqa: BLE001 - an exit must never fail because of Hindsight
            log.exception("hindsight: the forked child's last flush failed")

    def keep_refused(self, thing: Any, reason: str) -> None:
        """Dead-letter something refused before it became an event (not an event at all, or
        an event that fails the wire check), kept under ``refused`` with the reason: converted
        and redacted like an event, its text cut only past 100,000 characters."""
        sanitizer = _Sanitizer(max(self.max_text, 100_000))
        try:
            clean = sanitizer.value(thing)
            try:
                line = orjson.dumps({"refused": clean, "_dead_letter_reason": reason})
            except orjson.JSONEncodeError:
                line = orjson.dumps(
                    {"refused": sanitizer.strict(clean), "_dead_letter_reason": reason}
                )
        except Exception:  # noqa: BLE001 - the dead letter must take anything
            line = orjson.dumps(
                {"refused": sanitizer._marker(thing)[:10_000], "_dead_letter_reason": reason}
            )
        self._append_dead_letter(
            [redact(line, secret_key=sanitizer.secret_key, escaped=True)], reason
        )

    def _append_dead_letter(self, lines: Iterable[bytes], reason: str) -> None:
        """Append lines to the dead letter, or where it cannot be written to its fallback;
        what neither takes is counted in ``stats["lost"]`` (and ``flush()`` says False).

        Written a thousand lines at a time: building a whole batch's lines first would take
        memory at the moment it is tightest, the spill. A chunk a full disk took only in part
        is cut back off the file, and written whole to the next place.
        """
        places = [self.dead_letter, self.fallback_dead_letter]
        errors: list[str] = []
        written = [0, 0]
        lost = 0
        with self._dead_letter_lock:
            fh = None
            place = 0
            try:
                for chunk in _chunks(lines, 1000):
                    data = b"\n".join(chunk) + b"\n"
                    while place < len(places):
                        try:
                            if fh is None:
                                if place:
                                    places[place].parent.mkdir(parents=True, exist_ok=True)
                                fh = open(places[place], "ab", buffering=0)  # noqa: SIM115
                            _write_whole(fh, data)
                            written[place] += len(chunk)
                            break
                        except OSError as exc:
                            errors.append(f"{places[place]}: {exc}")
                            if fh is not None:
                                with contextlib.suppress(OSError):
                                    fh.close()
                                fh = None
                            place += 1
                    else:
                        lost += len(chunk)
            except Exception as exc:  # noqa: BLE001 - a line that cannot be made: say so
                errors.append(f"could not write the dead letter: {exc!r}")
                log.exception("hindsight: dead letter failed")
            finally:
                if fh is not None:
                    with contextlib.suppress(OSError):
                        fh.close()
            self.stats["dead_lettered"] += written[0] + written[1]
            self.stats["lost"] += lost
        if written[0]:
            warn(f"{written[0]} events written to {self.dead_letter} ({reason})")
        if written[1]:
            warn(
                f"{written[1]} events written to {self.fallback_dead_letter} ({reason}); "
                f"{self.dead_letter} could not be written: {'; '.join(errors[:2])}"
            )
        if lost or (errors and not any(written)):
            log.error(
                "hindsight: LOST %d events (%s): the dead letter could not be written: %s",
                lost,
                reason,
                "; ".join(errors),
            )

    # -- control ---------------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> bool:
        """Block until every event accepted so far is durable (stored or dead-lettered).

        Returns False on timeout, when the writer is gone, or when events were lost (neither
        stored nor dead-lettered anywhere, counted in ``stats["lost"]``) since the previous
        ``flush()`` reported: each loss is reported once.
        """
        # Taking a seq here counts every emit() that took one before us: the items the
        # writer must have handled are the seqs issued so far minus those flush() took. A
        # loop's step takes it, not next(): with no call under the lock, no signal handler
        # runs while it is held (a reentrant lock: one that did would come in).
        mark = 0
        with self._mark_lock:
            for mark in self._seq:  # noqa: B007
                break
            self._flush_marks += 1
            target = mark - self._flush_marks
        deadline = None if timeout is None else time.monotonic() + timeout
        beneath = []
        if self._done + len(self._forgone) < target or self._dead_letter_lock.locked():
            beneath = self.calls_beneath(self, every=True)
        if beneath:
            # A signal handler's flush: the record calls it interrupted took their seqs and
            # queue their events only once it returns.
            target -= sum(f.f_code is Recorder.emit.__code__ for f in beneath)
            return self._flush_beneath(target, deadline)
        self._wake.set()
        self.hurry()
        with self._cond:
            while self._done + len(self._forgone) < target:
                if not (self._thread.is_alive() and self._committer.is_alive()):
                    return False
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(0.05 if left is None else min(left, 0.05))
        with self._dead_letter_lock:
            lost = self.stats["lost"]
            ok = lost == self._lost_reported
            self._lost_reported = lost
        return ok

    def _flush_beneath(self, target: int, deadline: float | None) -> bool:
        """``flush`` from a signal handler: it looks rather than waits on ``_cond`` (the call
        it interrupted may be inside a wait on it) and takes no lock that call may hold; it
        wakes nothing either (the call may be inside that very ``Event.set``): the writer
        polls. What the call holds (a spill under way) goes on only once the handler returns:
        False once nothing became durable for ``BENEATH_STALL`` seconds."""
        last, since = -1, 0.0
        while (handled := self._done + len(self._forgone)) < target:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return False
            if handled != last:
                last, since = handled, now
            elif now - since >= self.BENEATH_STALL:
                return False
            if not (self._thread.is_alive() and self._committer.is_alive()):
                return False
            time.sleep(0.002)
        return self.stats["lost"] == self._lost_reported  # reported by the next flush

    def hurry(self) -> None:
        """Someone waits for what is durable: stop a checkpoint under way."""
        if self._checkpoints is not None:
            try:
                self._checkpoints.stop_checkpoint()
            except Exception:  # noqa: BLE001
                log.exception("hindsight: could not stop a checkpoint")

    @property
    def backlog(self) -> int:
        """Events waiting in the queue (the part ``queue_bound`` limits)."""
        return len(self._queue)

    @property
    def pending(self) -> int:
        """Events accepted and not yet durable: the queue, the batches being written, spills."""
        return len(self._queue) + self._in_flight + self._spilling

    @property
    def held_up(self) -> bool:
        """close() gave up on a writer held up in a call (``_give_up``) that has not returned:
        the store must stay open under it (closing a connection in use waits for its call)."""
        return self._close_owed or (self._given_up and self._committer.is_alive())

    def _handled(self) -> int:
        """Accepted events handled so far (written, dead-lettered, spilled, after close, forgone):
        what ``close()`` watches for progress."""
        with self._cond:
            return self._done + len(self._forgone)

    def _flush_or_gone(self, timeout: float) -> bool:
        """``flush``, True too when the writer threads are gone (as close() always took it)."""
        return self.flush(timeout) or not (self._thread.is_alive() and self._committer.is_alive())

    def close(self) -> None:
        """Flush, then stop the writer threads. A writer held up for ``CLOSE_STALL`` seconds
        (a store call blocked for good) is waited for no more: what it had not made durable is
        kept in the dead letter, with a warning that says how many and where."""
        self._child_idle = False
        if not self.started:
            self._stop = True
            self._release()
            return
        if self.calls_beneath(self):
            self._close_later()
            return
        if self._close_owed:
            self._close_owed = False
            atexit.unregister(self._finish_close)
        held_up = not flush_while_it_moves(self._flush_or_gone, self._handled)
        self._stop = True
        self._wake.set()
        if held_up:
            self._give_up()
        self._thread.join(timeout=5)
        if not held_up:  # else it is inside the call close() gave up on
            self._committer.join(timeout=5)
        if not self._committer.is_alive():
            self._release()  # else the committer does, as it ends

    def on_released(self, call: Callable[[], None]) -> None:
        """Make ``call`` (closing the store) once no thread of this recorder can use the store:
        now if none can, else once close() is done, or once the store call close() gave up on
        (``_give_up``) returns. Before, a store left open under such a call stayed open for good,
        and so did one under a close a signal handler left for later (``_close_later``)."""
        with self._release_lock:
            if not self._released:
                self._on_release.append(call)
                return
        self._call_released(call)

    def _release(self) -> None:
        """Closed, and no thread of ours uses the store: make the ``on_released`` calls (once)."""
        with self._release_lock:
            if self._released:
                return
            self._released = True
            calls, self._on_release = self._on_release, []
        for call in calls:
            self._call_released(call)

    @staticmethod
    def _call_released(call: Callable[[], None]) -> None:
        try:
            call()
        except Exception:  # noqa: BLE001 - the agent must never crash because of Hindsight
            log.exception("hindsight: closing the store after the writer failed")

    def _close_later(self) -> None:
        """close() from a signal handler that interrupted a call of this recorder (``on
        SIGTERM: close and exit``): the writer threads must go on (the interrupted call queues
        its event once the handler returns), so this flushes what can be made durable now and
        leaves the rest of the close to the exit (or a later close()); ``held_up`` keeps the
        store open for the writer meanwhile."""
        self.flush()
        if not self._close_owed:
            self._close_owed = True
            atexit.register(self._finish_close)

    def _finish_close(self) -> None:
        """The close a signal handler asked for (``_close_later``), at the exit."""
        if self._close_owed:
            self.close()

    def _give_up(self) -> None:
        """close() waited ``CLOSE_STALL`` seconds and nothing became durable: keep the batch
        the committer is writing, the one waiting for it and what is still queued in the dead
        letter (from now on every batch goes there), wait for that while it moves, and say
        what became of it. A batch whose store call returns later may be stored too; the
        dead letter's event ids let ``hindsight import`` skip it."""
        pending = self.pending
        with self._cond:
            self._given_up = True
            held = [self._writing] if self._writing is not None else []
            self._writing = None
            try:
                waiting = self._commits.get_nowait()
            except queue.Empty:
                waiting = None
            else:
                self._commits.task_done()  # the writer thread goes on (to the dead letter)
                if waiting is None:  # the writer thread's end: for the committer, if it returns
                    self._commits.put_nowait(None)
        if waiting is not None:
            held.append(waiting[:3])
        for n, rows, raw in held:
            self._keep_held_up(n, rows, raw)
        # What is still queued, in case the writer thread is the one held up (a logging
        # handler it warns through may block): each item is taken by it or by this loop.
        while True:
            items = []
            with contextlib.suppress(IndexError):
                for _ in range(BATCH_SIZE):
                    items.append(self._queue.popleft())
            if not items:
                break
            with self._cond:
                self._in_flight += len(items)
            rows, raw = self._prepare(items, project=False)
            self._keep_held_up(len(items), rows, raw)
        self._wake.set()
        flush_while_it_moves(self._flush_or_gone, self._handled)
        left = self.pending
        message = (
            f"the Hindsight writer made nothing durable for {CLOSE_STALL:.0f} s (a store call "
            f"held up: another process's lock, a hung disk): close() stopped waiting for it; "
            f"the {max(pending - left, 0)} events it had not made durable are kept in the dead "
            f"letter {self.dead_letter} ('hindsight import' takes them back)"
        )
        if left:
            message += f"; {left} more are held by the writer thread and are not durable"
        warn(message)

    def _keep_held_up(self, n: int, rows: list[Row], raw: list[Item]) -> None:
        """Dead-letter a batch close() gave up on (``_give_up``), then count it handled."""
        try:
            self._dead_letter(rows, HELD_UP.format(CLOSE_STALL))
            self._dead_letter_raw(raw, HELD_UP.format(CLOSE_STALL))
        finally:
            with self._cond:
                self._in_flight -= n
                self._set_room()
                self._done += n
                self._cond.notify_all()


def _chunks(lines: Iterable[bytes], size: int) -> Iterable[list[bytes]]:
    chunk: list[bytes] = []
    for one in lines:
        chunk.append(one)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _write_whole(fh: Any, data: bytes) -> None:
    """Write all of ``data`` or none of it: a part a full disk took is cut off again."""
    start = os.fstat(fh.fileno()).st_size
    view = memoryview(data)
    try:
        while view:
            n = fh.write(view)
            if not n:
                raise OSError("the dead letter took no more bytes")
            view = view[n:]
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fh.fileno(), start)
        raise


__all__ = [
    "DEFAULT_MAX_TEXT",
    "EVENT_BODY_FIELDS",
    "HindsightWarning",
    "Recorder",
    "redact",
    "redact_text",
    "state_dir",
    "warn",
]
