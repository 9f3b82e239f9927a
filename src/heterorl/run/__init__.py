"""Run concerns: components built from a config, the run directory, the recorder of metrics and summary,
checkpoints. Used by both drivers; knows no clock and no transport."""
