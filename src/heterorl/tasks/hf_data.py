"""Problem records from the `datasets` library: a directory written by `save_to_disk`, or a Hub dataset.

`datasets` is optional (`pip install heterorl[data]`) and imported only here, only when such a source is used.
Hub datasets (`hf:<repo id>`) need network access the first time (then `datasets` caches them); without it,
the load fails with one line saying so. `HF_DATASETS_OFFLINE=1` makes `datasets` use its cache only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from heterorl.config.tasks import HUB_PREFIX
from heterorl.errors import DataError, MissingDependencyError, PathNotFoundError


def _datasets() -> Any:
    try:
        import datasets
    except ImportError as exc:
        raise MissingDependencyError(
            "reading a dataset directory or a Hub dataset needs `datasets`: pip install 'heterorl[data]'"
        ) from exc
    return datasets


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def read_dataset_dir(path: str | Path, split: str, field: str) -> list[dict[str, Any]]:
    """The records of `split` of a `save_to_disk` directory (a Dataset, or a DatasetDict holding `split`)."""
    datasets = _datasets()
    p = Path(path)
    if not p.is_dir():
        raise PathNotFoundError(f"{field}: dataset directory not found: {p}")
    try:
        loaded = datasets.load_from_disk(str(p))
    except FileNotFoundError as exc:  # a directory that save_to_disk did not write
        raise DataError(f"{field}: {p} is not a `datasets` save_to_disk directory ({_first_line(exc)})") from exc
    return _split_records(loaded, split, f"{field}: {p}")


def read_hub_dataset(spec: str, subset: str | None, split: str, field: str) -> list[dict[str, Any]]:
    """The records of `split` of Hub dataset `hf:<repo id>` (configuration `subset`)."""
    datasets = _datasets()
    repo = spec.removeprefix(HUB_PREFIX)
    try:
        loaded = datasets.load_dataset(repo, subset, split=split)
    except (ConnectionError, OSError, ValueError, RuntimeError) as exc:
        # no network, an unknown repository or split, a gated dataset: the library's errors vary by version
        raise DataError(
            f"{field}: cannot load {spec} (subset {subset}, split {split}) from the Hugging Face Hub; "
            f"is the network reachable, and the name right? ({_first_line(exc)})"
        ) from exc
    return _split_records(loaded, split, f"{field}: {spec}")


def _split_records(loaded: Any, split: str, where: str) -> list[dict[str, Any]]:
    datasets = _datasets()
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DataError(f"{where} has no split {split!r}; its splits are {sorted(loaded)}")
        loaded = loaded[split]
    records = loaded.to_list()
    if not records:
        raise DataError(f"{where}: split {split!r} holds no records")
    return records
