"""Read problem records (dicts) from JSONL or parquet files, with errors that name the file and config field.

Parquet needs pyarrow, imported only when a parquet file is read, so JSONL datasets work without it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SUFFIXES = (".jsonl", ".parquet")


def read_records(path: str | Path, field: str) -> list[dict[str, Any]]:
    """All records of a JSONL or parquet file; `field` names the config field that gave the path (for errors)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{field}: data file not found: {p}")
    if p.suffix == ".jsonl":
        records = _read_jsonl(p)
    elif p.suffix == ".parquet":
        records = _read_parquet(p)
    else:
        raise ValueError(f"{field}: {p} has suffix {p.suffix!r}; supported: {', '.join(SUFFIXES)}")
    if not records:
        raise ValueError(f"{field}: {p} holds no records (empty file)")
    return records


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    records = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue  # blank lines (a trailing newline, editor artefacts) carry no record
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc})") from exc
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
            records.append(record)
    return records


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ImportError(f"reading {path} needs pyarrow (pip install pyarrow); JSONL files do not") from exc
    return pq.read_table(path).to_pylist()


def require_fields(records: list[dict[str, Any]], path: str | Path, fields: dict[str, str]) -> None:
    """Every record has every field; `fields` maps config field -> record field name (e.g. problem_field)."""
    for i, record in enumerate(records):
        for config_field, name in fields.items():
            if name not in record:
                raise ValueError(
                    f"{path}: record {i} has no field {name!r} (set by task.{config_field}); "
                    f"its fields are {sorted(record)}"
                )
