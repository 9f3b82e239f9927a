"""Read problem records (dicts) from data files, with errors that name the file and the config field.

Files: JSONL (one object per line), JSON (an array of objects, or JSON lines), CSV (a header row; every value
is text) and parquet (needs pyarrow, imported only when a parquet file is read). Directories written by
`datasets.save_to_disk` and Hub datasets are read by `heterorl.tasks.hf_data`.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from heterorl.errors import DataError, MissingDependencyError, PathNotFoundError

SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


def read_records(path: str | Path, field: str) -> list[dict[str, Any]]:
    """All records of a data file; `field` names the config field that gave the path (for errors)."""
    p = Path(path)
    if not p.is_file():
        raise PathNotFoundError(f"{field}: data file not found: {p}")
    readers = {".jsonl": _read_jsonl, ".json": _read_json, ".csv": _read_csv, ".parquet": _read_parquet}
    if p.suffix not in readers:
        raise DataError(f"{field}: {p} has suffix {p.suffix!r}; supported: {', '.join(SUFFIXES)}, or a directory")
    records = readers[p.suffix](p)
    if not records:
        raise DataError(f"{field}: {p} holds no records (empty file)")
    return records


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    records = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue  # blank lines (a trailing newline, editor artefacts) carry no record
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: not valid JSON ({exc})") from exc
            records.append(_object(record, f"{path}:{lineno}"))
    return records


def _read_json(path: Path) -> list[dict[str, Any]]:
    """A JSON array of objects; a file of one object per line (JSON lines named .json) is read as JSONL."""
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return _read_jsonl(path)
    if isinstance(data, dict):  # one object: a single record
        return [data]
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON array of objects, got {type(data).__name__}")
    return [_object(r, f"{path}: item {i}") for i, r in enumerate(data)]


def _read_csv(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None:
            return []
        return [dict(row) for row in reader]


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise MissingDependencyError(f"reading {path} needs pyarrow (pip install pyarrow); JSONL does not") from exc
    return pq.read_table(path).to_pylist()


def require_fields(records: list[dict[str, Any]], where: str, fields: dict[str, str]) -> None:
    """Every record has every field; `fields` maps config field -> record field name (e.g. problem_field)."""
    for i, record in enumerate(records):
        for config_field, name in fields.items():
            if name not in record:
                raise DataError(
                    f"{where}: record {i} has no field {name!r} (set by task.{config_field}); "
                    f"its fields are {sorted(record)}"
                )
