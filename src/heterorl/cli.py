"""The `heterorl` command. Thin: parse the config, then import the heavy modules lazily (`--help` is instant)."""

from __future__ import annotations

import errno
import platform
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any

import typer

from heterorl import __version__
from heterorl.cli_errors import Command, Group, command_line, fail, interrupted, on_interrupt, user_errors
from heterorl.config import ConfigError, load_config

app = typer.Typer(
    cls=Group, add_completion=False, no_args_is_help=True, help="RL post-training across slow, unequal networks."
)

# Boolean options are flags (`--live`, no value); metavar "" keeps typer's help from printing a `<bool>` type.
ConfigArg = Annotated[Path | None, typer.Argument(help="YAML run config (defaults apply when omitted).")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="Override: dotted.key=value (repeatable).", metavar="KEY=VALUE"),
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.", metavar="")]


def _version(value: bool) -> None:
    if not value:
        return
    versions = ", ".join(f"{pkg} {_installed(pkg)}" for pkg in ("torch", "transformers"))
    typer.echo(f"heterorl {__version__} (python {platform.python_version()}, {versions})")
    raise typer.Exit()


def _installed(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the versions and exit.", metavar=""),
    ] = False,
) -> None:
    """RL post-training across slow, unequal networks."""


NprocOpt = Annotated[
    int | None,
    typer.Option(
        "--nproc", min=1, help="Learner processes on this host: starts itself under torchrun (see `parallel`)."
    ),
]


def _load(config: Path | None, overrides: list[str] | None):
    return load_config(config, overrides or [])  # a ConfigError ends the command in one line (`user_errors`)


def weight_traffic_text(summary: dict[str, Any], codec: str | None, wire_dtype: str | None) -> str:
    """Bytes sent to the samplers against the same weights raw in the wire dtype, and what made the difference:
    PULSE patches, or (codec `full`) only zstd on full snapshots, which is no sparsity saving."""
    sent, raw = summary["weight_bytes_sent"], summary["weight_bytes_full"]
    ratio = raw / max(sent, 1)
    how = {"pulse": "PULSE patches", "full": "zstd-compressed full snapshots"}.get(codec or "", "")
    unit, scale = ("GB", 1e9) if raw >= 1e10 else ("MB", 1e6)
    return (
        f"{sent / scale:.2f} {unit} sent vs {raw / scale:.2f} {unit} of raw {wire_dtype or 'wire-dtype'} weights "
        f"({ratio:.1f}x less" + (f": {how})" if how else ")")
    )


def _print_summary(summary: dict[str, Any], run_dir: Path) -> None:
    """The run's short human summary, on stdout (so `heterorl run ... > log` keeps it)."""
    import yaml
    from rich.table import Table

    from heterorl.console import out

    config_path = run_dir / "config.yaml"
    resolved = (yaml.safe_load(config_path.read_text()) or {}) if config_path.is_file() else {}
    weights = resolved.get("weights") or {}
    table = Table(title="heterorl run", show_header=False, title_justify="left")
    if "modelled" in summary:  # a large-cluster plan: its sizes and costs are not what was computed
        table.add_row("modelled", summary["modelled"]["note"])
    acc0, acc1 = summary["accuracy_initial"], summary["accuracy_final"]
    table.add_row("held-out accuracy", f"{acc0:.1%} -> {acc1:.1%}  ({(acc1 - acc0) * 100:+.1f} points)")
    table.add_row("reward", f"{summary['reward_first']:.3f} -> {summary['reward_last']:.3f}")
    table.add_row("learner steps", f"{summary['steps']}  ({summary['objective']}, {summary['mode']} mode)")
    table.add_row("clock time", f"{summary['clock_seconds']:.0f} s ({summary.get('clock', 'virtual')})")
    table.add_row("staleness", f"mean {summary['staleness_mean']:.2f}, max {summary['staleness_max']} steps")
    table.add_row("groups dropped", str(summary["groups_dropped"]))
    table.add_row("throughput", f"{summary['tokens_per_clock_second']:.0f} tokens / clock s")
    table.add_row("idle", f"learner {summary['learner_idle']:.0%}; samplers {idle_text(summary['sampler_idle'])}")
    if summary["weight_bytes_full"]:
        table.add_row("weight traffic", weight_traffic_text(summary, weights.get("codec"), weights.get("wire_dtype")))
    table.add_row("wall time", f"{summary['wall_seconds']:.1f} s (RL {summary['rl_wall_seconds']:.1f} s)")
    table.add_row("run directory", str(run_dir))
    out.print(table)


