"""Math data sources: more file formats, `datasets` directories, the Hub (offline: one clear error), mixtures."""

from __future__ import annotations

import collections
import csv
import itertools
import json
from pathlib import Path

import pytest

from heterorl.errors import DataError, MissingDependencyError, PathNotFoundError
from heterorl.tasks import make_task
from heterorl.tasks.math import MathTask

from ._configs import MathTaskConfig


def records_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def math_task(**kw) -> MathTask:
    task = make_task(MathTaskConfig(**kw))
    assert isinstance(task, MathTask)
    return task


@pytest.fixture(scope="module")
def reference(math_small: Path) -> MathTask:
    return math_task(path=str(math_small), eval_fraction=0.25)


def test_json_array_json_lines_and_csv_read_like_jsonl(tmp_path: Path, math_small: Path, reference: MathTask) -> None:
    records = records_of(math_small)
    (tmp_path / "array.json").write_text(json.dumps(records))
    (tmp_path / "lines.json").write_text(math_small.read_text())
    with (tmp_path / "table.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["problem", "answer"])
        writer.writeheader()
        writer.writerows(records)
    for name in ("array.json", "lines.json", "table.csv"):
        task = math_task(path=str(tmp_path / name), eval_fraction=0.25)
        assert task.train_problems == reference.train_problems, name
        assert task.eval_set() == reference.eval_set(), name


def test_a_saved_dataset_directory_and_its_splits(tmp_path: Path, math_small: Path, reference: MathTask) -> None:
    datasets = pytest.importorskip("datasets")
    records = records_of(math_small)
    datasets.Dataset.from_list(records).save_to_disk(str(tmp_path / "plain"))
    task = math_task(path=str(tmp_path / "plain"), eval_fraction=0.25)
    assert task.train_problems == reference.train_problems
    assert task.eval_set() == reference.eval_set()
    splits = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(records[:30]), "test": datasets.Dataset.from_list(records[30:])}
    )
    splits.save_to_disk(str(tmp_path / "splits"))
    task = math_task(path=str(tmp_path / "splits"), eval_split="test")
    assert [p.answer for p in task.held_out_problems] == [r["answer"] for r in records[30:]]
    assert len(task.train_problems) == 30
    with pytest.raises(DataError, match=r"has no split 'validation'; its splits are \['test', 'train'\]"):
        math_task(path=str(tmp_path / "splits"), eval_split="validation")


def test_a_directory_that_is_not_a_dataset_is_one_clear_error(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    (tmp_path / "notes").mkdir()
    with pytest.raises(DataError, match=r"task\.path: .*notes is not a `datasets` save_to_disk directory"):
        math_task(path=str(tmp_path / "notes"))


def test_the_hub_without_network_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")
    import huggingface_hub

    # offline mode, so that no request leaves this machine (the flags are read when the libraries are imported)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataError) as info:
        math_task(path="hf:heterorl-test/no-such-dataset", subset="main")
    message = str(info.value)
    assert message.startswith("task.path: cannot load hf:heterorl-test/no-such-dataset (subset main, split train)")
    assert "is the network reachable" in message
    assert "\n" not in message


def test_without_the_datasets_package_the_error_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(__import__("sys").modules, "datasets", None)  # `import datasets` raises ImportError
    (tmp_path / "d").mkdir()
    with pytest.raises(MissingDependencyError, match=r"pip install 'heterorl\[data\]'"):
        math_task(path=str(tmp_path / "d"))


def test_a_missing_file_is_a_path_error(tmp_path: Path, math_small: Path) -> None:
    with pytest.raises(PathNotFoundError, match=r"task\.sources\.1\.path: data file not found: .*nope\.jsonl"):
        math_task(sources=[{"path": str(math_small)}, {"path": str(tmp_path / "nope.jsonl")}])


@pytest.fixture
def two_sources(write_jsonl) -> tuple[Path, Path]:
    arith = write_jsonl([{"problem": f"What is {i} + {i}?", "answer": 2 * i} for i in range(40)], "arith.jsonl")
    alg = write_jsonl([{"q": f"Solve x - {i} = 0.", "a": i} for i in range(40)], "algebra.jsonl")
    return arith, alg


def test_a_mixture_draws_by_weight_from_one_seeded_stream(two_sources: tuple[Path, Path]) -> None:
    arith, alg = two_sources
    sources = [
        {"path": str(arith), "weight": 3.0},
        {"path": str(alg), "name": "alg", "problem_field": "q", "answer_field": "a", "eval_fraction": 0.25},
    ]
    task = math_task(sources=sources, eval_size=4)
    draws = [p.info["source"] for p in itertools.islice(task.train_stream(7), 4000)]
    share = collections.Counter(draws)["arith"] / len(draws)
    assert share == pytest.approx(0.75, abs=0.02)  # weights 3 : 1
    again = math_task(sources=sources, eval_size=4)
    assert [p.prompt for p in itertools.islice(again.train_stream(7), 200)] == [
        p.prompt for p in itertools.islice(task.train_stream(7), 200)
    ]
    assert [p.prompt for p in itertools.islice(task.train_stream(8), 200)] != [
        p.prompt for p in itertools.islice(task.train_stream(7), 200)
    ]


def test_each_source_keeps_its_own_held_out_set(two_sources: tuple[Path, Path]) -> None:
    arith, alg = two_sources
    sources = [
        {"path": str(arith)},
        {"path": str(alg), "problem_field": "q", "answer_field": "a", "eval_fraction": 0.25},
    ]
    task = math_task(sources=sources, eval_size=4)
    by_source = collections.Counter(p.info["source"] for p in task.held_out_problems)
    assert by_source == {"arith": 4, "algebra": 10}  # 10% and 25% of 40
    assert [p.info["source"] for p in task.eval_set()] == ["arith"] * 4 + ["algebra"] * 4  # eval_size per source
    held = {p.prompt for p in task.held_out_problems}
    assert held.isdisjoint(p.prompt for p in itertools.islice(task.train_stream(0), 2000))
    alone = math_task(path=str(arith))  # a source's split does not depend on the other sources
    assert [p for p in task.held_out_problems if p.info["source"] == "arith"] == alone.held_out_problems


def test_a_prompt_held_out_by_one_source_is_never_trained_on_from_another(write_jsonl) -> None:
    shared = [{"problem": f"What is {i} + 1?", "answer": i + 1} for i in range(20)]
    a = write_jsonl(shared, "a.jsonl")
    b = write_jsonl(shared, "b.jsonl")
    task = math_task(sources=[{"path": str(a), "eval_fraction": 0.5}, {"path": str(b), "eval_fraction": 0.1}])
    held = {p.prompt for p in task.held_out_problems}
    assert held.isdisjoint(p.prompt for p in task.train_problems)


def test_mixture_config_errors() -> None:
    with pytest.raises(ValueError, match=r"set task\.path \(one source\) or task\.sources"):
        MathTaskConfig()
    with pytest.raises(ValueError, match=r"with task\.sources, set \['eval_fraction'\] inside each source"):
        MathTaskConfig(sources=[{"path": "a.jsonl"}], eval_fraction=0.3)
    with pytest.raises(ValueError, match="source names must be distinct"):
        MathTaskConfig(sources=[{"path": "a.jsonl", "name": "x"}, {"path": "b.jsonl", "name": "x"}])
    with pytest.raises(ValueError, match="set eval_path or eval_split, not both"):
        MathTaskConfig(path="a.jsonl", eval_path="b.jsonl", eval_split="test")
