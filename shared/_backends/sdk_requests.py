"""One store request on an Azure SDK client, built once for a backend's sync and async store.

A backend's mapping turns each store step (`shared._core.store`) into a `Request`: the SDK
call, how to read its answer, and which failures are part of the store contract.
`send_request` and `send_request_async` send it; both translate failures by `translate_error`.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

from azure.core.exceptions import AzureError, HttpResponseError

from shared._core.exceptions import (
    RETRIABLE_STATUS,
    OperationFailedError,
    RecordChangedError,
    StoreRequestError,
    StoreUnavailableError,
)
from shared._core.records import IdempotencyRecord
from shared._core.store import (
    Commit,
    CommitGroup,
    Committed,
    DeleteRecordIfUnchanged,
    Document,
    GetRecord,
    PutRecordIfAbsent,
    ReadDocument,
    RecordDispatched,
    ReplaceRecordIfUnchanged,
    StoreStep,
    WriteDocuments,
    WriteOp,
    group_commit,
    group_commit_error,
    without_etags,
)


def changed_statuses(record_id: str) -> dict[int, Callable[[], Exception]]:
    """An etag-conditional write's contract: 412 (changed) or 404 (gone) = RecordChangedError."""
    return {412: lambda: RecordChangedError(record_id), 404: lambda: RecordChangedError(record_id)}


def translate_error(backend: str, error: AzureError, *,
                    on_status: dict[int, Callable[[], Exception]] | None = None,
                    none_if_missing: bool = False) -> None:
    """Raise the library's exception for an SDK failure; return (answer None) on a missing read.

    `on_status` maps the statuses that are part of this request's contract (409 on a create,
    412/404 on a conditional write) to the error to raise; throttling, timeouts, 5xx and
    transport failures become StoreUnavailableError; anything else StoreRequestError. The SDK
    error is always the cause. `none_if_missing` answers a 404 (point read) with None.
    """
    if not isinstance(error, HttpResponseError):  # connection refused, timeouts, broken responses
        raise StoreUnavailableError(f"{backend} unreachable: {error}", error=error) from error
    status = error.status_code
    if none_if_missing and status == 404:
        return
    if on_status and status in on_status:
        raise on_status[status]() from error
    if status is None or status in RETRIABLE_STATUS:
        raise StoreUnavailableError(f"{backend} answered {status}", status_code=status,
                                    error=error) from error
    raise StoreRequestError(f"{backend} rejected the request ({status}): {error.message}",
                            status_code=status) from error


StatusErrors = dict[int, Callable[[], Exception]]


@overload
def store_call[T](backend: str, action: Callable[[], T], *, on_status: StatusErrors | None = None,
                  none_if_missing: Literal[False] = False) -> T: ...
@overload
def store_call[T](backend: str, action: Callable[[], T], *, on_status: StatusErrors | None = None,
                  none_if_missing: bool) -> T | None: ...
def store_call[T](backend: str, action: Callable[[], T], *,
                  on_status: StatusErrors | None = None,
                  none_if_missing: bool = False) -> T | None:
    """Run one store request; its failure translated by `translate_error`."""
    try:
        return action()
    except AzureError as error:
        translate_error(backend, error, on_status=on_status, none_if_missing=none_if_missing)
        return None


def store_items[T](backend: str, pages: Iterable[T]) -> Iterator[T]:
    """The items of an SDK pager; each page's request translated by `translate_error`."""
    iterator = iter(pages)
    while True:
        try:
            item = store_call(backend, lambda: next(iterator))
        except StopIteration:
            return
        yield item


@overload
async def async_store_call[T](backend: str, action: Callable[[], Awaitable[T]], *,
                              on_status: StatusErrors | None = None,
                              none_if_missing: Literal[False] = False) -> T: ...
@overload
async def async_store_call[T](backend: str, action: Callable[[], Awaitable[T]], *,
                              on_status: StatusErrors | None = None,
                              none_if_missing: bool) -> T | None: ...
async def async_store_call[T](backend: str, action: Callable[[], Awaitable[T]], *,
                              on_status: StatusErrors | None = None,
                              none_if_missing: bool = False) -> T | None:
    """`store_call` for an async SDK request."""
    try:
        return await action()
    except AzureError as error:
        translate_error(backend, error, on_status=on_status, none_if_missing=none_if_missing)
        return None


