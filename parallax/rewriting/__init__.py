"""Rewriting: a worker's copy of the user's graph (`graph_copy`), prepared (`split_variables`)
and rewritten by the passes (`passes/`) that `pipeline.transform` composes for the plan."""
