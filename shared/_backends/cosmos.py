"""Cosmos DB for NoSQL backend (`azure-cosmos`).

Claim = `create_item` (409 = exists). Atomic path = one transactional batch with the marker
first and the business operations after it, in the marker's logical partition: all commit or
none do, and a 409 at index 0 identifies the duplicate. Markers carry a native `ttl` and their
expiry (`codec.EXPIRES`), which every read checks, since the service expires in the background.

A store refuses an account with more than one write region (`check_write_regions`): each
region arbitrates the conditional create, so two regions can each accept a copy's marker.
"""

from __future__ import annotations

import email.utils
import functools
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Self

from azure.core import MatchConditions
from azure.cosmos import ContainerProxy, CosmosClient, CosmosDict
from azure.cosmos.exceptions import CosmosBatchOperationError

from shared._backends.sdk_requests import (
    Request,
    RequestMapping,
    changed_statuses,
    send_request,
    store_call,
    store_items,
)
from shared._core.codec import (
    EXPIRES,
    LEASE,
    NATIVE_TTL,
    STATE,
    VERSION,
    WRITTEN,
    bound_millis,
    check_flat,
    is_record,
    pending_names,
    record_fields,
    record_from_fields,
)
from shared._core.exceptions import ConfigurationError, MultiRegionWritesError, RecordExistsError
from shared._core.outbox import PENDING_SINCE
from shared._core.records import IdempotencyRecord, RecordState
from shared._core.store import (
    Document,
    StepStore,
    StoreStep,
    WriteOp,
    check_transaction_size,
    transaction_failure,
    written_documents,
)

BACKEND = "Cosmos DB"
#: The WARNING record of a store that runs, by the caller's choice, on a multi-write account.
EVENT_MULTI_REGION_WRITES = "CosmosMultiRegionWrites"
#: The keyword (of every Cosmos store's constructor) that accepts such an account.
ACCEPT_MULTI_REGION = "accept_duplicates_across_write_regions"
logger = logging.getLogger(__name__)
_SYSTEM = ("_rid", "_self", "_etag", "_attachments", "_ts", "ttl")
IF_UNCHANGED = MatchConditions.IfNotModified
_MINIMAL: Mapping[str, Any] = MappingProxyType({"no_response": True})  # Prefer: return=minimal
_ECHOED: Mapping[str, Any] = MappingProxyType({})


