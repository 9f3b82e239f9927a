"""The math task: reading files, errors that name the problem, math-verify rewards and counters, the split."""

from __future__ import annotations

import itertools
import json
import threading
from pathlib import Path

import pytest

from heterorl.tasks import Problem, make_task
from heterorl.tasks.math import MathTask

from ._configs import MathTaskConfig

N_SMALL = 40  # problems in tests/data/math_small.jsonl


def math_task(path: Path, **kw) -> MathTask:
    task = make_task(MathTaskConfig(path=str(path), **kw))
    assert isinstance(task, MathTask)
    return task


@pytest.fixture(scope="module")
def task(math_small: Path) -> MathTask:
    return math_task(math_small, eval_fraction=0.25, eval_size=8)


# --- reading
def test_reads_jsonl_with_the_default_template(task: MathTask) -> None:
    assert task.max_problems == N_SMALL
    assert (len(task.train_problems), len(task.held_out_problems)) == (30, 10)
    p = next(p for p in task.train_problems + task.held_out_problems if p.answer == "115")
    assert p.prompt.startswith("A baker makes 14 loaves")
    assert p.prompt.endswith("put your final answer within \\boxed{}.")
    assert p.info["record"]["answer"] == "115"


def test_reads_parquet_like_jsonl(tmp_path: Path, math_small: Path) -> None:
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    records = [json.loads(line) for line in math_small.read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "math.parquet")
    from_parquet = math_task(tmp_path / "math.parquet", eval_fraction=0.25)
    from_jsonl = math_task(math_small, eval_fraction=0.25)
    assert from_parquet.train_problems == from_jsonl.train_problems
    assert from_parquet.eval_set() == from_jsonl.eval_set()


def test_custom_field_names_template_and_numeric_answers(write_jsonl) -> None:
    path = write_jsonl([{"q": f"What is {i} + {i}?", "sol": 2 * i} for i in range(10)])
    task = math_task(path, problem_field="q", answer_field="sol", prompt_template="Q: {problem}\nA: {}")
    p = task.train_problems[0]
    assert p.prompt.startswith("Q: What is ")
    assert p.prompt.endswith("\nA: {}")  # other braces stay literal
    assert p.answer == str(p.info["record"]["sol"])


# --- errors
def test_missing_file_names_the_path_and_the_field(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"task\.path: data file not found: .*nope\.jsonl"):
        math_task(tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError, match=r"task\.eval_path: .*missing\.jsonl"):
        math_task(Path(__file__).parents[1] / "data" / "math_small.jsonl", eval_path=str(tmp_path / "missing.jsonl"))


def test_missing_field_names_it_the_file_and_the_fields_present(write_jsonl) -> None:
    path = write_jsonl([{"question": "1+1?", "answer": "2"}])
    fields = r"has no field 'problem' \(set by task\.problem_field\); its fields are \['answer', 'question'\]"
    with pytest.raises(ValueError, match=fields):
        math_task(path)
    with pytest.raises(ValueError, match=r"data\.jsonl: record 0 has no field 'solution'"):
        math_task(path, problem_field="question", answer_field="solution")


def test_empty_file_unknown_suffix_bad_json_and_empty_answer(tmp_path: Path, write_jsonl) -> None:
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match=r"task\.path: .*empty\.jsonl holds no records"):
        math_task(tmp_path / "empty.jsonl")
    (tmp_path / "data.xlsx").write_text("problem,answer\n")
    with pytest.raises(ValueError, match=r"suffix '\.xlsx'; supported: \.jsonl, \.json, \.csv, \.parquet"):
        math_task(tmp_path / "data.xlsx")
    (tmp_path / "bad.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n{"problem": \n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: not valid JSON"):
        math_task(tmp_path / "bad.jsonl")
    with pytest.raises(ValueError, match=r"record 1 field 'answer' is empty"):
        math_task(write_jsonl([{"problem": "a", "answer": "1"}, {"problem": "b", "answer": " "}]))
    with pytest.raises(ValueError, match=r"repeats a problem with answer '3' != '2'"):
        math_task(write_jsonl([{"problem": "1+1", "answer": "2"}, {"problem": "1+1", "answer": "3"}]))


def test_config_rejects_a_template_without_the_problem() -> None:
    with pytest.raises(ValueError, match="prompt_template must contain"):
        MathTaskConfig(path="x.jsonl", prompt_template="Solve it.")


