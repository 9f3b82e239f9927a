"""Config base classes: strict sections (unknown keys are errors) and the error every config problem raises."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the offending field."""


class Strict(BaseModel):
    """Base for all config sections: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
