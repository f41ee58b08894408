"""The lean `$batch` codec (`shared._backends.table_batch`) against its oracles.

* Its request body parses with the standard library's MIME parser, the one the
  SDK itself builds bodies with.
* On Azurite every transaction is sent twice, to twin tables: through the SDK's
  `submit_transaction` and through the lean codec, sync and async. Both must
  store the same entities and report the same metadata, and a failing
  transaction must raise the same error (type, failed index, status, code).
  The same twin suite runs on the fallback path (an SDK internal hidden).
* Each part carries the headers the SDK's own parts carry.
* The guard: an internal missing or changed, or an SDK outside the supported
  range, is caught at first use and falls back to the SDK, logged once.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import json
import math
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import azure.data.tables._error as sdk_error
import azure.data.tables._table_batch as sdk_batch
import pytest
from azure.core import MatchConditions
from azure.core.exceptions import DecodeError, HttpResponseError
from azure.core.pipeline.transport import HttpTransport
from azure.data.tables import EdmType, EntityProperty, TableClient, UpdateMode
from azure.data.tables.aio import TableClient as AsyncTableClient
from hypothesis import given, settings
from hypothesis import strategies as st

from shared._backends import TableIdempotencyStore, WriteOp, table_batch
from shared._backends.table_batch import (
    CodecGuard,
    Part,
    codec_problem,
    decode_changeset,
    encode_changeset,
    lean_part,
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
@pytest.fixture(autouse=True)
def fresh_guard(monkeypatch) -> None:
    """Each test decides afresh whether the codec can run (the guard decides once per process)."""
    monkeypatch.setattr(table_batch, "_GUARD", CodecGuard())


@pytest.fixture(params=["codec", "fallback"])
def path(request, monkeypatch) -> str:
    """The lean codec, or the fallback to the SDK's submit_transaction with an internal the
    codec needs hidden (the SDK's own path keeps its reference)."""
    if request.param == "fallback":
        monkeypatch.delattr(sdk_batch, "TableBatchOperations")
    return request.param


@pytest.fixture
def twins(stack, table_service, path) -> Iterator[tuple[TableClient, TableClient]]:
    """Two fresh tables: one written through the SDK, one through the lean codec."""
    names = [f"t{uuid.uuid4().hex[:16]}" for _ in range(2)]
    clients = []
    for name in names:
        table_service.create_table(name)
        clients.append(TableClient.from_connection_string(stack.table_connection_string, name))
    assert (codec_problem(clients[1]) is None) == (path == "codec")
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


@pytest.mark.parametrize("path", ["codec"], indirect=True)
def test_more_than_100_operations_raise_the_servers_reason(twins):
    """Azurite's answer here trips the SDK's own parser (http.client.BadStatusLine, a stray
    boundary line before the status line); the lean codec reads the 400 and its reason.
    (Codec only: the stores refuse > 100 operations before sending, on either path.)"""
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


def test_a_transaction_on_a_missing_table_raises_what_the_sdk_raises(stack, path):
    name = f"t{uuid.uuid4().hex[:16]}"
    with TableClient.from_connection_string(stack.table_connection_string, name) as client:
        ops = [("create", {"PartitionKey": PK, "RowKey": "a"})]
        sdk = _failure(lambda: client.submit_transaction(ops))
        lean = _failure(lambda: submit_transaction(client, ops))
    assert sdk is not None and lean == sdk


@pytest.mark.parametrize("name", ["bad_name", "1starts", "ab"])
def test_a_transaction_on_an_invalid_table_name_raises_what_the_sdk_raises(stack, path, name):
    """(Azurite answers "table does not exist" here; the service's invalid-name answer is
    the next test's.)"""
    with TableClient.from_connection_string(stack.table_connection_string, name) as client:
        ops = [("create", {"PartitionKey": PK, "RowKey": "a"})]
        sdk = _failure(lambda: client.submit_transaction(ops))
        lean = _failure(lambda: submit_transaction(client, ops))
    assert sdk is not None and lean == sdk


def _answer(status: int, code: str, message: str) -> Any:
    body = json.dumps({"odata.error": {"code": code, "message": {"lang": "en-US", "value": message}}})

    class Response:
        status_code, reason = 202, "Accepted"
        headers = {"Content-Type": "multipart/mixed; boundary=b"}
        content = (f"--b\r\nContent-Type: multipart/mixed; boundary=c\r\n\r\n--c\r\n"
                   f"Content-Type: application/http\r\n\r\nHTTP/1.1 {status} Bad\r\n"
                   f"Content-Type: application/json\r\n\r\n{body}\r\n--c--\r\n--b--\r\n").encode()

    return Response()


def test_the_services_invalid_name_answer_becomes_the_sdks_value_error():
    """As the SDK's `_batch_send` does (`_validate_tablename_error`): the service's refusal
    of a table name becomes a ValueError that says the naming rule."""
    refused = _answer(400, "InvalidResourceName", "0:The specified resource name contains invalid "
                      "characters.\nRequestId:1")
    with pytest.raises(ValueError, match="Storage table names must be alphanumeric"):
        transaction_result(refused, table_name="bad_name")
    with pytest.raises(HttpResponseError) as kept:  # a valid name: the service's error stands
        transaction_result(refused, table_name="goodname")
    assert not isinstance(kept.value, ValueError) and kept.value.status_code == 400


# -- what each part carries --------------------------------------------------------------------
class _Capture(HttpTransport):
    """A transport that keeps the request and sends nothing."""

    def __enter__(self) -> _Capture:
        return self

    def __exit__(self, *args: object) -> None:
        pass

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def send(self, request: Any, **kwargs: Any) -> Any:
        self.request = request
        raise _Sent


class _Sent(Exception):
    pass


def _parts(content_type: str, body: bytes) -> list[tuple[str, dict[str, str], bytes]]:
    """(request line, headers, body) of each part; dates and boundaries left out."""
    head = f"Content-Type: {content_type}\r\n\r\n".encode()
    message: Any = email.message_from_bytes(head + body, policy=email.policy.HTTP)
    [changeset] = message.get_payload()
    parts = []
    for part in changeset.get_payload():
        assert {k: v for k, v in part.items()} == {
            "Content-Type": "application/http", "Content-Transfer-Encoding": "binary",
            "Content-ID": part["Content-ID"]}
        line, rest = part.get_payload(decode=True).split(b"\r\n", 1)
        header_block, payload = rest.split(b"\r\n\r\n", 1)
        headers = dict(h.split(": ", 1) for h in header_block.decode().split("\r\n"))
        assert headers.get("x-ms-date") and headers["x-ms-date"] == headers.get("Date")
        headers["x-ms-date"] = headers["Date"] = "<date>"
        parts.append((line.decode(), headers, payload.rstrip(b"\r\n")))
    return parts


def test_every_part_carries_the_headers_the_sdks_parts_carry():
    """The SDK's own $batch body, captured at its transport, against the codec's: per part
    the same request line, the same headers (operation headers, DataServiceVersion, Accept,
    Content-Type, If-Match, x-ms-date / Date) and the same body."""
    capture = _Capture()
    client = TableClient.from_connection_string("UseDevelopmentStorage=true", "codec",
                                                transport=capture)
    ops = [("create", {"PartitionKey": PK, "RowKey": "m1", **EVERY_TYPE}),
           ("upsert", {"PartitionKey": PK, "RowKey": "u", "v": 1}, {"mode": UpdateMode.REPLACE}),
           ("upsert", {"PartitionKey": PK, "RowKey": "m", "v": 1}, {"mode": UpdateMode.MERGE}),
           ("update", {"PartitionKey": PK, "RowKey": "b", "v": 2},
            {"mode": UpdateMode.REPLACE, "etag": 'W/"1"', "match_condition": MatchConditions.IfNotModified}),
           ("update", {"PartitionKey": PK, "RowKey": "c", "v": 2}, {"mode": UpdateMode.MERGE}),
           ("delete", {"PartitionKey": PK, "RowKey": "d"},
            {"etag": 'W/"2"', "match_condition": MatchConditions.IfNotModified}),
           ("delete", {"PartitionKey": PK, "RowKey": "e"})]
    with pytest.raises(_Sent):
        client.submit_transaction(ops)
    sdk = capture.request
    lean = transaction_request(client, ops)
    assert _parts(lean.headers["Content-Type"], lean.content) == _parts(
        sdk.headers["Content-Type"], sdk.body)
    outer = ("x-ms-version", "DataServiceVersion", "MaxDataServiceVersion", "Accept")
    assert {h: lean.headers[h] for h in outer} == {h: sdk.headers[h] for h in outer}


# -- the parts the codec writes itself, against the SDK's builder -------------------------------
IF_UNCHANGED = MatchConditions.IfNotModified
KEYS = st.text(min_size=1, max_size=12)
PLAIN = st.one_of(st.text(max_size=20), st.booleans(), st.none(),
                  st.integers(min_value=-(2**31), max_value=2**31 - 1),
                  st.floats(allow_nan=False, allow_infinity=False),
                  st.builds(lambda n: EntityProperty(n, EdmType.INT64),
                            st.integers(min_value=-(2**63), max_value=2**63 - 1)))
NOT_PLAIN = st.one_of(st.integers(min_value=2**31, max_value=2**62), st.just(math.nan),
                      st.just(math.inf), st.just(EntityProperty(5, EdmType.INT32)),
                      st.just(EntityProperty(2**63, EdmType.INT64)),
                      st.just(EntityProperty("5", EdmType.INT64)),
                      st.just(datetime(2026, 12, 3, tzinfo=UTC)), st.just(b"\x00"),
                      st.just(uuid.UUID(int=3)), st.just(UpdateMode.MERGE))
OPTIONS = {  # the operations the stores send (the codec writes them), and others (the SDK does)
    "create": ({}, {"mode": UpdateMode.REPLACE}),
    "upsert": ({"mode": UpdateMode.REPLACE}, {"mode": UpdateMode.MERGE}),
    "update": ({"mode": UpdateMode.REPLACE, "etag": 'W/"1"', "match_condition": IF_UNCHANGED},
               {"mode": UpdateMode.MERGE, "etag": 'W/"1"', "match_condition": IF_UNCHANGED}),
    "delete": ({"etag": 'W/"2\'x"', "match_condition": IF_UNCHANGED}, {}),
}


def _sdk_part(operation: tuple[Any, ...]) -> Part:
    client = TableClient.from_connection_string("UseDevelopmentStorage=true", "codec")
    batch = sdk_batch.TableBatchOperations(
        config=client._client._config, endpoint=f"{client.scheme}://{client._primary_hostname}",
        table_name=client.table_name, is_cosmos_endpoint=False)
    batch.add_operation(operation)
    [request] = batch.requests
    return Part(request.method, request.url, dict(request.headers.items()), request.content)


def _lean(operation: tuple[Any, ...]) -> Part | None:
    client = TableClient.from_connection_string("UseDevelopmentStorage=true", "codec")
    return lean_part(operation, base=f"{client.scheme}://{client._primary_hostname}/codec",
                     version=client._client._config.version)


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(sorted(OPTIONS)), partition=KEYS, row=KEYS,
       body=st.dictionaries(st.text(max_size=10).filter(lambda k: k not in ("PartitionKey", "RowKey")),
                            PLAIN, max_size=6))