def idle_text(idle: dict[str, float], listed: int = 8) -> str:
    """Each sampler's idle share, or for more than `listed` samplers their mean, least and most."""
    if len(idle) <= listed:
        return ", ".join(f"{k} {v:.0%}" for k, v in idle.items())
    low, high = min(idle, key=idle.__getitem__), max(idle, key=idle.__getitem__)
    mean = sum(idle.values()) / len(idle)
    return f"{len(idle)}: mean {mean:.0%}, least {low} {idle[low]:.0%}, most {high} {idle[high]:.0%}"


@contextmanager
def _live_errors(connect: str | None = None) -> Iterator[None]:
    """Failures a user can act on (live setup, token, unreachable learner, a URL that is no learner, ranks, Ray,
    the store, a diverged learner, a run directory that cannot be used as asked) end in one line: exit 1, or 2
    for the config or the run directory. `connect`: the sampler's --connect URL, named when it answers wrongly."""
    from heterorl.lab import LabError
    from heterorl.launch.errors import LaunchError
    from heterorl.live.launcher import LiveRunError
    from heterorl.live.preflight import LiveSetupError
    from heterorl.live.sampler_node import SamplerStoppedError
    from heterorl.loop.learner_loop import TrainingDivergedError
    from heterorl.parallel.distributed import DistributedSetupError
    from heterorl.run.run_dir import RunDirError
    from heterorl.transport.http.auth import TokenError
    from heterorl.transport.http.client import AuthError, LearnerUnreachableError, ProtocolError
    from heterorl.transport.store.learner import StoreThreadError
    from heterorl.transport.store.objects import StoreSetupError
    from heterorl.transport.store.source import StoreUnreachableError

    failures = (LiveSetupError, TokenError, LiveRunError, LearnerUnreachableError, AuthError, TrainingDivergedError)
    failures += (SamplerStoppedError, StoreThreadError)
    try:
        yield
    except (ConfigError, RunDirError) as exc:
        fail(str(exc), 2)
    except ProtocolError as exc:
        fail(f"{exc} (is --connect {connect} the learner's URL?)" if connect else str(exc))
    except (*failures, DistributedSetupError, LaunchError, StoreSetupError, StoreUnreachableError, LabError) as exc:
        fail(str(exc))


def _check_listen(listen: str) -> None:
    """`--listen HOST:PORT` names an address of this host whose port is free, checked before the model loads (the
    service binds it minutes later on a large model; a port taken in between still fails at the bind)."""
    from heterorl.live.preflight import parse_listen

    with _live_errors():
        host, port = parse_listen(listen)
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        fail(f"--listen {listen}: cannot resolve {host!r} ({exc.strerror})")
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the service binds: TIME_WAIT is no obstacle
        try:
            probe.bind(address)
        except OSError as exc:
            why = {
                errno.EADDRINUSE: "the port is in use (another learner still running?): pick another port or stop it",
                errno.EADDRNOTAVAIL: f"{host} is not an address of this host",
                errno.EACCES: "binding this port needs privileges (ports below 1024): pick a port above 1023",
            }.get(exc.errno or 0, exc.strerror)
            fail(f"--listen {listen}: {why}")


def _under_torchrun(nproc: int | None) -> None:
    """`--nproc N`: start this same command again as N processes under torchrun (loopback), and exit with it."""
    if nproc is None:
        return
    from heterorl.launch.torchrun import torchrun_self

    with _live_errors():
        raise typer.Exit(torchrun_self(nproc))


