"""Invariant checker: reads the stores and says whether every message had exactly one effect.

Effects are counted from what the stores hold (order documents and lines,
ledger markers and account balances, order-status documents, parked
entries) and, in the simulator, from what the fake notification API and the
simulated broker's dead-letter queues saw: never from counters kept by the
code under test.

Invariants:

* exactly one effect per logical message: one order document (with all its
  lines), one ledger marker per payment with every account balance equal to
  the sum of its applied events, one accepted notification per subscription
  (distinct Idempotency-Keys when the API honours them, raw calls when not);
* nothing lost: every message is effected, dead-lettered or parked, with a reason;
* every valid message effected: valid = not invalid input and not a key
  conflict; a valid message that is not effected, or whose copy was
  dead-lettered or parked although it was effected, fails the run whatever the
  reason (MaxDeliveryCountExceeded, StaleInProgress, ProcessingFailed,
  Transient, UnexpectedError, ...). Two exceptions: `OutcomeUnknown`, below,
  and an effected message whose redundant copy the broker dead-lettered after
  every delivery of that copy drew a fault from the harness (listed apart:
  the fault injector, not the app, ran out the delivery count);
* invalid input rejected with a reason on its first delivery: dead-lettered or
  parked with a reason that says what is wrong with the input (any reason that
  `is_operational` does not flag), once per copy sent, and no delivery of it
  before the rejection that raised, abandoned or left it unsettled (host
  crashes and lock losses the harness injected excepted);
* no exception reached the host other than a transient store failure, and no
  Event Hubs batch retried until the host gave up (in production its partition
  would stall: the retry policy is unbounded);
* every key conflict (same id, other content) is dead-lettered or parked;
* no dedup record left in progress (after reconciliation);
* the outbox's hops (orders -> notify/audit, payments -> balance_projection): every
  committed effect's messages effected exactly once downstream, none published for an
  effect that did not commit (phantoms), none left pending after reconciliation, and each
  account's balance view equal to its balance document.

`OutcomeUnknown` is the notifications' honest "the call may or may not have
landed" when the API does not honour Idempotency-Key and a timeout hid the
answer: re-sending could notify twice, so a person decides. With such an API
(`Evidence.api_honours_key` false) those parkings are allowed and listed apart
(with whether the API's log shows the call landed); with an API that honours
the key the app can always re-send safely, so an `OutcomeUnknown` counts as
not effected like any other reason.

One `Evidence` (evidence.py) holds what the checks read; each consumer's checks are
a module (orders, order_status, payments, notifications, outbox, balance_changes,
invalid_input, host),
a function from the evidence to its invariants that also adds to the shared tallies
(`CheckResult`); checker.py runs them and states the invariants across consumers.
`python -m simulator.check` (cli.py) runs them against a real deployment.
"""

from simulator.check.checker import CHECKS, Check, Checker, run_checks, shared_invariants
from simulator.check.cli import SERVICE_BUS_CONSUMERS, main, read_dead_letters
from simulator.check.evidence import (
    CHANNELS,
    CONFLICT,
    CONSUMERS,
    OPERATIONAL_REASONS,
    OUTCOME_UNKNOWN,
    DeadLetter,
    Evidence,
    gather,
    is_operational,
    is_transient_error,
)
from simulator.check.result import CheckResult, Invariant, format_result, valid_detail, valid_line
from simulator.check.stores import Stores, scan, stores_from_settings, stores_of

__all__ = [
    "CHANNELS", "CHECKS", "CONFLICT", "CONSUMERS", "OPERATIONAL_REASONS", "OUTCOME_UNKNOWN",
    "SERVICE_BUS_CONSUMERS", "Check", "CheckResult", "Checker", "DeadLetter", "Evidence",
    "Invariant", "Stores", "format_result", "gather", "is_operational", "is_transient_error",
    "main", "read_dead_letters", "run_checks", "scan", "shared_invariants", "stores_from_settings",
    "stores_of", "valid_detail", "valid_line",
]
