"""Fixtures: the shipped small math file, and writers for ad-hoc JSONL files."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="session")
def math_small() -> Path:
    """40 arithmetic / algebra word problems written for this project (fields: problem, answer)."""
    return DATA / "math_small.jsonl"


@pytest.fixture
def write_jsonl(tmp_path: Path) -> Callable[..., Path]:
    def write(records: list[dict[str, Any]], name: str = "data.jsonl") -> Path:
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        return path

    return write
