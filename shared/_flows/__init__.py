"""The flows: sans-I/O generators of steps (the dedup flow, the group commit, the watermark,
parking) and the two drivers that run them, sync and async. They know no SDK."""
