"""Trust: who the learner believes, and the adversarial samplers the simulator can play (docs/deployment.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from heterorl.config.base import Strict


class VerifyConfig(Strict):
    """Verified rollouts: a share of the groups re-scored under the version they claim (`loop/verifier.py`).

    Tolerances left at None come from the calibrated table for the samplers' engine and dtype
    (`heterorl.loop.screen.TOLERANCES`); set them to override it.
    """

    fraction: float = Field(
        0.1, ge=0.0, le=1.0, description="Share of groups re-scored (a keyed hash of the group id picks them)."
    )
    mean_tolerance: float | None = Field(
        None, gt=0.0, le=100.0, description="Largest mean |claimed - recomputed| log-prob over a group's tokens."
    )
    token_tolerance: float | None = Field(
        None, gt=0.0, le=100.0, description="A token whose |claimed - recomputed| log-prob is over this is 'off'."
    )
    max_share_over: float | None = Field(
        None, ge=0.0, le=1.0, description="Largest share of a group's tokens that may be off."
    )
    z_tolerance: float | None = Field(
        None, gt=0.0, le=1000.0, description="Largest |z| of the sampling-calibration test of a group's tokens."
    )
    cache_versions: int = Field(2, ge=1, le=1024, description="Rebuilt versions the verifier keeps in memory.")
    key_env: str = Field(
        "HETERORL_VERIFY_KEY",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Environment variable holding the secret that picks the verified groups; unset: random in a live "
        "learner (samplers must not predict the choice), derived from the seed in the simulator (reproducible).",
    )


class ReputationConfig(Strict):
    """Per-sampler records and quarantine (`loop/reputation.py`): clock-free, counted in groups."""

    window: int = Field(64, ge=1, le=1_000_000, description="A sampler's last judged groups that count.")
    max_charges: int = Field(
        4,
        ge=1,
        le=1_000_000,
        description="Charged refusals (reward mismatch, failed verification, poison, replay, invalid content) within "
        "`window` that quarantine a sampler: its groups are refused and its grants withdrawn.",
    )
    z_tolerance: float = Field(
        6.0,
        gt=0.0,
        le=1000.0,
        description="Quarantine a sampler whose verified tokens, all together, fail the calibration test by more "
        "than this many standard deviations (a small shift that no single group shows).",
    )
    release_after_steps: int | None = Field(
        None, ge=1, le=10_000_000, description="Learner steps a quarantine lasts; None: until the learner restarts."
    )


class TrustConfig(Strict):
    """Keys, credentials and the checks of what samplers send (docs/deployment.md's threat model)."""

    learner_private_key: str | None = Field(
        None,
        min_length=1,
        description="Learner: Ed25519 PEM key (mode 600; `heterorl keys new DIR`) that signs every published weight "
        "blob and store manifest. None: weights are authenticated by hashes only.",
    )
    learner_public_key: str | None = Field(
        None,
        min_length=1,
        description="Sampler: the learner's public key; then it applies only weights the learner signed.",
    )
    sampler_private_key: str | None = Field(
        None,
        min_length=1,
        description="Sampler: its own Ed25519 PEM key (mode 600; `heterorl keys sampler NAME --ed25519`); it signs "
        "every upload it writes to a store, which a learner with trust.credentials requires.",
    )
    credentials: str | None = Field(
        None,
        min_length=1,
        description="Learner: YAML file of per-sampler credentials (`heterorl keys sampler`), reloaded when it changes "
        "or on SIGHUP. None: the one run token of `live.token_env` / `live.token_file`.",
    )
    recheck_rewards: bool = Field(
        True,
        description="The learner recomputes the rewards of every group whose task it can verify and trains on its own; "
        "a group whose claimed rewards differ is refused (reward_mismatch).",
    )
    reward_tolerance: float = Field(
        1e-6, ge=0.0, le=1e6, description="Largest |claimed - recomputed| reward that still agrees."
    )
    replay_window: int = Field(
        100_000,
        ge=0,
        le=100_000_000,
        description="Recent groups whose content fingerprints are remembered; the same completions sent again under "
        "another id are refused (replayed). 0: off.",
    )
    verify: VerifyConfig = Field(default_factory=VerifyConfig, description="Re-scored rollouts.")
    reputation: ReputationConfig = Field(default_factory=ReputationConfig, description="Per-sampler records.")


AdversaryKind = Literal["forged_logprobs", "poison", "other_model", "forged_rewards", "replay"]


class AdversaryConfig(Strict):
    """A sampler that lies (simulator experiments, `heterorl.adversaries`): what it does to the groups it sends."""

    kind: AdversaryKind = Field(
        description="forged_logprobs: shifts its behaviour log-probs by `logprob_shift`; poison: one token of a group "
        "at `poison_logprob`; other_model: completions from another model (the base model) under its claimed "
        "version; forged_rewards: rewards inverted (max - r); replay: groups it sent before, again under new ids and "
        "its current version."
    )
    share: float = Field(1.0, gt=0.0, le=1.0, description="Share of its groups it tampers with.")
    logprob_shift: float = Field(-1.0, ge=-50.0, le=50.0, description="forged_logprobs: added to every log-prob.")
    poison_logprob: float = Field(-70.0, ge=-1e4, le=0.0, description="poison: the log-prob it claims for one token.")
    rescore: bool = Field(
        True,
        description="other_model: report the claimed version's log-probs of the foreign tokens (a careful forger) "
        "rather than the other model's own.",
    )

    @model_validator(mode="after")
    def _forgery_forges(self) -> AdversaryConfig:
        if self.kind == "forged_logprobs" and self.logprob_shift == 0.0:
            raise ValueError("adversary forged_logprobs with logprob_shift 0 forges nothing")
        return self
