"""The simulated transport: each sampler's link as two FIFO paths in virtual time (`paths`), the conversation over it
(`link`: uploads and replies, weight pulls and long-polls), and the object store on the simulated clock (`store`)."""
