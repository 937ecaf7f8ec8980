"""Matched validation: the simulator against live Ray Serve on the same workload (paper 6.5)."""
