"""Planning: what the driver decides once, before any worker starts. `analysis` reads the
graph and `measure` probes the input, the step and the links; the planner (`planner`) poses
the `problem`, whose `candidates` the `proposal` searches by their rating (`cost`), and says
why (`explanation`); `plan` makes the one `Plan` value that every worker receives."""
