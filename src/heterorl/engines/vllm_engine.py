"""The vLLM rollout engine: continuous batching, processed log-probs, verified in-place weight updates.

One `VLLMEngine` owns one vLLM `LLMEngine` (its engine core and worker run in their own processes) and serves
any number of chunks at once:

- `submit(prompt_ids_KP, prompt_mask_KP, G, params)` queues one request per prompt with n = G (vLLM fans it out
  into G completions, each with its own seed: the request's seed + its index, so every completion's randomness is
  its own and does not depend on what else is batched) and returns a `Job`; `step()` runs one engine step for
  every request in flight and routes the new tokens to their completions; `result(job)` gives the `Generation`;
- `generate(...)` is the `RolloutEngine` process on top: submit, then one `step()` per `next()`. Several
  `generate` processes on one engine advance the same batch together (continuous batching).

Weight updates (`load_weights`) travel through shared memory (`shm_staging`): the engine copies the published
tensors into a file the worker maps once and sends a manifest with one xxh3 digest per tensor. The worker checks
the manifest and every digest before it touches a parameter (a corrupted or malformed update is refused and the
engine keeps its weights, its version and its completions in flight); then, with the requests in flight
interrupted, it copies each tensor into its slot, compares a random sample of positions per tensor and probes
that every linear layer computes with its weight (`vllm_worker`). An update that does not land after that raises
`EngineError` and leaves the engine without weights (no generation until a full update lands). The prefix cache
is reset after every update.

Completions in flight at an update are interrupted and continued (`vllm_jobs`): their requests are aborted and
each unfinished completion is resubmitted on its own as prompt + tokens so far, so the KV cache of that prefix is
recomputed with the new weights. Every token thus carries the log-prob and version of the one weight version that
produced it (the behaviour policy), exactly like the transformers engine, and none is wasted. A loop that prefers
whole completions at one version calls `load_weights` only between chunks.

Not thread-safe: call it from one thread.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from heterorl.config import RunConfig, VLLMEngineConfig
from heterorl.engines.base import EngineError, RolloutEngine
from heterorl.engines.lora_merge import AdapterMerger
from heterorl.engines.shm_staging import Entry, NonFiniteError, StagingBuffer, update_problems
from heterorl.engines.vllm_jobs import Job, Sequence, make_job, sampled_logprobs
from heterorl.engines.vllm_setup import engine_args, import_vllm, on_cpu, private_rpc_folder
from heterorl.policy import Generation, SamplingParams

_SEED_STRIDE = 1_000_003  # request numbers of different engine seeds land apart
_SEED_SPACING = 1 << 16  # a request's completions take seeds seed .. seed + n - 1 (vLLM's fan-out): n < spacing


def request_seed(engine_seed: int, number: int) -> int:
    """The seed of request `number`: its n completions use seed + 0 .. seed + n - 1, disjoint from every other
    request's (for n <= 2**16 and fewer than 2**47 requests per engine seed)."""
    return (engine_seed * _SEED_STRIDE + number) % (1 << 47) * _SEED_SPACING


class WorkerCallError(RuntimeError):
    """A call into vLLM's worker failed (vLLM reports it as a bare Exception)."""


