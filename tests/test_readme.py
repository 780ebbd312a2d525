"""The README's Python examples run as written (in a temporary folder, on a fresh store)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_readme_has_python_examples() -> None:
    assert BLOCKS, "the README should show the library in use"


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for key in [k for k in os.environ if k.startswith("HINDSIGHT_")]:
        monkeypatch.delenv(key)
    code = compile(BLOCKS[index], f"README.md[python block {index}]", "exec")
    exec(code, {"__name__": f"readme_{index}"})  # noqa: S102 - the README is ours
