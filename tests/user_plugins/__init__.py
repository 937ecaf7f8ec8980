"""A user's own plug-ins, kept outside faro-serve (see my_policies.py)."""
