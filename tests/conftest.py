"""Settings every test shares.

Hypothesis: no per-example deadline. The machines that run the suite are shared and loaded; a
property either holds or not, and how long one example took says nothing about that."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile(
    "orch", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("orch")
