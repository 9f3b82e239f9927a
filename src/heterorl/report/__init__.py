"""Reports over run directories: grouped tables, figures and exports to TensorBoard / W&B.

- `runs`: reading run directories; grouping runs that differ only by seed; naming groups by the keys that differ.
- `stats`: per-run numbers from metrics.jsonl and their mean ± std over seeds, baseline comparison.
- `plots`: the PNG figures. `document`: report.md / report.json (`make_report`). `export`, `wandb_sink`:
  optional sinks (TensorBoard; W&B offline or online). `labels`: naming groups by what tells them apart.
- `command`: the `heterorl report` command function.
"""

from heterorl.report.command import report_command
from heterorl.report.document import ReportResult, make_report
from heterorl.report.export import MissingPackageError, tensorboard_export
from heterorl.report.runs import ReportError
from heterorl.report.wandb_sink import SinkError, WandbRun, wandb_export, wandb_preflight

__all__ = [
    "MissingPackageError",
    "ReportError",
    "ReportResult",
    "SinkError",
    "WandbRun",
    "make_report",
    "report_command",
    "tensorboard_export",
    "wandb_export",
    "wandb_preflight",
]
