"""The passes: each a function from a graph and the plan to the graph rewritten for one
concern. `parallax.rewriting.pipeline` composes them."""
