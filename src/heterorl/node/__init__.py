"""A node: a sampler session bound to a transport and a runtime, carried out the same way under both clocks."""
