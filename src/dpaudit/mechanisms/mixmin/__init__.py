"""DP-MixMin: solver, tasks and proxies, plan, the mechanism and its audit target."""