def test_a_part_of_plain_values_is_byte_for_byte_the_sdks(kind, partition, row, body):
    operation = (kind, {**body, "PartitionKey": partition, "RowKey": row}, OPTIONS[kind][0])
    part = _lean(operation)
    assert part is not None
    assert part == _sdk_part(operation)


@settings(max_examples=100, deadline=None)
@given(kind=st.sampled_from(sorted(OPTIONS)), value=NOT_PLAIN, plain_options=st.booleans())
def test_anything_else_is_left_to_the_sdk(kind, value, plain_options):
    entity = {"PartitionKey": PK, "RowKey": "r", "v": value}
    options = OPTIONS[kind][0 if plain_options else 1]
    if kind == "delete" and plain_options:  # a delete sends no body: only its options matter
        options = {**options, "match_condition": MatchConditions.IfPresent}
    assert _lean((kind, entity, options)) is None


def test_a_batch_keeps_the_sdks_partition_checks(table_service):
    client = table_service.get_table_client("codec")
    with pytest.raises(ValueError, match="must all be the same"):
        transaction_request(client, [("create", {"PartitionKey": "a", "RowKey": "1"}),
                                     ("create", {"PartitionKey": "b", "RowKey": "2", "big": 2**40})])
    with pytest.raises(ValueError, match="were not provided"):
        transaction_request(client, [("create", {"PartitionKey": "a"})])
    with pytest.raises(ValueError, match="Unrecognized operation"):
        transaction_request(client, [("merge", {"PartitionKey": "a", "RowKey": "1"})])


