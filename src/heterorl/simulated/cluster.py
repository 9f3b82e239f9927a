"""The simulated cluster: the learner loop and the sampler nodes on a virtual clock.

Generation, training and weight encoding run for real (`heterorl.loop`); only time is modelled:
- a sampler generating n tokens is busy n / tokens_per_second virtual seconds (`simulated.runtime`);
- a learner step costs `learner_step_seconds + learner_seconds_per_token * tokens`, then its commit
  `learner_commit_seconds` (+ `learner_eval_seconds` when it evaluates) before the next step starts (the version
  is published when the step's cost has passed; the commit's time is not counted busy, as live);
- with a large-cluster plan's codec speeds (`cluster.modelled`), a version is served its encode time after the
  step, a step's commit waits for the previous version's encode (one publish at a time, as live; without
  `weights.overlap` the next step waits for its own), and a sampler applies an update its decode time after it
  arrived (`transport.simulated.link`);
- every message of the conversation crosses its link as a live transport would carry it
  (`heterorl.transport.simulated`: uploads and replies, weight pulls and long-polls; or the object store's puts,
  listings and polls), with the link's delays, bandwidth and faults.

Each sampler is the same `node.SamplerNode` a live sampler process runs (its session decides everything it
does), on a `VirtualRuntime`. Groups enter the learner through `LearnerLoop.exchange`, the same intake, admission
and verdicts as live. A learner step starts as soon as a batch is eligible; its version is published when the
step's virtual cost has passed, and waiting weight pulls are answered then.

Same config + seed => identical metrics apart from wall-clock fields: every stream is seeded and events at equal
times run first-in first-out. A run that cannot progress (every sampler stopped, e.g. refused again and again)
stops with the samplers' reasons instead of generating forever.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from heterorl.config import RunConfig
from heterorl.loop.learner_loop import LearnerLoop, StepResult
from heterorl.loop.session import SamplerSession
from heterorl.loop.worker import SamplerWorker
from heterorl.node.sampler import SamplerNode
from heterorl.simulated.events import EventLoop
from heterorl.simulated.runtime import VirtualRuntime
from heterorl.simulated.shared_weights import SharedUpdate
from heterorl.transport.simulated.link import SimLearnerSide
from heterorl.transport.simulated.store import SimStore


def overgeneration_warning(cfg: RunConfig) -> str | None:
    """A warning when the simulated samplers would generate (really compute) far more per learner step than the
    learner can train on: nothing bounds them in async mode without `cluster.max_queued_steps`, and a run with
    fast virtual samplers and a slow virtual learner then looks hung."""
    cc = cfg.cluster
    if cc.mode != "async" or cc.max_queued_steps is not None or cc.eta is not None:
        return None
    most = cfg.learner.groups_per_step * cfg.sampler.group_size * cfg.sampler.max_new_tokens  # tokens a step trains
    step_seconds = cc.learner_step_seconds + cc.learner_seconds_per_token * most
    generated = sum(n.tokens_per_second for n in cc.samplers) * step_seconds
    if generated <= 10 * most:
        return None
    return (
        f"the simulated samplers can generate ~{generated:,.0f} tokens per learner step (really computed) while a "
        f"step trains at most {most:,}; set cluster.max_queued_steps to bound them, or lower their speeds"
    )


@dataclass
class SimNode:
    node: SamplerNode
    side: Any  # the sampler side of its transport (simulated link or store)
    runtime: VirtualRuntime

    @property
    def worker(self) -> SamplerWorker:
        return self.node.worker

    @property
    def name(self) -> str:
        return self.node.worker.name


class SimulatedCluster:
    """Runs the learner loop to `learner.steps` with the sampler nodes on a virtual clock."""

    def __init__(self, cfg: RunConfig, loop: LearnerLoop, workers: list[SamplerWorker], events: EventLoop) -> None:
        cc = cfg.cluster
        if len(workers) != len(cc.samplers):
            raise ValueError(f"{len(workers)} samplers for {len(cc.samplers)} configured nodes")
        self.cfg, self.cc, self.loop, self.events = cfg, cc, loop, events
        share = lambda version, settle: SharedUpdate(version, loop.published_weights, settle)  # noqa: E731
        self.link = SimLearnerSide(cfg, loop, events, share, on_upload=self._maybe_train)
        self.store = SimStore(cfg, loop, events, self.link, self._maybe_train) if cfg.transport.uses_store else None
        self.nodes: list[SimNode] = []
        for i, (worker, node_cfg) in enumerate(zip(workers, cc.samplers, strict=True)):
            side = self.store.side(i, worker.name) if self.store is not None else self.link.side(i, worker.name)
            session = SamplerSession(cfg, i, worker.name, f"sim{i}", worker.sampler.engine.chunks_in_flight)
            runtime = VirtualRuntime(events, node_cfg.tokens_per_second, worker.name)
            node = SamplerNode(session, worker, side, runtime, cfg.live.poll_seconds)
            self.nodes.append(SimNode(node, side, runtime))
        self.learner_busy = False
        self.warning = overgeneration_warning(cfg)

    # ------------------------------------------------------------------ running
    def run(self) -> None:
        self.loop.start()
        self.link.published(self.loop.published_version)  # the first version is served once it is encoded
        if self.store is not None:
            self.store.published(self.loop.published_version)  # the first version's objects go up too
        for sim, node_cfg in zip(self.nodes, self.cc.samplers, strict=True):
            self.events.schedule(node_cfg.start_delay_s, sim.node.start, label=f"{sim.name} starts")
        self.events.run_until(lambda: self.loop.done)
        if not self.loop.done:
            raise RuntimeError(f"the simulation stalled before the last learner step: {self._why_stalled()}")
        self.link.finish()
        if self.store is not None:
            self.store.finish()
        self.link.settle()  # updates sent before the end count in the traffic, as they were sent

    def _why_stalled(self) -> str:
        stopped = [f"{s.name}: {s.node.session.stopped}" for s in self.nodes if s.node.session.stopped]
        if stopped:
            return "; ".join(stopped)
        return (
            f"no event left at step {self.loop.learner.version} with {len(self.loop.intake.buffer)} groups queued "
            f"(net: {self.loop.intake.counters_json()})"
        )

    def close(self) -> None:
        """Release the samplers' engines (a vLLM engine holds processes and memory)."""
        for sim in self.nodes:
            sim.node.worker.sampler.engine.close()

    def summary(self) -> dict[str, Any]:
        """The nodes' own figures (their weight updates, outcomes and transport counts) for summary.json."""
        out: dict[str, Any] = {
            "samplers": {
                sim.name: {
                    **sim.node.summary(),
                    "transport": dict(sim.side.counts),
                    "faults": sim.side.faults(),
                }
                for sim in self.nodes
            }
        }
        if self.store is not None:
            out["store"] = self.store.summary()
        return out

    # ------------------------------------------------------------------ learner
    def _maybe_train(self) -> None:
        if self.learner_busy or self.loop.done:
            return
        taken = self.loop.take()
        if taken is None:
            return
        result = self.loop.train(taken)
        cost = self.cc.learner_step_seconds + self.cc.learner_seconds_per_token * result.tokens
        self.learner_busy = True
        self.events.schedule_in(cost, self._train_done, result, cost, label=f"learner step {self.loop.learner.version}")

    def _train_done(self, result: StepResult, cost: float) -> None:
        if self.events.now < self.link.ready_at:  # the previous version is still being encoded (a plan's figure)
            label = f"learner commit {self.loop.learner.version} waits for the publish"
            self.events.schedule(self.link.ready_at, self._train_done, result, cost, label=label)
            return
        self.learner_busy = False
        self.link.settle()  # before the next publish moves the store on, and before the record counts the traffic
        self.loop.commit(result, busy_seconds=cost)  # publish (overlaps the next step: ParaBlock), record, evaluate
        if self.loop.done:
            return
        self.link.published(self.loop.published_version)
        if self.store is not None:
            self.store.published(self.loop.published_version)
        pause = self.cc.learner_commit_seconds + self.cc.learner_eval_seconds * self.loop.evaluated
        if not self.cfg.weights.overlap:  # the publish runs in the commit: the next step waits for its encode
            pause += self.link.encode_s
        if pause > 0.0:  # the commit's own time: the version is out, the next step waits (not counted busy)
            self.learner_busy = True
            self.events.schedule_in(pause, self._committed, label=f"learner commit {self.loop.learner.version}")
            return
        self._maybe_train()

    def _committed(self) -> None:
        self.learner_busy = False
        self._maybe_train()
