"""The reasoning-gym task: the dataset's own scorer as reward, answer extraction, split and errors."""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("reasoning_gym")

from heterorl.tasks import Problem, make_task
from heterorl.tasks.gym import GymTask, extract_answer

from ._configs import GymTaskConfig


def gym_task(**kw) -> GymTask:
    task = make_task(GymTaskConfig(**{"dataset": "basic_arithmetic", "size": 40, "eval_size": 4, **kw}))
    assert isinstance(task, GymTask)
    return task


@pytest.mark.parametrize("dataset", ["basic_arithmetic", "leg_counting", "chain_sum"])
def test_reference_answers_score_one_and_wrong_ones_less(dataset: str) -> None:
    task = gym_task(dataset=dataset)
    for p in task.train_problems[:10] + task.eval_set():
        assert task.score(p, p.answer) == 1.0
        assert task.score(p, f"  {p.answer}\n") == 1.0  # the completion is stripped
        assert task.score(p, p.answer + "1") < 1.0
        assert task.score(p, "") < 1.0


def test_dataset_options_pass_through() -> None:
    task = gym_task(dataset="chain_sum", dataset_options={"min_terms": 5, "max_terms": 5})
    assert all(p.info["entry"]["metadata"]["num_terms"] == 5 for p in task.train_problems)


def test_answer_tag_extraction_and_the_unparsable_count() -> None:
    task = gym_task(answer_tag="answer")
    p = task.train_problems[0]
    assert task.score(p, f"think... <answer>0</answer> no, <answer> {p.answer} </answer>") == 1.0
    assert task.score(p, p.answer) == 0.0  # no tag
    assert task.stats() == {"checked": 2, "correct": 1, "unparsable": 1, "timeouts": 0}
    assert extract_answer(" 12 \n", None) == "12"
    assert extract_answer("<answer>1\n2</answer>", "answer") == "1\n2"


def test_split_is_disjoint_and_independent_of_the_run_seed() -> None:
    task, again = gym_task(eval_fraction=0.25), gym_task(eval_fraction=0.25)
    assert len(task.held_out_problems) == 10
    assert again.eval_set() == task.eval_set()
    held_out = {p.prompt for p in task.held_out_problems}
    assert held_out.isdisjoint(p.prompt for p in itertools.islice(task.train_stream(1), 200))
    assert gym_task(seed=1).train_problems != task.train_problems  # task.seed changes the data


def test_template_wraps_the_question() -> None:
    task = gym_task(prompt_template="Question: {question}\nAnswer:")
    p: Problem = task.train_problems[0]
    assert p.prompt == f"Question: {p.info['entry']['question']}\nAnswer:"


def test_errors_name_the_config_field() -> None:
    with pytest.raises(ValueError, match=r"task\.dataset: unknown reasoning-gym dataset 'no_such'.*chain_sum"):
        gym_task(dataset="no_such")
    with pytest.raises(ValueError, match=r"task\.dataset_options: invalid for 'chain_sum'.*bogus"):
        gym_task(dataset="chain_sum", dataset_options={"bogus": 1})
    with pytest.raises(ValueError, match=r"task\.dataset_options: invalid for 'chain_sum'.*max_terms"):
        gym_task(dataset="chain_sum", dataset_options={"min_terms": 5, "max_terms": 2})
    with pytest.raises(ValueError, match=r"must not set \['seed'\]; use task\.seed"):
        GymTaskConfig(dataset="chain_sum", dataset_options={"seed": 3})
