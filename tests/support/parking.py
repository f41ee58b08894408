"""Read a parked entry's stored body in tests (the product reads entries as `ParkedEntry`)."""

from __future__ import annotations

from typing import Any

from shared._core.keys import store_safe_id
from shared._flows.parking import ParkingLot


def parked_body(lot: ParkingLot, consumer: str, entry_id: str) -> dict[str, Any] | None:
    """The entry's stored body, or None when nothing is parked under that id."""
    document = lot.store.read_document(store_safe_id(consumer), store_safe_id(entry_id))
    return document.body if document else None
