"""RL objectives: pure loss functions (tensors in, loss and stats out) chosen by name.

    objective = make_objective("gepo", defensive_lam=0.1)
    adv_B = group_advantages(rewards_B, group_index_B, normalize=objective.normalize_advantages)
    out = objective(logp=logp_BT, behavior_logp=behavior_logp_BT, mask=mask_BT, advantages=adv_B,
                    group_index=group_index_B)          # + prox_logp=... when objective.needs_prox_logp
    out.loss.backward(); out.stats  # dict[str, float]

See docs/objectives.md for the formulas, defaults and the definition of every stats key.
"""

from heterorl.objectives.advantages import group_advantages
from heterorl.objectives.aggregation import aggregate, seq_mean, token_mean
from heterorl.objectives.base import LossParts, Objective, ObjectiveBatch, ObjectiveOutput, make_batch
from heterorl.objectives.diagnostics import CLIP_STAT_KEYS, COMMON_STAT_KEYS, GATE_STAT_KEYS, WEIGHT_STAT_KEYS
from heterorl.objectives.registry import OBJECTIVES, hyperparameter_names, make_objective, objective_from_config

__all__ = [
    "CLIP_STAT_KEYS",
    "COMMON_STAT_KEYS",
    "GATE_STAT_KEYS",
    "OBJECTIVES",
    "WEIGHT_STAT_KEYS",
    "LossParts",
    "Objective",
    "ObjectiveBatch",
    "ObjectiveOutput",
    "aggregate",
    "group_advantages",
    "hyperparameter_names",
    "make_batch",
    "make_objective",
    "objective_from_config",
    "seq_mean",
    "token_mean",
]
