"""LoRA adapters (PEFT) on the learner, and the two ways to publish them.

- `publish: adapter` sends only the adapter tensors (what users ask for: a few MB instead of the model);
  samplers wrap the same base model with the same adapter config and load them.
- `publish: merged` sends W + (alpha / r) * B @ A under the plain model's names; samplers run a plain model.
The base weights never change, so with adapters the samplers' base is fixed at the checkpoint they loaded.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from heterorl.config import LoraConfig

_PREFIX = "base_model.model."


def apply_lora(model: PreTrainedModel, cfg: LoraConfig) -> torch.nn.Module:
    """Wrap `model` with freshly initialised adapters (B = 0, so the wrapped model starts identical)."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    peft_cfg = PeftLoraConfig(
        r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=list(cfg.target_modules)
    )
    return get_peft_model(model, peft_cfg)


def is_lora(model: torch.nn.Module) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainable adapter tensors by their PEFT names (no copy)."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def plain_name(peft_name: str) -> str:
    """`base_model.model.X.base_layer.weight` -> `X.weight`: the name in the unwrapped model."""
    name = peft_name.removeprefix(_PREFIX)
    return name.replace(".base_layer.", ".")


@torch.no_grad()
def merged_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every weight of the unwrapped model with the adapters folded in, under the plain model's names."""
    from peft.tuners.lora import LoraLayer

    deltas = {
        f"{name}.base_layer.weight": module.get_delta_weight(module.active_adapters[0])
        for name, module in model.named_modules()
        if isinstance(module, LoraLayer)
    }
    merged = {}
    for name, p in model.named_parameters():
        if p.requires_grad:  # an adapter tensor: folded into its base weight
            continue
        merged[plain_name(name)] = p + deltas[name] if name in deltas else p
    return merged
