"""DP-ELM with the exact discrete Laplace sampler."""
