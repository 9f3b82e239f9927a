"""A short run of the envelope fuzzer (benchmarks/fuzz_envelopes.py; the figures in the notes come from 12,000
trials): mutated weight envelopes through `LiveSampler._receive` never raise, never leave weights other than the
ones published under the hash the sampler then claims, and a refused one leaves the weights as they were."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

FUZZER = Path(__file__).resolve().parents[2] / "benchmarks" / "fuzz_envelopes.py"


def test_mutated_envelopes_are_refused_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("fuzz_envelopes", FUZZER)
    assert spec is not None
    assert spec.loader is not None
    fuzz = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "fuzz_envelopes", fuzz)  # dataclasses look their module up there
    spec.loader.exec_module(fuzz)
    figures = fuzz.run(trials=640, seed=1, workdir=tmp_path)
    assert figures.trials == 640
    assert figures.applied > 0  # consistent rewrites and swapped genuine envelopes do apply
    assert figures.refused > 500
    assert dict(figures.unexpected) == {}
    assert dict(figures.wrong_weights) == {}
    # a refused envelope leaves the sampler's weights as they were, blobs re-signed with a valid checksum included
    # (the receiver validates the whole patch before writing)
    assert dict(figures.changed_after_refusal) == {}