@app.command(cls=Command)
@user_errors
def run(
    config: ConfigArg = None,
    set_: SetOpt = None,
    run_dir: Annotated[Path | None, typer.Option("--run-dir", help="Where to write the run.")] = None,
    live: Annotated[
        bool, typer.Option("--live", help="Learner and samplers as local processes over HTTP, real clocks.", metavar="")
    ] = False,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            help="Learner and samplers as Ray actors: 'local' starts Ray here, or a cluster ADDRESS (e.g. auto, "
            "ray://head:10001).",
        ),
    ] = None,
    nproc: NprocOpt = None,
    overwrite: Annotated[
        bool,
        typer.Option("--overwrite", help="Replace the run already in --run-dir (default: refuse).", metavar=""),
    ] = False,
    resume: Annotated[
        bool, typer.Option("--resume", help="With --live: continue the interrupted run in --run-dir.", metavar="")
    ] = False,
    quiet: QuietOpt = False,
) -> None:
    """Post-train a model with RL on the simulated cluster (or, with --live, on local processes; with --ray, as Ray
    actors) and write a run directory."""
    cfg = _load(config, set_)
    if resume and (not live or run_dir is None):
        fail("--resume continues a live run: use it with --live and that run's --run-dir", 2)
    if live and ray is not None:
        fail("--live and --ray are two ways to launch the same run: pick one", 2)
    if ray is not None and cfg.live.wan_lab:
        fail(
            "live.wan_lab runs the processes of `run --live` in a WAN lab; Ray places its actors itself: use --live", 2
        )
    if nproc is not None and (live or ray is not None):
        fail("--nproc runs the simulated learner as N processes; with --ray use ray.learner.ranks", 2)
    _under_torchrun(nproc)
    from heterorl.api import Trainer
    from heterorl.run.run_dir import new_run_dir

    target = run_dir or new_run_dir(name=config.stem if config else "run")
    trainer = Trainer(cfg, run_dir=target, show_progress=not quiet, overwrite=overwrite)
    if live or ray is not None:  # the learner saves its state and every child ends; the line says how to resume
        with _live_errors(), _live_interrupt(config, target, set_, ray=ray is not None):
            summary = trainer.fit(clock="live", ray=ray, resume=resume)
    else:  # Ctrl-C or SIGTERM: the run finishes the step it is on (a second one stops it at once)
        with _live_errors(), on_interrupt(lambda: interrupted_run(target, config, set_), soft=trainer.stop):
            summary = trainer.fit(clock="simulated")
    if summary is None:  # a follower rank of a multi-process learner: rank 0 prints the summary
        from heterorl.parallel.distributed import is_follower, leave_as_follower

        if is_follower():
            leave_as_follower()
        return
    _print_summary(summary, target)
    if trainer.stop_requested:  # only a signal asks this command's trainer to stop
        again = command_line("run", config, "--run-dir", target, "--overwrite", sets=set_)
        interrupted(
            f"{target} holds the run stopped after step {summary['steps']} of {cfg.learner.steps}, evaluated, with "
            f"checkpoint/ and summary.json; a simulated run does not resume (it is deterministic): run all "
            f"{cfg.learner.steps} steps with {again}"
        )


