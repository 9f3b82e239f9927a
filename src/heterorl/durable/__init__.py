"""Durability of a live learner: the write-ahead journal of acknowledged groups and the atomic learner state."""
