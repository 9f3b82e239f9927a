"""Parameter sweeps: a grid of run configs, each run as an ordinary run directory, resumable and in parallel.

A sweep file names a base run config and the keys to vary (dotted keys, as for `heterorl run --set`):

    base: ../configs/smoke.yaml        # a run config, relative to this sweep file
    name: staleness
    out: runs/staleness                # default runs/<name>; a relative path is taken from the current directory
    grid:                              # cartesian product
      objective.name: [grpo, gepo]
      cluster.max_staleness: [2, 8]
    zip:                               # equal-length lists varied together (one row per point)
      cluster.samplers.0.link.weights_delay: [{kind: fixed, seconds: 0}, {kind: weibull}]
      cluster.eta: [0, 4]
    seeds: [0, 1, 2]
    set: [cluster.mode=async]          # fixed overrides, applied before each point's own
    workers: 2                         # parallel processes

Every point (grid x zip rows x seeds) becomes `out/<run name>`; the name is built from the point's keys and
values only, so it is stable across invocations and a rerun skips every run whose summary.json exists.
All configs are validated before anything runs. `out/sweep.json` records the expanded grid and each run's status.

This module does not import torch: the runner imports `heterorl.simulated.run` inside the worker process.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from multiprocessing import get_context
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from heterorl.config import ConfigError, RunConfig, load_config, parse_override, read_yaml_mapping
from heterorl.naming import short_keys

Runner = Callable[[RunConfig, Path], object]
"""Trains one config into one run directory and writes its summary.json (the default is `execute_run`)."""

Status = Literal["pending", "done", "skipped", "failed"]
SAFE_CHARS = re.compile(r"[^A-Za-z0-9._+-]+")
MAX_ERRORS_SHOWN = 5  # invalid points listed in full; usually they all fail for the same reason
MAX_NAME = 120  # run directory names (and group names) beyond this keep a prefix and a hash of the point
MAX_SLUG = 40  # longer (or lossy) value slugs are cut and suffixed with a hash, keeping names under path limits


class SweepError(ValueError):
    """The sweep file, one of its points, or the state of its output directory is invalid."""


class SweepFile(BaseModel):
    """The sweep file as written (paths unresolved). Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    base: Path = Field(description="Run config the points override, relative to the sweep file.")
    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]*$", max_length=80, description="Sweep name (a directory name)."
    )
    out: Path | None = Field(None, description="Output directory; default runs/<name>.")
    grid: dict[str, Annotated[list[Any], Field(min_length=1)]] = Field(
        default_factory=dict, description="dotted.key -> values; the cartesian product of all keys is run."
    )
    zip_: dict[str, Annotated[list[Any], Field(min_length=1)]] = Field(
        default_factory=dict, alias="zip", description="dotted.key -> values; equal lengths, varied together."
    )
    seeds: list[Annotated[int, Field(ge=0)]] = Field(default_factory=lambda: [0], min_length=1, description="Seeds.")
    set_: list[str] = Field(default_factory=list, alias="set", description="Fixed overrides: dotted.key=value.")
    workers: int = Field(1, ge=1, le=256, description="Parallel worker processes.")

    @field_validator("seeds")
    @classmethod
    def _unique_seeds(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds must be distinct, got {seeds}")
        return seeds

    @field_validator("set_")
    @classmethod
    def _overrides_parse(cls, items: list[str]) -> list[str]:
        for item in items:
            try:
                parse_override(item)
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        return items

    @field_validator("grid", "zip_")
    @classmethod
    def _keys_and_values(cls, table: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key in table:
            if not key or any(not part for part in key.split(".")):
                raise ValueError(f"{key!r} is not a dotted key")
            if key == "seed":
                raise ValueError("vary the seed with `seeds`, not as a key")
        return table

    @field_validator("grid")
    @classmethod
    def _distinct_values(cls, table: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in table.items():
            canonical = [_canonical(v) for v in values]
            if len(set(canonical)) != len(canonical):
                raise ValueError(f"{key}: values must be distinct, got {values}")
        return table

    @model_validator(mode="after")
    def _consistent(self) -> SweepFile:
        lengths = {key: len(values) for key, values in self.zip_.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"zip lists must have equal lengths, got {lengths}")
        rows = [tuple(_canonical(v[i]) for v in self.zip_.values()) for i in range(next(iter(lengths.values()), 0))]
        if len(set(rows)) != len(rows):  # a key may repeat values across rows; whole rows must differ
            raise ValueError("zip rows must be distinct")
        fixed = {".".join(parse_override(item)[0]) for item in self.set_}
        if both := sorted(self.grid.keys() & self.zip_.keys()):
            raise ValueError(f"{both} are in both grid and zip")
        if fixed_too := sorted((self.grid.keys() | self.zip_.keys()) & fixed):
            raise ValueError(f"{fixed_too} are varied by the sweep and also fixed in `set`")
        if "seed" in fixed:
            raise ValueError("set: vary the seed with `seeds`, not in `set`")
        return self


@dataclass(frozen=True)
class Sweep:
    """A loaded sweep: the file's content with `base` and `out` resolved."""

    spec: SweepFile
    path: Path
    base: Path
    out: Path


@dataclass(frozen=True)
class RunSpec:
    """One point of the sweep: where it runs and which overrides (fixed ones first) produce its config."""

    name: str
    group: str  # the name without the seed: runs of one group differ only by seed
    point: dict[str, Any]  # dotted key -> value, seed included
    overrides: tuple[str, ...]
    run_dir: Path


@dataclass
class RunOutcome:
    spec: RunSpec
    status: Status
    seconds: float | None = None
    error: str | None = None
    traceback: str | None = None


OUTCOME_FIELDS = ("status", "seconds", "error", "traceback")


@dataclass
class SweepResult:
    sweep: Sweep
    outcomes: list[RunOutcome] = field(default_factory=list)

    @property
    def failed(self) -> list[RunOutcome]:
        return [o for o in self.outcomes if o.status == "failed"]

    @property
    def sweep_json(self) -> Path:
        return self.sweep.out / "sweep.json"


# --- loading and expansion
def load_sweep(path: str | Path) -> Sweep:
    """Parse and validate a sweep file; errors name the field."""
    path = Path(path)
    data = read_yaml_mapping(path, SweepError)
    try:
        spec = SweepFile.model_validate(data)
    except ValidationError as exc:
        lines = [f"  {'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors()]
        raise SweepError(f"invalid sweep file {path}:\n" + "\n".join(lines)) from None
    base = spec.base if spec.base.is_absolute() else path.parent / spec.base
    out = spec.out if spec.out is not None else Path("runs") / spec.name
    return Sweep(spec=spec, path=path, base=base.resolve(), out=out.resolve())


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _slug(value: Any) -> str:
    """A filesystem-safe rendering of a value; a lossy or long one gets a hash so distinct values stay distinct.

    A mapping (a delay model, say) renders its discriminator first: `{kind: weibull, upper: 900}` ->
    `weibull_upper900~<hash>`; the hash is always added there because the rendering drops the keys' syntax.
    """
    if isinstance(value, bool) or value is None:
        text = json.dumps(value)
    elif isinstance(value, dict):
        tag = [str(value[k]) for k in ("kind", "name") if k in value]
        rest = [f"{k}{_slug(v)}" for k, v in sorted(value.items()) if k not in ("kind", "name")]
        text = "{" + "_".join(tag + rest) + "}"
    elif isinstance(value, list):
        text = json.dumps(value, separators=(",", ":"), default=str)
    else:
        text = str(value)
    slug = SAFE_CHARS.sub("_", text).strip("_") or "_"
    if slug != text or len(slug) > MAX_SLUG:
        digest = hashlib.sha1(_canonical(value).encode()).hexdigest()[:8]
        slug = f"{slug[:MAX_SLUG]}~{digest}"
    return slug


def point_name(point: dict[str, Any], keys: dict[str, str] | None = None) -> str:
    """`{objective.name: gepo, cluster.max_staleness: 8, seed: 1}` -> `objective.name-gepo__max_staleness-8__seed-1`
    (keys in sweep order, shortened by `short_keys`)."""
    keys = keys or short_keys(list(point))
    parts = (f"{SAFE_CHARS.sub('_', keys[key])}-{_slug(value)}" for key, value in point.items())
    name = "__".join(parts) or "base"
    if len(name) <= MAX_NAME:
        return name
    # filesystems cap names at 255 bytes: keep a readable prefix and the seed, identify the point by a hash
    digest = hashlib.sha256(json.dumps(point, sort_keys=True, default=str).encode()).hexdigest()[:10]
    seed = f"__seed-{point['seed']}" if "seed" in point else ""
    return f"{name[: MAX_NAME - len(seed) - 12]}~{digest}{seed}"


def expand(sweep: Sweep) -> list[RunSpec]:
    """Every point of the sweep: grid product x zip rows x seeds, the seed varying fastest (groups stay adjacent)."""
    spec = sweep.spec
    zip_rows = list(zip(*spec.zip_.values(), strict=True)) or [()]
    keys = short_keys([*spec.grid, *spec.zip_, "seed"])
    runs = []
    for combo in itertools.product(*spec.grid.values()):
        for row in zip_rows:
            varied = {**dict(zip(spec.grid, combo, strict=True)), **dict(zip(spec.zip_, row, strict=True))}
            for seed in spec.seeds:
                point = {**varied, "seed": seed}
                name = point_name(point, keys)
                overrides = (*spec.set_, *(f"{key}={_canonical(value)}" for key, value in point.items()))
                runs.append(RunSpec(name, point_name(varied, keys), point, overrides, sweep.out / name))
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        duplicates = sorted({n for n in names if names.count(n) > 1})
        raise SweepError(f"run names collide (values that print the same?): {duplicates}")
    return runs


def resolve_configs(sweep: Sweep, runs: list[RunSpec]) -> list[RunConfig]:
    """Validate every point's config before anything runs; one error lists every invalid run by name."""
    configs, errors = [], []
    for run in runs:
        try:
            configs.append(load_config(sweep.base, list(run.overrides)))
        except ConfigError as exc:
            errors.append(f"{run.name}: {exc}")
    if errors:
        shown = errors[:MAX_ERRORS_SHOWN]
        if len(errors) > len(shown):
            shown.append(f"... and {len(errors) - len(shown)} more")
        raise SweepError(f"{len(errors)} of {len(runs)} sweep points are invalid:\n" + "\n".join(shown))
    return configs


def _check_finished(run: RunSpec, cfg: RunConfig) -> None:
    """A finished run is only reused if it ran this very config (the base config may have changed since)."""
    try:
        existing = load_config(run.run_dir / "config.yaml")
    except ConfigError as exc:
        raise SweepError(f"{run.run_dir} is finished but its config.yaml does not load: {exc}") from None
    if existing != cfg:
        raise SweepError(
            f"{run.run_dir} is finished but was run with a different config; delete it or choose another `out`"
        )


# --- running
def _limit_threads(n: int) -> None:
    """Worker processes share the machine's cores: one intra-op thread each avoids oversubscription."""
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(n)
    if "torch" in sys.modules:  # already imported: the environment variables are read only at import
        sys.modules["torch"].set_num_threads(n)


def execute_run(cfg: RunConfig, run_dir: Path) -> None:
    """The default runner: `heterorl.simulated.run.execute`, imported here so that the sweep module stays torch-free."""
    from heterorl.simulated.run import execute

    execute(cfg, run_dir, show_progress=False, overwrite=True)  # a point without summary.json starts over


def _run_one(runner: Runner, cfg: RunConfig, run_dir: Path) -> float:
    """Run one point (in a worker or inline); the wall seconds it took."""
    start = time.monotonic()
    runner(cfg, run_dir)
    if not (run_dir / "summary.json").is_file():
        raise RuntimeError(f"the runner returned without writing {run_dir / 'summary.json'}")
    return time.monotonic() - start


def _failure(run: RunSpec, exc: BaseException) -> RunOutcome:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return RunOutcome(run, "failed", error=f"{type(exc).__name__}: {exc}", traceback=text)


def _execute(jobs: list[tuple[RunSpec, RunConfig]], workers: int, runner: Runner) -> Iterator[RunOutcome]:
    """Run the jobs, yielding each outcome as it finishes. A failing run must not stop the others, so every
    exception a run raises is caught and recorded (KeyboardInterrupt is not an Exception and still stops all)."""
    if workers == 1:
        for run, cfg in jobs:
            try:
                yield RunOutcome(run, "done", seconds=_run_one(runner, cfg, run.run_dir))
            except Exception as exc:
                yield _failure(run, exc)
        return
    context = get_context("spawn")  # fork would copy the parent's torch/thread state into the children
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_limit_threads, initargs=(1,))
    try:
        futures = {pool.submit(_run_one, runner, cfg, run.run_dir): run for run, cfg in jobs}
        for future in as_completed(futures):
            run = futures[future]
            try:
                yield RunOutcome(run, "done", seconds=future.result())
            except Exception as exc:
                yield _failure(run, exc)
    except KeyboardInterrupt:  # Ctrl-C, or a SIGTERM the CLI turned into one: the running runs end now too
        for process in list(getattr(pool, "_processes", {}).values()):  # Python 3.14: pool.terminate_workers()
            process.terminate()
        raise
    finally:  # on Ctrl-C, queued runs must not start (a plain `with` would wait for all of them)
        pool.shutdown(wait=True, cancel_futures=True)


def _write_record(sweep: Sweep, outcomes: dict[str, RunOutcome]) -> None:
    """sweep.json: the expanded grid, run directories and statuses; rewritten atomically after every run."""
    record = {
        "name": sweep.spec.name,
        "sweep_file": str(sweep.path.resolve()),
        "base": str(sweep.base),
        "out": str(sweep.out),
        "definition": sweep.spec.model_dump(mode="json", by_alias=True),
        "updated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "runs": [{**asdict(o.spec), **{k: getattr(o, k) for k in OUTCOME_FIELDS}} for o in outcomes.values()],
    }
    sweep.out.mkdir(parents=True, exist_ok=True)
    tmp = sweep.out / "sweep.json.tmp"
    tmp.write_text(json.dumps(record, indent=2, default=str))
    tmp.replace(sweep.out / "sweep.json")


def run_sweep(
    sweep_path: str | Path,
    workers: int | None = None,
    show_progress: bool = True,
    runner: Runner = execute_run,
) -> SweepResult:
    """Run every point of a sweep that has not finished yet; `workers` overrides the file's value.

    Raises SweepError (before anything runs) if a point's config is invalid or a finished run directory holds
    a different config. Failing runs are recorded in the result and sweep.json; the others continue.
    """
    from heterorl.console import console, progress_bar

    sweep = load_sweep(sweep_path)
    runs = expand(sweep)
    configs = resolve_configs(sweep, runs)
    outcomes: dict[str, RunOutcome] = {}
    jobs = []
    for run, cfg in zip(runs, configs, strict=True):
        if (run.run_dir / "summary.json").is_file():
            _check_finished(run, cfg)
            outcomes[run.name] = RunOutcome(run, "skipped")
        else:
            outcomes[run.name] = RunOutcome(run, "pending")
            jobs.append((run, cfg))
    for run, _ in jobs:
        if run.run_dir.exists():  # a run interrupted earlier: start it again from scratch
            shutil.rmtree(run.run_dir)
    _write_record(sweep, outcomes)
    n_workers = min(workers or sweep.spec.workers, max(1, len(jobs)))
    skipped = len(runs) - len(jobs)
    label = f"sweep {sweep.spec.name}" + (f" ({skipped} finished earlier)" if skipped else "")
    with progress_bar(label, total=len(jobs), enabled=show_progress) as bar:
        for outcome in _execute(jobs, n_workers, runner):
            outcomes[outcome.spec.name] = outcome
            _write_record(sweep, outcomes)
            n_failed = sum(o.status == "failed" for o in outcomes.values())
            bar.advance(1, failed=n_failed)
            if outcome.status == "failed" and show_progress:
                console.print(f"failed {outcome.spec.name}: {outcome.error}", style="red", markup=False)
    return SweepResult(sweep, list(outcomes.values()))


# --- command
def sweep_command(sweep_file: Path, workers: int | None, quiet: bool, runner: Runner = execute_run) -> int:
    """`heterorl sweep`: run the sweep, print a summary; the exit code is 0, 1 (a run failed) or 2 (invalid).
    `runner` is for tests (a runner that does not train)."""
    from rich.table import Table

    from heterorl.console import console, print_error

    try:
        result = run_sweep(sweep_file, workers=workers, show_progress=not quiet, runner=runner)
    except (SweepError, ConfigError) as exc:
        print_error(str(exc))
        return 2
    counts = {s: sum(o.status == s for o in result.outcomes) for s in ("done", "skipped", "failed")}
    table = Table(title=f"heterorl sweep {result.sweep.spec.name}", show_header=False, title_justify="left")
    table.add_row("runs", f"{len(result.outcomes)} ({counts['done']} run now, {counts['skipped']} finished earlier)")
    table.add_row("failed", str(counts["failed"]))
    for outcome in result.failed:
        table.add_row(f"  {outcome.spec.name}", outcome.error or "")
    table.add_row("output", str(result.sweep.out))
    table.add_row("record", str(result.sweep_json))
    table.add_row("next", f"heterorl report {result.sweep.out}")
    console.print(table)
    return 1 if result.failed else 0
