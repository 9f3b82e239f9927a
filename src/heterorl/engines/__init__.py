"""Rollout engines behind one interface (`base.RolloutEngine`): `transformers` (the default) and `vllm`."""

from heterorl.engines.base import EngineError, RolloutEngine

__all__ = ["EngineError", "RolloutEngine"]
