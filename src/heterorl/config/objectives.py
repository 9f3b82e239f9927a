"""One config model per objective; the `name` field picks the objective (a discriminated union).

Options every objective takes (the KL penalty to the frozen reference model, masking of truncated completions,
DAPO's soft overlong penalty) live in `ObjectiveOptions`; the behaviour-weight cap of the importance-weighted
objectives (TIS / MIS, train–inference mismatch correction) in `CappedObjective`. docs/objectives.md has the
formulas.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from heterorl.config.base import Strict

Aggregation = Literal["seq_mean_token_mean", "token_mean", "dr_grpo"]
AGGREGATION_HELP = (
    "seq_mean_token_mean: mean over tokens of each sequence, then over sequences (every sequence counts the same); "
    "token_mean: mean over all tokens of the batch (long sequences count more); "
    "dr_grpo: sum over tokens / (B * max_len) (no length normalisation, Dr.GRPO)."
)
KLEstimator = Literal["k1", "k2", "k3"]
CapMode = Literal["none", "clamp", "mask"]
CapLevel = Literal["token", "sequence", "geometric"]
CAP_MODE_HELP = (
    "Correction of the sampler's log-probs (train-inference mismatch, staleness) by the behaviour weight "
    "w = pi_prox / mu: none; clamp: truncated IS (TIS), w -> min(w, cap); mask: masked IS (MIS / IcePop), w kept "
    "inside [cap_low, cap] and 0 outside. With a cap the surrogate is taken against pi_prox (needs a no-grad "
    "forward pass per batch)."
)
CAP_LEVEL_HELP = (
    "What one behaviour weight covers: token (pi_prox/mu per token); sequence (the product over the sequence); "
    "geometric (the per-token geometric mean of the sequence)."
)


class ObjectiveOptions(Strict):
    """Options of every objective: KL to the frozen reference model and the handling of truncated completions."""

    name: str = Field(description="The objective (registry key); each subclass fixes it.")
    ref_kl_beta: float = Field(
        0.0,
        ge=0.0,
        le=10.0,
        description="Coefficient of the KL penalty to the frozen reference (the run's base model); 0 disables it "
        "and its forward pass.",
    )
    ref_kl_estimator: KLEstimator = Field(
        "k3",
        description="Per-token KL estimator with d = ref_logp - logp: k1 = -d; k2 = d^2 / 2; k3 = exp(d) - d - 1 "
        "(TRL's and verl's low_var_kl, unclamped).",
    )
    mask_truncated: bool = Field(
        False, description="Completions without an end-of-sequence token (cut at max_new_tokens) contribute no loss."
    )
    overlong_cache: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="DAPO soft overlong penalty: length of the punishment interval L_cache before max_new_tokens; "
        "0 disables it. Must not exceed sampler.max_new_tokens.",
    )
    overlong_penalty_factor: float = Field(
        1.0, ge=0.0, le=100.0, description="Scale of the overlong penalty (its value at max_new_tokens is -factor)."
    )


class CappedObjective(ObjectiveOptions):
    """An importance-weighted objective that can correct the sampler's log-probs with a capped behaviour weight."""

    cap_mode: CapMode = Field("none", description=CAP_MODE_HELP)
    cap: float = Field(2.0, gt=0.0, le=1e6, description="Upper bound of the behaviour weight (clamp and mask).")
    cap_low: float | None = Field(
        None,
        ge=0.0,
        le=1e6,
        description="mask only: lower bound of the behaviour weight; None = 1 / cap, 0 = no lower bound.",
    )
    cap_level: CapLevel = Field("token", description=CAP_LEVEL_HELP)

    @model_validator(mode="after")
    def _cap_bounds(self) -> CappedObjective:
        if self.cap_mode != "mask" and self.cap_low:
            raise ValueError(f"cap_low only applies to cap_mode 'mask' (cap_mode is {self.cap_mode!r})")
        if self.cap_mode == "mask" and self.cap_low is not None and self.cap_low >= self.cap:
            raise ValueError(f"cap_low {self.cap_low} must be below cap {self.cap}")
        return self

    @property
    def cap_lower_bound(self) -> float:
        """The weight below which mask mode drops an element (0 in the other modes)."""
        if self.cap_mode != "mask":
            return 0.0
        return 1.0 / self.cap if self.cap_low is None else self.cap_low


class GRPOConfig(CappedObjective):
    """GRPO: token-level ratio against the behaviour log-probs, PPO clip (DAPO clip-higher when eps_high > eps_low)."""

    name: Literal["grpo"] = "grpo"
    eps_low: float = Field(0.2, ge=0.0, le=1.0, description="Lower clip range: ratio >= 1 - eps_low.")
    eps_high: float = Field(0.2, ge=0.0, le=100.0, description="Upper clip range: ratio <= 1 + eps_high.")
    dual_clip: float | None = Field(
        None,
        gt=1.0,
        le=100.0,
        description="Dual-clip PPO constant c (Ye et al. 2020, typically 3): for A < 0 the token loss is capped at "
        "c |A|, so ratios above c give no gradient; None disables it.",
    )
    aggregation: Aggregation = Field("seq_mean_token_mean", description=AGGREGATION_HELP)
    normalize_advantages: bool = Field(True, description="Divide group-centred advantages by the group std.")


class GSPOConfig(CappedObjective):
    """GSPO: sequence-level, length-normalised ratio with a very narrow clip range."""

    name: Literal["gspo"] = "gspo"
    eps_low: float = Field(3e-4, ge=0.0, le=1.0, description="Lower clip range of the sequence ratio.")
    eps_high: float = Field(4e-4, ge=0.0, le=1.0, description="Upper clip range of the sequence ratio.")
    normalize_advantages: bool = Field(True, description="Divide group-centred advantages by the group std.")