def recorded_steps(run_dir: Path) -> int:
    """Learner steps recorded in a run directory's metrics.jsonl (a line cut short by an interruption is left
    out)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    with path.open(encoding="utf-8", errors="replace") as f:
        return sum('"kind": "train"' in line and line.endswith("\n") for line in f)


def interrupted_run(run_dir: Path, config: Path | None, sets: list[str] | None) -> str:
    """What a simulated run stopped at once (a second Ctrl-C) kept, and the command that runs it again."""
    steps = recorded_steps(run_dir)
    if steps:
        kept = f"{run_dir} keeps the resolved config and {steps} learner steps in metrics.jsonl"
    else:
        kept = f"{run_dir} keeps only the resolved config (no learner step finished)"
    again = command_line("run", config, "--run-dir", run_dir, "--overwrite", sets=sets)
    return f"{kept}; a simulated run does not resume (it is deterministic): run it again with {again}"


@contextmanager
def _live_interrupt(config: Path | None, run_dir: Path, sets: list[str] | None, ray: bool) -> Iterator[None]:
    """Ctrl-C or SIGTERM ending `run --live` (the launcher ends every child, the learner saving its state first,
    and raises LiveInterruptedError) or `run --ray` (the actors are ended) in one line: what was kept and the
    command that continues it."""
    from heterorl.live.launcher import LiveInterruptedError

    how = "--ray" if ray else "--live"
    again = command_line(
        "run", config, how, *(["ADDRESS"] if ray else []), "--run-dir", run_dir, "--overwrite", sets=sets
    )
    if ray:
        learner = command_line("learner", config, "--run-dir", run_dir, "--resume", sets=sets)
        kept = (
            f"the Ray actors were ended; {run_dir} on the learner's node keeps its saved state: continue with "
            f"{learner} and samplers pointed at it, or run it again with {again}"
        )
    else:  # interrupted before the children started (the warm start, the run directory)
        kept = f"no process had started: run it again with {again}"
    try:
        with on_interrupt(lambda: kept):
            yield
    except LiveInterruptedError as exc:
        if exc.version is None:
            interrupted(f"{exc.kept}: run it again with {again}")
        resume = command_line("run", config, "--live", "--run-dir", run_dir, "--resume", sets=sets)
        interrupted(f"{exc.kept}; continue with {resume}")


@app.command(cls=Command)
@user_errors
def learner(
    config: ConfigArg = None,
    set_: SetOpt = None,
    listen: Annotated[str, typer.Option("--listen", help="HOST:PORT to serve on.")] = "127.0.0.1:8470",
    run_dir: Annotated[Path | None, typer.Option("--run-dir", help="Where to write the run.")] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the run directory's saved state.", metavar="")
    ] = False,
    nproc: NprocOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Run the learner service: samplers pull weights from it and push rollout groups (docs/deployment.md). Under
    torchrun (or with --nproc N) it is N processes: rank 0 serves, every rank trains (`parallel`)."""
    cfg = _load(config, set_)
    from heterorl.parallel.distributed import is_follower, leave_as_follower, run_as_rank

    if not is_follower():  # rank 0 (or the one process) serves: its port must be free
        _check_listen(listen)
    _under_torchrun(nproc)
    from heterorl.live.learner_node import serve_learner
    from heterorl.run.run_dir import new_run_dir

    target = run_dir or new_run_dir(name=config.stem if config else "learner")
    with _live_errors():
        summary = run_as_rank(cfg, lambda: serve_learner(cfg, listen, target, resume=resume, show_progress=not quiet))
    if is_follower():
        leave_as_follower()
    if summary is None:  # stopped by a signal, its state saved
        from heterorl.durable.state import latest_state

        state = latest_state(target / "live" / "state")
        kept = f"{target} keeps the learner's state saved at version {state.name.rsplit('-v', 1)[1]}" if state else ""
        again = command_line("learner", config, "--listen", listen, "--run-dir", target, "--resume", sets=set_)
        interrupted(f"{kept or f'{target} holds no saved state'}; continue with {again}")
    else:
        _print_summary(summary, target)


@app.command(cls=Command)
@user_errors
def sampler(
    config: ConfigArg = None,
    set_: SetOpt = None,
    connect: Annotated[
        str, typer.Option("--connect", help="The learner's URL, e.g. http://host:8470 (not needed store-only).")
    ] = "",
    index: Annotated[int, typer.Option("--index", help="Which node of cluster.samplers this is.")] = 0,
) -> None:
    """Run one sampler against a learner service and/or an object store (outbound connections only)."""
    cfg = _load(config, set_)
    from heterorl.live.sampler_node import run_sampler

    again = command_line(
        "sampler", config, *(("--connect", connect) if connect else ()), "--index", str(index), sets=set_
    )
    kept = f"the sampler stopped (the learner keeps the run; undelivered groups are lost): start it again with {again}"
    with _live_errors(connect=connect or None), on_interrupt(lambda: kept):
        run_sampler(cfg, connect or None, index, stop_on_signals=True)


@app.command(cls=Command)
@user_errors
def pretrain(
    config: ConfigArg = None,
    set_: SetOpt = None,
    out: Annotated[Path | None, typer.Option("--out", help="Checkpoint directory (default: the cache).")] = None,
    quiet: QuietOpt = False,
) -> None:
    """Supervised warm start: train until the target accuracy and save a transformers checkpoint."""
    cfg = _load(config, set_)
    from heterorl.pretrain import ensure_base_model
    from heterorl.pretrain import pretrain as do_pretrain

    again = command_line("pretrain", config, *(("--out", out) if out else ()), sets=set_)
    with on_interrupt(lambda: f"no checkpoint was written (it is saved only when complete): run {again} again"):
        result = do_pretrain(cfg, out, not quiet) if out else ensure_base_model(cfg, not quiet)
    cached = " (cached)" if result.cached else ""
    typer.echo(f"base model{cached}: {result.path}  steps={result.steps}  val_accuracy={result.val_accuracy:.1%}")


