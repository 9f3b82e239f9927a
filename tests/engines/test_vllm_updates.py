"""The vLLM engine's weight updates in place through shared memory, on the tier's shared engine (`make test-vllm`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from heterorl.config import WeightsConfig
from heterorl.engines.base import EngineError
from heterorl.engines.lora_merge import AdapterMerger
from heterorl.engines.shm_staging import Entry
from heterorl.engines.vllm_engine import VLLMEngine
from heterorl.policy import Policy, SamplingParams, run_process
from heterorl.weights import WeightReceiver, WeightStore

from .conftest import PROMPTS, TOL, G, max_logp_error, perturbed, reference

pytestmark = pytest.mark.vllm

TARGET = "model.layers.1.self_attn.o_proj.weight"


def differing(engine: VLLMEngine, weights: dict[str, torch.Tensor]) -> list[str]:
    """Names whose every element the engine's model does not hold as in `weights` (a full comparison in the
    worker, through the shared buffer: the test's own check, not the update path)."""
    manifest = engine._staging.stage(weights)
    buffer = engine._staging
    return engine._rpc("heterorl_full_check", buffer.path, buffer.size, [e.to_wire() for e in manifest])


def test_update_lands_in_every_layer(at_base: VLLMEngine, trained_dir: Path, base: dict[str, torch.Tensor]) -> None:
    new = perturbed(base, 0.05, seed=1)
    at_base.load_weights(1, new)
    report = at_base.last_update
    n_layers = Policy.load(trained_dir).model.config.num_hidden_layers
    assert report["mismatched"] == []
    assert report["stale"] == []
    assert report["loaded"] == len(base)
    assert report["probed"] == 4 * n_layers + 1  # qkv, o, gate_up, down per layer; the LM head
    assert differing(at_base, new) == []  # every element of every tensor, in vLLM's dtype
    assert sorted(differing(at_base, base)) == sorted(base)  # and every tensor changed
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    ids, mask = Policy.load(trained_dir).encode_prompts(PROMPTS)
    gen = run_process(at_base.generate(ids, mask, G, params))
    assert bool((gen.version_NL[gen.completion_mask_NL.bool()] == 1).all())
    assert max_logp_error(reference(trained_dir, new), gen, params) <= TOL
    assert max_logp_error(reference(trained_dir, base), gen, params) > 100 * TOL  # the old weights are gone


def test_updates_travel_through_one_mapped_buffer(at_base: VLLMEngine, base: dict[str, torch.Tensor]) -> None:
    """The worker maps the staging file once (its name is then unlinked: nothing is left in /dev/shm); an update
    that does not fit (fp32 instead of bf16) moves to a larger file, which the worker maps in turn."""
    path = at_base._staging.path
    assert path is not None
    assert not Path(path).exists()
    at_base.load_weights(1, perturbed(base, 0.05, seed=2))
    assert at_base._staging.path == path
    wide = {name: w.float() for name, w in perturbed(base, 0.05, seed=3).items()}
    at_base.load_weights(2, wide)
    assert at_base._staging.path != path
    assert at_base._staging.size >= 2 * sum(w.nbytes for w in base.values())
    assert differing(at_base, wide) == []


def test_a_corrupted_update_is_refused_and_changes_nothing(
    at_base: VLLMEngine, trained_dir: Path, base: dict[str, torch.Tensor]
) -> None:
    """One bit flipped in the shared buffer after staging: the worker's digest check refuses the update before
    touching the model; weights, version and the completions in flight go on as before."""
    ids, mask = Policy.load(trained_dir).encode_prompts(PROMPTS)
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    process = at_base.generate(ids, mask, G, params)
    next(process)
    manifest = at_base._staging.stage(perturbed(base, 0.05, seed=4))
    entry = next(e for e in manifest if e.name == TARGET)
    at_base._staging.bytes[entry.offset + 100] ^= 0x40
    with pytest.raises(
        EngineError, match=rf"refused \(the engine keeps version 0\): 1 tensors arrived corrupted.*{TARGET}"
    ):
        at_base._apply(1, manifest, full=True)
    assert at_base.version == 0
    gen = run_process(process)
    assert bool((gen.version_NL[gen.completion_mask_NL.bool()] == 0).all())
    assert max_logp_error(reference(trained_dir, base), gen, params) <= TOL
    assert differing(at_base, base) == []


def test_non_finite_and_malformed_updates_are_refused(at_base: VLLMEngine, base: dict[str, torch.Tensor]) -> None:
    """A NaN or an infinity is refused while staging; a manifest pointing outside the buffer, or at a tensor the
    model lacks, by the worker's check: nothing loads, version 0 stays."""
    for bad in (float("nan"), float("-inf")):
        broken = {**base, TARGET: base[TARGET].clone()}
        broken[TARGET][3, 4] = bad
        with pytest.raises(EngineError, match=rf"refused \(the engine keeps version 0\): 1 tensors hold NaN.*{TARGET}"):
            at_base.load_weights(1, broken)
    manifest = at_base._staging.stage(base)
    entry = next(e for e in manifest if e.name == TARGET)
    outside = [Entry(TARGET, entry.dtype, entry.shape, at_base._staging.size, entry.digest)]
    with pytest.raises(EngineError, match=r"refused .*leave the buffer"):
        at_base._apply(1, outside, full=False)
    unknown = [Entry("model.layers.9.mlp.up_proj.weight", entry.dtype, entry.shape, entry.offset, entry.digest)]
    with pytest.raises(EngineError, match=r"refused .*does not have"):
        at_base._apply(1, unknown, full=False)
    assert at_base.version == 0
    assert differing(at_base, base) == []