class CosmosMapping(RequestMapping):
    """Record <-> item and WriteOp -> batch operation mapping, shared by the sync and async stores."""

    _pk_field: str
    _container: Any  # a container proxy of the sync or the async SDK
    # Writes ask for `Prefer: return=minimal`: the answer has the etag in its headers (in a
    # batch, each operation's `eTag`) but not the item, which nothing here reads.
    _write_options: Mapping[str, Any] = _MINIMAL

    def _configure(self, partition_key_path: str, minimal_responses: bool) -> None:
        if not partition_key_path.startswith("/") or "/" in partition_key_path[1:]:
            raise ValueError("partition_key_path must be a top-level path such as '/pk'")
        self._pk_field = partition_key_path[1:]
        self._write_options = _MINIMAL if minimal_responses else _ECHOED

    @classmethod
    def from_container(cls, container: Any, partition_key_path: str = "/pk",
                       **options: Any) -> Self:
        """Around a container of the caller's (who keeps its client and closes it)."""
        # cls is a store class: the mapping mixin itself has no __init__ taking these
        return cls("", database="", container=container.id,  # type: ignore[call-arg]
                   partition_key_path=partition_key_path, container_client=container, **options)

    @property
    def container(self) -> Any:
        return self._container

    @property
    def partition_key_field(self) -> str:
        """The property the container is partitioned on (`/pk` -> "pk")."""
        return self._pk_field

    def _record_document(self, record: IdempotencyRecord, body: dict[str, Any] | None = None,
                         *, written_id: str | None = None) -> dict[str, Any]:
        # JSON values, not text; pending messages in one property, so recording them as
        # dispatched is one patch of at most two operations.
        document = record_fields(record, native_json=True, written_id=written_id)  # ours
        if body:
            document = {**body, **document}
        document["id"] = record.id
        document[self._pk_field] = record.partition_key
        if record.expires_at is not None:
            ttl = max(1, math.ceil(record.expires_at - record.updated_at))
            document[NATIVE_TTL] = ttl
            if document[EXPIRES] - document[WRITTEN] == ttl * 1000:
                del document[WRITTEN]  # the expiry and the item's ttl say it
        return document

    def _to_record(self, document: dict[str, Any]) -> IdempotencyRecord:
        return record_from_fields(document, record_id=document["id"],
                                  partition=document[self._pk_field], etag=document.get("_etag"))

    def _business_document(self, partition: str, op: WriteOp) -> dict[str, Any]:
        if op.record is not None:  # a further marker of a group commit, with its ttl
            document = self._record_document(op.record, written_id=op.id)  # a new dict: ours
            document["id"] = op.id
            document[self._pk_field] = partition
            return document
        check_flat(op.body)
        return {**op.body, "id": op.id, self._pk_field: partition}

    def _batch_op(self, partition: str, op: WriteOp) -> tuple[Any, ...]:
        condition = {"if_match_etag": op.etag} if op.etag else {}
        if op.kind in ("create", "upsert"):
            return (op.kind, (self._business_document(partition, op),))
        if op.kind == "replace":
            return ("replace", (op.id, self._business_document(partition, op)), condition)
        if op.kind == "patch":
            return ("patch", (op.id, list(op.patch)), condition)
        if op.kind == "delete":
            return ("delete", (op.id,), condition)
        raise ValueError(f"unknown operation {op.kind!r}")

    def _commit_batch(self, marker: IdempotencyRecord, operations: Sequence[WriteOp],
                      marker_body: dict[str, Any] | None) -> list[tuple[Any, ...]]:
        """The batch of an atomic commit: the marker (create, or replace of an expired one) first."""
        if marker_body:
            check_flat(marker_body)
        document = self._record_document(marker, marker_body)
        first: tuple[Any, ...] = (("replace", (marker.id, document), {"if_match_etag": marker.etag})
                                  if marker.etag else ("create", (document,)))
        return [first, *(self._batch_op(marker.partition_key, op) for op in operations)]

    @staticmethod
    def _committed(marker: IdempotencyRecord, operations: Sequence[WriteOp],
                   results: list[dict[str, Any]], written: list[Document] | None
                   ) -> IdempotencyRecord:
        etags = [_etag_in(result) for result in results]
        if written is not None:
            written += written_documents(marker.partition_key, operations, etags[1:])
        first: dict[str, Any] = results[0].get("resourceBody") or {}
        return marker.evolve(etag=etags[0], server_time=server_time(results) or server_time(first))

    @staticmethod
    def _dispatched_patch(marker: IdempotencyRecord) -> list[dict[str, Any]]:
        """The patch that clears a marker's pending messages (its other fields untouched)."""
        return [{"op": "remove", "path": f"/{name}"}
                for name in pending_names(marker, native_json=True)]

    _PENDING_QUERY = (f"SELECT * FROM c WHERE c.{PENDING_SINCE} > 0 "  # noqa: S608 - constants
                      f"AND c.{PENDING_SINCE} < @before")

    def _document(self, partition: str, document_id: str, item: dict[str, Any]) -> Document:
        # A synthetic "/pk" is storage detail; a business partition field (orderId) stays.
        hidden = {"id", "pk"} if self._pk_field == "pk" else {"id"}
        body = {k: v for k, v in item.items() if k not in _SYSTEM and k not in hidden}
        return Document(document_id, partition, body, item.get("_etag"))

    def _get_record(self, partition: str, record_id: str) -> Request[IdempotencyRecord | None]:
        return Request(lambda container: container.read_item(record_id, partition),
                       lambda item: self._to_record(item)
                       if item is not None and is_record(item) else None, none_if_missing=True)

    def _put_record_if_absent(self, record: IdempotencyRecord) -> Request[IdempotencyRecord]:
        return Request(lambda container: container.create_item(self._record_document(record),
                                                               **self._write_options),
                       lambda created: record.evolve(etag=written_etag(created),
                                                     server_time=server_time(created)),
                       on_status={409: lambda: RecordExistsError(record.id)})

    def _replace_record_if_unchanged(self, record: IdempotencyRecord) -> Request[IdempotencyRecord]:
        return Request(lambda container: container.replace_item(
            record.id, self._record_document(record), etag=record.etag,
            match_condition=IF_UNCHANGED, **self._write_options),
            lambda replaced: record.evolve(etag=written_etag(replaced),
                                           server_time=server_time(replaced)),
            on_status=changed_statuses(record.id))

    def _record_dispatched(self, marker: IdempotencyRecord) -> Request[IdempotencyRecord]:
        return Request(lambda container: container.patch_item(
            marker.id, marker.partition_key, self._dispatched_patch(marker), etag=marker.etag,
            match_condition=IF_UNCHANGED, **self._write_options),
            lambda patched: marker.evolve(etag=written_etag(patched), outbox=(), server_time=None),
            on_status=changed_statuses(marker.id))

    def _delete_record_if_unchanged(self, record: IdempotencyRecord) -> Request[None]:
        return Request(lambda container: container.delete_item(
            record.id, record.partition_key, etag=record.etag, match_condition=IF_UNCHANGED),
            lambda _: None, on_status=changed_statuses(record.id))

    def _read_document(self, partition: str, document_id: str) -> Request[Document | None]:
        return Request(lambda container: container.read_item(document_id, partition),
                       lambda item: None if item is None
                       else self._document(partition, document_id, item), none_if_missing=True)

    def _write_documents(self, partition: str, operations: Sequence[WriteOp]
                         ) -> Request[list[Document]]:
        return _batch(partition, [self._batch_op(partition, op) for op in operations], None,
                      lambda results: [Document(op.id, partition, op.body, _etag_in(result))
                                       for op, result in zip(operations, results, strict=True)],
                      self._write_options)

    def _commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp],
                marker_body: dict[str, Any] | None, written: list[Document] | None
                ) -> Request[IdempotencyRecord]:
        return _batch(marker.partition_key, self._commit_batch(marker, operations, marker_body),
                      marker.id, lambda results: self._committed(marker, operations, results,
                                                                 written), self._write_options)


