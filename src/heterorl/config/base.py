"""Config base classes: strict sections (unknown keys are errors) and the error every config problem raises, and
the upper bounds shared by many fields (a value past them is a typo, not a plan)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

MAX_SEED = 2**32 - 1  # numpy's seed range; derived streams (seed * 1_000_003 + i) stay within torch's 64 bits
MAX_STEPS = 10_000_000  # learner / supervised steps, and every count or interval measured in steps
MAX_SECONDS = 1e7  # any duration of the simulated network (about 116 days)
MAX_MBPS = 1e7  # any bandwidth (10 Tbit/s)


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the offending field."""


class Strict(BaseModel):
    """Base for all config sections: unknown keys are errors, assignments are validated, floats are finite."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
