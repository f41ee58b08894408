from datetime import timedelta

import pytest

from shared import IdempotencyConfig
from shared._core.config import RedeliveryWindow, validate_retention
from shared._core.exceptions import RetentionConfigError


def test_default_ttl_covers_the_default_service_bus_window():
    window = RedeliveryWindow()
    assert window.length == timedelta(minutes=5) * 10 + timedelta(days=1)
    validate_retention(timedelta(days=7), window)
    IdempotencyConfig(window=window)  # default TTL is 7 days


def test_ttl_shorter_than_the_redelivery_window_is_a_startup_error_that_says_why():
    window = RedeliveryWindow(lock_duration=timedelta(minutes=5), max_delivery_count=10,
                              max_auto_lock_renewal=timedelta(minutes=5), margin=timedelta(hours=1))
    with pytest.raises(RetentionConfigError, match=r"shorter than the redelivery window .* x 10"):
        IdempotencyConfig(ttl=timedelta(minutes=30), window=window)


def test_lease_must_be_shorter_than_the_ttl():
    with pytest.raises(RetentionConfigError):
        IdempotencyConfig(ttl=timedelta(minutes=1), lease=timedelta(minutes=5))
