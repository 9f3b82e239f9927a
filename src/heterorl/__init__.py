"""heterorl: RL post-training of language models across decentralized, heterogeneous, high-latency networks.

from heterorl import Trainer
Trainer("configs/smoke.yaml").fit()        # docs: heterorl.api
"""

from heterorl.api import Callback, Trainer

__version__ = "0.1.0"
__all__ = ["Callback", "Trainer", "__version__"]
