"""The `heterorl` command. Thin: parse the config, then import the heavy modules lazily (`--help` is instant)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from heterorl.config import ConfigError, load_config

app = typer.Typer(add_completion=False, no_args_is_help=True, help="RL post-training across slow, unequal networks.")

ConfigArg = Annotated[Path | None, typer.Argument(help="YAML run config (defaults apply when omitted).")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", "-s", help="Override: dotted.key=value (repeatable).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")]


def _load(config: Path | None, overrides: list[str] | None):
    try:
        return load_config(config, overrides or [])
    except ConfigError as exc:
        typer.secho(str(exc), fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None


def _print_summary(summary: dict[str, Any], run_dir: Path) -> None:
    from rich.table import Table

    from heterorl.console import console

    table = Table(title="heterorl run", show_header=False, title_justify="left")
    acc0, acc1 = summary["accuracy_initial"], summary["accuracy_final"]
    table.add_row("held-out accuracy", f"{acc0:.1%} -> {acc1:.1%}  ({(acc1 - acc0) * 100:+.1f} points)")
    table.add_row("reward", f"{summary['reward_first']:.3f} -> {summary['reward_last']:.3f}")
    table.add_row("learner steps", f"{summary['steps']}  ({summary['objective']}, {summary['mode']} mode)")
    table.add_row("clock time", f"{summary['clock_seconds']:.0f} s ({summary.get('clock', 'virtual')})")
    table.add_row("staleness", f"mean {summary['staleness_mean']:.2f}, max {summary['staleness_max']} steps")
    table.add_row("groups dropped", str(summary["groups_dropped"]))
    table.add_row("throughput", f"{summary['tokens_per_clock_second']:.0f} tokens / clock s")
    idle = ", ".join(f"{k} {v:.0%}" for k, v in summary["sampler_idle"].items())
    table.add_row("idle", f"learner {summary['learner_idle']:.0%}; samplers {idle}")
    if summary["weight_bytes_full"]:
        ratio = summary["weight_bytes_full"] / max(summary["weight_bytes_sent"], 1)
        table.add_row("weight traffic", f"{summary['weight_bytes_sent'] / 1e6:.2f} MB ({ratio:.1f}x less than full)")
    table.add_row("wall time", f"{summary['wall_seconds']:.1f} s (RL {summary['rl_wall_seconds']:.1f} s)")
    table.add_row("run directory", str(run_dir))
    console.print(table)


@contextmanager
def _live_errors() -> Iterator[None]:
    """Failures a user can act on (live setup, token, unreachable learner, a diverged learner) print in red and
    exit 1."""
    from heterorl.live.launcher import LiveRunError
    from heterorl.live.preflight import LiveSetupError
    from heterorl.loop.learner_loop import TrainingDivergedError
    from heterorl.transport.http.auth import TokenError
    from heterorl.transport.http.client import AuthError, LearnerUnreachableError

    user_errors = (LiveSetupError, TokenError, LiveRunError, LearnerUnreachableError, AuthError, TrainingDivergedError)
    try:
        yield
    except (*user_errors, ConfigError) as exc:
        typer.secho(f"{type(exc).__name__}: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from None


@app.command()
def run(
    config: ConfigArg = None,
    set_: SetOpt = None,
    run_dir: Annotated[Path | None, typer.Option("--run-dir", help="Where to write the run.")] = None,
    live: Annotated[
        bool, typer.Option("--live", help="Learner and samplers as local processes over HTTP, real clocks.")
    ] = False,
    quiet: QuietOpt = False,
) -> None:
    """Post-train a model with RL on the simulated cluster (or, with --live, on local processes) and write a run
    directory."""
    cfg = _load(config, set_)
    from heterorl.loop.run_dir import new_run_dir
    from heterorl.run import execute

    target = run_dir or new_run_dir(name=config.stem if config else "run")
    if live:
        from heterorl.live.launcher import run_live

        with _live_errors():
            summary = run_live(cfg, target, show_progress=not quiet)
    else:
        with _live_errors():
            summary = execute(cfg, target, show_progress=not quiet)
    _print_summary(summary, target)


@app.command()
def learner(
    config: ConfigArg = None,
    set_: SetOpt = None,
    listen: Annotated[str, typer.Option("--listen", help="HOST:PORT to serve on.")] = "127.0.0.1:8470",
    run_dir: Annotated[Path | None, typer.Option("--run-dir", help="Where to write the run.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the run directory's saved state.")] = False,
    quiet: QuietOpt = False,
) -> None:
    """Run the learner service: samplers pull weights from it and push rollout groups (docs/deployment.md)."""
    cfg = _load(config, set_)
    from heterorl.live.learner_node import serve_learner
    from heterorl.loop.run_dir import new_run_dir

    target = run_dir or new_run_dir(name=config.stem if config else "learner")
    with _live_errors():
        summary = serve_learner(cfg, listen, target, resume=resume, show_progress=not quiet)
    if summary is None:
        typer.echo(f"stopped; continue with: heterorl learner ... --run-dir {target} --resume")
    else:
        _print_summary(summary, target)


@app.command()
def sampler(
    config: ConfigArg = None,
    set_: SetOpt = None,
    connect: Annotated[str, typer.Option("--connect", help="The learner's URL, e.g. http://host:8470.")] = "",
    index: Annotated[int, typer.Option("--index", help="Which node of cluster.samplers this is.")] = 0,
) -> None:
    """Run one sampler against a learner service (outbound connections only); prints its event log."""
    if not connect:
        raise typer.BadParameter("--connect URL is required")
    cfg = _load(config, set_)
    from heterorl.live.sampler_node import run_sampler

    with _live_errors():
        run_sampler(cfg, connect, index)


@app.command()
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

    result = do_pretrain(cfg, out, not quiet) if out else ensure_base_model(cfg, not quiet)
    cached = " (cached)" if result.cached else ""
    typer.echo(f"base model{cached}: {result.path}  steps={result.steps}  val_accuracy={result.val_accuracy:.1%}")


@app.command("eval")
def evaluate(
    checkpoint: Annotated[Path, typer.Argument(help="A transformers checkpoint directory.")],
    config: Annotated[Path | None, typer.Option("--config", help="Config naming the task.")] = None,
    set_: SetOpt = None,
) -> None:
    """Held-out greedy accuracy of a checkpoint on the config's task."""
    cfg = _load(config, set_)
    from heterorl.evaluate import greedy_accuracy
    from heterorl.policy import Policy
    from heterorl.tasks import make_task

    task = make_task(cfg.task)
    policy = Policy.load(checkpoint)
    acc = greedy_accuracy(policy, task, task.eval_set(), cfg.sampler.max_new_tokens)
    typer.echo(f"{checkpoint}: held-out greedy accuracy {acc:.1%} on {len(task.eval_set())} {cfg.task.name} prompts")


