"""DP-SGD: config and kernels (core, ghost_clip, user_level), the one loop (loop), models and
features, the mechanism and schedule, and the audit targets built from its plans."""
