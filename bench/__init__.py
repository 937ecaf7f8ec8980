"""bench package of faro-serve."""