# -- the guard: fall back to the SDK when its internals do not fit ------------------------------
def _renamed_requests(original: type) -> type:
    """TableBatchOperations as a later SDK might have it: `requests` renamed `items`."""
    class Renamed(original):
        @property
        def requests(self) -> Any:
            raise AttributeError("'TableBatchOperations' object has no attribute 'requests'")

        @requests.setter
        def requests(self, value: Any) -> None:
            self.items = value

    return Renamed


def _new_signature(original: Any) -> Any:
    def decode_error(response: Any, message: str | None = None, error_cls: Any = None) -> Any:
        return original(response, message, error_cls)
    return decode_error


SEEDED = {
    "an internal removed": lambda mp: mp.delattr(sdk_batch, "TableBatchOperations"),
    "an attribute renamed": lambda mp: mp.setattr(
        sdk_batch, "TableBatchOperations", _renamed_requests(sdk_batch.TableBatchOperations)),
    "a signature changed": lambda mp: mp.setattr(
        sdk_error, "_decode_error", _new_signature(sdk_error._decode_error)),
    "an SDK outside the range": lambda mp: mp.setattr(table_batch, "_sdk_version", lambda: "12.8.0"),
    "a pre-release": lambda mp: mp.setattr(table_batch, "_sdk_version", lambda: "12.7.1b1"),
}


