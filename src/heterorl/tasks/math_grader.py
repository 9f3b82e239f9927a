"""Math answer equivalence with math-verify, bounded in time, safe in any thread, with counters.

Reference answers are parsed as the content of `\\boxed{...}` (so `1/2`, `0.5`, `\\frac{1}{2}` and `$\\frac12$` all
work); completions are parsed for a boxed answer first, then the last LaTeX or plain expression. Equivalence is
math-verify's `verify` (numeric, symbolic, sets, intervals, equations).

math-verify's own timeouts use `signal.alarm`, which fails outside the main thread and cancels outer SIGALRM
timers, so they are switched off and each check (parse + compare) runs under `call_with_deadline` instead.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from heterorl.tasks.deadline import DeadlineExceeded, call_with_deadline

STAT_KEYS = ("checked", "correct", "unparsable", "timeouts")


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns that its timeouts are off; here they are replaced by `call_with_deadline`."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


def _import_math_verify() -> Any:
    try:
        import math_verify
    except ImportError as exc:
        raise ImportError("the math task needs math-verify: pip install math-verify") from exc
    for name in ("math_verify.parser", "math_verify.grader"):
        log = logging.getLogger(name)
        if not any(isinstance(f, _DropTimeoutDisabledWarning) for f in log.filters):
            log.addFilter(_DropTimeoutDisabledWarning())
    return math_verify


class MathGrader:
    """`grade(answer, completion)` -> 1.0 if equivalent else 0.0; `stats` counts outcomes (thread-safe).

    stats: checked (every call), correct, unparsable (no answer could be extracted from the completion: reward 0),
    timeouts (the check ran past `timeout_s`: reward 0).
    """

    def __init__(self, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        mv = _import_math_verify()
        self._parse, self._verify = mv.parse, mv.verify
        self._gold_config = [mv.LatexExtractionConfig(), mv.ExprExtractionConfig()]
        self._pred_config = [mv.LatexExtractionConfig(boxed_match_priority=0), mv.ExprExtractionConfig()]
        self.timeout_s = timeout_s
        self.stats: dict[str, int] = dict.fromkeys(STAT_KEYS, 0)
        self._lock = threading.Lock()
        self._gold: dict[str, list[Any]] = {}  # answer text -> parsed (sympy objects are immutable: shareable)

    def _count(self, key: str) -> None:
        with self._lock:
            self.stats[key] += 1

    def parse_gold(self, answer: str) -> list[Any]:
        """The parsed reference answer (cached); a reference math-verify cannot read is a data error."""
        gold = self._gold.get(answer)
        if gold is None:
            gold = self._parse(f"\\boxed{{{answer}}}", self._gold_config, parsing_timeout=None)
            if not gold:
                raise ValueError(f"math-verify cannot parse the reference answer {answer!r}")
            self._gold[answer] = gold
        return gold

    def _check(self, answer: str, completion: str) -> bool | None:
        """True/False for (in)equivalent, None when nothing could be extracted from the completion."""
        gold = self.parse_gold(answer)
        pred = self._parse(completion, self._pred_config, parsing_timeout=None)
        if not pred:
            return None
        return bool(self._verify(gold, pred, timeout_seconds=None))

    def grade(self, answer: str, completion: str) -> float:
        self._count("checked")
        try:
            ok = call_with_deadline(lambda: self._check(answer, completion), self.timeout_s)
        except DeadlineExceeded:
            self._count("timeouts")
            return 0.0
        if ok is None:
            self._count("unparsable")
            return 0.0
        if ok:
            self._count("correct")
        return 1.0 if ok else 0.0
