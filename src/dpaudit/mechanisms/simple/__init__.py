"""The small closed-form mechanisms: the Gaussian sum query of the audits and noisy-sum."""