def eval_inputs(checkpoint: Path, config: Path | None) -> tuple[Path, Path | None]:
    """(checkpoint directory, config file) for `heterorl eval`: a run directory stands for its checkpoint/ and
    config.yaml; a checkpoint inside a run directory is scored with the config.yaml beside it unless --config
    says otherwise. None: no config anywhere (then the command refuses rather than guess the task)."""
    if (checkpoint / "checkpoint").is_dir() and (checkpoint / "config.yaml").is_file():
        return checkpoint / "checkpoint", config or checkpoint / "config.yaml"
    beside = checkpoint.parent / "config.yaml"
    return checkpoint, config or (beside if beside.is_file() else None)


def format_eval(metrics: dict[str, float]) -> list[str]:
    """The `eval/*` metrics beyond greedy accuracy, one line each: sampled (pass@k, maj@k), unparsable, sources."""
    lines = []
    sampled = [k for k in metrics if k.startswith(("eval/pass@", "eval/maj@"))]
    if sampled:
        lines.append("sampled: " + ", ".join(f"{k.removeprefix('eval/')} {metrics[k]:.1%}" for k in sampled))
    if "eval/unparsable" in metrics:
        lines.append(f"no readable answer: {metrics['eval/unparsable']:.1%} of greedy completions")
    per_source = {k: v for k, v in metrics.items() if k.count("/") == 2 and k.endswith("/accuracy")}
    if per_source:
        lines.append("by source: " + ", ".join(f"{k.split('/')[1]} {v:.1%}" for k, v in per_source.items()))
    return lines


@app.command("eval", cls=Command)
@user_errors
def evaluate(
    checkpoint: Annotated[Path, typer.Argument(help="A transformers checkpoint directory, or a run directory.")],
    config: Annotated[
        Path | None, typer.Option("--config", help="Config naming the task (default: the run's config.yaml).")
    ] = None,
    set_: SetOpt = None,
) -> None:
    """Held-out accuracy of a checkpoint on its run's task (greedy; pass@k and maj@k with eval.samples=k)."""
    checkpoint, config = eval_inputs(checkpoint, config)
    if not (checkpoint / "config.json").is_file():
        fail(f"{checkpoint} is not a transformers checkpoint (no config.json)", 2)
    if config is None:
        fail(
            f"no --config given and no config.yaml beside {checkpoint} (a run directory holds one): "
            "pass the config that names the task",
            2,
        )
    cfg = _load(config, set_)
    typer.echo(f"config: {config}" + (f" with {', '.join(set_)}" if set_ else ""))
    from heterorl.evaluate import evaluate as run_eval
    from heterorl.policy import Policy, SamplingParams, resolve_device
    from heterorl.tasks import make_task

    task = make_task(cfg.task, rewards=False)  # held-out accuracy is the verifier's
    policy = Policy.load(checkpoint, resolve_device(cfg.model.device), chat_template=cfg.task.chat_template)
    problems = task.eval_set()
    sampling = SamplingParams.from_config(cfg.sampler)
    with on_interrupt(lambda: "nothing was written (eval only prints): run the same command again"):
        metrics = run_eval(policy, task, problems, cfg.eval, cfg.sampler.max_new_tokens, sampling, seed=cfg.seed)
    acc = metrics["eval/accuracy"]
    typer.echo(f"{checkpoint}: held-out greedy accuracy {acc:.1%} on {len(problems)} {cfg.task.name} prompts")
    for line in format_eval(metrics):
        typer.echo(line)


@app.command(cls=Command)
@user_errors
def sweep(
    sweep_file: Annotated[Path, typer.Argument(help="Sweep YAML: base, name, grid, zip, seeds, set, workers.")],
    workers: Annotated[int | None, typer.Option("--workers", "-j", help="Parallel runs (default: the file's).")] = None,
    quiet: QuietOpt = False,
) -> None:
    """Run a grid of configs x seeds as run directories (resumable: finished runs are skipped; in parallel)."""
    from heterorl.sweep import sweep_command

    def kept() -> str:
        again = command_line("sweep", sweep_file, *(("--workers", workers) if workers else ()))
        return f"finished runs keep their directories (summary.json); run {again} again to run only the rest"

    with on_interrupt(kept):
        code = sweep_command(sweep_file, workers, quiet)
    raise typer.Exit(code)


