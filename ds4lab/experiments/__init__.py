"""Experiments on the token: the stages of a capture plan, one stage run as an object (record, time, compare,
classify), and the tables of runs that the ladder, the context ladder and the hazard demonstrations execute; modeled
what-if sweeps."""
