"""Data sources of the math task: records from a file, a `datasets` directory or the Hub, turned into training
and held-out problems per source.

A source's held-out problems come from `eval_path` (another source of the same kind), `eval_split` (another
split of the same dataset), or a hash-chosen `eval_fraction` of its own problems (`finite.split_by_hash`).
Held-out prompts of every source are removed from every source's training problems, so a mixture never trains
on a prompt it evaluates on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from heterorl.config.tasks import HUB_PREFIX, MathSourceConfig
from heterorl.errors import DataError
from heterorl.tasks.base import Problem
from heterorl.tasks.finite import SourceSplit, remove_prompts, split_by_hash
from heterorl.tasks.hf_data import read_dataset_dir, read_hub_dataset
from heterorl.tasks.records import read_records, require_fields


def read_source(path: str, subset: str | None, split: str, field: str) -> list[dict[str, Any]]:
    """Records of one source: `hf:<repo>` from the Hub, a directory with `datasets`, else a data file."""
    if path.startswith(HUB_PREFIX):
        return read_hub_dataset(path, subset, split, field)
    if Path(path).is_dir():
        return read_dataset_dir(path, split, field)
    return read_records(path, field)


def source_name(cfg: MathSourceConfig, index: int) -> str:
    """`cfg.name`, else the file or dataset name (`gsm8k`, `math_small`), else `source<index>`."""
    if cfg.name:
        return cfg.name
    stem = Path(cfg.path.removeprefix(HUB_PREFIX)).stem
    return stem or f"source{index}"


def to_problems(
    records: list[dict[str, Any]], where: str, cfg: MathSourceConfig, template: str, name: str
) -> list[Problem]:
    """Distinct problems of one source's records; conflicting answers for one prompt are a data error."""
    require_fields(records, where, {"problem_field": cfg.problem_field, "answer_field": cfg.answer_field})
    problems: dict[str, Problem] = {}
    for i, record in enumerate(records):
        problem = _text(record[cfg.problem_field], where, i, cfg.problem_field)
        answer = _text(record[cfg.answer_field], where, i, cfg.answer_field)
        p = Problem(
            prompt=template.replace("{problem}", problem), answer=answer, info={"record": record, "source": name}
        )
        first = problems.setdefault(p.prompt, p)
        if first.answer != answer:
            raise DataError(f"{where}: record {i} repeats a problem with answer {answer!r} != {first.answer!r}")
    return list(problems.values())


def _text(value: Any, where: str, index: int, field: str) -> str:
    """A record value as stripped text; numbers (JSON 0.5, parquet int64) become their decimal form."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise DataError(f"{where}: record {index} field {field!r} is {type(value).__name__}, not text or a number")
    text = str(value).strip()
    if not text:
        raise DataError(f"{where}: record {index} field {field!r} is empty")
    return text


def load_source(cfg: MathSourceConfig, template: str, field: str, index: int) -> SourceSplit:
    """One source's training and held-out problems; `field` is the config path of the source (`task`,
    `task.sources.1`) for errors."""
    name = source_name(cfg, index)

    def problems(path: str, split: str, what: str) -> list[Problem]:
        records = read_source(path, cfg.subset, split, f"{field}.{what}")
        where = path if path.startswith(HUB_PREFIX) or not Path(path).is_dir() else f"{path} ({split})"
        return to_problems(records, where, cfg, template, name)

    everything = problems(cfg.path, cfg.split, "path")
    if cfg.eval_path is not None:
        held_out = problems(cfg.eval_path, cfg.split, "eval_path")
        train = remove_prompts(everything, held_out)
    elif cfg.eval_split is not None:
        held_out = problems(cfg.path, cfg.eval_split, "eval_split")
        train = remove_prompts(everything, held_out)
    else:
        train, held_out = split_by_hash(everything, cfg.eval_fraction)
    return SourceSplit(name, train, held_out, cfg.weight)
