"""vLLM's Unix sockets go with the process that started the engine (`vllm_setup.private_rpc_folder`)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

ENGINE_LIFE = """
import json, os, stat, sys
from heterorl.config import VLLMEngineConfig
from heterorl.engines.vllm_engine import VLLMEngine
from heterorl.policy import Policy

policy = Policy.load(sys.argv[1])
engine = VLLMEngine(sys.argv[1], VLLMEngineConfig(max_num_seqs=8), eos_id=policy.eos_id, pad_id=policy.pad_id, seed=0)
folder = os.environ["VLLM_RPC_BASE_PATH"]
sockets = [n for n in os.listdir(folder) if stat.S_ISSOCK(os.lstat(os.path.join(folder, n)).st_mode)]
engine.close()
print(json.dumps({"folder": folder, "sockets": len(sockets)}))
"""


def sockets_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if stat.S_ISSOCK(p.lstat().st_mode)]


def test_an_engine_leaves_no_socket_in_the_temp_folder(trained_dir: Path) -> None:
    temp = Path(tempfile.mkdtemp(prefix="t", dir="/tmp"))  # short: a socket's path must fit in 107 bytes
    env = {k: v for k, v in os.environ.items() if k != "VLLM_RPC_BASE_PATH"} | {"TMPDIR": str(temp)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", ENGINE_LIFE, str(trained_dir)], env=env, capture_output=True, text=True, timeout=600
        )
        left = sockets_under(temp)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(seen["folder"]).parent == temp  # a folder of its own in the temp folder ...
    assert seen["sockets"] > 0  # ... where vLLM's sockets were while the engine ran
    assert not Path(seen["folder"]).exists()  # gone with the process
    assert left == []
