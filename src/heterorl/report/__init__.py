"""Reports over run directories: grouped tables, figures and exports to TensorBoard / W&B.

- `runs`: reading run directories; grouping runs that differ only by seed. `labels`: naming groups by the keys
  that really differ.
- `stats`: per-run numbers from metrics.jsonl and their mean ± std over seeds, baseline comparison.
- `plots`: the PNG figures. `document`: report.md / report.json (`make_report`). The optional sinks (TensorBoard,
  W&B offline or online) live in `heterorl.sinks`, below the loop that writes them, and are re-exported here.
- `command`: the `heterorl report` command function.
"""

from heterorl.report.command import report_command
from heterorl.report.document import ReportResult, make_report
from heterorl.report.runs import ReportError
from heterorl.sinks import MissingPackageError, SinkError, WandbRun, tensorboard_export, wandb_export, wandb_preflight

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
