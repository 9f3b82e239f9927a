import itertools

import pytest

from heterorl.config import AdditionTaskConfig, ReversalTaskConfig
from heterorl.tasks import Problem, make_task


@pytest.fixture(params=["addition", "reversal"])
def task(request: pytest.FixtureRequest):
    cfg = AdditionTaskConfig(digits=2, eval_size=64) if request.param == "addition" else ReversalTaskConfig()
    return make_task(cfg)


def test_addition_verifier_accepts_right_and_rejects_wrong() -> None:
    task = make_task(AdditionTaskConfig(digits=2))
    p = Problem("47+85=", "132")
    assert task.score(p, "132") == 1.0
    for wrong in ["131", "0132", "132 ", "", "13", "1322"]:
        assert task.score(p, wrong) == 0.0


def test_reversal_verifier_accepts_right_and_rejects_wrong() -> None:
    task = make_task(ReversalTaskConfig(alphabet="ab"))
    p = Problem("aabab=", "babaa")
    assert task.score(p, "babaa") == 1.0
    for wrong in ["aabab", "baba", "babaab", ""]:
        assert task.score(p, wrong) == 0.0


def test_generated_problems_are_correct(task) -> None:
    for p in itertools.islice(task.train_stream(3), 200):
        body = p.prompt[:-1]
        assert p.prompt.endswith("=")
        if task.name == "addition":
            a, b = body.split("+")
            assert int(p.answer) == int(a) + int(b)
        else:
            assert p.answer == body[::-1]
        assert task.score(p, p.answer) == 1.0


def test_streams_are_seeded_and_disjoint_from_the_held_out_set(task) -> None:
    first = [p.prompt for p in itertools.islice(task.train_stream(5), 300)]
    assert first == [p.prompt for p in itertools.islice(task.train_stream(5), 300)]
    assert first != [p.prompt for p in itertools.islice(task.train_stream(6), 300)]
    held_out = {p.prompt for p in task.eval_set()}
    assert held_out.isdisjoint(first)
    assert len(held_out) == len(task.eval_set())  # distinct prompts


def test_held_out_set_is_independent_of_the_run_seed() -> None:
    a = make_task(AdditionTaskConfig(digits=2, eval_size=32)).eval_set()
    b = make_task(AdditionTaskConfig(digits=2, eval_size=32)).eval_set()
    assert a == b
    assert len(a) == 32


def test_small_problem_spaces_keep_most_problems_for_training() -> None:
    task = make_task(AdditionTaskConfig(digits=1, eval_size=1000))
    assert len(task.eval_set()) == 25  # at most a quarter of the 100 problems are held out
