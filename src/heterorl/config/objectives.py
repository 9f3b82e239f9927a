"""One config model per objective; the `name` field picks the objective (a discriminated union)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from heterorl.config.base import Strict

Aggregation = Literal["seq_mean_token_mean", "token_mean", "dr_grpo"]
AGGREGATION_HELP = (
    "seq_mean_token_mean: mean over tokens of each sequence, then over sequences (every sequence counts the same); "
    "token_mean: mean over all tokens of the batch (long sequences count more); "
    "dr_grpo: sum over tokens / (B * max_len) (no length normalisation, Dr.GRPO)."
)


class GRPOConfig(Strict):
    """GRPO: token-level ratio against the behaviour log-probs, PPO clip (DAPO clip-higher when eps_high > eps_low)."""

    name: Literal["grpo"] = "grpo"
    eps_low: float = Field(0.2, ge=0.0, le=1.0, description="Lower clip range: ratio >= 1 - eps_low.")
    eps_high: float = Field(0.2, ge=0.0, description="Upper clip range: ratio <= 1 + eps_high.")
    aggregation: Aggregation = Field("seq_mean_token_mean", description=AGGREGATION_HELP)
    normalize_advantages: bool = Field(True, description="Divide group-centred advantages by the group std.")


class GSPOConfig(Strict):
    """GSPO: sequence-level, length-normalised ratio with a very narrow clip range."""

    name: Literal["gspo"] = "gspo"
    eps_low: float = Field(3e-4, ge=0.0, le=1.0, description="Lower clip range of the sequence ratio.")
    eps_high: float = Field(4e-4, ge=0.0, description="Upper clip range of the sequence ratio.")
    normalize_advantages: bool = Field(True, description="Divide group-centred advantages by the group std.")


class GEPOConfig(Strict):
    """GEPO: sequence weight p_i / E_q[q] with the group expectation shared by the G completions of a prompt."""

    name: Literal["gepo"] = "gepo"
    eps: float = Field(0.2, ge=0.0, le=1.0, description="Clip range of the group-expectation weight.")
    defensive_lam: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Defensive mixture: denominator (1-lam) E_q[q] + lam sg(p_i); 1 -> plain PG.",
    )
    switch: bool = Field(False, description="gepo+: use q_i as denominator for sequences whose KL < switch_kappa.")
    switch_kappa: float = Field(0.002, ge=0.0, description="KL threshold of the gepo+ switch.")
    kl_beta: float = Field(0.0, ge=0.0, description="Weight of the learner–sampler KL penalty (paper: 0.005).")
    normalize_advantages: bool = Field(False, description="GEPO centres advantages without dividing by the std.")


class DGConfig(Strict):
    """Delightful PG: gate each token by sigmoid((A * surprisal - lam) / eta); no behaviour log-probs."""

    name: Literal["dg"] = "dg"
    eta: float = Field(1.0, ge=0.0, description="Gate temperature; 0 gives the hard gate 1[chi > lam].")
    lam: float = Field(0.0, description="Gate threshold on delight chi = A * surprisal.")
    aggregation: Aggregation = Field("seq_mean_token_mean", description=AGGREGATION_HELP)
    normalize_advantages: bool = Field(False, description="DG uses reward minus the group mean.")


class DecoupledPPOConfig(Strict):
    """AReaL's decoupled PPO: clip against the proximal policy, behaviour importance weight capped."""

    name: Literal["decoupled_ppo"] = "decoupled_ppo"
    eps: float = Field(0.2, ge=0.0, le=1.0, description="Lower clip range (and upper unless eps_high is set).")
    eps_high: float | None = Field(None, ge=0.0, description="Upper clip range; None uses eps.")
    cap: float = Field(5.0, gt=0.0, description="Behaviour importance weight cap.")
    cap_mode: Literal["mask", "clamp"] = Field("mask", description="mask: drop tokens above cap; clamp: truncate.")
    aggregation: Aggregation = Field("token_mean", description=AGGREGATION_HELP)
    normalize_advantages: bool = Field(True, description="Divide group-centred advantages by the group std.")


class PGConfig(Strict):
    """REINFORCE with the group-mean baseline and no off-policy correction."""

    name: Literal["pg"] = "pg"
    aggregation: Aggregation = Field("seq_mean_token_mean", description=AGGREGATION_HELP)
    normalize_advantages: bool = Field(False, description="Divide group-centred advantages by the group std.")


class ISPGConfig(Strict):
    """Importance-weighted PG with the exact sequence ratio, truncated."""

    name: Literal["is_pg"] = "is_pg"
    truncate: float = Field(10.0, gt=0.0, description="Upper bound of the sequence importance weight.")
    aggregation: Aggregation = Field("seq_mean_token_mean", description=AGGREGATION_HELP)
    normalize_advantages: bool = Field(False, description="Divide group-centred advantages by the group std.")


ObjectiveConfig = Annotated[
    GRPOConfig | GSPOConfig | GEPOConfig | DGConfig | DecoupledPPOConfig | PGConfig | ISPGConfig,
    Field(discriminator="name"),
]
OBJECTIVE_CONFIGS: dict[str, type[Strict]] = {
    c.model_fields["name"].default: c
    for c in (GRPOConfig, GSPOConfig, GEPOConfig, DGConfig, DecoupledPPOConfig, PGConfig, ISPGConfig)
}