def written_etag(answer: Any) -> str | None:
    """A point write's new etag: its `etag` response header, else the echoed item's `_etag`."""
    headers: Any = answer.get_response_headers() if isinstance(answer, CosmosDict) else {}
    return headers.get("etag") or answer.get("_etag")


def sdk_connection(container: Any) -> Any:
    """The SDK client connection behind a container, whose account the store checks;
    ConfigurationError for anything but an azure-cosmos ContainerProxy."""
    connection = getattr(container, "client_connection", None)
    if connection is None:
        raise ConfigurationError(
            f"{type(container).__name__} is not an azure-cosmos ContainerProxy: pass the SDK's "
            "container (the store checks its account's write regions), or use "
            "shared.testing.InMemoryIdempotencyStore in a test")
    return connection


def cached_account(connection: Any) -> Any | None:
    """The account properties an SDK client connection read when it was set up, or None (an
    async client not entered yet, or an SDK that keeps them elsewhere)."""
    manager = getattr(connection, "_global_endpoint_manager", None)
    return getattr(manager, "_database_account_cache", None)


def write_regions(account: Any) -> tuple[bool, tuple[str, ...]]:
    """(enableMultipleWriteLocations, the names of the writable locations) of an account."""
    # The SDK keeps `enableMultipleWriteLocations` in a private attribute only.
    multiple = bool(getattr(account, "_EnableMultipleWritableLocations", False))
    locations: list[dict[str, Any]] = list(getattr(account, "WritableLocations", None) or [])
    return multiple, tuple(str(location.get("name", "?")) for location in locations)


