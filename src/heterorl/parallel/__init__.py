"""The learner past one process: micro-batch sharding across ranks, collectives, and the rank-0-drives loop
(torch.distributed, FSDP2 / DDP)."""
