"""`heterorl run CONFIG --ray [ADDRESS]`: the live cluster placed by Ray -- the learner as `ray.learner.ranks`
actors (one torch.distributed group; rank 0 serves), every sampler node as an actor with its own resources.

The actors run the entry points that already exist (`serve_learner` under `run_as_rank`, `run_sampler`), so the
loop stays one and weights and rollouts keep heterorl's formats over the live HTTP transport; Ray only places,
watches and restarts processes. A sampler actor that dies is restarted by Ray (`ray.max_restarts`) and its `run`
is called again; every death is counted in summary.json (`ray.sampler_restarts`). Any learner rank dying ends the
run (the learner's durable state lets `heterorl learner --resume` continue it).

Rank 0's URL and metrics records reach the driver through a small `Board` actor, because on a cluster the run
directory lives on the learner's node, not the driver's. The driver advances its progress bar from the records and
hands each to the Trainer's callbacks, which run in the driver's process; a callback's `stop()` goes back through
the board, and rank 0 finishes after the step it is on (SIGUSR1, as under `run --live`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from heterorl.config import ActorResources, RunConfig
from heterorl.console import Bar, progress_bar
from heterorl.launch.errors import LaunchError
from heterorl.launch.torchrun import free_port
from heterorl.live.preflight import check_live_config
from heterorl.run.recorder import Observer
from heterorl.transport.http.auth import configured_token, new_token

POLL_S = 0.5
INSTALL_HINT = "Ray is not installed: pip install 'heterorl[ray]' (or pip install ray)"


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise LaunchError(INSTALL_HINT) from None
    return ray


# ---------------------------------------------------------------- actors (plain classes, made remote at launch)
class Board:
    """What the learner and the driver tell each other: the learner's URL once it listens, the metrics records it
    wrote (until the driver takes them), and whether a callback asked the run to finish."""

    def __init__(self) -> None:
        self.url: str | None = None
        self.records: list[dict[str, Any]] = []
        self.finish = False

    def set_url(self, url: str) -> None:
        self.url = url

    def get_url(self) -> str | None:
        return self.url

    def add_records(self, records: list[dict[str, Any]]) -> None:
        self.records.extend(records)

    def take_records(self) -> list[dict[str, Any]]:
        taken, self.records = self.records, []
        return taken

    def request_finish(self) -> None:
        self.finish = True

    def finish_requested(self) -> bool:
        return self.finish


def _watch(run_dir: Path, board: Any, stop: threading.Event) -> None:
    """Rank 0's side thread: report the URL from live/learner.json and each complete record of metrics.jsonl;
    finish the run (SIGUSR1 to this process, the learner's own handler) once the driver asks. After `stop` it
    reads once more and waits until the board holds the last records (the final evaluation)."""
    import ray

    address, metrics = run_dir / "live" / "learner.json", run_dir / "metrics.jsonl"
    sent_url, offset, told, stopping = None, 0, False, False
    while not stopping:
        stopping = stop.wait(POLL_S)
        if sent_url is None and address.is_file():
            info = json.loads(address.read_text())
            if info.get("pid") == os.getpid():
                sent_url = info["url"]
                board.set_url.remote(sent_url)
        if metrics.is_file():
            with metrics.open("rb") as f:
                f.seek(offset)
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1]
            offset += len(complete)
            if complete:
                added = board.add_records.remote([json.loads(line) for line in complete.splitlines()])
                if stopping:
                    ray.get(added)
        if sent_url is not None and not told and ray.get(board.finish_requested.remote()):
            os.kill(os.getpid(), signal.SIGUSR1)
            told = True


class LearnerRank:
    """One rank of the learner. `run` executes in the actor's main thread, where the learner's SIGTERM handling
    (checkpoint, then stop) works as in a plain process."""

    def address(self) -> tuple[str, int]:
        """This node's address and a free port on it (rank 0's are the group's rendezvous)."""
        import ray

        host = ray.util.get_node_ip_address()
        return host, free_port(host)

    def run(
        self, cfg_data: dict[str, Any], rank: int, env: dict[str, str], listen: str, run_dir: str, board: Any
    ) -> dict[str, Any] | None:
        """Rank `rank` of the learner (`env`: torchrun's variables; none for a learner of one process)."""
        from heterorl.live.learner_node import serve_learner
        from heterorl.parallel.distributed import run_as_rank

        os.environ.update(env)
        cfg = RunConfig.model_validate(cfg_data)
        stop = threading.Event()
        watch = threading.Thread(target=_watch, args=(Path(run_dir), board, stop), daemon=True)
        if rank == 0:
            watch.start()
        try:
            return run_as_rank(cfg, lambda: serve_learner(cfg, listen, run_dir, show_progress=False))
        finally:
            stop.set()
            if watch.is_alive():
                watch.join()  # the last records reach the board before the driver sees this call return


class SamplerActor:
    """One sampler node: waits for the learner's URL on the board, then runs until the learner finishes."""

    def ready(self) -> bool:
        """Answers once the actor's process is up (again, after a restart)."""
        return True

    def run(self, cfg_data: dict[str, Any], index: int, board: Any, timeout_s: float) -> dict[str, Any]:
        import ray

        from heterorl.live.sampler_node import run_sampler

        cfg = RunConfig.model_validate(cfg_data)
        deadline = time.monotonic() + timeout_s
        while (url := ray.get(board.get_url.remote())) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no learner URL after {timeout_s:.0f} s")
            time.sleep(POLL_S)
        return run_sampler(cfg, url, index)


# ---------------------------------------------------------------- the driver
def _options(res: ActorResources, env: dict[str, str], namespace: str) -> dict[str, Any]:
    return {
        "namespace": namespace,
        "num_cpus": res.num_cpus,
        "num_gpus": res.num_gpus,
        "resources": dict(res.resources),
        "runtime_env": {"env_vars": env},
    }


def _listen_host(ray: Any, cfg: RunConfig, started_here: bool) -> str:
    """`ray.host`, or auto: loopback when every actor shares this one machine, else the learner node's IP."""
    if cfg.ray.host != "auto":
        return cfg.ray.host
    alive = [n for n in ray.nodes() if n.get("Alive")]
    return "127.0.0.1" if started_here or len(alive) == 1 else ""  # "": the learner node's IP, known at start


class RayRun:
    """The actors of one run and the driver's watch over them."""

    def __init__(self, ray: Any, cfg: RunConfig, run_dir: Path, token: str, host: str) -> None:
        self.ray, self.cfg, self.run_dir = ray, cfg, run_dir
        threads = str(cfg.runtime.threads or 1)
        self.env = {cfg.live.token_env: token, "OMP_NUM_THREADS": threads}
        self.prefix = f"{run_dir.name}:"  # actor names: `<run>:learner-<rank>`, `<run>:<sampler name>`, `<run>:board`
        board = ray.remote(num_cpus=0)(Board)
        self.board = board.options(name=self.prefix + "board", namespace=cfg.ray.namespace).remote()
        self.host = host
        self.ranks = self._start_learner()
        self.samplers = [self._sampler(i) for i in range(len(cfg.cluster.samplers))]
        self.restarts = dict.fromkeys(cfg.cluster.sampler_names(), 0)

    def _start_learner(self) -> list[Any]:
        ray, lc = self.ray, self.cfg.ray.learner
        options = _options(lc.actor, self.env, self.cfg.ray.namespace)
        if lc.ranks > 1:
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            bundle = {"CPU": lc.actor.num_cpus, "GPU": lc.actor.num_gpus, **lc.actor.resources}
            group = placement_group([{k: v for k, v in bundle.items() if v}] * lc.ranks, strategy=lc.placement)
            if not group.wait(self.cfg.ray.startup_timeout_s):
                raise LaunchError(f"Ray could not place {lc.ranks} learner ranks ({bundle}, {lc.placement})")
            actors = [
                ray.remote(LearnerRank)
                .options(
                    **options,
                    name=f"{self.prefix}learner-{i}",
                    scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i),
                )
                .remote()
                for i in range(lc.ranks)
            ]
        else:
            actors = [ray.remote(LearnerRank).options(**options, name=f"{self.prefix}learner-0").remote()]
        return actors

    def _sampler(self, index: int) -> Any:
        options = _options(self.cfg.ray.sampler_resources(index), self.env, self.cfg.ray.namespace)
        actor_cls = self.ray.remote(SamplerActor)
        name = self.prefix + self.cfg.cluster.sampler_name(index)
        return actor_cls.options(
            **options, name=name, max_restarts=self.cfg.ray.max_restarts, max_task_retries=0
        ).remote()

    def _sampler_run(self, index: int) -> Any:
        cfg_data = self.cfg.model_dump(mode="json")
        return self.samplers[index].run.remote(cfg_data, index, self.board, self.cfg.ray.startup_timeout_s)

    def run(self, show_progress: bool, observer: Observer | None = None) -> dict[str, Any]:
        ray, cfg = self.ray, self.cfg
        node, port = ray.get(self.ranks[0].address.remote(), timeout=cfg.ray.startup_timeout_s)
        host = self.host or node
        world = len(self.ranks)
        cfg_data = cfg.model_dump(mode="json")
        learner_refs = []
        for rank, actor in enumerate(self.ranks):
            # Ray gives each actor its own GPU(s) (CUDA_VISIBLE_DEVICES), so every rank's local device is 0
            env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": "0", "MASTER_ADDR": node}
            env = {**env, "MASTER_PORT": str(port)} if world > 1 else {}  # one rank: a plain process
            if env and node.startswith("127.") and sys.platform.startswith("linux"):
                env["GLOO_SOCKET_IFNAME"] = "lo"  # a one-machine Ray: the ranks meet on loopback
            listen = f"{host}:0"
            learner_refs.append(actor.run.remote(cfg_data, rank, env, listen, str(self.run_dir), self.board))
        pending: dict[Any, int] = {self._sampler_run(i): i for i in range(len(self.samplers))}
        summary: dict[str, Any] | None = None
        if observer is not None:
            observer.started()
        with progress_bar("RL", total=cfg.learner.steps, enabled=show_progress) as bar:
            while summary is None:
                ready, _ = ray.wait([learner_refs[0], *pending], num_returns=1, timeout=POLL_S)
                for ref in ready:
                    if ref is learner_refs[0]:
                        summary = self._learner_result(learner_refs)
                    else:
                        self._sampler_done(ref, pending)
                self._follow(bar, observer)
            self._follow(bar, observer)  # what rank 0 wrote last (its final evaluation)
        return summary

    def _follow(self, bar: Bar, observer: Observer | None) -> None:
        """The records rank 0 wrote since the last call: the bar advances, the observer sees each in order."""
        for record in self.ray.get(self.board.take_records.remote()):
            if record.get("kind") == "train":
                bar.advance(1)
            if observer is not None:
                observer.observe(record)
        if observer is not None and observer.stop_requested:
            self.board.request_finish.remote()

    def _learner_result(self, refs: list[Any]) -> dict[str, Any]:
        try:
            results = self.ray.get(refs)
        except self.ray.exceptions.RayError as err:
            raise LaunchError(f"the learner failed: {err}") from None
        if results[0] is None:
            raise LaunchError("the learner stopped before the last step; continue with heterorl learner --resume")
        return results[0]

    def _sampler_done(self, ref: Any, pending: dict[Any, int]) -> None:
        """A sampler's run ended: fine once the learner finished; a dead actor is counted and run again."""
        index = pending.pop(ref)
        name = self.cfg.cluster.sampler_name(index)
        try:
            self.ray.get(ref)
        except self.ray.exceptions.RayActorError:
            self.restarts[name] += 1
            self._wait_restarted(index)
            pending[self._sampler_run(index)] = index
        except self.ray.exceptions.RayTaskError as err:
            raise LaunchError(f"sampler {name} failed: {err}") from None

    def _wait_restarted(self, index: int) -> None:
        """Wait while Ray restarts sampler `index`'s process (calls meanwhile answer ActorUnavailableError)."""
        errors, name = self.ray.exceptions, self.cfg.cluster.sampler_name(index)
        deadline = time.monotonic() + self.cfg.ray.startup_timeout_s
        while True:
            try:
                self.ray.get(self.samplers[index].ready.remote())
                return
            except errors.ActorUnavailableError:
                if time.monotonic() > deadline:
                    raise LaunchError(f"sampler {name} did not come back within ray.startup_timeout_s") from None
                time.sleep(POLL_S)
            except errors.ActorDiedError:
                limit = self.cfg.ray.max_restarts
                raise LaunchError(
                    f"sampler {name} died and Ray will not restart it (ray.max_restarts {limit})"
                ) from None

    def close(self) -> None:
        for actor in [*self.samplers, *self.ranks, self.board]:
            self.ray.kill(actor, no_restart=True)


