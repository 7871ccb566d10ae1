"""Bridges to training libraries outside dpaudit (imported lazily; each needs its library).

- :mod:`dpaudit.integrations.opacus`: one-run audits of models trained with Opacus's
  ``PrivacyEngine`` (canaries injected through the ``DPOptimizer``).
"""