def check_write_regions(account: Any, *, endpoint: str, accept: bool) -> None:
    """Refuse an account that accepts writes in more than one region (MultiRegionWritesError),
    unless the caller accepted it (`accept`): then one WARNING record says what that costs.
    The flag alone refuses too: adding a region makes such an account multi-write at once.
    """
    multiple, regions = write_regions(account)
    if not multiple and len(regions) <= 1:
        return
    where = f"{len(regions)} region(s): {', '.join(regions)}" if regions else "several regions"
    risk = ("each write region arbitrates a conditional create on its own, so two regions can "
            "each accept a copy's dedup marker; last-writer-wins resolves the conflict after "
            "both effects ran")
    if accept:
        logger.warning("%s endpoint=%s regions=%s: %s (accepted with %s=True)",
                       EVENT_MULTI_REGION_WRITES, endpoint, ",".join(regions), risk,
                       ACCEPT_MULTI_REGION,
                       extra={"event": EVENT_MULTI_REGION_WRITES, "endpoint": endpoint,
                              "write_regions": ",".join(regions)})
        return
    raise MultiRegionWritesError(
        f"The Cosmos DB account at {endpoint} accepts writes in {where} "
        f"(enableMultipleWriteLocations={str(multiple).lower()}): {risk}. Keep the dedup "
        "containers in an account with a single write region: set enableMultipleWriteLocations "
        "to false on this account (Bicep/ARM property; `az cosmosdb update --name <account> "
        "--resource-group <group> --enable-multiple-write-locations false`) or use another "
        "account; read regions and service-managed failover keep it available. To run on it "
        f"anyway, accepting that a message can take effect once per write region, pass "
        f"{ACCEPT_MULTI_REGION}=True.", regions=regions)


def server_time(answer: Any) -> float | None:
    """When the service answered a write: the middle of the second its `Date` header names,
    else of an echoed item's `_ts`; None when neither is there."""
    get_headers = getattr(answer, "get_response_headers", None)  # CosmosDict, CosmosList
    headers: Any = get_headers() if callable(get_headers) else {}
    date = headers.get("date") or headers.get("Date")
    if date and (seconds := _http_date(str(date))) is not None:
        return seconds
    item: dict[str, Any] = answer if isinstance(answer, dict) else {}  # pyright: ignore[reportUnknownVariableType] - an SDK answer: any dict
    ts = item.get("_ts")
    return ts + 0.5 if isinstance(ts, int | float) and not isinstance(ts, bool) else None


@functools.lru_cache(maxsize=16)
def _http_date(value: str) -> float | None:
    """The middle of the second an HTTP `Date` names, or None. Cached: every write in the same
    second answers the same text."""
    try:
        return email.utils.parsedate_to_datetime(value).timestamp() + 0.5
    except (TypeError, ValueError, IndexError):
        return None


def _etag_in(result: dict[str, Any]) -> str | None:
    """An operation's new etag in a transactional batch answer: its `eTag`, else the echoed
    item's `_etag`."""
    body: dict[str, Any] = result.get("resourceBody") or {}
    return result.get("eTag") or body.get("_etag")


def _batch[T](partition: str, batch: list[tuple[Any, ...]], marker_id: str | None,
              answer: Callable[[list[dict[str, Any]]], T], options: Mapping[str, Any]) -> Request[T]:
    """One transactional batch; a failed operation maps to the store contract."""
    check_transaction_size(len(batch))
    return Request(lambda container: container.execute_item_batch(
        batch, partition_key=partition, **options),
        answer, refine=lambda error: batch_failure(error, marker_id)
        if isinstance(error, CosmosBatchOperationError) else None)


def batch_failure(error: CosmosBatchOperationError, marker_id: str | None) -> Exception:
    """The store-contract error for a failed transactional batch."""
    failed: Any = error  # the SDK leaves these attributes untyped
    index = int(failed.error_index or 0)
    responses: list[dict[str, Any]] = failed.operation_responses or []
    status: int | None = responses[index].get("statusCode") if index < len(responses) else None
    return transaction_failure(index, status, marker_id=marker_id)


