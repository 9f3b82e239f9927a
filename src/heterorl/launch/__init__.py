"""Launchers beyond one host: torchrun for a multi-process learner (`torchrun.py`) and Ray actors (`ray.py`).

Both start the entry points that already exist (the simulated run, `serve_learner`, `run_sampler`); neither
schedules anything itself.
"""
