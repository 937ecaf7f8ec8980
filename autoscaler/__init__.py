"""autoscaler package of faro-serve."""