@pytest.mark.parametrize("path", ["codec"], indirect=True)
@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("seeded", list(SEEDED))
def test_a_seeded_change_is_caught_at_first_use_and_falls_back_logged_once(
        twins, stack, monkeypatch, caplog, seeded, use_async):
    sdk, lean = twins
    SEEDED[seeded](monkeypatch)
    monkeypatch.setattr(table_batch, "_GUARD", CodecGuard())  # a process that starts like this
    caplog.set_level("WARNING", logger="shared._backends.table_batch")

    def ops(n: int) -> list[Any]:
        return [("create", {"PartitionKey": PK, "RowKey": f"r{n}-{i}", "v": i}) for i in range(3)]

    for n in range(3):
        (sdk_result, lean_result), failures = _both(
            sdk, lean, lambda n=n: ops(n), async_lean=stack.table_connection_string if use_async else None)
        assert failures == (None, None) and len(lean_result) == len(sdk_result) == 3
    assert _entities(lean) == _entities(sdk)
    [warning] = [r for r in caplog.records if r.name == "shared._backends.table_batch"]
    assert "submit_transaction" in warning.getMessage() and warning.levelname == "WARNING"
    problem = codec_problem(lean)
    assert problem is not None and problem in warning.getMessage()


@pytest.mark.parametrize("path", ["codec"], indirect=True)
def test_the_supported_sdk_with_its_internals_intact_uses_the_codec_and_logs_nothing(twins, caplog):
    _, lean = twins
    caplog.set_level("WARNING", logger="shared._backends.table_batch")
    assert table_batch._version_problem() is None  # the pinned SDK is in the declared range
    assert len(submit_transaction(lean, [("create", {"PartitionKey": PK, "RowKey": "a"})])) == 1
    assert codec_problem(lean) is None
    assert not [r for r in caplog.records if r.name == "shared._backends.table_batch"]


# -- the store option ------------------------------------------------------------------------------
@pytest.mark.parametrize("codec", ["sdk", "lean"])
def test_the_stores_batch_codec_option_chooses_the_path(stack, table_service, monkeypatch, codec):
    name = f"t{uuid.uuid4().hex[:16]}"
    table_service.create_table(name)
    built = []
    real = table_batch.transaction_request
    monkeypatch.setattr(table_batch, "transaction_request",
                        lambda *a, **k: built.append(1) or real(*a, **k))
    store = TableIdempotencyStore.from_connection_string(stack.table_connection_string,
                                                         table_name=name, batch_codec=codec)
    try:
        documents = store.write_documents(PK, [WriteOp("create", "a", {"v": 1}),
                                               WriteOp("create", "b", {"v": 2})])
        assert all(d.etag for d in documents)
        assert store.read_document(PK, "b").body["v"] == 2
        # the probe builds one request at first use; a lean transaction builds one more
        assert len(built) == (2 if codec == "lean" else 0)
    finally:
        store.close()
        table_service.delete_table(name)


