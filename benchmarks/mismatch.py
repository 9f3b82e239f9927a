"""Train–inference mismatch at staleness 0: what the importance ratios and their clips see when the sampler holds
exactly the learner's current version.

    .venv/bin/python benchmarks/mismatch.py --groups 64

The learner keeps fp32 master weights; samplers receive them in the wire dtype (`weights.wire_dtype`, bf16 by
default) and compute in `model.dtype`. For each (wire dtype, sampler dtype) setting this samples `--groups` groups
at version 0 and reports, over completion tokens, the token ratio rho = pi_learner / mu_sampler (GRPO clips it at
1 +- 0.2; TIS truncates at 2), and over sequences GSPO's s_i = exp(mean_t log rho), with the share of sequences
outside GSPO's default clip range [1 - 3e-4, 1 + 4e-4] although nothing is stale, and GSPO's clip fraction
(sequences whose gradient the clip zeroes, with the batch's real advantages) without and with a behaviour-weight
cap (`cap_mode=clamp, cap_level=geometric`: the ratio is then against the learner's own log-probs).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from heterorl.config import load_config
from heterorl.objectives import group_advantages, make_objective
from heterorl.objectives.aggregation import seq_mean
from heterorl.rollout import pack_groups
from heterorl.run.build import build_learner, build_sampler, resolve_base_model

REPO = Path(__file__).resolve().parents[1]
SETTINGS = [("bfloat16", "bfloat16"), ("bfloat16", "float32"), ("float32", "float32")]


def measure(config: Path, wire: str, dtype: str, groups: int, overrides: list[str]) -> dict[str, float]:
    cfg = load_config(config, [*overrides, f"weights.wire_dtype={wire}", f"model.dtype={dtype}"])
    torch.manual_seed(cfg.seed)
    base, _ = resolve_base_model(cfg, show_progress=False)
    learner = build_learner(cfg, base)
    sampler = build_sampler(cfg, 0, base)
    sampler.load_weights(0, learner.export_weights())
    batch = pack_groups(sampler.generate_groups(groups), learner.policy.pad_id)
    mask_BL = batch.completion_mask_BL.bool()
    with torch.no_grad():
        logp_BL = learner.policy.token_logprobs(
            batch.prompt_ids_BP, batch.prompt_mask_BP, batch.completion_ids_BL, batch.completion_mask_BL, learner.params
        )
    log_rho = (logp_BL.double() - batch.behavior_logp_BL.double())[mask_BL]
    log_s_B = seq_mean(torch.where(mask_BL, logp_BL.double() - batch.behavior_logp_BL.double(), 0.0), mask_BL)
    adv_B = group_advantages(batch.rewards_B, batch.group_index_B, normalize=True)
    inputs = {"logp": logp_BL, "behavior_logp": batch.behavior_logp_BL, "mask": mask_BL, "advantages": adv_B}
    inputs |= {"group_index": batch.group_index_B, "prox_logp": logp_BL}  # one update per batch: prox = current
    gspo = make_objective("gspo")(**inputs).stats
    gspo_capped = make_objective("gspo", cap_mode="clamp", cap_level="geometric")(**inputs).stats
    return {
        "tokens": float(mask_BL.sum()),
        "abs_log_rho_mean": float(log_rho.abs().mean()),
        "abs_log_rho_max": float(log_rho.abs().max()),
        "k3": float((log_rho.expm1() - log_rho).mean()),
        "rho_outside_0.8_1.2": float(((log_rho < math.log(0.8)) | (log_rho > math.log(1.2))).double().mean()),
        "rho_above_2": float((log_rho > math.log(2.0)).double().mean()),
        "abs_log_s_median": float(log_s_B.abs().median()),
        "s_outside_gspo": float(((log_s_B < math.log1p(-3e-4)) | (log_s_B > math.log1p(4e-4))).double().mean()),
        "gspo_clip_frac": gspo["clip_frac"],
        "gspo_capped_clip_frac": gspo_capped["clip_frac"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "demo.yaml")
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="dotted.key=value override")
    args = parser.parse_args()
    table = Table(title=f"learner fp32 vs sampler at staleness 0 ({args.config.name}, {args.groups} groups)")
    rows = [(wire, dtype, measure(args.config, wire, dtype, args.groups, args.overrides)) for wire, dtype in SETTINGS]
    table.add_column("wire / sampler dtype")
    for key in rows[0][2]:
        table.add_column(key, justify="right")
    for wire, dtype, result in rows:
        table.add_row(f"{wire} / {dtype}", *(f"{v:.3g}" for v in result.values()))
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
