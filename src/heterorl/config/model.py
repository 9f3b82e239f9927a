"""The policy network: a local checkpoint or an architecture built in code, dtype, device, LoRA."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from heterorl.config.base import Strict


class LoraConfig(Strict):
    """LoRA adapters (PEFT) trained by the learner instead of the full weights."""

    rank: int = Field(8, ge=1, le=1024, description="Adapter rank r.")
    alpha: float = Field(16.0, gt=0.0, le=65_536.0, description="Scale numerator: the update is (alpha / r) * B @ A.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the adapter input.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        max_length=1024,
        description="Module names that get adapters.",
    )
    publish: Literal["adapter", "merged"] = Field(
        "adapter", description="Send only the adapter tensors, or the merged full weights, to samplers."
    )


class ModelConfig(Strict):
    """The policy network: a local transformers checkpoint, or a small architecture built in code."""

    path: str | None = Field(None, description="Local transformers checkpoint directory; None builds `arch`.")
    arch: Literal["qwen3", "llama"] = Field("qwen3", description="Architecture family when building in code.")
    hidden_size: int = Field(128, ge=8, le=8192, description="Width of the residual stream.")
    num_layers: int = Field(2, ge=1, le=128, description="Number of transformer blocks.")
    num_heads: int = Field(4, ge=1, le=128, description="Attention heads.")
    num_kv_heads: int = Field(2, ge=1, le=128, description="Key/value heads (grouped-query attention).")
    intermediate_size: int = Field(256, ge=8, le=131_072, description="MLP hidden width.")
    max_positions: int = Field(64, ge=8, le=2**21, description="Maximum sequence length (prompt + completion).")
    device: Literal["auto", "cpu", "cuda"] = Field("cpu", description="Where to run; auto picks CUDA if present.")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Samplers' compute dtype; the learner always keeps fp32 master weights."
    )
    lora: LoraConfig | None = Field(None, description="Train LoRA adapters instead of every weight.")

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} must be divisible by num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} must be divisible by num_kv_heads {self.num_kv_heads}")
        return self