class CosmosIdempotencyStore(CosmosMapping, StepStore):
    """Dedup records and business documents in one Cosmos DB container.

    `native_ttl`: whether the container expires markers itself (a default TTL is set), so
    `purge_expired` need not query; None asks the container once. `minimal_responses=False`
    has writes echo the item. A multi-write account is refused here (MultiRegionWritesError),
    from what the SDK client read when it was built, unless
    `accept_duplicates_across_write_regions=True` (then with a WARNING).
    """

    name = "cosmos"

    def __init__(self, endpoint: str, credential: Any = None, *, database: str, container: str,
                 partition_key_path: str = "/pk", container_client: ContainerProxy | None = None,
                 native_ttl: bool | None = None, minimal_responses: bool = True,
                 accept_duplicates_across_write_regions: bool = False,
                 **client_options: Any) -> None:
        self._native_ttl = native_ttl
        self._configure(partition_key_path, minimal_responses)
        self._cosmos: CosmosClient | None = None
        if container_client is None:
            self._cosmos = store_call(BACKEND, lambda: CosmosClient(endpoint, credential,
                                                                    **client_options))
            container_client = (self._cosmos.get_database_client(database)
                                .get_container_client(container))
        self._container = container_client
        try:
            self._check_account(accept=accept_duplicates_across_write_regions)
        except BaseException:
            self.close()  # a client this store created; a caller's stays open
            raise

    def _check_account(self, *, accept: bool) -> None:
        """Refuse a multi-write account, from what the client read in its constructor (an SDK
        that keeps it elsewhere costs one account read here)."""
        connection = sdk_connection(self._container)
        account = cached_account(connection)
        if account is None:
            account = store_call(BACKEND, connection.GetDatabaseAccount)
        check_write_regions(account, endpoint=str(getattr(connection, "url_connection", "")),
                            accept=accept)

    @classmethod
    def from_connection_string(cls, conn_str: str, *, database: str, container: str,
                               partition_key_path: str = "/pk",
                               accept_duplicates_across_write_regions: bool = False,
                               **client_options: Any) -> CosmosIdempotencyStore:
        client = store_call(BACKEND, lambda: CosmosClient.from_connection_string(  # pyright: ignore[reportUnknownMemberType] - its credential parameter is partly untyped
            conn_str, **client_options))
        try:
            store = cls.from_container(
                client.get_database_client(database).get_container_client(container),
                partition_key_path,
                accept_duplicates_across_write_regions=accept_duplicates_across_write_regions)
        except BaseException:
            client.close()
            raise
        store._cosmos = client  # closed with the store
        return store

    def perform(self, step: StoreStep) -> Any:
        return send_request(BACKEND, self._container, self.request_for(step))

    def iter_pending(self, *, since_before: float) -> Iterator[IdempotencyRecord]:
        """A range query on `PENDING_SINCE`, an indexed field that exists only while messages
        are pending: it reads the index entries of pending markers only."""
        pages = store_call(BACKEND, lambda: self._container.query_items(
            self._PENDING_QUERY,
            parameters=[{"name": "@before", "value": bound_millis(since_before)}],
            enable_cross_partition_query=True))
        for document in store_items(BACKEND, pages):
            if is_record(document):
                yield self._to_record(document)

    def iter_records(self, *, in_progress_before: float | None = None,
                     expired_before: float | None = None) -> Iterator[IdempotencyRecord]:
        clauses = [f"IS_DEFINED(c.{VERSION})"]
        params: list[dict[str, Any]] = []
        if in_progress_before is not None:
            clauses.append(f"c.{STATE} = @state AND c.{LEASE} < @lease")
            params += [{"name": "@state", "value": RecordState.IN_PROGRESS.value},
                       {"name": "@lease", "value": bound_millis(in_progress_before)}]
        if expired_before is not None:
            clauses.append(f"c.{EXPIRES} < @expiry")
            params.append({"name": "@expiry", "value": bound_millis(expired_before)})
        query = "SELECT * FROM c WHERE " + " AND ".join(clauses)  # noqa: S608 - fixed clauses, values bound
        pages = store_call(BACKEND, lambda: self._container.query_items(
            query, parameters=params, enable_cross_partition_query=True))
        yield from map(self._to_record, store_items(BACKEND, pages))

    def purge_expired(self, now: float) -> int:
        """Nothing to do where the container expires markers by TTL (a purge query would read
        them all again); otherwise the query purge. Reads check the expiry either way."""
        if self._native_ttl is None:
            properties: dict[str, Any] = store_call(BACKEND, self._container.read) or {}
            self._native_ttl = properties.get("defaultTtl") is not None
        return 0 if self._native_ttl else super().purge_expired(now)

    def close(self) -> None:
        if self._cosmos is not None:
            self._cosmos.close()