@dataclass(frozen=True, slots=True)
class Request[T]:
    """One store request: `send(client)` makes the SDK call (the async SDK returns an
    awaitable), `answer` turns the SDK's answer into the store's; `on_status` and
    `none_if_missing` as for `translate_error`; `refine` may name a more precise error for one
    the SDK raised (a failed transaction's operation)."""

    send: Callable[[Any], Any]
    answer: Callable[[Any], T]
    on_status: StatusErrors | None = None
    none_if_missing: bool = False
    refine: Callable[[Exception], Exception | None] | None = None


def _failed(backend: str, request: Request[Any], error: Exception) -> None:
    """Raise the request's `refine`d error, else the translated SDK error; return on a
    missing read."""
    refined = request.refine(error) if request.refine is not None else None
    if refined is not None:
        raise refined from error
    if not isinstance(error, AzureError):
        raise error
    translate_error(backend, error, on_status=request.on_status,
                    none_if_missing=request.none_if_missing)


def send_request[T](backend: str, client: Any, request: Request[T]) -> T:
    """Send a request with a sync SDK client."""
    try:
        answer = request.send(client)
    except Exception as error:
        _failed(backend, request, error)
        answer = None
    return request.answer(answer)


async def send_request_async[T](backend: str, client: Any, request: Request[T]) -> T:
    """`send_request` with an async SDK client."""
    try:
        answer = await request.send(client)
    except Exception as error:
        _failed(backend, request, error)
        answer = None
    return request.answer(answer)


class RequestMapping(abc.ABC):
    """A backend's requests, one per store step: `request_for` turns a step into the `Request`
    its sync or async store sends."""

    def request_for(self, step: StoreStep) -> Request[Any]:
        match step:
            case GetRecord(partition, record_id):
                return self._get_record(partition, record_id)
            case PutRecordIfAbsent(record):
                return self._put_record_if_absent(record)
            case ReplaceRecordIfUnchanged(record):
                return self._replace_record_if_unchanged(record)
            case DeleteRecordIfUnchanged(record):
                return self._delete_record_if_unchanged(record)
            case ReadDocument(partition, document_id):
                return self._read_document(partition, document_id)
            case WriteDocuments(partition, operations):
                return self._write_documents(partition, operations)
            case Commit(marker, operations, marker_body):
                return self._committed_request((marker,), operations, marker_body)
            case CommitGroup(markers, operations):
                return self._committed_request(markers, operations, None)
            case RecordDispatched(marker):
                return self._record_dispatched(marker)

    def _committed_request(self, markers: Sequence[IdempotencyRecord],
                           operations: Sequence[WriteOp], marker_body: dict[str, Any] | None
                           ) -> Request[Committed]:
        """A commit of one marker or of a group (the further markers travel as operations);
        a further marker's failure names it by index (`group_commit_error`)."""
        written: list[Document] = []
        first, rest = (markers[0], operations) if len(markers) == 1 else group_commit(markers, operations)
        commit = self._commit(first, rest, marker_body, written)
        further = without_etags(markers[1:])

        def refine(error: Exception) -> Exception | None:
            refined = commit.refine(error) if commit.refine is not None else None
            if len(markers) > 1 and isinstance(refined, OperationFailedError):
                return group_commit_error(refined, markers) or refined
            return refined

        return Request(commit.send, lambda result: Committed((commit.answer(result), *further),
                                                             tuple(written)),
                       commit.on_status, commit.none_if_missing, refine)

    @abc.abstractmethod
    def _get_record(self, partition: str, record_id: str) -> Request[IdempotencyRecord | None]: ...
    @abc.abstractmethod
    def _put_record_if_absent(self, record: IdempotencyRecord) -> Request[IdempotencyRecord]: ...
    @abc.abstractmethod
    def _replace_record_if_unchanged(self, record: IdempotencyRecord
                                     ) -> Request[IdempotencyRecord]: ...
    @abc.abstractmethod
    def _delete_record_if_unchanged(self, record: IdempotencyRecord) -> Request[None]: ...
    @abc.abstractmethod
    def _read_document(self, partition: str, document_id: str) -> Request[Document | None]: ...
    @abc.abstractmethod
    def _write_documents(self, partition: str, operations: Sequence[WriteOp]
                         ) -> Request[list[Document]]: ...
    @abc.abstractmethod
    def _commit(self, marker: IdempotencyRecord, operations: Sequence[WriteOp],
                marker_body: dict[str, Any] | None, written: list[Document]
                ) -> Request[IdempotencyRecord]: ...
    @abc.abstractmethod
    def _record_dispatched(self, marker: IdempotencyRecord) -> Request[IdempotencyRecord]: ...
