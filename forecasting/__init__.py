"""forecasting package of faro-serve."""