@app.command(cls=Command)
@user_errors
def report(
    run_dirs: Annotated[list[Path], typer.Argument(help="Run directories or a sweep's output directory.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where report.md and the PNGs go.")] = Path("report"),
    baseline: Annotated[
        str | None, typer.Option("--baseline", help="Reference group KEY=VALUE, e.g. cluster.mode=sync.")
    ] = None,
    group_by: Annotated[
        str | None, typer.Option("--group-by", help="Comma-separated keys (default: all that differ but seed).")
    ] = None,
) -> None:
    """Tables and figures comparing runs, grouped over seeds (accuracy, reward, KL and IS variance vs staleness,
    staleness histograms, weight traffic)."""
    from heterorl.report import report_command

    with on_interrupt(lambda: f"{out} may hold part of the report: run the same command again"):
        report_command(run_dirs, out, baseline, group_by)


@app.command(cls=Command)
def calibrate(
    run_dir: Annotated[Path, typer.Argument(help="A live run's directory (`heterorl run --live`).")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="The simulator config to write (RUN_DIR/calibrated.yaml).")
    ] = None,
) -> None:
    """A simulator config from a live run's own records: sampler speeds, the learner's cost per step and per token,
    link delays and rates, start-up delays; prints each with its count and 95% interval."""
    from heterorl.calibrate import calibrate_command

    calibrate_command(run_dir, out)


sync_app = typer.Typer(
    cls=Group, no_args_is_help=True, help="PULSE weight sync: benchmark the codec, inspect a run's traffic."
)
app.add_typer(sync_app, name="sync")


@sync_app.command("bench", cls=Command)
@user_errors
def sync_bench(
    params: Annotated[float, typer.Option(help="Synthetic model size in parameters (e.g. 1e9).")] = 1e8,
    lr: Annotated[float, typer.Option(help="Learning rate of the step (synthetic: lr * sign(g)).")] = 1e-6,
    change_rate: Annotated[float | None, typer.Option(help="Instead: share of bf16 elements moved by 1 ULP.")] = None,
    step: Annotated[
        str, typer.Option(help="synthetic | noise (masters - lr * N(0,1)) | qwen3 (real AdamW, ~90M) | demo (real RL).")
    ] = "synthetic",
    run: Annotated[Path | None, typer.Option(help="Also compare a run's base model with its final checkpoint.")] = None,
    base: Annotated[Path | None, typer.Option(help="Compare two checkpoints: the base ...")] = None,
    new: Annotated[Path | None, typer.Option(help="... and the new one (files or directories).")] = None,
    level: Annotated[int, typer.Option(help="zstd level.")] = 1,
    workers: Annotated[int, typer.Option(help="Threads for encode and decode.")] = 1,
    seed: int = 0,
) -> None:
    """Both patch formats side by side ("pulse" v1 and "pulse-ctx" v2): bytes per changed element, ratios vs
    full bf16, zstd-1 of full bf16 and the reference layout, the step's entropy bounds, and encode / checked
    decode GB/s, all measured in this invocation."""
    import json

    from heterorl.bench.pulse import compare_checkpoints, run_sync_bench
    from heterorl.bench.steps import STEPS

    if (base is None) != (new is None):
        fail("--base and --new go together", 2)
    if step not in STEPS:
        fail(f"--step must be one of {', '.join(STEPS)}", 2)
    if not 1e3 <= params <= 1e11:
        fail(f"--params {params:g}: give a model size between 1e3 and 1e11 parameters", 2)
    what = f"change rate {change_rate}" if change_rate and step == "synthetic" else f"lr {lr}"
    size = f"{params:.3g} parameters, " if step in ("synthetic", "noise") else ""
    typer.echo(f"{step} step: {size}" + ("the demo's own lr" if step == "demo" else what))
    pairs = []
    if run is not None:
        if not (run / "summary.json").is_file():
            fail(f"--run {run}: no summary.json there (not a finished run directory)", 2)
        summary = json.loads((run / "summary.json").read_text())
        pairs.append((Path(summary["base_model"]), run / "checkpoint"))
    if base is not None and new is not None:
        pairs.append((base, new))
    with on_interrupt(lambda: "nothing was written (the bench only prints): run it again, smaller with --params"):
        run_sync_bench(int(params), change_rate, lr, seed, level=level, workers=workers, step=step)
        for a, b in pairs:
            typer.echo(f"\ncheckpoints: {a} -> {b}")
            compare_checkpoints(a, b, level=level, workers=workers)