class VLLMEngine(RolloutEngine):
    """Generates with vLLM; see the module docstring."""

    name = "vllm"
    interruptible = True

    def __init__(
        self,
        model_path: str | Path,
        cfg: VLLMEngineConfig,
        *,
        eos_id: int,
        pad_id: int,
        seed: int,
        dtype: str = "float32",
        adapter: AdapterMerger | None = None,
    ) -> None:
        vllm = import_vllm()
        from vllm.v1.engine.llm_engine import LLMEngine

        self._vllm = vllm
        self.cfg = cfg
        self.eos_id, self.pad_id, self.seed = eos_id, pad_id, seed
        self.adapter = adapter
        self.cpu = on_cpu(vllm)
        self.device = torch.device("cpu")  # prompts are handed over as token lists
        self._version = -1
        self._jobs: dict[int, Job] = {}
        self._owner: dict[str, tuple[Job, list[Sequence]]] = {}  # request id -> its job, completions by index
        self._job_ids = itertools.count()
        self._request_ids = itertools.count()
        self._params: dict[int, SamplingParams] = {}  # job id -> its sampling params
        self._scoring: set[str] = set()  # `score` requests in flight
        self._scored: dict[str, Any] = {}  # their prompt log-probs, once finished
        self.last_update: dict[str, Any] = {}  # the worker's report on the last update that landed
        self._staging = StagingBuffer()  # shared memory the worker maps: how weights reach it
        args = engine_args(vllm, cfg, str(model_path), dtype, seed, self.cpu)
        private_rpc_folder()  # its sockets not left in the temp folder
        self._engine: Any = None
        self._engine = LLMEngine.from_engine_args(args)
        self._layout: dict[str, tuple[int, ...]] = {
            name: tuple(shape) for name, shape in self._rpc("heterorl_setup").items()
        }

    @classmethod
    def from_config(cls, cfg: RunConfig, base_model_path: str, seed: int) -> VLLMEngine:
        """The engine of one sampler of `cfg` (`sampler.engine` must be the vllm section)."""
        engine_cfg = cfg.sampler.engine
        if not isinstance(engine_cfg, VLLMEngineConfig):
            raise EngineError(f"sampler.engine.name is {engine_cfg.name!r}, not 'vllm'")
        if cfg.sampler.frictions.logit_noise > 0:
            raise EngineError("sampler.frictions.logit_noise needs sampler.engine.name: transformers")
        tokenizer = AutoTokenizer.from_pretrained(base_model_path)
        eos_id = tokenizer.eos_token_id
        if eos_id is None:
            raise EngineError(f"the tokenizer of {base_model_path} has no eos token")
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
        adapter = None
        lora = cfg.model.lora
        if lora is not None and lora.publish == "adapter":
            adapter = AdapterMerger(base_model_path, list(lora.target_modules), lora.rank, lora.alpha)
        engine = cls(
            base_model_path, engine_cfg, eos_id=eos_id, pad_id=pad_id, seed=seed, dtype=cfg.model.dtype, adapter=adapter
        )
        engine.chunks_in_flight = engine_cfg.chunks_in_flight
        return engine

    # ------------------------------------------------------------------ weights
    @property
    def version(self) -> int:
        return self._version

    def load_weights(self, version: int, weights: Mapping[str, torch.Tensor]) -> None:
        """Load published tensors (every weight, or the LoRA adapter) in place and verify them in every layer.

        Requests in flight are interrupted and continue under the new weights (module docstring); an update the
        worker refuses before loading (corrupted, malformed, non-finite) leaves weights, version and requests as
        they were.
        """
        tensors, full = self._plain_tensors(version, weights)
        started = time.perf_counter()
        try:
            manifest = self._staging.stage(tensors)
        except NonFiniteError as err:
            raise EngineError(
                f"weights for version {version} refused (the engine keeps version {self._version}): {err}"
            ) from err
        except (ValueError, OSError) as err:
            raise EngineError(f"weights for version {version} could not be staged: {err}") from err
        stage_s = time.perf_counter() - started
        self._apply(version, manifest, full)
        self.last_update.update(stage_s=stage_s, seconds=time.perf_counter() - started)

    def _apply(self, version: int, manifest: list[Entry], full: bool) -> None:
        """Have the worker check the staged update, then (requests interrupted) load and verify it."""
        buffer = self._staging
        try:
            verdict = self._rpc(
                "heterorl_check_update", buffer.path, buffer.size, [e.to_wire() for e in manifest], full
            )
        except WorkerCallError as err:  # the check failed before anything was loaded
            raise EngineError(f"weights for version {version} refused (the engine keeps its weights): {err}") from err
        buffer.worker_mapped()
        if verdict["refused"]:
            raise EngineError(
                f"weights for version {version} refused (the engine keeps version {self._version}): "
                f"{verdict['refused']}"
            )
        in_flight = self._interrupt()
        try:
            report = self._rpc("heterorl_apply_update")
        except WorkerCallError as err:  # the worker's state is unknown: refuse to generate
            self._failed_update(in_flight, f"weights for version {version} did not load: {err}")
            raise EngineError(f"weights for version {version} did not load: {err}") from err
        problems = update_problems(report)
        if problems:
            message = f"weights for version {version} did not land: " + "; ".join(problems)
            self._failed_update(in_flight, message)
            raise EngineError(message)
        if not self._engine.reset_prefix_cache():
            message = f"vLLM did not reset its prefix cache after loading version {version}"
            self._failed_update(in_flight, message)
            raise EngineError(message)
        self._version = version
        self.last_update = {**report, "check_s": verdict["check_s"]}
        for job, seq in in_flight:
            self._add_request(job, [seq])

    def _plain_tensors(self, version: int, weights: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], bool]:
        """The tensors to load under vLLM's (Hugging Face) names, and whether they are the whole model."""
        if self.adapter is not None:
            try:
                return self.adapter.merge(weights), False
            except ValueError as err:
                raise EngineError(f"adapter weights for version {version}: {err}") from err
        if any(".lora_A." in n or ".lora_B." in n for n in weights):
            raise EngineError(
                "received LoRA adapter tensors but the engine was built without model.lora (publish: adapter)"
            )
        missing = sorted(set(self._layout) - set(weights))
        unknown = sorted(set(weights) - set(self._layout))
        if missing or unknown:
            raise EngineError(
                f"weights for version {version}: missing {missing[:3]} ({len(missing)}), "
                f"unknown {unknown[:3]} ({len(unknown)})"
            )
        for name, tensor in weights.items():
            if tuple(tensor.shape) != self._layout[name]:
                raise EngineError(
                    f"weights for version {version}: {name} is {tuple(tensor.shape)}, "
                    f"the model has {self._layout[name]}"
                )
        return dict(weights), True

    # ------------------------------------------------------------------ generation
    def submit(
        self, prompt_ids_KP: torch.Tensor, prompt_mask_KP: torch.Tensor, group_size: int, params: SamplingParams
    ) -> Job:
        """Queue G completions of each of the K left-padded prompts; they advance with every `step()`."""
        if self._version < 0:
            raise EngineError("the engine has no weights yet (or its last update failed)")
        self._check_params(params)
        if not 1 <= group_size < _SEED_SPACING:
            raise EngineError(f"group size {group_size} outside 1 .. {_SEED_SPACING - 1}")
        try:
            job = make_job(next(self._job_ids), prompt_ids_KP, prompt_mask_KP, group_size, params.max_new_tokens)
        except ValueError as err:
            raise EngineError(str(err)) from err
        self._jobs[job.job_id] = job
        self._params[job.job_id] = params
        for k in range(prompt_ids_KP.shape[0]):  # one request per prompt, n = G
            self._add_request(job, job.sequences[k * group_size : (k + 1) * group_size])
        return job

    def step(self) -> None:
        """One vLLM engine step for every request in flight; new tokens go to their jobs."""
        if not self._owner and not self._scoring:
            return
        for out in self._engine.step():
            if out.request_id in self._scoring:
                if out.finished:
                    self._scored[out.request_id] = out.prompt_logprobs
                    self._scoring.discard(out.request_id)
                continue
            owner = self._owner.get(out.request_id)
            if owner is None:  # a late output of a request aborted at an update
                continue
            job, seqs = owner
            try:
                for completion in out.outputs:  # one per completion that advanced (its index in the request)
                    if not 0 <= completion.index < len(seqs):
                        raise ValueError(f"completion index {completion.index} of a request with n = {len(seqs)}")
                    seq = seqs[completion.index]
                    tokens = list(completion.token_ids)
                    logps = [entry[tok].logprob for entry, tok in zip(completion.logprobs, tokens, strict=True)]
                    seq.extend(tokens, logps, self.eos_id)
                    if completion.finish_reason is not None and not seq.done:
                        raise ValueError(f"vLLM stopped a completion early ({completion.finish_reason})")
                if out.finished and not all(seq.done for seq in seqs):
                    raise ValueError("vLLM finished a request before its completions")
            except ValueError as err:
                self._fail_job(job, f"vLLM returned a bad completion: {err}")
                continue
            if out.finished:
                del self._owner[out.request_id]
                for seq in seqs:
                    seq.request_id = None

    def result(self, job: Job) -> Generation:
        """The finished job's `Generation` (EngineError if it failed); forgets the job."""
        if not job.done:
            raise EngineError(f"job {job.job_id} is still running")
        self._jobs.pop(job.job_id, None)
        self._params.pop(job.job_id, None)
        if job.error is not None:
            raise EngineError(job.error)
        return job.generation(self.pad_id)

    def generate(
        self, prompt_ids_KP: torch.Tensor, prompt_mask_KP: torch.Tensor, group_size: int, params: SamplingParams
    ) -> Generator[int, None, Generation]:
        """`submit`, then one engine step per `next()` (yields this job's tokens so far) until it is done."""
        job = self.submit(prompt_ids_KP, prompt_mask_KP, group_size, params)
        return self._run(job)

    def _run(self, job: Job) -> Generator[int, None, Generation]:
        while not job.done:
            self.step()
            yield job.tokens
        return self.result(job)

    @property
    def in_flight(self) -> int:
        """Completions being sampled now (all jobs)."""
        return sum(not seq.done for _, seqs in self._owner.values() for seq in seqs)

    # ------------------------------------------------------------------ scoring
    def score(
        self,
        prompt_ids_NP: torch.Tensor,
        prompt_mask_NP: torch.Tensor,
        completion_ids_NL: torch.Tensor,
        completion_mask_NL: torch.Tensor,
        params: SamplingParams,
    ) -> torch.Tensor:
        """Teacher-forced log-probs under the sampling distribution, from full-vocabulary prompt log-probs.

        Prompt log-probs are vLLM's unprocessed log-softmax; the sampling distribution (temperature, top-k,
        top-p) is rebuilt from them with heterorl's `filter_logits` (log-softmax is shift-invariant, so these
        act as logits). Exact, but it moves V numbers per token: meant for the rare replaced completion.
        """
        if self._version < 0:
            raise EngineError("the engine has no weights yet (or its last update failed)")
        self._check_params(params)
        out = torch.zeros(completion_ids_NL.shape, dtype=torch.float32)
        rows = [
            (i, p[m.bool()].tolist(), c[cm.bool()].tolist())
            for i, (p, m, c, cm) in enumerate(
                zip(
                    prompt_ids_NP.cpu(),
                    prompt_mask_NP.cpu(),
                    completion_ids_NL.cpu(),
                    completion_mask_NL.cpu(),
                    strict=True,
                )
            )
        ]
        vocab = self._vocab_rows()
        pending = {}
        for i, prompt, completion in rows:
            if not completion:
                continue
            request_id = f"score-{next(self._request_ids)}"
            sp = self._vllm.SamplingParams(max_tokens=1, prompt_logprobs=-1, detokenize=False, temperature=1.0)
            self._scoring.add(request_id)
            self._engine.add_request(request_id, {"prompt_token_ids": prompt + completion}, sp)
            pending[request_id] = (i, len(prompt), completion)
        while self._scoring & set(pending):
            self.step()  # also advances (and routes) the jobs in flight
        for request_id, (i, P, completion) in pending.items():
            logprobs = self._scored.pop(request_id)[P : P + len(completion)]  # token P + t given those before it
            out[i, : len(completion)] = sampled_logprobs(logprobs, completion, vocab, params)
        return torch.where(completion_mask_NL.cpu().bool(), out, torch.zeros_like(out))

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Abort everything and shut vLLM's processes down (idempotent)."""
        if self._engine is None:
            return
        self._interrupt()
        engine, self._engine = self._engine, None
        engine.engine_core.shutdown()
        self._staging.close()

    # ------------------------------------------------------------------ internals
    def _check_params(self, params: SamplingParams) -> None:
        if params.greedy:
            raise EngineError("the vLLM engine samples; greedy decoding (evaluation) runs on the learner's policy")
        if params.logit_noise > 0:
            raise EngineError("sampler.frictions.logit_noise needs sampler.engine.name: transformers")

    def _vllm_params(self, params: SamplingParams, n: int, max_tokens: int, seed: int) -> Any:
        from vllm.sampling_params import RequestOutputKind

        return self._vllm.SamplingParams(
            n=n,
            temperature=params.temperature,
            top_k=params.top_k if params.top_k > 0 else 0,
            top_p=params.top_p,
            max_tokens=max_tokens,
            logprobs=0,
            stop_token_ids=[self.eos_id],
            seed=seed,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )

    def _add_request(self, job: Job, seqs: list[Sequence]) -> None:
        """Start `seqs` (completions of one context: a prompt's G, or one continued after an update) as one vLLM
        request with n = len(seqs) and the current weights."""
        number = next(self._request_ids)
        request_id = f"j{job.job_id}-r{number}"
        params = self._vllm_params(
            self._params[job.job_id], len(seqs), seqs[0].remaining, request_seed(self.seed, number)
        )
        for seq in seqs:
            seq.request_id, seq.segment_version = request_id, self._version
            seq.segments += 1
        self._owner[request_id] = (job, seqs)
        self._engine.add_request(request_id, {"prompt_token_ids": seqs[0].context()}, params)

    def _interrupt(self) -> list[tuple[Job, Sequence]]:
        """Abort every request in flight; returns the unfinished completions to continue after the update."""
        in_flight = [(job, seq) for job, seqs in self._owner.values() for seq in seqs if not seq.done]
        if self._owner:
            self._engine.abort_request(list(self._owner))
        for _, seqs in self._owner.values():
            for seq in seqs:
                seq.request_id = None
        self._owner.clear()
        return in_flight

    def _fail_job(self, job: Job, message: str) -> None:
        """Abort a job's requests; its `generate` / `result` raises `message`."""
        job.error = job.error or message
        requests = {seq.request_id for seq in job.sequences if seq.request_id is not None}
        for request_id in requests:
            self._owner.pop(request_id, None)
        if requests:
            self._engine.abort_request(sorted(requests))
        for seq in job.sequences:
            seq.request_id = None

    def _failed_update(self, in_flight: list[tuple[Job, Sequence]], message: str) -> None:
        """After an update that did not land: fail the interrupted jobs and hold no weights."""
        self._version = -1
        for job, _ in in_flight:
            self._fail_job(job, message)

    def _vocab_rows(self) -> int:
        embed = [shape for name, shape in self._layout.items() if name.endswith("embed_tokens.weight")]
        if not embed:
            raise EngineError("cannot tell the vocabulary size (no embed_tokens.weight)")
        return embed[0][0]

    def _rpc(self, method: str, *args: Any) -> Any:
        """Call `method` of the worker extension in vLLM's worker (one worker: tensor_parallel_size is 1)."""
        try:
            (result,) = self._engine.collective_rpc(method, args=args)
        except Exception as err:
            if type(err) is not Exception:  # only vLLM's report of a failed worker call (a bare Exception)
                raise
            raise WorkerCallError(str(err)) from err
        return result
