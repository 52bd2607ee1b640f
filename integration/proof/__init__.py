"""Offline proof tooling: runs vLLM engines on a GPU to show the plugin works and to time norms in the model.

prove (driver) -> prove_arm (one engine per arm, in its own process) -> steptrace (profiler traces)
-> evidence (the results file and the step profile) -> ingraph (policy tables from the profile);
launchcost times the host cost of one fused call. Nothing here runs inside a serving vLLM.
"""
