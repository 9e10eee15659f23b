"""``ds4lab audit``: what CUDA-graph capture would refuse, break or silently get wrong in any engine's
decode step, and what it would save, from the traces people already take (``events``: the one event
table every source is read into)."""