# --- rewards
@pytest.mark.parametrize(
    ("answer", "completion"),
    [
        ("1/2", "So the answer is \\boxed{0.5}."),
        ("0.5", "\\boxed{\\frac{1}{2}}"),
        ("\\frac{1}{2}", "We get $\\frac{2}{4}$, i.e. \\boxed{1/2}"),
        ("-8", "15 - 23 = \\boxed{-8}"),
        ("12", "first 3, then 7, finally 12"),  # no box: the last expression
    ],
)
def test_equivalent_answers_score_one(task: MathTask, answer: str, completion: str) -> None:
    assert task.score(Problem("p", answer), completion) == 1.0


@pytest.mark.parametrize("completion", ["\\boxed{1/3}", "\\boxed{2}", "it is 0.51", "\\boxed{-1/2}"])
def test_wrong_answers_score_zero(task: MathTask, completion: str) -> None:
    assert task.score(Problem("p", "1/2"), completion) == 0.0


def test_an_unparsable_completion_scores_zero_and_is_counted(math_small: Path) -> None:
    task = math_task(math_small)
    assert task.score(Problem("p", "7"), "I do not know.") == 0.0
    assert task.score(Problem("p", "7"), "\\boxed{7}") == 1.0
    assert task.score(Problem("p", "7"), "\\boxed{6}") == 0.0
    assert task.stats() == {"checked": 3, "correct": 1, "unparsable": 1, "timeouts": 0}


def test_every_reference_answer_scores_one_when_boxed(task: MathTask) -> None:
    for p in task.train_problems + task.held_out_problems:
        assert task.score(p, f"... so the answer is \\boxed{{{p.answer}}}") == 1.0, p


def test_a_check_over_the_deadline_scores_zero_and_is_counted(math_small: Path, monkeypatch) -> None:
    task = math_task(math_small, timeout_s=0.05)
    monkeypatch.setattr(task.grader, "_check", lambda answer, completion: _spin())
    assert task.score(Problem("p", "7"), "\\boxed{7}") == 0.0
    assert task.stats()["timeouts"] == 1


def _spin() -> bool:
    while True:
        pass


def test_scoring_works_from_worker_threads(task: MathTask) -> None:
    results: list[float] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            results.extend(task.score(Problem("p", "3/4"), c) for c in ["\\boxed{0.75}", "\\boxed{3/5}"])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert sorted(results) == [0.0] * 4 + [1.0] * 4


# --- split
def test_held_out_split_is_disjoint_deterministic_and_capped_by_eval_size(task: MathTask, math_small: Path) -> None:
    held_out = {p.prompt for p in task.held_out_problems}
    assert held_out.isdisjoint(p.prompt for p in task.train_problems)
    assert held_out.isdisjoint(p.prompt for p in itertools.islice(task.train_stream(0), 500))
    assert len(task.eval_set()) == 8  # eval_size caps the evaluation, not the split
    again = math_task(math_small, eval_fraction=0.25, eval_size=8)
    assert again.eval_set() == task.eval_set()
    assert [p.prompt for p in itertools.islice(again.train_stream(3), 50)] == [
        p.prompt for p in itertools.islice(task.train_stream(3), 50)
    ]


def test_split_does_not_depend_on_file_order(tmp_path: Path, math_small: Path, task: MathTask) -> None:
    lines = math_small.read_text().splitlines()
    (tmp_path / "reversed.jsonl").write_text("\n".join(reversed(lines)) + "\n")
    shuffled = math_task(tmp_path / "reversed.jsonl", eval_fraction=0.25, eval_size=8)
    assert shuffled.eval_set() == task.eval_set()


def test_a_separate_eval_file_is_removed_from_training(write_jsonl, math_small: Path) -> None:
    records = [json.loads(line) for line in math_small.read_text().splitlines()]
    eval_path = write_jsonl(records[:5], "eval.jsonl")
    task = math_task(math_small, eval_path=str(eval_path))
    assert [p.answer for p in task.eval_set()] == [r["answer"] for r in records[:5]]
    assert len(task.train_problems) == N_SMALL - 5
    assert {p.prompt for p in task.eval_set()}.isdisjoint(p.prompt for p in task.train_problems)
