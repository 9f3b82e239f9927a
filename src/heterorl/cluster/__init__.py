"""Cluster drivers: the discrete-event loop and clocks (`events`), the simulated and the live cluster."""