@sync_app.command("inspect", cls=Command)
@user_errors
def sync_inspect(run_dir: Annotated[Path, typer.Argument(help="A run directory.")]) -> None:
    """Per-version sparsity and weight traffic of a run (from its metrics.jsonl; version 0, the initial
    snapshot, is left out)."""
    from rich.table import Table

    from heterorl.console import out
    from heterorl.metrics import read_metrics

    if not (run_dir / "metrics.jsonl").is_file():
        what = "does not exist" if not run_dir.exists() else "has no metrics.jsonl (not a run directory)"
        fail(f"{run_dir} {what}", 2)
    try:
        records = read_metrics(run_dir / "metrics.jsonl")
    except (ValueError, UnicodeDecodeError) as exc:
        fail(f"{run_dir / 'metrics.jsonl'} is not JSON lines ({exc})", 2)
    steps = [r for r in records if r.get("kind") == "train" and "sync/bytes" in r and r["sync/version"] > 0]
    if not steps:
        fail(f"{run_dir} has no weight-sync records", 2)
    table = Table(title=f"weight sync of {run_dir}")
    for col in ("version", "changed share", "bytes sent", "full bytes", "ratio"):
        table.add_column(col, justify="right")
    for r in steps:
        ratio = r["sync/full_bytes"] / max(r["sync/bytes"], 1)
        table.add_row(
            str(int(r["sync/version"])),
            f"{r['sync/changed_share']:.4%}",
            f"{r['sync/bytes']:,.0f}",
            f"{r['sync/full_bytes']:,.0f}",
            f"{ratio:.1f}x",
        )
    sent, full = sum(r["sync/bytes"] for r in steps), sum(r["sync/full_bytes"] for r in steps)
    shares = [r["sync/changed_share"] for r in steps]
    out.print(table)
    out.print(
        f"total {sent / 1e6:.3f} MB sent vs {full / 1e6:.3f} MB of full weights ({full / max(sent, 1):.1f}x less); "
        f"changed share per version: mean {sum(shares) / len(shares):.4%}, max {max(shares):.4%}"
    )


keys_app = typer.Typer(
    cls=Group, add_completion=False, no_args_is_help=True, help="Key pairs and sampler credentials (trust)."
)
app.add_typer(keys_app, name="keys")
CredentialsOpt = Annotated[
    Path, typer.Option("--credentials", help="The learner's credentials file (`trust.credentials`).")
]


@keys_app.command("new", cls=Command)
@user_errors
def keys_new(
    directory: Annotated[Path, typer.Argument(help="Where to write learner.key (mode 600) and learner.pub.")],
) -> None:
    """A new learner key pair: the learner signs every published version with it, samplers check with its public
    half (`trust.learner_private_key`, `trust.learner_public_key`). One pair per run."""
    from heterorl.weights.signing import write_keypair

    private, public = write_keypair(directory)
    typer.echo(f"learner key: {private} (keep it on the learner, mode 600)")
    typer.echo(f"public key:  {public} (copy it to every sampler: trust.learner_public_key)")


@keys_app.command("sampler", cls=Command)
@user_errors
def keys_sampler(
    name: Annotated[str, typer.Argument(help="The sampler's name in cluster.samplers.")],
    credentials: CredentialsOpt,
    out: Annotated[
        Path, typer.Option("--out", help="Write the sampler's token (or key) here (mode 600); it is not shown.")
    ],
    ed25519: Annotated[
        bool,
        typer.Option("--ed25519", help="An Ed25519 key pair instead of a token: what store uploads are signed with."),
    ] = False,
) -> None:
    """Give sampler NAME its own credential: a fresh token (live.token_file) or, with --ed25519, a private key
    (trust.sampler_private_key) written to --out for that sampler alone; its SHA-256 or public key goes into the
    credentials file (replacing any credential NAME had). A running learner picks it up at once."""
    import os

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from heterorl.transport.identity import add_sampler

    if out.exists():
        raise typer.BadParameter(f"{out} exists; refusing to overwrite a credential")
    key = Ed25519PrivateKey.generate() if ed25519 else None
    token = add_sampler(credentials, name, key=key)
    if key is not None:
        text = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
    else:
        assert token is not None
        text = token + "\n"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    what = "key" if key is not None else "token"
    typer.echo(f"{name}: {what} written to {out}; its {'public key' if key else 'hash'} is in {credentials}")


