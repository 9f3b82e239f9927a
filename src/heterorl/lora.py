"""LoRA adapters (PEFT) on the learner, and the two ways to publish them.

- `publish: adapter` sends only the adapter tensors (what users ask for: a few MB instead of the model);
  samplers wrap the same base model with the same adapter config and load them.
- `publish: merged` sends W + (alpha / r) * B @ A under the plain model's names; samplers run a plain model.
The base weights never change, so with adapters the samplers' base is fixed at the checkpoint they loaded.

A saved adapter (`checkpoint/adapter/`) is a standard PEFT causal-LM adapter: its config records
`task_type: CAUSAL_LM` and the base model's absolute path (a relative one would only resolve from the directory
the run was started in), so `AutoPeftModelForCausalLM.from_pretrained(adapter_dir)` works from anywhere.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from transformers import PreTrainedModel

from heterorl.config import LoraConfig

_PREFIX = "base_model.model."


def base_reference(model: PreTrainedModel) -> str:
    """Where the base model came from, for the adapter's config: a local directory as an absolute path; a Hub id
    (or nothing, for a model built in code) as it is."""
    name = model.name_or_path
    return str(Path(name).resolve()) if name and Path(name).exists() else name


def apply_lora(model: PreTrainedModel, cfg: LoraConfig) -> torch.nn.Module:
    """Wrap `model` with freshly initialised adapters (B = 0, so the wrapped model starts identical)."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    peft_cfg = PeftLoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():
        # peft probes a transformers property that transformers has deprecated; nothing a user can act on
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        wrapped = get_peft_model(model, peft_cfg)
    # set afterwards: peft takes the model's own (possibly relative) name, and warns when told another
    wrapped.peft_config["default"].base_model_name_or_path = base_reference(model)
    return wrapped


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute activations in the backward pass (`learner.gradient_checkpointing`), through transformers'
    current API (`activation_checkpointing_enable`; its `gradient_checkpointing_enable` is a deprecated alias),
    falling back to the old name on transformers releases that predate it. Works on PEFT-wrapped models too."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is None:
        enable = model.gradient_checkpointing_enable
    enable()


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
