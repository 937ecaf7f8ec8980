"""Policies by name: the built-in catalogue (one row per policy: factory, summary, whether it
batches, whether it forecasts), policies registered in code, and plug-ins named by import
path or entry point."""
