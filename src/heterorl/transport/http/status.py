"""HTTP status codes of the learner's answers: each outcome and refusal reason of `loop.intake` as HTTP says it."""

from __future__ import annotations

from heterorl.loop.intake import REASONS

OUTCOME_STATUS = {
    "accepted": 200,
    "duplicate": 200,
    "filtered": 200,
    "busy": 503,
    "finished": 410,
}
REJECTION_STATUS = {
    "unauthorized": 401,
    "unknown_sampler": 403,
    "too_large": 413,
    "corrupt": 400,
    "malformed": 400,
    "too_long": 422,
    "out_of_vocab": 422,
    "bad_logprobs": 422,
    "future_version": 422,
    "group_size": 422,
    "prompt_mismatch": 422,
    "bad_rewards": 422,
    "invalid": 422,
    "bad_http": 400,
    "timeout": 408,
    "too_many_connections": 503,
    "disk_full": 507,
    "id_conflict": 409,
    "internal_error": 500,
    "not_regular": 400,
    "config_mismatch": 409,
}
assert set(REJECTION_STATUS) == set(REASONS), "every refusal reason has its HTTP status"


def status_of(outcome: str) -> int:
    """The HTTP status that says `outcome` (an unknown name is the learner's bug: 500)."""
    return OUTCOME_STATUS.get(outcome) or REJECTION_STATUS.get(outcome, 500)


def upload_status(outcomes: list[str]) -> int:
    """One status for an upload the learner processed: 507 when a group could not be stored (the client sends
    the same upload again later: what was kept answers `duplicate`), else the status of its first refused group (a
    4xx, so a bad group is answered as it would be alone), else 410 when the run is finished, else 200 (a group
    the full queue could not take is `busy` in its verdict: the session sends it again)."""
    if "disk_full" in outcomes:
        return status_of("disk_full")
    for outcome in outcomes:
        status = status_of(outcome)
        if 400 <= status < 500 and outcome != "finished":
            return status
    return 410 if "finished" in outcomes else 200
