"""Held-out evaluation: greedy accuracy, and pass@k / maj@k over sampled completions.

- `eval/accuracy`: share of greedy completions the task's own verifier accepts (mean score; whatever reward
  trains the policy). `eval/unparsable`: share of greedy completions with no readable answer (tasks that parse
  answers). With several data sources, `eval/<source>/accuracy` per source as well.
- With `eval.samples` = k > 0, n = `eval.samples_drawn` (default k) completions are sampled per prompt at the
  sampler's temperature, top-k and top-p (without injected logit noise):
  - `eval/pass@k`: the unbiased estimator of Chen et al. 2021 (Codex, eq. 1): with c of the n samples fully
    correct, pass@k = 1 - C(n - c, k) / C(n, k), averaged over prompts. With n = k it is the plain "any of k
    correct"; drawing n > k lowers its variance. Computed as 1 - prod_{i=n-c+1..n} (1 - k / i) (no big
    binomials).
  - `eval/maj@k`: majority vote over the first k samples of each prompt: the answer read by the task
    (`Task.check`, canonical, e.g. math-verify's sympy form, so 0.5 and 1/2 vote together) that most samples
    give wins (ties: the answer given first); a sample with no readable answer does not vote; the prompt
    scores that answer's score (0 if no sample had an answer).
  - `eval/pass@1`: mean correctness over all n samples (pass@1's unbiased estimate: sampled accuracy).
Evaluation uses `Task.check`, which does not count into `Task.stats()` (those describe training data).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import torch

from heterorl.config import EvalConfig
from heterorl.policy import Policy, SamplingParams
from heterorl.tasks import Check, Problem, Task

SAMPLE_BATCH_ROWS = 512  # completions decoded together (prompts x n)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def majority_score(checks: list[Check]) -> float:
    """The score of the most common readable answer (ties: the one given first); 0 when none was readable."""
    answers = [c.answer for c in checks if c.parsed and c.answer is not None]
    if not answers:
        return 0.0
    counts = Counter(answers)
    best = max(counts.values())
    winner = next(a for a in answers if counts[a] == best)  # first given among the most common
    return next(c.score for c in checks if c.answer == winner)


def greedy_accuracy(policy: Policy, task: Task, problems: list[Problem], max_new_tokens: int) -> float:
    """Share of greedy completions the task's own verifier accepts (0..1), whatever reward trains the policy."""
    if not problems:
        raise ValueError("no evaluation problems")
    texts = policy.greedy_completions([p.prompt for p in problems], max_new_tokens)
    return sum(task.verify(p, t) for p, t in zip(problems, texts, strict=True)) / len(problems)


def sampled_completions(
    policy: Policy, prompts: list[str], n: int, params: SamplingParams, generator: torch.Generator
) -> list[list[str]]:
    """n sampled completions per prompt (in prompt order), in batches of about SAMPLE_BATCH_ROWS rows."""
    per_batch = max(1, SAMPLE_BATCH_ROWS // n)
    out: list[list[str]] = []
    was_training = policy.model.training
    policy.model.eval()
    try:
        for i in range(0, len(prompts), per_batch):
            chunk = prompts[i : i + per_batch]
            ids, mask = policy.encode_prompts([p for p in chunk for _ in range(n)])  # prompt-major rows
            gen = policy.generate(ids, mask, params, generator=generator)
            texts = policy.decode_completions(gen.completion_ids_NL, gen.completion_mask_NL)
            out += [texts[j * n : (j + 1) * n] for j in range(len(chunk))]
    finally:
        policy.model.train(was_training)
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def evaluate(
    policy: Policy,
    task: Task,
    problems: list[Problem],
    eval_cfg: EvalConfig,
    max_new_tokens: int,
    sampling: SamplingParams | None = None,
    seed: int = 0,
) -> dict[str, float]:
    """The `eval/*` metrics of `policy` on `problems` (see the module docstring). `sampling`: the sampler's
    distribution for pass@k / maj@k (default: temperature 1); `seed`: of their sampling stream."""
    if not problems:
        raise ValueError("no evaluation problems")
    greedy = policy.greedy_completions([p.prompt for p in problems], max_new_tokens)
    checks = [task.check(p, t) for p, t in zip(problems, greedy, strict=True)]
    metrics = {"eval/accuracy": _mean([c.score for c in checks])}
    if task.parses_answers:
        metrics["eval/unparsable"] = _mean([float(not c.parsed) for c in checks])
    sources = [str(p.info.get("source", "")) for p in problems]
    if len(set(sources)) > 1:
        for name in dict.fromkeys(sources):
            metrics[f"eval/{name}/accuracy"] = _mean(
                [c.score for c, s in zip(checks, sources, strict=True) if s == name]
            )
    k = eval_cfg.samples
    if k == 0:
        return metrics
    n = eval_cfg.n_drawn
    params = dataclasses.replace(
        sampling or SamplingParams(), max_new_tokens=max_new_tokens, greedy=False, logit_noise=0.0
    )
    generator = torch.Generator(device=policy.device).manual_seed(seed)
    samples = sampled_completions(policy, [p.prompt for p in problems], n, params, generator)
    passes, majorities, sampled = [], [], []
    for problem, texts in zip(problems, samples, strict=True):
        sample_checks = [task.check(problem, t) for t in texts]
        correct = sum(c.score >= 1.0 for c in sample_checks)
        passes.append(pass_at_k(n, correct, k))
        majorities.append(majority_score(sample_checks[:k]))
        sampled.append(correct / n)
    metrics[f"eval/pass@{k}"] = _mean(passes)
    metrics[f"eval/maj@{k}"] = _mean(majorities)
    metrics["eval/pass@1"] = _mean(sampled)
    return metrics
