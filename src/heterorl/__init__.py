"""heterorl: RL post-training of language models across decentralized, heterogeneous, high-latency networks."""

__version__ = "0.1.0"
