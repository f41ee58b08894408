"""What the app sends, learnt at set-up: the `same-transactions` variant's templates.

The app (`build_services`, then `payments_async.process_batch`, as the `app` variant runs
it) handles two probe batches on the variant's own stores, with a fixed clock, while their
clients record every request (`RequestCounter.recording`). Each document the app wrote (the
first marker of a transaction, a further marker, a balance, the partition's mark) is matched
field by field against the values `benchmarks.raw_payments` computes for the same events: a
field that holds one of them in every recorded document of its kind becomes that slot; a
field equal in all of them, a constant. Any other field stops the run here
(`TemplateError`), naming it: the variant could not write it. So the variant's markers are
byte for byte the app's, whatever the marker format becomes, as long as every varying field
is a value the variant knows how to compute.

Only this set-up runs the app and the library; the variant's hot path does not.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks import raw_payments as raw
from benchmarks.counting import AsyncCostedDispatcher, RequestCounter, SendTally, SentRequest
from benchmarks.workload import CLOUDEVENTS_JSON
from shared._triggers.eventhubs import EventView

CONSUMER = "payments"  # the app's consumer name for the payments function (domain.payments)
# An Event Hubs partition id no measured batch uses; a character to escape in it and in the
# accounts, so a store-safe id and its raw text differ (each field is told apart)
PROBE_PARTITION = "setup/probe"
PROBE_TIME = 1_767_225_600.125  # the probe's clock: a fraction, so float and ms forms differ
PROBE_SOURCE = "/bench/setup/probe"
# (sequence number, account, signed cents): batch 1 gives one account three events (markers
# after the first) and another one; batch 2 writes a known account again (a replace under
# its etag) and a new one. Amounts chosen so no balance, version or sequence number coincide.
PROBE_BATCHES: tuple[tuple[tuple[int, str, int], ...], ...] = (
    ((900_001, "probe/a", 1000), (900_002, "probe/a", -300), (900_003, "probe/b", 7),
     (900_004, "probe/a", 20)),
    ((900_005, "probe/a", 5), (900_006, "probe/c", 11)))


class TemplateError(RuntimeError):
    """The app wrote something the same-transactions variant cannot write."""


@dataclass(frozen=True)
class Operation:
    kind: str  # "create" or "replace"
    document: dict[str, Any]
    etag: str | None


@dataclass(frozen=True)
class Transaction:
    role: str  # the store role ("ledger", "dedup")
    operations: tuple[Operation, ...]


@dataclass(frozen=True)
class AppShape:
    """What the variant needs of the app, learnt from it."""

    templates: raw.Templates
    balance_id: str  # the id of an account's balance document
    mark_partition: str  # the store partition of the partitions' marks
    ttl_seconds: float
    event_hub: str
    queue: str  # where BalanceChanged goes ("": the app publishes nothing)
    namespace: Any  # uuid.UUID of the message ids
    send_limit: int  # bytes per send (the dispatcher's cut)
    header_allowance: int
    concurrency: int  # the app's bound on concurrent account groups
    recorded: list[list[SentRequest]] = field(default_factory=list[list[SentRequest]])


def probe_events(batch: Sequence[tuple[int, str, int]]) -> list[EventView]:
    return [EventView(sequence_number=sequence, body=json.dumps({
        "specversion": "1.0", "id": f"probe-{sequence}", "source": PROBE_SOURCE,
        "type": "payment.credit" if cents > 0 else "payment.debit",
        "datacontenttype": "application/json",
        "data": {"accountId": account, "amountCents": abs(cents)}}).encode(),
        content_type=CLOUDEVENTS_JSON, offset=str(sequence * 512), partition_key=account)
        for sequence, account, cents in batch]


# -- reading the recorded requests ---------------------------------------------------------------
_BATCH_HEADER = "x-ms-cosmos-is-batch-request"
_PART = re.compile(r"\r\n\r\n(POST|PUT) (\S+) HTTP/1\.1\r\n(.*?)\r\n\r\n(.*?)\r\n--changeset_",
                   re.DOTALL)


def transactions(requests: Sequence[SentRequest], roles: Mapping[str, str]) -> list[Transaction]:
    """The transactions among `requests` (Cosmos transactional batches, Table `$batch`es),
    each with the role of the container / table it went to (`roles`: name -> role)."""
    found: list[Transaction] = []
    for request in requests:
        headers = {k.lower(): v for k, v in request.headers.items()}
        if request.method == "POST" and headers.get(_BATCH_HEADER, "").lower() == "true":
            container = re.search(r"/colls/([^/]+)/docs", request.url)
            operations = tuple(
                Operation(op["operationType"].lower(), op["resourceBody"], op.get("ifMatch"))
                for op in json.loads(request.body))
            found.append(Transaction(roles[container.group(1) if container else ""], operations))
        elif request.method == "POST" and request.url.endswith("/$batch"):
            parts = _PART.findall(request.body.decode("utf-8"))
            table = re.search(r"/([^/(]+?)(?:\(|$)", parts[0][1]) if parts else None
            operations = tuple(
                Operation("create" if method == "POST" else "replace", json.loads(body),
                          _header(head, "If-Match")) for method, _, head, body in parts)
            found.append(Transaction(roles[table.group(1) if table else ""], operations))
    return found


def _header(head: str, name: str) -> str | None:
    for line in head.split("\r\n"):
        key, _, value = line.partition(": ")
        if key.lower() == name.lower():
            return value
    return None


# -- learning a template -------------------------------------------------------------------------
def _same(a: Any, b: Any) -> bool:
    """Equal and of the same type (1, 1.0 and True are three different JSON values here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def learn(kind: str, samples: Sequence[tuple[dict[str, Any], Any]],
          slots: Mapping[str, Callable[[Any], Any]]) -> raw.Template:
    """The template of documents `samples` holds, each with the facts the variant has for it."""
    if not samples:
        raise TemplateError(f"the app wrote no {kind} in the probe batches")
    names = list(samples[0][0])
    for document, _ in samples:
        if list(document) != names:
            raise TemplateError(f"{kind}: the app wrote different fields in one run: {names} and "
                                f"{list(document)}")
    fields: list[tuple[str, Callable[[Any], Any] | None, Any]] = []
    chosen: list[str | None] = []
    for name in names:
        slot = next((s for s, value_of in slots.items()
                     if all(_same(value_of(facts), document[name]) for document, facts in samples)),
                    None)
        first = samples[0][0][name]
        if slot is not None:
            fields.append((name, slots[slot], None))
        elif all(_same(document[name], first) for document, _ in samples):
            fields.append((name, None, first))
        else:
            values = [document[name] for document, _ in samples][:3]
            raise TemplateError(
                f"{kind} field {name!r} holds values the same-transactions variant does not "
                f"compute ({values!r}; it knows {sorted(slots)}): teach "
                "benchmarks/raw_payments.py that field's form")
        chosen.append(slot)
    return raw.Template(kind, tuple(fields), tuple(chosen))


# -- the probe: the app itself, recorded ---------------------------------------------------------
@dataclass
class _Account:
    balance: int = 0
    version: int = 0


def learn_app(*, services: Any, run: Callable[[Any], Any], counters: Sequence[RequestCounter],
              roles: Mapping[str, str], cosmos: bool, settings: Any, send_limit: int,
              header_allowance: int, namespace: Any) -> AppShape:
    """Run the app's payments path (`services`, built with the probe's clock) on the probe
    batches, recording; the templates of what it wrote."""
    recorded: list[list[SentRequest]] = []
    for batch in PROBE_BATCHES:
        with contextlib.ExitStack() as stack:
            logs = [stack.enter_context(counter.recording()) for counter in counters]
            run(services.payments_async.process_batch(probe_events(batch), PROBE_PARTITION))
        recorded.append([request for log in logs for request in log])
    ttl = settings.idempotency_config().ttl.total_seconds()
    hub, queue = settings.payments_hub, settings.balance_changes_queue
    id_field, pk_field = ("id", "pk") if cosmos else ("RowKey", "PartitionKey")
    accounts: dict[str, _Account] = {}
    firsts: list[tuple[dict[str, Any], raw.MarkerFacts]] = []
    markers: list[tuple[dict[str, Any], raw.MarkerFacts]] = []
    balances: list[tuple[dict[str, Any], raw.BalanceFacts]] = []
    marks: list[tuple[dict[str, Any], raw.MarkFacts]] = []
    kinds: list[tuple[str, ...]] = []
    balance_ids: set[str] = set()
    mark_partitions: set[str] = set()
    for batch, requests in zip(PROBE_BATCHES, recorded, strict=True):
        found = transactions(requests, roles)
        ledger = [t for t in found if t.role == "ledger"]
        groups: dict[str, list[raw.Payment]] = {}
        for event in probe_events(batch):
            paid = raw.payment(event.body, event.sequence_number, event.offset)
            groups.setdefault(paid.account, []).append(paid)
        if len(ledger) != len(groups):
            raise TemplateError(f"the app sent {len(ledger)} ledger transactions for "
                                f"{len(groups)} accounts in a probe batch")
        for transaction in ledger:
            operations = transaction.operations
            account = next((a for a, g in groups.items() if raw.safe_id(a)
                            == operations[0].document.get(pk_field)), None)
            if account is None:
                raise TemplateError(f"a ledger transaction in an unknown partition: "
                                    f"{operations[0].document.get(pk_field)!r}")
            group = groups[account]
            state = accounts.setdefault(account, _Account())
            was_new = state.version == 0
            facts: list[raw.MarkerFacts] = []
            for paid in group:
                state.balance += paid.cents
                facts.append(raw.MarkerFacts(
                    paid.key, raw.record_id(CONSUMER, paid.key), raw.safe_id(account), paid.digest,
                    state.balance, PROBE_TIME, PROBE_TIME + ttl))
            state.version += len(group)
            if queue:
                sent = raw.balance_changed(
                    consumer=CONSUMER, key=group[0].key, marker_id=facts[0].record_id,
                    queue=queue, account=account, balance=state.balance,
                    version=state.version, event_ids=[p.event_id for p in group],
                    header_allowance=header_allowance)
                facts[0].outbox = sent.stored
                facts[0].position = raw.position(hub, PROBE_PARTITION, group[0].sequence)
            ids = [f.record_id for f in facts]
            if [op.document.get(id_field) for op in operations[:len(facts)]] != ids:
                raise TemplateError("the app's transaction does not hold the markers the variant "
                                    f"derives, in order: {ids} vs "
                                    f"{[op.document.get(id_field) for op in operations]}")
            if len(operations) != len(facts) + 1:
                raise TemplateError(f"the app's transaction holds {len(operations)} writes for "
                                    f"{len(facts)} events (the variant writes markers + balance)")
            firsts.append((operations[0].document, facts[0]))
            markers += [(op.document, f) for op, f in zip(operations[1:-1], facts[1:], strict=True)]
            balance = operations[-1]
            balance_ids.add(str(balance.document.get(id_field)))
            balances.append((balance.document, raw.BalanceFacts(account, raw.safe_id(account),
                                                                state.balance, state.version)))
            kinds.append((*(op.kind for op in operations[:-1]),
                          f"{balance.kind}{'+etag' if balance.etag else ''}",
                          "new" if was_new else "known"))
        for transaction in (t for t in found if t.role == "dedup"):
            (mark,) = transaction.operations
            newest = max(paid[0] for paid in batch)
            mark_partitions.add(str(mark.document.get(pk_field)))
            marks.append((mark.document, raw.MarkFacts(
                raw.safe_id(PROBE_PARTITION), str(mark.document.get(pk_field)), newest,
                PROBE_PARTITION, str(newest * 512))))
            kinds.append((f"mark {mark.kind}{'+etag' if mark.etag else ''}",))
    _check_kinds(kinds)
    if len(balance_ids) != 1 or len(mark_partitions) != 1 or len(marks) != len(PROBE_BATCHES):
        raise TemplateError(f"unexpected balance ids {balance_ids}, mark partitions "
                            f"{mark_partitions} or {len(marks)} mark writes")
    templates = raw.Templates(
        first_marker=learn("first marker", firsts, raw.MARKER_SLOTS),
        marker=learn("marker", markers, raw.MARKER_SLOTS),
        balance=learn("balance", balances, raw.BALANCE_SLOTS),
        mark=learn("mark", marks, raw.MARK_SLOTS))
    return AppShape(templates, balance_ids.pop(), mark_partitions.pop(), ttl, hub, queue,
                    namespace, send_limit, header_allowance, settings.payments_max_concurrency,
                    recorded)


def _check_kinds(kinds: list[tuple[str, ...]]) -> None:
    """Markers are created; a balance is created when new and replaced under its etag when
    known; the mark is created, then replaced under its etag: what the variant writes."""
    for shape in kinds:
        if shape[0].startswith("mark "):
            continue
        *marker_kinds, balance, age = shape
        expected = "create" if age == "new" else "replace+etag"
        if set(marker_kinds) != {"create"} or balance != expected:
            raise TemplateError(f"the app's ledger transaction changed shape: {shape}")
    marks = [shape[0] for shape in kinds if shape[0].startswith("mark ")]
    if marks != ["mark create", "mark replace+etag"]:
        raise TemplateError(f"the app's mark writes changed shape: {marks}")


def probe_dispatcher() -> AsyncCostedDispatcher:
    """The probe's sends: costed at no round trip, tallied apart from the variant's."""
    return AsyncCostedDispatcher(SendTally(), 0.0)
