"""Run configuration: one pydantic model per component, composed into `RunConfig`.

This package must not import torch (the CLI parses configs before loading heavy modules). Every field has a
description and bounds; unknown keys are rejected; cross-field rules live in validators. Choices between
implementations (objective, task, delay model, engine) are discriminated unions keyed by `name` / `kind`, so an
unknown name fails when the config is parsed, with a message naming the field.

One module per area; everything is re-exported here, so `from heterorl.config import X` is the one import path.
"""

from heterorl.config.base import ConfigError, Strict
from heterorl.config.cluster import ClusterConfig, LiveConfig, SamplerNodeConfig, WeightsConfig
from heterorl.config.engines import EngineConfig, TransformersEngineConfig, VLLMEngineConfig
from heterorl.config.launch import ActorResources, ParallelConfig, RayConfig, RayLearnerConfig
from heterorl.config.model import LoraConfig, ModelConfig
from heterorl.config.modelled import WIRE_BYTES, ModelledConfig, count_text
from heterorl.config.network import (
    DelayConfig,
    EmpiricalDelay,
    ExponentialDelay,
    FaultConfig,
    FixedDelay,
    LinkConfig,
    LogNormalDelay,
    Outage,
    SimpleTransfer,
    TcpTransfer,
    TransferConfig,
    UniformDelay,
    WeibullDelay,
)
from heterorl.config.objectives import (
    AGGREGATION_HELP,
    OBJECTIVE_CONFIGS,
    Aggregation,
    CapLevel,
    CapMode,
    CappedObjective,
    CISPOConfig,
    DecoupledPPOConfig,
    DGConfig,
    GEPOConfig,
    GRPOConfig,
    GSPOConfig,
    ISPGConfig,
    KLEstimator,
    ObjectiveConfig,
    ObjectiveOptions,
    PGConfig,
)
from heterorl.config.run import (
    RunConfig,
    apply_overrides,
    changed_settings,
    config_to_yaml,
    load_config,
    parse_override,
    validate_config,
)
from heterorl.config.tasks import (
    MATH_PROMPT_TEMPLATE,
    REWARD_PATTERN,
    AdditionTaskConfig,
    GymTaskConfig,
    MathTaskConfig,
    ReversalTaskConfig,
    TaskConfig,
)
from heterorl.config.training import (
    CheckpointConfig,
    EvalConfig,
    FrictionConfig,
    LearnerConfig,
    MetricsConfig,
    PretrainConfig,
    RuntimeConfig,
    SamplerConfig,
)
from heterorl.config.transport import StoreConfig, TransportConfig, check_store_url
from heterorl.config.trust import AdversaryConfig, ReputationConfig, TrustConfig, VerifyConfig
from heterorl.config.yaml_io import load_yaml_text, read_yaml_mapping

__all__ = [
    "AGGREGATION_HELP",
    "MATH_PROMPT_TEMPLATE",
    "OBJECTIVE_CONFIGS",
    "REWARD_PATTERN",
    "WIRE_BYTES",
    "ActorResources",
    "AdditionTaskConfig",
    "AdversaryConfig",
    "Aggregation",
    "CISPOConfig",
    "CapLevel",
    "CapMode",
    "CappedObjective",
    "CheckpointConfig",
    "ClusterConfig",
    "ConfigError",
    "DGConfig",
    "DecoupledPPOConfig",
    "DelayConfig",
    "EmpiricalDelay",
    "EngineConfig",
    "EvalConfig",
    "ExponentialDelay",
    "FaultConfig",
    "FixedDelay",
    "FrictionConfig",
    "GEPOConfig",
    "GRPOConfig",
    "GSPOConfig",
    "GymTaskConfig",
    "ISPGConfig",
    "KLEstimator",
    "LearnerConfig",
    "LinkConfig",
    "LiveConfig",
    "LogNormalDelay",
    "LoraConfig",
    "MathTaskConfig",
    "MetricsConfig",
    "ModelConfig",
    "ModelledConfig",
    "ObjectiveConfig",
    "ObjectiveOptions",
    "Outage",
    "PGConfig",
    "ParallelConfig",
    "PretrainConfig",
    "RayConfig",
    "RayLearnerConfig",
    "ReputationConfig",
    "ReversalTaskConfig",
    "RunConfig",
    "RuntimeConfig",
    "SamplerConfig",
    "SamplerNodeConfig",
    "SimpleTransfer",
    "StoreConfig",
    "Strict",
    "TaskConfig",
    "TcpTransfer",
    "TransferConfig",
    "TransformersEngineConfig",
    "TransportConfig",
    "TrustConfig",
    "UniformDelay",
    "VLLMEngineConfig",
    "VerifyConfig",
    "WeibullDelay",
    "WeightsConfig",
    "apply_overrides",
    "changed_settings",
    "check_store_url",
    "config_to_yaml",
    "count_text",
    "load_config",
    "load_yaml_text",
    "parse_override",
    "read_yaml_mapping",
    "validate_config",
]
