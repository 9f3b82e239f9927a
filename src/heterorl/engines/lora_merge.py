"""Sampler-side LoRA merging for engines that run a plain model (vLLM) when the learner publishes adapters only.

With `model.lora.publish: adapter` a sampler receives the adapter tensors under PEFT names
(`base_model.model.<module>.lora_A.default.weight` [r, in] and `...lora_B.default.weight` [out, r]). The base
weights never change, so the merger keeps the base weights of the adapted modules (read once from the base
checkpoint) and turns each adapter update into W + (alpha / r) * B @ A under the plain names: a partial update
of exactly the adapted weights (PEFT's merge, computed in fp32).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import safe_open

_PREFIX = "base_model.model."
_A, _B = ".lora_A.", ".lora_B."


def checkpoint_files(path: str | Path) -> list[Path]:
    """The safetensors files of a transformers checkpoint directory (single file or sharded index)."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / s for s in shards]
    single = path / "model.safetensors"
    if not single.is_file():
        raise FileNotFoundError(f"{path} has no model.safetensors (nor a sharded index)")
    return [single]


def split_adapter_name(name: str) -> tuple[str, str]:
    """`base_model.model.X.lora_A.default.weight` -> (`X`, `A`); ValueError for any other name."""
    if not name.startswith(_PREFIX) or not name.endswith(".weight"):
        raise ValueError(f"{name!r} is not a PEFT LoRA adapter tensor name")
    body = name.removeprefix(_PREFIX)
    for marker, which in ((_A, "A"), (_B, "B")):
        module, sep, rest = body.partition(marker)
        if sep and rest.count(".") == 1:  # `<adapter name>.weight`
            return module, which
    raise ValueError(f"{name!r} is not a PEFT LoRA adapter tensor name")


class AdapterMerger:
    """Turns published adapter tensors into merged plain weights of the adapted modules."""

    def __init__(self, base_path: str | Path, target_modules: list[str], rank: int, alpha: float) -> None:
        self.rank = rank
        self.scale = alpha / rank
        self.base: dict[str, torch.Tensor] = {}  # plain module name -> base weight [out, in], fp32
        for file in checkpoint_files(base_path):
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    module, _, leaf = key.rpartition(".")
                    if leaf == "weight" and module.rpartition(".")[2] in target_modules:
                        self.base[module] = f.get_tensor(key).float()
        if not self.base:
            raise ValueError(f"the base checkpoint {base_path} has no modules named {target_modules}")

    @property
    def modules(self) -> list[str]:
        return sorted(self.base)

    def merge(self, adapter: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Merged weights `<module>.weight` (fp32) of every adapted module; ValueError on an incomplete adapter."""
        parts: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in adapter.items():
            module, which = split_adapter_name(name)
            if module not in self.base:
                raise ValueError(f"adapter tensor {name!r} targets {module!r}, which the base model does not adapt")
            parts.setdefault(module, {})[which] = tensor
        missing = [m for m in self.base if set(parts.get(m, {})) != {"A", "B"}]
        if missing:
            raise ValueError(f"the adapter lacks lora_A or lora_B for {len(missing)} modules, e.g. {missing[:2]}")
        merged = {}
        for module, ab in parts.items():
            A, B, W = ab["A"].float(), ab["B"].float(), self.base[module]
            if A.shape != (self.rank, W.shape[1]) or B.shape != (W.shape[0], self.rank):
                raise ValueError(
                    f"{module}: lora_A {tuple(A.shape)} / lora_B {tuple(B.shape)} do not fit the base weight "
                    f"{tuple(W.shape)} at rank {self.rank}"
                )
            merged[f"{module}.weight"] = W + self.scale * (B @ A)
        return merged
