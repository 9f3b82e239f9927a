"""Tasks: where prompts come from and how completions are rewarded."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from heterorl.config.base import Strict

REWARD_HELP = (
    "Custom reward 'module:function' replacing the task's verifier as training reward; called as "
    "f(prompt, completion, answer, **info) -> float. None uses the verifier."
)
REWARD_PATTERN = r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$"  # module.path:function
MATH_PROMPT_TEMPLATE = "{problem}\n\nPlease reason step by step, and put your final answer within \\boxed{}."


class _TaskBase(Strict):
    eval_size: int = Field(256, ge=1, le=100_000, description="Held-out prompts for greedy evaluation.")
    chat_template: bool = Field(False, description="Wrap each prompt as a user turn with the tokenizer's template.")
    reward: str | None = Field(None, pattern=REWARD_PATTERN, description=REWARD_HELP)


class AdditionTaskConfig(_TaskBase):
    """`a+b=` -> the decimal sum; a and b have up to `digits` digits."""

    name: Literal["addition"] = "addition"
    digits: int = Field(2, ge=1, le=12, description="Maximum number of digits of each operand.")


class ReversalTaskConfig(_TaskBase):
    """`s=` -> s reversed, s a string over `alphabet` (the Delightful PG papers' task)."""

    name: Literal["reversal"] = "reversal"
    min_length: int = Field(4, ge=1, le=48, description="Shortest string to reverse.")
    max_length: int = Field(8, ge=1, le=48, description="Longest string to reverse.")
    alphabet: str = Field("abcd", min_length=2, max_length=26, description="Symbols (lower-case letters).")

    @model_validator(mode="after")
    def _lengths(self) -> ReversalTaskConfig:
        if self.min_length > self.max_length:
            raise ValueError(f"min_length {self.min_length} > max_length {self.max_length}")
        if not (self.alphabet.isalpha() and self.alphabet.islower() and len(set(self.alphabet)) == len(self.alphabet)):
            raise ValueError("alphabet must be distinct lower-case letters")
        return self


class MathTaskConfig(_TaskBase):
    """Problems with reference answers from a JSONL or parquet file; reward 1 when math-verify finds them equal."""

    name: Literal["math"] = "math"
    path: str = Field(..., min_length=1, description="JSONL or parquet file of problems.")
    eval_path: str | None = Field(
        None, description="Separate file of held-out problems (its prompts are removed from training)."
    )
    eval_fraction: float = Field(
        0.1, gt=0.0, lt=1.0, description="Share of `path` held out, chosen by prompt hash; unused with eval_path."
    )
    problem_field: str = Field("problem", min_length=1, description="Record field holding the problem text.")
    answer_field: str = Field("answer", min_length=1, description="Record field holding the reference answer.")
    prompt_template: str = Field(
        MATH_PROMPT_TEMPLATE, description="Prompt text; `{problem}` is replaced, other braces are literal."
    )
    timeout_s: float = Field(
        5.0, gt=0.0, le=600.0, description="Bound on one check (parse + compare); a check over it scores 0."
    )

    @model_validator(mode="after")
    def _template(self) -> MathTaskConfig:
        if "{problem}" not in self.prompt_template:
            raise ValueError("prompt_template must contain {problem}")
        return self


class GymTaskConfig(_TaskBase):
    """A procedural reasoning-gym dataset, rewarded by the dataset's own `score_answer`."""

    name: Literal["gym"] = "gym"
    dataset: str = Field(..., min_length=1, description="reasoning-gym dataset, e.g. basic_arithmetic, chain_sum.")
    dataset_options: dict[str, Any] = Field(
        default_factory=dict, description="Options of that dataset's config (e.g. min_terms, max_terms)."
    )
    size: int = Field(1000, ge=2, le=10_000_000, description="Entries generated (training + held-out).")
    seed: int = Field(0, ge=0, description="Seed of the generated entries (fixed data, not the run seed).")
    eval_fraction: float = Field(0.1, gt=0.0, lt=1.0, description="Share of entries held out, by prompt hash.")
    prompt_template: str = Field("{question}", description="Prompt text; `{question}` is replaced by the question.")
    answer_tag: str | None = Field(
        None,
        pattern=r"^\w+$",
        description="Score the text inside the last <tag>...</tag> (none: reward 0); None scores the whole "
        "completion, stripped.",
    )

    @model_validator(mode="after")
    def _template_and_options(self) -> GymTaskConfig:
        if "{question}" not in self.prompt_template:
            raise ValueError("prompt_template must contain {question}")
        clash = {"seed", "size"} & set(self.dataset_options)
        if clash:
            raise ValueError(f"dataset_options must not set {sorted(clash)}; use task.seed / task.size")
        return self


TaskConfig = Annotated[
    AdditionTaskConfig | ReversalTaskConfig | MathTaskConfig | GymTaskConfig, Field(discriminator="name")
]
