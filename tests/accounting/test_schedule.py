import pytest

from dpaudit.accounting import dp_sgd_schedule
from dpaudit.errors import UsageError


@pytest.mark.parametrize(
    "n,b,e,q,m0,steps",
    [
        (51000, 256, 10, 0.005, 255, 2000),  # MNIST
        (42500, 256, 10, 0.00598802, 254, 1670),  # CIFAR-10
        (48025, 256, 30, 0.00531915, 255, 5640),  # Cardio
        (212, 64, 30, 0.25, 53, 120),  # Heart
    ],
)
def test_published_schedules(n, b, e, q, m0, steps):
    s = dp_sgd_schedule(n, b, e)
    assert round(s.sample_rate, 8) == q
    assert s.normalizer == m0 and s.steps == steps
    assert s.sample_rate == 1.0 / s.batches_per_epoch


def test_normaliser_at_least_one_and_bad_input():
    assert dp_sgd_schedule(3, 256, 1).normalizer == 3
    with pytest.raises(UsageError, match="batch_size must be an integer >= 1"):
        dp_sgd_schedule(100, 0, 1)
