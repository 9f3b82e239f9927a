"""Tasks: where prompts come from and how completions are rewarded."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from heterorl.config.base import MAX_SEED, Strict

REWARD_HELP = (
    "Custom reward 'module:function', or a list of them, replacing the task's verifier as training reward: "
    "f(prompt, completion, answer, **info) -> float per completion, or TRL's batched "
    "f(prompts, completions, **kwargs) -> list[float] (a function with a `completions` parameter). None uses the "
    "verifier (held-out evaluation always does)."
)
REWARD_PATTERN = r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$"  # module.path:function
MAX_REWARD_FUNCTIONS = 64
MATH_PROMPT_TEMPLATE = "{problem}\n\nPlease reason step by step, and put your final answer within \\boxed{}."


class _TaskBase(Strict):
    eval_size: int = Field(256, ge=1, le=100_000, description="Held-out prompts for greedy evaluation.")
    chat_template: bool = Field(False, description="Wrap each prompt as a user turn with the tokenizer's template.")
    reward: str | list[str] | None = Field(None, description=REWARD_HELP)
    reward_weights: list[Annotated[float, Field(ge=-1e6, le=1e6)]] | None = Field(
        None,
        description="Weight w_i of each function of `reward` (training reward sum_i w_i r_i); None: 1 each.",
    )

    @field_validator("reward", mode="before")
    @classmethod
    def _reward_paths(cls, value: Any) -> Any:
        """One message for a wrong reward, whichever form (a path or a list of paths) was meant."""
        if value is None:
            return None
        items = value if isinstance(value, list) else [value]
        if not 1 <= len(items) <= MAX_REWARD_FUNCTIONS:
            raise ValueError(f"a list of 1 to {MAX_REWARD_FUNCTIONS} reward functions, got {len(items)}")
        for item in items:
            if not isinstance(item, str) or not re.match(REWARD_PATTERN, item):
                raise ValueError(f"{item!r} is not module:function (or a list of them)")
        return value

    @model_validator(mode="after")
    def _reward_functions(self) -> _TaskBase:
        specs = self.reward_specs
        if self.reward_weights is not None and len(self.reward_weights) != len(specs):
            raise ValueError(f"reward_weights has {len(self.reward_weights)} weights for {len(specs)} reward functions")
        return self

    @property
    def reward_specs(self) -> list[str]:
        """The reward functions as a list (empty: the verifier is the reward)."""
        if self.reward is None:
            return []
        return [self.reward] if isinstance(self.reward, str) else list(self.reward)


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


HUB_PREFIX = "hf:"  # task.path `hf:openai/gsm8k`: a dataset on the Hugging Face Hub, read with `datasets`
SOURCE_FIELDS = ("path", "split", "subset", "eval_path", "eval_split", "eval_fraction", "problem_field", "answer_field")


class _MathSource(Strict):
    """Where one set of problems comes from and how its held-out part is chosen."""

    split: str = Field(
        "train", min_length=1, description="Split of a dataset directory or Hub dataset (files have no splits)."
    )
    subset: str | None = Field(None, min_length=1, description="Hub dataset configuration, e.g. gsm8k's `main`.")
    eval_path: str | None = Field(
        None, description="Separate source of held-out problems (its prompts are removed from training)."
    )
    eval_split: str | None = Field(
        None, min_length=1, description="Held-out problems from this split of the same dataset (e.g. `test`)."
    )
    eval_fraction: float = Field(
        0.1, gt=0.0, lt=1.0, description="Share held out, chosen by prompt hash; unused with eval_path/eval_split."
    )
    problem_field: str = Field("problem", min_length=1, description="Record field holding the problem text.")
    answer_field: str = Field("answer", min_length=1, description="Record field holding the reference answer.")

    @model_validator(mode="after")
    def _one_eval_source(self) -> _MathSource:
        if self.eval_path is not None and self.eval_split is not None:
            raise ValueError("set eval_path or eval_split, not both")
        return self


class MathSourceConfig(_MathSource):
    """One source of a mixture: its problems are drawn in proportion to `weight`, its held-out set is its own."""

    path: str = Field(
        ...,
        min_length=1,
        description="A .jsonl/.json/.parquet/.csv file, a `datasets` save_to_disk directory, or hf:<repo id>.",
    )
    name: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.-]+$", description="Name in per-source metrics; default: from the path."
    )
    weight: float = Field(1.0, gt=0.0, le=1e6, description="Relative share of training draws from this source.")


class MathTaskConfig(_TaskBase, _MathSource):
    """Problems with reference answers from files, `datasets` directories or the Hub, one source (`path`) or a
    weighted mixture (`sources`); reward 1 when math-verify finds the answers equal."""

    name: Literal["math"] = "math"
    path: str | None = Field(
        None,
        min_length=1,
        description="A .jsonl/.json/.parquet/.csv file, a `datasets` save_to_disk directory, or hf:<repo id>.",
    )
    sources: list[MathSourceConfig] = Field(
        default_factory=list,
        max_length=1000,
        description="A mixture of sources (instead of `path`), each with its own weight.",
    )
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

    @model_validator(mode="after")
    def _path_or_sources(self) -> MathTaskConfig:
        if self.path is None and not self.sources:
            raise ValueError("set task.path (one source) or task.sources (a mixture)")
        if self.sources:
            # compared with the defaults, not `model_fields_set`: a resolved config.yaml writes every field
            clash = sorted(f for f in SOURCE_FIELDS if getattr(self, f) != type(self).model_fields[f].default)
            if clash:
                raise ValueError(f"with task.sources, set {clash} inside each source, not on the task")
            names = [s.name for s in self.sources if s.name is not None]
            if len(set(names)) < len(names):
                raise ValueError(f"source names must be distinct, got {names}")
        return self

    def source_configs(self) -> list[MathSourceConfig]:
        """The sources: `sources`, or the one source the task's own fields describe."""
        if self.sources:
            return list(self.sources)
        assert self.path is not None, "checked by _path_or_sources"
        return [MathSourceConfig(**{f: getattr(self, f) for f in SOURCE_FIELDS})]


class GymTaskConfig(_TaskBase):
    """A procedural reasoning-gym dataset, rewarded by the dataset's own `score_answer`."""

    name: Literal["gym"] = "gym"
    dataset: str = Field(..., min_length=1, description="reasoning-gym dataset, e.g. basic_arithmetic, chain_sum.")
    dataset_options: dict[str, Any] = Field(
        default_factory=dict, description="Options of that dataset's config (e.g. min_terms, max_terms)."
    )
    size: int = Field(1000, ge=2, le=10_000_000, description="Entries generated (training + held-out).")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="Seed of the generated entries (fixed data, not the run seed).")
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


DEFAULT_TASK = "addition"  # RunConfig's default task


def _task_name(value: Any) -> str | None:
    """The discriminator: the `name` of a config or raw mapping; a mapping without one (`--set task.eval_size=...`
    on a config that names no task, or a dict from code) means the default task."""
    if isinstance(value, dict):
        return value.get("name", DEFAULT_TASK)
    return getattr(value, "name", None)


TaskConfig = Annotated[
    Annotated[AdditionTaskConfig, Tag("addition")]
    | Annotated[ReversalTaskConfig, Tag("reversal")]
    | Annotated[MathTaskConfig, Tag("math")]
    | Annotated[GymTaskConfig, Tag("gym")],
    Discriminator(_task_name),
]
