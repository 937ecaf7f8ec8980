"""Faro's policy and its parts (paper 4.4, and ours beyond it). ``composition`` says in one
place how the parts compose and in which order; ``hybrid`` holds the policy class."""