def test_patch_chain_and_snapshot_land(at_base: VLLMEngine, trained_dir: Path, base: dict[str, torch.Tensor]) -> None:
    """PULSE patches v0 -> v1 -> v2 through a WeightReceiver, then a snapshot from scratch."""
    store = WeightStore.from_config(WeightsConfig(codec="pulse", snapshot_every=100))
    versions = [base, perturbed(base, 0.01, seed=2), perturbed(base, 0.02, seed=3)]
    receiver = WeightReceiver()
    kinds = []
    for v, weights in enumerate(versions):
        store.publish(v, weights)
        update = store.update_for(*receiver.held())
        kinds.append(update.kind)
        assert receiver.apply(update), receiver.last_error
        at_base.load_weights(receiver.version, receiver.weights)
    assert kinds == ["snapshot", "patch", "patch"]
    params = SamplingParams(temperature=0.7, max_new_tokens=8)
    ids, mask = Policy.load(trained_dir).encode_prompts(PROMPTS)
    gen = run_process(at_base.generate(ids, mask, G, params))
    assert max_logp_error(reference(trained_dir, versions[2]), gen, params) <= TOL
    fresh = WeightReceiver()
    snapshot = store.update_for(None, None)
    assert snapshot.kind == "snapshot"
    assert fresh.apply(snapshot)
    at_base.load_weights(0, base)
    at_base.load_weights(fresh.version, fresh.weights)
    gen = run_process(at_base.generate(ids, mask, G, params))
    assert max_logp_error(reference(trained_dir, versions[2]), gen, params) <= TOL


def test_a_kernel_that_misses_updates_is_an_error(
    at_base: VLLMEngine, trained_dir: Path, base: dict[str, torch.Tensor]
) -> None:
    """A layer computing with a private copy of its weight (what vLLM-CPU's packed kernels do unless rebuilt) keeps
    the old weight after an update: the update must be refused, naming the layer."""
    target = "model.layers.1.mlp.down_proj"
    at_base._rpc("heterorl_stale_kernel", target)
    ids, mask = Policy.load(trained_dir).encode_prompts(PROMPTS)
    process = at_base.generate(ids, mask, G, SamplingParams(max_new_tokens=8))
    next(process)
    with pytest.raises(EngineError, match=rf"did not land: .*compute with other weights.*{target}"):
        at_base.load_weights(1, perturbed(base, 0.01, seed=5))
    assert at_base.version == -1
    with pytest.raises(EngineError, match="did not land"):  # the interrupted chunk fails too
        run_process(process)
    with pytest.raises(EngineError, match="no weights"):
        at_base.generate(ids, mask, G, SamplingParams())
    at_base._rpc("heterorl_fresh_kernel", target)
    at_base.load_weights(0, base)
    assert at_base.last_update["stale"] == []


def test_lora_adapter_updates_only_the_adapted_weights(
    at_base: VLLMEngine, trained_dir: Path, base: dict[str, torch.Tensor]
) -> None:
    """`publish: adapter`: the engine merges each adapter into its copy of the base and sends only those weights."""
    merger = AdapterMerger(trained_dir, ["q_proj", "v_proj", "down_proj"], rank=4, alpha=8.0)
    gen = torch.Generator().manual_seed(6)
    adapter = {}
    for module in merger.modules:
        out_f, in_f = merger.base[module].shape
        prefix = f"base_model.model.{module}"
        adapter[f"{prefix}.lora_A.default.weight"] = (0.3 * torch.randn(4, in_f, generator=gen)).bfloat16()
        adapter[f"{prefix}.lora_B.default.weight"] = (0.3 * torch.randn(out_f, 4, generator=gen)).bfloat16()
    merged = merger.merge(adapter)
    at_base.adapter = merger
    try:
        at_base.load_weights(1, adapter)
    finally:
        at_base.adapter = None
    assert at_base.last_update["loaded"] == len(merged) == 3 * 2  # q, v, down in each of the 2 layers
    assert at_base.last_update["mismatched"] == []
    expected = {**{n: w.float() for n, w in base.items()}, **merged}
    params = SamplingParams(temperature=0.7, max_new_tokens=8)
    ids, mask = Policy.load(trained_dir).encode_prompts(PROMPTS)
    out = run_process(at_base.generate(ids, mask, G, params))
    assert max_logp_error(reference(trained_dir, expected), out, params) <= TOL
    assert max_logp_error(reference(trained_dir, base), out, params) > 100 * TOL


def test_bad_updates_are_clear_errors(at_base: VLLMEngine, base: dict[str, torch.Tensor]) -> None:
    name = "model.layers.0.self_attn.q_proj.weight"
    with pytest.raises(EngineError, match=r"missing \['model.layers.0.self_attn.q_proj.weight'\]"):
        at_base.load_weights(1, {k: v for k, v in base.items() if k != name})
    with pytest.raises(EngineError, match=r"q_proj.weight is \(3, 3\), the model has"):
        at_base.load_weights(1, {**base, name: torch.zeros(3, 3)})
    with pytest.raises(EngineError, match="unknown"):
        at_base.load_weights(1, {**base, "model.extra.weight": torch.zeros(3)})
    with pytest.raises(EngineError, match="LoRA adapter tensors"):
        at_base.load_weights(1, {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight": base[name]})
    with pytest.raises(EngineError, match="cannot be staged"):
        at_base.load_weights(1, {**base, name: base[name].to(torch.float64)})
    assert at_base.version == 0  # refused before anything was sent: the engine keeps its weights
