"""`heterorl calibrate`: a simulator config from a live run's own records (docs/planning.md).

- `records`: reading the run directory (config.yaml, event lines of the learner and samplers, summary.json).
- `fit`: the statistics (ratio of sums, least squares, quantiles), each with its count and 95% interval.
- `measure`: what is measured and how: sampler speeds, the learner's cost, each link's delays and rates, start-up.
- `write`: the calibrated config and the table; `command`: the command.
"""

from heterorl.calibrate.command import calibrate, calibrate_command
from heterorl.calibrate.measure import Calibration, calibrate_run
from heterorl.calibrate.records import CalibrationError, read_run
from heterorl.calibrate.write import calibrated_config

__all__ = [
    "Calibration",
    "CalibrationError",
    "calibrate",
    "calibrate_command",
    "calibrate_run",
    "calibrated_config",
    "read_run",
]