@app.command()
def sweep(
    sweep_file: Annotated[Path, typer.Argument(help="Sweep YAML: base, name, grid, zip, seeds, set, workers.")],
    workers: Annotated[int | None, typer.Option("--workers", "-j", help="Parallel runs (default: the file's).")] = None,
    quiet: QuietOpt = False,
) -> None:
    """Run a grid of configs x seeds as run directories (resumable: finished runs are skipped; in parallel)."""
    from heterorl.sweep import sweep_command

    raise typer.Exit(sweep_command(sweep_file, workers, quiet))


@app.command()
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

    report_command(run_dirs, out, baseline, group_by)


sync_app = typer.Typer(no_args_is_help=True, help="PULSE weight sync: benchmark the codec, inspect a run's traffic.")
app.add_typer(sync_app, name="sync")


@sync_app.command("bench")
def sync_bench(
    params: Annotated[float, typer.Option(help="Synthetic model size in parameters (e.g. 1e9).")] = 1e8,
    lr: Annotated[float, typer.Option(help="Step size of the synthetic lr * sign(g) update.")] = 1e-6,
    change_rate: Annotated[float | None, typer.Option(help="Instead: share of bf16 elements moved by 1 ULP.")] = None,
    run: Annotated[Path | None, typer.Option(help="Also compare a run's base model with its final checkpoint.")] = None,
    base: Annotated[Path | None, typer.Option(help="Compare two checkpoints: the base ...")] = None,
    new: Annotated[Path | None, typer.Option(help="... and the new one (files or directories).")] = None,
    level: Annotated[int, typer.Option(help="zstd level.")] = 1,
    seed: int = 0,
) -> None:
    """Patch size (bytes per changed element; ratios vs full bf16, zstd-1 of full bf16 and the reference
    layout) and encode / decode GB/s, all measured in this invocation."""
    import json

    from heterorl.weights.bench import compare_checkpoints, run_sync_bench

    if (base is None) != (new is None):
        raise typer.BadParameter("--base and --new go together")
    typer.echo(
        f"synthetic step: {params:.3g} parameters, " + (f"change rate {change_rate}" if change_rate else f"lr {lr}")
    )
    run_sync_bench(int(params), change_rate, lr, seed, level=level)
    pairs = []
    if run is not None:
        summary = json.loads((run / "summary.json").read_text())
        pairs.append((Path(summary["base_model"]), run / "checkpoint"))
    if base is not None and new is not None:
        pairs.append((base, new))
    for a, b in pairs:
        typer.echo(f"\ncheckpoints: {a} -> {b}")
        compare_checkpoints(a, b, level=level)


@sync_app.command("inspect")
def sync_inspect(run_dir: Annotated[Path, typer.Argument(help="A run directory.")]) -> None:
    """Per-version sparsity and weight traffic of a run (from its metrics.jsonl; version 0, the initial
    snapshot, is left out)."""
    from rich.table import Table

    from heterorl.console import console
    from heterorl.metrics import read_metrics

    records = read_metrics(run_dir / "metrics.jsonl")
    steps = [r for r in records if r.get("kind") == "train" and "sync/bytes" in r and r["sync/version"] > 0]
    if not steps:
        raise typer.BadParameter(f"{run_dir} has no weight-sync records")
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
    console.print(table)
    console.print(
        f"total {sent / 1e6:.3f} MB sent vs {full / 1e6:.3f} MB of full weights ({full / max(sent, 1):.1f}x less); "
        f"changed share per version: mean {sum(shares) / len(shares):.4%}, max {max(shares):.4%}"
    )


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
