"""The guide's code blocks run, so the guide stays true."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guide.md"
BLOCK = re.compile(r"^```(python(?: test)?)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def blocks(kind: str) -> list[str]:
    return [code for info, code in BLOCK.findall(GUIDE.read_text()) if info == kind]


def test_the_guide_has_examples() -> None:
    assert len(blocks("python")) >= 6 and len(blocks("python test")) == 1


def test_the_guides_python_blocks_run_in_order(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "guide"}
    for number, code in enumerate(blocks("python"), 1):
        try:
            exec(compile(code, f"{GUIDE.name} block {number}", "exec"), namespace)
        except Exception as exc:
            pytest.fail(f"guide block {number} failed: {type(exc).__name__}: {exc}\n{code}")


def test_the_guides_test_examples_pass(pytester: pytest.Pytester) -> None:
    (code,) = blocks("python test")
    pytester.makepyfile(test_guide_example=code)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    count = len(re.findall(r"^def test_", code, re.MULTILINE))
    result.assert_outcomes(passed=count)


@pytest.fixture(autouse=True)
def _quiet_home(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", os.fspath(tmp_path))
