"""deployments package of faro-serve."""