def test_an_unknown_codec_is_refused():
    with pytest.raises(ValueError, match="codec"):
        submit_transaction(object(), [], codec="fast")  # type: ignore[arg-type]


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_http_instrumentation_records_no_second_span_of_a_transaction(stack, table_service,
                                                                      monkeypatch, use_async):
    """azure-core's tracing policy gives the `$batch` request its HTTP span; the SDK's own
    methods suppress HTTP instrumentation (the distro's `requests`) around their requests, and
    the codec, which sends through the pipeline directly, must do the same or every sampled
    transaction is exported twice."""
    from azure.core.pipeline.transport import AioHttpTransport, RequestsTransport
    from opentelemetry.instrumentation.utils import is_http_instrumentation_enabled

    name = f"t{uuid.uuid4().hex[:16]}"
    table_service.create_table(name)
    seen: list[bool] = []
    for transport in (RequestsTransport, AioHttpTransport):
        original = transport.send

        def send(self, request, *args, _original=original, **kwargs):
            seen.append(is_http_instrumentation_enabled())
            return _original(self, request, *args, **kwargs)

        monkeypatch.setattr(transport, "send", send)
    try:
        ops = [("create", {"PartitionKey": PK, "RowKey": "r1"})]
        if use_async:
            async def run() -> list[Any]:
                async with AsyncTableClient.from_connection_string(
                        stack.table_connection_string, name) as client:
                    return await submit_transaction_async(client, ops)
            result = asyncio.run(run())
        else:
            with TableClient.from_connection_string(stack.table_connection_string, name) as client:
                assert codec_problem(client) is None
                result = submit_transaction(client, ops)
        assert len(result) == 1
        assert seen == [False], seen  # the transaction, sent with instrumentation suppressed
    finally:
        monkeypatch.undo()
        table_service.delete_table(name)


# -- the common answer read from its status lines and ETags, held to the full decoder ------------
_PART = st.fixed_dictionaries({
    "status": st.sampled_from([200, 201, 204, 400, 404, 409, 412, 500]),
    "etag": st.one_of(st.none(), st.sampled_from(['W/"1"', "W/\"datetime'2026-12-07T05%3A13%3A46.5Z'\""])),
    "spelling": st.sampled_from(["ETag", "etag", "Etag"]),
    # a body whose text names a status line and an ETag (JSON escapes the line breaks)
    "body": st.sampled_from([b"", b'{"note":"\\r\\nHTTP/1.1 200 OK\\r\\nETag: W/\\"9\\""}']),
})


def _changeset_answer(parts: list[dict[str, Any]], newline: bytes) -> bytes:
    out = [b"--batchresponse_1", b"Content-Type: multipart/mixed; boundary=changesetresponse_2", b""]
    for part in parts:
        out += [b"--changesetresponse_2", b"Content-Type: application/http",
                b"Content-Transfer-Encoding: binary", b"", f"HTTP/1.1 {part['status']} X".encode(),
                b"DataServiceVersion: 3.0;"]
        if part["etag"] is not None:
            out.append(f"{part['spelling']}: {part['etag']}".encode())
        out += [b"", part["body"]]
    out += [b"--changesetresponse_2--", b"", b"--batchresponse_1--", b""]
    return newline.join(out)


def _outcome(response: Any, **options: Any) -> tuple[str, Any]:
    try:
        return "answered", transaction_result(response, **options)
    except Exception as error:  # compared, not handled
        return type(error).__name__, str(error)


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(_PART, max_size=6), newline=st.sampled_from([b"\r\n", b"\n"]),
       off_by=st.sampled_from([0, 0, 0, -1, 1]))
def test_the_fast_read_answers_what_the_full_decoder_answers(parts, newline, off_by):
    class Response:
        status_code, reason = 202, "Accepted"
        headers = {"Content-Type": "multipart/mixed; boundary=batchresponse_1"}
        content = _changeset_answer(parts, newline)

    assert _outcome(Response(), expected=len(parts) + off_by) == _outcome(Response())


def test_counter_proof_a_fast_read_of_statuses_alone_is_caught():
    """Seeded: a fast read that trusts the status lines without counting ETags answers a part
    that has none with the next part's, where the full decoder answers {}."""
    class Response:
        status_code, reason = 202, "Accepted"
        headers = {"Content-Type": "multipart/mixed; boundary=batchresponse_1"}
        content = _changeset_answer([{"status": 204, "etag": None, "spelling": "ETag", "body": b""},
                           {"status": 201, "etag": 'W/"1"', "spelling": "ETag", "body": b""}],
                          b"\r\n")

    seeded = [{"etag": e.decode()} for e in table_batch._PART_ETAG.findall(Response.content)]
    assert seeded != _outcome(Response())[1] == [{}, {"etag": 'W/"1"'}]
    assert _outcome(Response(), expected=2) == ("answered", [{}, {"etag": 'W/"1"'}])
