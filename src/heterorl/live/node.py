"""Process entry point used by `run --live` and the tests: `python -m heterorl.live.node learner|sampler ...`.

People use `heterorl learner` / `heterorl sampler`; this launcher starts the same functions without the CLI
layer, so the local launcher depends only on this package. The token comes from the environment as usual. A node
started this way dies with its parent (`heterorl.process.die_with_parent`): no learner or sampler outlives `run
--live`, however it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from heterorl.config import load_config
from heterorl.process import die_with_parent

PARENT_ENV = "HETERORL_PARENT_PID"  # set by the launcher: a child whose parent is gone at start exits


def wait_for_url_file(path: Path, timeout_s: float) -> str:
    """The `url` field of the learner's address file, once it exists (lets samplers start with the learner)."""
    deadline = time.monotonic() + timeout_s
    while not path.is_file():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no learner address in {path} after {timeout_s:.0f} s")
        time.sleep(0.1)
    return str(json.loads(path.read_text())["url"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m heterorl.live.node")
    roles = parser.add_subparsers(dest="role", required=True)
    learner = roles.add_parser("learner")
    learner.add_argument("config")
    learner.add_argument("--listen", default="127.0.0.1:0")
    learner.add_argument("--run-dir", required=True)
    learner.add_argument("--resume", action="store_true")
    learner.add_argument("--progress", action="store_true")
    sampler = roles.add_parser("sampler")
    sampler.add_argument("config")
    where = sampler.add_mutually_exclusive_group()  # neither: a store-only sampler (transport: store)
    where.add_argument("--connect", help="The learner's URL.")
    where.add_argument("--connect-file", help="Wait for the learner to write its URL into this file (JSON).")
    sampler.add_argument("--index", type=int, default=0)
    args = parser.parse_args(argv)
    die_with_parent(int(os.environ[PARENT_ENV]) if os.environ.get(PARENT_ENV, "").isdigit() else None)
    cfg = load_config(args.config)
    if args.role == "learner":
        from heterorl.live.learner_node import serve_learner

        serve_learner(cfg, args.listen, args.run_dir, args.resume, show_progress=args.progress, progress_log=False)
    else:
        from heterorl.live.sampler_node import run_sampler

        url = args.connect
        if args.connect_file:
            url = wait_for_url_file(Path(args.connect_file), cfg.live.startup_timeout_s)
        run_sampler(cfg, url, args.index)
    return 0


if __name__ == "__main__":
    sys.exit(main())