@keys_app.command("revoke", cls=Command)
@user_errors
def keys_revoke(
    name: Annotated[str, typer.Argument(help="The sampler to refuse from now on.")],
    credentials: CredentialsOpt,
) -> None:
    """Revoke sampler NAME's credential: a running learner refuses it from its next request on, the others go on."""
    from heterorl.transport.identity import revoke_sampler

    revoke_sampler(credentials, name)
    typer.echo(f"{name}: revoked in {credentials}")


lab_app = typer.Typer(
    cls=Group, no_args_is_help=True, help="WAN lab: samplers' links shaped for real between network namespaces (root)."
)
app.add_typer(lab_app, name="lab")


@lab_app.command("ping", cls=Command)
@user_errors
def lab_ping(
    config: ConfigArg = None,
    overrides: SetOpt = None,
    seconds: Annotated[
        float, typer.Option(min=0.5, max=600.0, help="Length of each bulk transfer at the link's rate (s).")
    ] = 3.0,
    pings: Annotated[int, typer.Option(min=1, max=10_000, help="Round trips measured per link.")] = 10,
) -> None:
    """Each sampler link of the config, shaped in a WAN lab: round trip (1-byte pings on a TCP connection) and
    steady rates (bulk upload and download, second half of the bytes) measured through real TCP, beside the
    configured values (docs/wan-lab.md)."""
    import os

    from rich.table import Table

    from heterorl.console import console, out
    from heterorl.lab import LabError, WanLab
    from heterorl.lab.ping import configured_rtt, measure_link, start_probe_server

    cfg = _load(config, overrides)
    links = [node.link for node in cfg.cluster.samplers]
    for i, link in enumerate(links):
        median = configured_rtt(link, n=1000)[0]
        if median > MAX_PING_RTT_S:
            fail(
                f"cluster.samplers.{i}.link has a median round trip of {median:.0f} s; `lab ping` measures links up "
                f"to {MAX_PING_RTT_S:.0f} s (set shorter delays with --set)",
                2,
            )
    table = Table(title="WAN lab links: configured vs measured through TCP")
    for col in ("sampler", "RTT cfg p50/p90", "RTT measured p50/p90", "up cfg/measured", "down cfg/measured", "retx"):
        table.add_column(col, justify="right")
    measured = "nothing was kept (lab ping only prints; its namespaces were removed): run it again"
    try:
        with on_interrupt(lambda: measured), WanLab(links, seed=cfg.seed) as lab:
            start_probe_server(lab)
            before = lab.stats()["cpu_s"]
            names = cfg.cluster.sampler_names()
            for i, node in enumerate(cfg.cluster.samplers):
                console.print(f"measuring link {i} ({names[i]}) ...")
                m = measure_link(lab, i, seconds=seconds, pings=pings)
                p50, p90 = configured_rtt(node.link)
                rates = [node.link.bandwidth_of(p) for p in ("rollout", "weights")]
                cfg_rtt = "trace" if node.link.trace else f"{p50 * 1e3:.1f}/{p90 * 1e3:.1f} ms"
                table.add_row(
                    names[i],
                    cfg_rtt,
                    f"{m.rtt_median * 1e3:.1f}/{m.rtt_p90 * 1e3:.1f} ms",
                    f"{_mbps(rates[0])}/{m.upload_mbps:.2f}",
                    f"{_mbps(rates[1])}/{m.download_mbps:.2f}",
                    str(m.retransmitted),
                )
            stats = lab.stats()
    except LabError as exc:
        fail(str(exc))
    out.print(table)
    out.print(
        f"rates in payload Mbit/s (1448 of 1500 bytes); router CPU {stats['cpu_s'] - before:.2f} s over "
        f"{stats['elapsed_s']:.1f} s, latest write {stats['late_max_s'] * 1e3:.1f} ms late; "
        f"load {os.getloadavg()[0]:.2f}"
    )


MAX_PING_RTT_S = 30.0  # `lab ping` sends ~20 round trips per link; beyond this it would take many minutes


def _mbps(rate: float | None) -> str:
    return "unlimited" if rate is None else f"{rate:g}"


@lab_app.command("clean", cls=Command)
def lab_clean() -> None:
    """Delete network namespaces left behind by labs that were killed outright (their process is gone)."""
    from heterorl.lab import LabError
    from heterorl.lab.netns import check_host, remove_stale

    try:
        check_host()
    except LabError as exc:
        fail(str(exc))
    removed = remove_stale()
    typer.echo(f"removed {len(removed)} namespace(s)" + (f": {', '.join(removed)}" if removed else ""))


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
