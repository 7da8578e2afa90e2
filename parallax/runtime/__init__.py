"""Runtime: a worker's session of its rewritten graph (`session.ParallaxRunner`), what each run
is (`steps`), checkpoints, profiling, and the parameter-server process (`server`)."""