class GEPOConfig(CappedObjective):
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
    switch_kappa: float = Field(0.002, ge=0.0, le=100.0, description="KL threshold of the gepo+ switch.")
    kl_beta: float = Field(
        0.0, ge=0.0, le=100.0, description="Weight of the learner–sampler KL penalty (paper: 0.005)."
    )
    normalize_advantages: bool = Field(False, description="GEPO centres advantages without dividing by the std.")


class DGConfig(ObjectiveOptions):
    """Delightful PG: gate each token by sigmoid((A * surprisal - lam) / eta); no behaviour log-probs."""

    name: Literal["dg"] = "dg"
    eta: float = Field(1.0, ge=0.0, le=1e6, description="Gate temperature; 0 gives the hard gate 1[chi > lam].")
    lam: float = Field(0.0, ge=-1e6, le=1e6, description="Gate threshold on delight chi = A * surprisal.")
    aggregation: Aggregation = Field("seq_mean_token_mean", description=AGGREGATION_HELP)
    normalize_advantages: bool = Field(False, description="DG uses reward minus the group mean.")


class DecoupledPPOConfig(CappedObjective):
    """AReaL's decoupled PPO: clip against the proximal policy, behaviour importance weight capped."""

    name: Literal["decoupled_ppo"] = "decoupled_ppo"
    eps: float = Field(0.2, ge=0.0, le=1.0, description="Lower clip range (and upper unless eps_high is set).")
    eps_high: float | None = Field(None, ge=0.0, le=100.0, description="Upper clip range; None uses eps.")
    cap: float = Field(5.0, gt=0.0, le=1e6, description="Behaviour importance weight cap.")
    cap_mode: Literal["mask", "clamp"] = Field(  # type: ignore[assignment]
        "mask", description="mask: drop elements whose weight is outside [cap_low, cap]; clamp: truncate at cap."
    )
    cap_low: float | None = Field(
        0.0,
        ge=0.0,
        le=1e6,
        description="mask only: lower bound of the behaviour weight; 0 = none (AReaL), None = 1 / cap.",
    )
    dual_clip: float | None = Field(
        None,
        gt=1.0,
        le=100.0,
        description="Dual-clip constant c on the proximal ratio: for A < 0 the token loss is capped at b c |A|; "
        "None disables it.",
    )
    aggregation: Aggregation = Field("token_mean", description=AGGREGATION_HELP)
    normalize_advantages: bool = Field(True, description="Divide group-centred advantages by the group std.")


class CISPOConfig(CappedObjective):
    """CISPO (MiniMax-M1): REINFORCE with a clipped, stop-gradient token importance weight; no token is dropped."""

    name: Literal["cispo"] = "cispo"
    eps_low: float = Field(
        1.0, ge=0.0, le=1.0, description="Weight >= 1 - eps_low; 1 = no lower bound (the paper's choice)."
    )
    eps_high: float = Field(3.0, ge=0.0, le=1e6, description="Weight <= 1 + eps_high (the paper tunes only this).")
    aggregation: Aggregation = Field("token_mean", description=AGGREGATION_HELP)
    normalize_advantages: bool = Field(True, description="Divide group-centred advantages by the group std.")


class PGConfig(ObjectiveOptions):
    """REINFORCE with the group-mean baseline and no off-policy correction."""

    name: Literal["pg"] = "pg"
    aggregation: Aggregation = Field("seq_mean_token_mean", description=AGGREGATION_HELP)
    normalize_advantages: bool = Field(False, description="Divide group-centred advantages by the group std.")


class ISPGConfig(ObjectiveOptions):
    """Importance-weighted PG with the exact sequence ratio, truncated."""

    name: Literal["is_pg"] = "is_pg"
    truncate: float = Field(10.0, gt=0.0, le=1e6, description="Upper bound of the sequence importance weight.")
    aggregation: Aggregation = Field("seq_mean_token_mean", description=AGGREGATION_HELP)
    normalize_advantages: bool = Field(False, description="Divide group-centred advantages by the group std.")


DEFAULT_OBJECTIVE = "grpo"  # RunConfig's default objective


def _objective_name(value: Any) -> str | None:
    """The discriminator: the `name` of a config or raw mapping; a mapping without one (`--set objective.x=...` on a
    config that names no objective) means the default objective."""
    if isinstance(value, dict):
        return value.get("name", DEFAULT_OBJECTIVE)
    return getattr(value, "name", None)


_CONFIGS = (GRPOConfig, GSPOConfig, GEPOConfig, DGConfig, DecoupledPPOConfig, CISPOConfig, PGConfig, ISPGConfig)
ObjectiveConfig = Annotated[
    Annotated[GRPOConfig, Tag("grpo")]
    | Annotated[GSPOConfig, Tag("gspo")]
    | Annotated[GEPOConfig, Tag("gepo")]
    | Annotated[DGConfig, Tag("dg")]
    | Annotated[DecoupledPPOConfig, Tag("decoupled_ppo")]
    | Annotated[CISPOConfig, Tag("cispo")]
    | Annotated[PGConfig, Tag("pg")]
    | Annotated[ISPGConfig, Tag("is_pg")],
    Discriminator(_objective_name),
]
OBJECTIVE_CONFIGS: dict[str, type[Strict]] = {c.model_fields["name"].default: c for c in _CONFIGS}
