"""Planning: what the driver decides once, before any worker starts. `analysis` reads the
graph, `measure` probes the input, the step and the links, `search` chooses with the cost model
(`cost`), and `plan` makes the one `Plan` value that every worker receives."""
