"""Measurement tools behind `heterorl sync bench` and benchmarks/: the PULSE codec on realistic steps (`pulse`),
and the weight steps it is measured on (`steps`: synthetic, noise, a ~90M Qwen3's SFT steps, the demo's RL steps).
They sit above the loop (the demo step runs a learner and a sampler), so no library module imports them."""
