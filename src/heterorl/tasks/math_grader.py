"""Math answer equivalence with math-verify, bounded in time, safe in any thread, with counters.

Reference answers are parsed as the content of `\\boxed{...}` (so `1/2`, `0.5`, `\\frac{1}{2}` and `$\\frac12$` all
work); completions are parsed for a boxed answer first, then the last LaTeX or plain expression. Equivalence is
math-verify's `verify` (numeric, symbolic, sets, intervals, equations).

math-verify's own timeouts use `signal.alarm`, which fails outside the main thread and cancels outer SIGALRM
timers, so they are switched off and each check (parse + compare) runs under `call_with_deadline` instead.
"""

from __future__ import annotations

import logging
from typing import Any

from heterorl.errors import DataError, MissingDependencyError
from heterorl.tasks.base import Check
from heterorl.tasks.deadline import DeadlineExceeded, call_with_deadline


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns that its timeouts are off; here they are replaced by `call_with_deadline`."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


def _import_math_verify() -> Any:
    try:
        import math_verify
    except ImportError as exc:
        raise MissingDependencyError("the math task needs math-verify: pip install math-verify") from exc
    for name in ("math_verify.parser", "math_verify.grader"):
        log = logging.getLogger(name)
        if not any(isinstance(f, _DropTimeoutDisabledWarning) for f in log.filters):
            log.addFilter(_DropTimeoutDisabledWarning())
    return math_verify


class MathGrader:
    """`check(answer, completion)` -> a `Check`: score 1.0 if equivalent else 0.0, whether an answer could be
    extracted, whether the check ran past `timeout_s`, and the extracted answer in sympy's canonical text
    (`0.5`, `\\frac{1}{2}` and `2/4` all read `1/2`). Safe to call from any thread."""

    def __init__(self, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        mv = _import_math_verify()
        self._parse, self._verify = mv.parse, mv.verify
        self._gold_config = [mv.LatexExtractionConfig(), mv.ExprExtractionConfig()]
        self._pred_config = [mv.LatexExtractionConfig(boxed_match_priority=0), mv.ExprExtractionConfig()]
        self.timeout_s = timeout_s
        self._gold: dict[str, list[Any]] = {}  # answer text -> parsed (sympy objects are immutable: shareable)

    def parse_gold(self, answer: str) -> list[Any]:
        """The parsed reference answer (cached); a reference math-verify cannot read is a data error."""
        gold = self._gold.get(answer)
        if gold is None:
            gold = self._parse(f"\\boxed{{{answer}}}", self._gold_config, parsing_timeout=None)
            if not gold:
                raise DataError(f"math-verify cannot parse the reference answer {answer!r}")
            self._gold[answer] = gold
        return gold

    def _check(self, answer: str, completion: str) -> Check:
        gold = self.parse_gold(answer)
        pred = self._parse(completion, self._pred_config, parsing_timeout=None)
        if not pred:
            return Check(0.0, parsed=False)
        ok = bool(self._verify(gold, pred, timeout_seconds=None))
        return Check(1.0 if ok else 0.0, answer=str(pred[0]))

    def check(self, answer: str, completion: str) -> Check:
        try:
            return call_with_deadline(lambda: self._check(answer, completion), self.timeout_s)
        except DeadlineExceeded:
            return Check(0.0, timed_out=True)
