"""The lean `$batch` codec (`shared.stores.table_batch`) against its oracles.

* Its request body parses with the standard library's MIME parser, the one the
  SDK itself builds bodies with.
* On Azurite every transaction is sent twice, to twin tables: through the SDK's
  `submit_transaction` and through the lean codec, sync and async. Both must
  store the same entities and report the same metadata, and a failing
  transaction must raise the same error (type, failed index, status, code).
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from azure.core import MatchConditions
from azure.core.exceptions import DecodeError, HttpResponseError
from azure.data.tables import EdmType, EntityProperty, TableClient, UpdateMode
from azure.data.tables.aio import TableClient as AsyncTableClient

from shared.stores.table_batch import (
    decode_changeset,
    encode_changeset,
    operation_error,
    submit_transaction,
    submit_transaction_async,
    transaction_request,
    transaction_result,
)

PK = "acct-1"
AZURITE_OK = (
    b"--batchresponse_1\r\nContent-Type: multipart/mixed; boundary=changesetresponse_2\r\n\r\n"
    b"--changesetresponse_2\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary"
    b"\r\n\r\nHTTP/1.1 201 Created\r\nDataServiceVersion: 3.0;\r\n"
    b"ETag: W/\"datetime'2026-12-03T08%3A52%3A12.1Z'\"\r\n\r\n\r\n"
    b"--changesetresponse_2\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary"
    b"\r\n\r\nHTTP/1.1 204 No Content\r\nETag: W/\"2\"\r\n\r\n\r\n"
    b"--changesetresponse_2--\r\n\r\n--batchresponse_1--\r\n")
FAILED = (
    b"--batchresponse_1\r\nContent-Type: multipart/mixed; boundary=changesetresponse_2\r\n\r\n"
    b"--changesetresponse_2\r\nContent-Type: application/http\r\nContent-Transfer-Encoding: binary"
    b"\r\n\r\nHTTP/1.1 409 Conflict\r\nContent-Type: application/json;odata=minimalmetadata\r\n\r\n"
    b'{"odata.error":{"code":"EntityAlreadyExists","message":{"lang":"en-US",'
    b'"value":"2:The specified entity already exists.\\nRequestId:1"}}}\r\n'
    b"--changesetresponse_2--\r\n\r\n--batchresponse_1--\r\n")


# -- the codec, without a server ------------------------------------------------------------
def test_the_request_body_is_a_changeset_the_stdlib_mime_parser_reads(table_service):
    client = table_service.get_table_client("codec")
    request = transaction_request(client, [
        ("create", {"PartitionKey": PK, "RowKey": "m1", "note": "h\u00e9llo \U0001f600"}),
        ("update", {"PartitionKey": PK, "RowKey": "balance", "v": 2},
         {"mode": UpdateMode.REPLACE, "etag": 'W/"1"', "match_condition": MatchConditions.IfNotModified}),
        ("delete", {"PartitionKey": PK, "RowKey": "gone"}),
    ])
    head = f"Content-Type: {request.headers['Content-Type']}\r\n\r\n".encode()
    message: Any = email.message_from_bytes(head + request.content, policy=email.policy.HTTP)
    [changeset] = message.get_payload()
    parts = changeset.get_payload()
    assert [p["Content-ID"] for p in parts] == ["0", "1", "2"]
    assert all(p.get_content_type() == "application/http" for p in parts)
    lines = [p.get_payload(decode=True).split(b"\r\n") for p in parts]
    assert lines[0][0].startswith(b"POST ") and lines[0][0].endswith(b"/codec HTTP/1.1")
    assert lines[1][0].startswith(b"PUT ") and b"If-Match: W/\"1\"" in lines[1]
    assert lines[2][0].startswith(b"DELETE ") and b"If-Match: *" in lines[2]
    assert b"h\\u00e9llo \\ud83d\\ude00" in lines[0][-1]  # the SDK's JSON: ASCII escapes


def test_an_empty_changeset_encodes_to_delimiters_only():
    body = encode_changeset([], boundary="b", changeset="c")
    assert body == b"--b\r\nContent-Type: multipart/mixed; boundary=c\r\n\r\n--c--\r\n\r\n--b--\r\n"


def test_a_success_response_decodes_to_statuses_and_etags():
    parts = decode_changeset(AZURITE_OK, "multipart/mixed; boundary=batchresponse_1")
    assert [(status, headers.get("etag")) for status, headers, _ in parts] == [
        (201, "W/\"datetime'2026-12-03T08%3A52%3A12.1Z'\""), (204, 'W/"2"')]


def test_decoding_tolerates_bare_newlines_and_a_quoted_boundary():
    parts = decode_changeset(AZURITE_OK.replace(b"\r\n", b"\n"),
                             'multipart/mixed; boundary="batchresponse_1"')
    assert [status for status, _, _ in parts] == [201, 204]
    assert parts[1][1]["etag"] == 'W/"2"'


def test_a_failed_operation_raises_the_sdk_error_with_its_index():
    [(status, _, body)] = decode_changeset(FAILED, "multipart/mixed; boundary=batchresponse_1")
    error = operation_error(status, body)
    assert (type(error).__name__, error.index, error.status_code,
            error.error_code) == (  # pyright: ignore[reportAttributeAccessIssue] - set by the decoder
        "TableTransactionError", 2, 409, "EntityAlreadyExists")
    assert str(error).splitlines()[0] == "2:The specified entity already exists."


def test_a_failed_operation_with_an_unreadable_body_keeps_the_text_and_index_0():
    error = operation_error(500, b"<html>proxy error</html>")
    assert (error.index, error.status_code, error.message) == (0, 500, "<html>proxy error</html>")


def test_a_response_without_a_boundary_is_refused():
    with pytest.raises(ValueError, match="boundary"):
        decode_changeset(AZURITE_OK, "multipart/mixed")


# -- the codec against the SDK, on Azurite ----------------------------------------------------
@pytest.fixture
def twins(stack, table_service) -> Iterator[tuple[TableClient, TableClient]]:
    """Two fresh tables: one written through the SDK, one through the lean codec."""
    names = [f"t{uuid.uuid4().hex[:16]}" for _ in range(2)]
    clients = []
    for name in names:
        table_service.create_table(name)
        clients.append(TableClient.from_connection_string(stack.table_connection_string, name))
    yield clients[0], clients[1]
    for client, name in zip(clients, names, strict=True):
        client.close()
        table_service.delete_table(name)


def _entities(client: TableClient) -> list[dict[str, Any]]:
    return sorted(({**e, "etag?": bool(e.metadata.get("etag"))} for e in client.list_entities()),
                  key=lambda e: e["RowKey"])


def _failure(call) -> tuple[Any, ...] | None:
    try:
        call()
    except HttpResponseError as error:
        return (type(error).__name__, getattr(error, "index", None), error.status_code,
                getattr(error, "error_code", None), str(error).splitlines()[0])
    return None


def _both(sdk: TableClient, lean: TableClient, make_ops, *, async_lean: str | None = None):
    """The same transaction through the SDK and the lean codec (on an async client of the
    lean table when `async_lean` is its connection string): (results, failures)."""
    sdk_result: list[Any] = []
    lean_result: list[Any] = []
    sdk_failure = _failure(lambda: sdk_result.extend(sdk.submit_transaction(make_ops())))
    if async_lean:
        async def run() -> list[Any]:
            async with AsyncTableClient.from_connection_string(async_lean, lean.table_name) as client:
                return await submit_transaction_async(client, make_ops())
        lean_failure = _failure(lambda: lean_result.extend(asyncio.run(run())))
    else:
        lean_failure = _failure(lambda: lean_result.extend(submit_transaction(lean, make_ops())))
    return (sdk_result, lean_result), (sdk_failure, lean_failure)


EVERY_TYPE = {"text": "h\u00e9llo \U0001f600 \"quoted\" \\ back", "n": 7,
              "big": EntityProperty(2**40, EdmType.INT64), "f": 1.5, "yes": True,
              "when": datetime(2026, 12, 3, 8, 0, tzinfo=UTC), "raw": b"\x00\xff", "guid": uuid.UUID(int=5)}


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_a_transaction_stores_the_same_entities_and_reports_every_etag(twins, stack, use_async):
    sdk, lean = twins

    def ops():
        return [("create", {"PartitionKey": PK, "RowKey": f"m{i}", **EVERY_TYPE}) for i in range(5)] + [
            ("upsert", {"PartitionKey": PK, "RowKey": "balance", "v": 1}, {"mode": UpdateMode.REPLACE})]

    (sdk_result, lean_result), failures = _both(
        sdk, lean, ops, async_lean=stack.table_connection_string if use_async else None)
    assert failures == (None, None)
    assert len(lean_result) == len(sdk_result) == 6
    assert all(meta.get("etag") for meta in lean_result)
    assert _entities(lean) == _entities(sdk)
    # The etag reported is the stored one (the DocumentCache relies on it).
    assert lean_result[-1]["etag"] == lean.get_entity(PK, "balance").metadata["etag"]


def test_a_transaction_of_100_operations_goes_through(twins):
    sdk, lean = twins
    (sdk_result, lean_result), failures = _both(
        sdk, lean, lambda: [("create", {"PartitionKey": PK, "RowKey": f"r{i:03}"}) for i in range(100)])
    assert failures == (None, None) and len(lean_result) == len(sdk_result) == 100
    assert _entities(lean) == _entities(sdk)


def _seed(*clients: TableClient) -> None:
    for client in clients:
        client.create_entity({"PartitionKey": PK, "RowKey": "exists", "v": 1})


FAILING = {
    "create of an existing row (409)": lambda: [
        ("create", {"PartitionKey": PK, "RowKey": "new1"}),
        ("create", {"PartitionKey": PK, "RowKey": "new2"}),
        ("create", {"PartitionKey": PK, "RowKey": "exists"})],
    "replace under a stale etag (412)": lambda: [
        ("create", {"PartitionKey": PK, "RowKey": "new1"}),
        ("update", {"PartitionKey": PK, "RowKey": "exists", "v": 2},
         {"mode": UpdateMode.REPLACE, "etag": 'W/"datetime\'2000-01-01T00%3A00%3A00.0Z\'"',
          "match_condition": MatchConditions.IfNotModified})],
    "update of a missing row (404)": lambda: [
        ("update", {"PartitionKey": PK, "RowKey": "missing", "v": 2}, {"mode": UpdateMode.REPLACE})],
    "one row twice in a transaction (400)": lambda: [
        ("create", {"PartitionKey": PK, "RowKey": "twice"}),
        ("create", {"PartitionKey": PK, "RowKey": "twice"})],
}


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("case", list(FAILING))
def test_a_failing_transaction_raises_what_the_sdk_raises_and_writes_nothing(twins, stack, case,
                                                                             use_async):
    sdk, lean = twins
    _seed(sdk, lean)
    _, (sdk_failure, lean_failure) = _both(
        sdk, lean, FAILING[case], async_lean=stack.table_connection_string if use_async else None)
    assert sdk_failure is not None, "the case must fail"
    assert lean_failure == sdk_failure
    assert _entities(lean) == _entities(sdk) and len(_entities(lean)) == 1


def test_more_than_100_operations_raise_the_servers_reason(twins):
    """Azurite's answer here trips the SDK's own parser (http.client.BadStatusLine, a stray
    boundary line before the status line); the lean codec reads the 400 and its reason."""
    _, lean = twins
    ops = [("create", {"PartitionKey": PK, "RowKey": f"r{i:03}"}) for i in range(101)]
    with pytest.raises(HttpResponseError) as failed:
        submit_transaction(lean, ops)
    assert (failed.value.status_code,
            failed.value.index) == (400, 0)  # pyright: ignore[reportAttributeAccessIssue] - the SDK's
    assert "maximum 100 changes" in str(failed.value)
    assert _entities(lean) == []


def test_an_unreadable_response_raises_a_decode_error_not_an_index_error():
    class Response:
        status_code, reason = 202, "Accepted"
        headers = {"Content-Type": "multipart/mixed; boundary=b"}
        content = b"--b\r\nContent-Type: application/http\r\n\r\nnot http at all\r\n--b--\r\n"

    with pytest.raises(DecodeError, match="no HTTP status line"):
        transaction_result(Response())


def test_a_transaction_on_a_missing_table_raises_what_the_sdk_raises(stack):
    name = f"t{uuid.uuid4().hex[:16]}"
    with TableClient.from_connection_string(stack.table_connection_string, name) as client:
        ops = [("create", {"PartitionKey": PK, "RowKey": "a"})]
        sdk = _failure(lambda: client.submit_transaction(ops))
        lean = _failure(lambda: submit_transaction(client, ops))
    assert sdk is not None and lean == sdk
