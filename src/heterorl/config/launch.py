"""Past one machine: the learner as several torch.distributed processes (`parallel`) and the Ray launcher (`ray`).

Neither section changes what is computed: a learner of N processes makes the single-process update (tested), and a
Ray-launched run is the live cluster with its processes placed by Ray. docs/deployment.md shows both.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from heterorl.config.base import Strict


class ParallelConfig(Strict):
    """How a learner started as several processes (torchrun, or `ray.learner.ranks` > 1) shares its work.

    Read only when the process is one rank of a group (torchrun's RANK / WORLD_SIZE are set); a plain
    `heterorl learner` or `heterorl run` is one process whatever this says.
    """

    strategy: Literal["fsdp2", "ddp", "none"] = Field(
        "fsdp2",
        description="fsdp2: shard parameters, gradients and AdamW moments (fully_shard); ddp: replicate the model, "
        "all-reduce gradients; none: refuse to run as several processes.",
    )
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="Collective backend: auto = nccl when model.device resolves to CUDA, else gloo."
    )
    timeout_s: float = Field(
        1800.0,
        gt=0.0,
        le=86_400.0,
        description="Longest wait in one collective (rank 0 may spend it building the warm start or evaluating).",
    )


class ActorResources(Strict):
    """What one Ray actor asks of the cluster (Ray's own resource names; custom ones such as a region too)."""

    num_cpus: float = Field(1.0, ge=0.0, le=4096.0, description="CPUs reserved for the actor.")
    num_gpus: float = Field(0.0, ge=0.0, le=64.0, description="GPUs reserved for the actor (fractions allowed).")
    resources: dict[Annotated[str, Field(min_length=1, max_length=256)], Annotated[float, Field(gt=0.0, le=1e6)]] = (
        Field(
            default_factory=dict,
            max_length=1000,
            description="Custom resources, e.g. {region_eu: 1} for nodes started with them (amounts in (0, 1e6]).",
        )
    )


class RayLearnerConfig(Strict):
    """The learner under Ray: `ranks` actors forming one torch.distributed group (rank 0 serves the samplers)."""

    ranks: int = Field(1, ge=1, le=1024, description="Learner processes (torch.distributed ranks), one actor each.")
    actor: ActorResources = Field(default_factory=ActorResources, description="Resources of each learner rank.")
    placement: Literal["PACK", "STRICT_PACK", "SPREAD", "STRICT_SPREAD"] = Field(
        "STRICT_PACK", description="Placement-group strategy of the ranks (STRICT_PACK: all on one node)."
    )


class RayConfig(Strict):
    """`heterorl run --ray`: the learner and every sampler node as Ray actors, joined over the live HTTP service."""

    learner: RayLearnerConfig = Field(default_factory=RayLearnerConfig, description="The learner's ranks.")
    samplers: list[ActorResources] = Field(
        default_factory=list,
        max_length=10_000,
        description="Resources per sampler node: empty = defaults for all, one entry = for all, else one per "
        "entry of cluster.samplers.",
    )
    max_restarts: int = Field(
        3, ge=0, le=1000, description="Times Ray restarts a sampler actor that died (each restart is counted)."
    )
    host: str = Field(
        "auto",
        min_length=1,
        description="Address the learner listens on: auto = the learner node's IP as Ray sees it (127.0.0.1 "
        "on a local Ray).",
    )
    namespace: str = Field("heterorl", min_length=1, description="Ray namespace of the run's actors.")
    startup_timeout_s: float = Field(
        600.0, gt=0.0, le=86_400.0, description="Longest wait for the actors to be placed and the learner to listen."
    )

    def sampler_resources(self, index: int) -> ActorResources:
        """The resources of sampler node `index` (lengths are checked against cluster.samplers by RunConfig)."""
        if not self.samplers:
            return ActorResources()
        return self.samplers[0] if len(self.samplers) == 1 else self.samplers[index]