def run_ray(
    cfg: RunConfig,
    run_dir: str | Path,
    address: str | None = None,
    show_progress: bool = True,
    observer: Observer | None = None,
) -> dict:
    """Run `cfg` as Ray actors (on the Ray at `address`, the one this process already joined, or a new local one)
    into `run_dir` (on the learner's node); returns the summary with `ray.sampler_restarts` added. `observer`
    (the Trainer) sees every record in this process and may ask the run to finish early."""
    ray = _ray()
    check_live_config(cfg)
    wall_start = time.monotonic()
    run_dir = Path(run_dir).resolve()
    started_here = not ray.is_initialized()
    if started_here:
        local = address is None
        ray.init(
            address=address,
            namespace=cfg.ray.namespace,
            include_dashboard=False,
            log_to_driver=False,
            **({"_node_ip_address": "127.0.0.1"} if local else {}),
        )
    token = configured_token(cfg.live) or new_token()
    launched = None
    try:
        launched = RayRun(ray, cfg, run_dir, token, _listen_host(ray, cfg, started_here and address is None))
        summary = launched.run(show_progress, observer)
    finally:
        if launched is not None:
            launched.close()
        if started_here:
            ray.shutdown()
    summary = {**summary, "ray": {"sampler_restarts": launched.restarts, "learner_ranks": len(launched.ranks)}}
    summary["wall_seconds"] = time.monotonic() - wall_start
    path = run_dir / "summary.json"
    if path.parent.is_dir():  # on the learner's node (or a shared filesystem)
        path.write_text(json.dumps(summary, indent=2))
    return summary
