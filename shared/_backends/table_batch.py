"""Entity-group transactions with a lean multipart codec.

The SDK's `submit_transaction` builds and parses the `multipart/mixed` body with the `email`
package, at several times the client CPU of a single write. This codec does it with plain
byte operations and keeps the rest: the client's pipeline, the SDK's errors, and
`TableBatchOperations` for every part `lean_part` does not write byte for byte as it does.

It uses private SDK parts, so at first use per client type it checks the installed version
against `SUPPORTED_SDK`, the internals' signatures and a probe transaction; on any failure
every transaction goes through the SDK's `submit_transaction`, with one warning saying why.
`codec="sdk"` (`batch_codec`, `TABLE_BATCH_CODEC`) takes that path outright.
"""

# The SDK's private helpers, used on purpose (checked once, see `problem`), are untyped.
# pyright: reportPrivateUsage=false, reportUnknownMemberType=false, reportUnknownVariableType=false
from __future__ import annotations

import importlib.metadata
import inspect
import json
import logging
import math
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, NamedTuple, cast
from urllib.parse import quote
from wsgiref.handlers import format_date_time

from azure.core import MatchConditions
from azure.core.exceptions import DecodeError, HttpResponseError
from azure.core.rest import HttpRequest
from azure.data.tables import EdmType, EntityProperty, TableTransactionError, UpdateMode

from shared._core.jsontext import json_encoder
from shared._core.observability import sdk_request

logger = logging.getLogger(__name__)

#: azure-data-tables versions the codec supports: [lowest, first unsupported). Widen it only
#: after tests/store/test_table_batch.py passed on the new version.
SUPPORTED_SDK = ((12, 7, 0), (12, 8, 0))
Codec = Literal["lean", "sdk"]
CODECS: tuple[Codec, ...] = ("lean", "sdk")

_BOUNDARY = re.compile(r'boundary="?([^";,\s]+)"?', re.IGNORECASE)
_BLANK_LINE = re.compile(rb"\r?\n\r?\n")
_STATUS_LINE = re.compile(rb"^HTTP/\d(?:\.\d)? (\d{3})[^\n]*\n?", re.MULTILINE)
_CRLF = b"\r\n"
# A part's status line and its ETag header: each begins a line, and a part's JSON body holds no
# raw line break, so neither can match inside a body.
_PART_STATUS = re.compile(rb"\nHTTP/\d(?:\.\d)? (\d{3})")
_PART_ETAG = re.compile(rb"\n[Ee][Tt][Aa][Gg]:[ \t]*([^\r\n]*)")


class _Internals(NamedTuple):
    """The private parts of azure-data-tables the codec uses."""

    batch_operations: type  # _table_batch.TableBatchOperations
    decode_error: Callable[..., HttpResponseError]  # _error._decode_error
    too_large: type[HttpResponseError]  # _error.RequestTooLargeError
    validate_table_name: Callable[[HttpResponseError, str], None]  # _error._validate_tablename_error


def _sdk_version() -> str:
    return importlib.metadata.version("azure-data-tables")


def _version_problem() -> str | None:
    try:
        version = _sdk_version()
    except importlib.metadata.PackageNotFoundError:
        return "the installed azure-data-tables version is unknown"
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", version)  # a pre-release is not verified
    low, high = SUPPORTED_SDK
    if match is None or not low <= tuple(map(int, match.groups())) < high:
        return (f"azure-data-tables {version} is outside the range the codec supports "
                f"(>={'.'.join(map(str, low))},<{'.'.join(map(str, high))})")
    return None


def _import_internals() -> _Internals:
    """Raises ImportError / AttributeError / TypeError when they moved or changed."""
    from azure.data.tables import _error, _table_batch

    internals = _Internals(_table_batch.TableBatchOperations, _error._decode_error,
                           _error.RequestTooLargeError, _error._validate_tablename_error)
    inspect.signature(internals.batch_operations).bind(
        config=None, endpoint="", table_name="", is_cosmos_endpoint=False)
    inspect.signature(internals.decode_error).bind(None, error_message="", error_type=TableTransactionError)
    inspect.signature(internals.validate_table_name).bind(None, "")
    if not issubclass(internals.too_large, HttpResponseError):  # pyright: ignore[reportUnnecessaryIsInstance] - a runtime check of the SDK
        raise TypeError("RequestTooLargeError is no HttpResponseError")
    return internals


#: A transaction of every kind the stores send, built (never sent) to check the internals; the
#: last part (a merge) is one only the SDK's TableBatchOperations writes.
_PROBE = [("create", {"PartitionKey": "p", "RowKey": "a", "n": 1}),
          ("upsert", {"PartitionKey": "p", "RowKey": "b"}, {"mode": UpdateMode.REPLACE}),
          ("update", {"PartitionKey": "p", "RowKey": "c"},
           {"mode": UpdateMode.REPLACE, "etag": 'W/"1"', "match_condition": MatchConditions.IfNotModified}),
          ("delete", {"PartitionKey": "p", "RowKey": "d"},
           {"etag": 'W/"1"', "match_condition": MatchConditions.IfNotModified}),
          ("upsert", {"PartitionKey": "p", "RowKey": "e", "n": EntityProperty(2**40, EdmType.INT64)},
           {"mode": UpdateMode.MERGE})]


class CodecGuard:
    """Decides once per client type whether the lean codec can run; logs once why not."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._internals: _Internals | None = None
        self._problems: dict[type, str | None] = {}
        self._logged: set[str] = set()

    def internals(self) -> _Internals:
        if self._internals is None:
            self._internals = _import_internals()
        return self._internals

    def problem(self, client: Any) -> str | None:
        """Why the lean codec cannot serve `client` (None: it can)."""
        kind: type = type(client)
        if kind not in self._problems:
            with self._lock:
                if kind not in self._problems:
                    self._problems[kind] = problem = self._check(client)
                    if problem is not None and problem not in self._logged:
                        self._logged.add(problem)
                        logger.warning("Table transactions go through the SDK's submit_transaction,"
                                       " not the lean $batch codec: %s", problem)
        return self._problems[kind]

    def _check(self, client: Any) -> str | None:
        problem = _version_problem()
        if problem is not None:
            return problem
        try:
            self.internals()
        except (ImportError, AttributeError, TypeError) as error:
            return f"an SDK internal it needs is missing or changed ({type(error).__name__}: {error})"
        try:
            request = transaction_request(client, _PROBE)
            if not isinstance(request.content, bytes) or not callable(client._client.send_request):
                raise TypeError("the $batch request or the pipeline's send_request changed")
        except (AttributeError, TypeError, ValueError, KeyError) as error:
            return f"the SDK's client internals changed ({type(error).__name__}: {error})"
        return None


_GUARD = CodecGuard()


def codec_problem(client: Any) -> str | None:
    """Why transactions of `client` would fall back to the SDK's path (None: they do not)."""
    return _GUARD.problem(client)


class Part(NamedTuple):
    """One operation of a changeset: what `encode_changeset` reads of an `HttpRequest`."""

    method: str
    url: str
    headers: dict[str, str]
    content: str | None


_OPERATIONS = frozenset({"create", "update", "upsert", "delete"})  # TableBatchOperations' kinds
_INT32 = range(-(2**31), 2**31)
_INT64 = range(-(2**63), 2**63)
_odata_json = json_encoder()  # json.dumps's defaults, as the SDK's request body (AzureJSONEncoder)


def _entity_json(entity: Mapping[Any, Any]) -> str | None:
    """The SDK's request body for an entity of plain values (str, finite float, bool, Int32,
    Int64 EntityProperty, None); None when a value needs more: the SDK builds that one."""
    properties: dict[str, Any] = {}
    for name, value in entity.items():
        if type(name) is not str:
            return None
        kind = type(value)
        if kind is str:
            properties[name] = value
            properties[name + "@odata.type"] = "Edm.String"
        elif kind is float:
            if not math.isfinite(value):
                return None
            properties[name] = value
            properties[name + "@odata.type"] = "Edm.Double"
        elif kind is bool or (kind is int and value in _INT32):
            properties[name] = value
        elif kind is EntityProperty and value.edm_type is EdmType.INT64 and type(value.value) is int:
            if value.value not in _INT64:  # how the stores send an int beyond Int32
                return None
            properties[name] = str(value.value)
            properties[name + "@odata.type"] = "Edm.Int64"
        elif value is not None:
            return None
    return _odata_json(properties)


def _key_url(base: str, entity: Mapping[Any, Any]) -> str | None:
    """An entity's URL as the SDK's builders write it (quotes doubled, then percent-encoded)."""
    partition, row = entity.get("PartitionKey"), entity.get("RowKey")
    if type(partition) is not str or type(row) is not str:
        return None
    return f"{base}(PartitionKey='{_url_key(partition)}',RowKey='{_url_key(row)}')"


def _url_key(value: str) -> str:
    return quote(value.replace("'", "''"), safe="")


def lean_part(operation: tuple[Any, ...], *, base: str, version: str) -> Part | None:
    """The changeset part of a create, upsert (replace), update (replace under an etag) or
    delete (under an etag) of plain values, byte for byte as `TableBatchOperations` builds it;
    `base` is the table's URL. None for anything else: the SDK builds that part."""
    kind: Any = operation[0]
    entity: Any = operation[1]
    options: Mapping[str, Any] = operation[2] if len(operation) > 2 else {}
    if type(kind) is not str or not isinstance(entity, Mapping):
        return None
    fields = cast(Mapping[Any, Any], entity)
    given = options.get("etag")
    etag = given if type(given) is str and given else None
    under_etag = etag is not None and options.get("match_condition") is MatchConditions.IfNotModified
    replace = options.get("mode") == UpdateMode.REPLACE
    headers = {"x-ms-version": version, "DataServiceVersion": "3.0"}
    url: str | None
    if kind == "create" and not options:
        method, url = "POST", base
        headers["Accept"] = "application/json;odata=minimalmetadata"
    elif ((kind == "upsert" and replace and len(options) == 1)
          or (kind == "update" and replace and under_etag and len(options) == 3)):
        method, url = "PUT", _key_url(base, fields)
        headers["Accept"] = "application/json"
    elif kind == "delete" and etag is not None and under_etag and len(options) == 2:
        url = _key_url(base, fields)
        headers["Accept"] = "application/json;odata=minimalmetadata"
        headers["If-Match"] = etag
        return None if url is None else Part("DELETE", url, headers, None)
    else:
        return None
    body = None if url is None else _entity_json(fields)
    if url is None or body is None:
        return None
    if kind == "update" and etag is not None:
        headers["If-Match"] = etag
    return Part(method, url, {"Content-Type": "application/json",
                              "Content-Length": str(len(body)), **headers}, body)


def _check_partition(entity: Any, partition: list[Any]) -> None:
    """TableBatchOperations' checks: both keys given, one PartitionKey for the whole batch."""
    if "PartitionKey" not in entity or "RowKey" not in entity:
        raise ValueError("PartitionKey and/or RowKey were not provided in entity")
    if not partition:
        partition.append(entity["PartitionKey"])
    elif entity["PartitionKey"] != partition[0]:
        raise ValueError("Partition Keys in the batch must all be the same.")


def transaction_request(client: Any, operations: Iterable[tuple[Any, ...]]) -> HttpRequest:
    """The `$batch` request of `operations` for a sync or async `TableClient`: each part by
    `lean_part`, else (and always for a Cosmos DB Table endpoint) by `TableBatchOperations`."""
    endpoint = f"{client.scheme}://{client._primary_hostname}"
    config = client._client._config
    table = f"{endpoint}/{quote(client.table_name, safe='')}"
    batch: Any = None  # the SDK's builder, made for the first part it has to write
    parts: list[Any] = []
    partition: list[Any] = []
    for operation in operations:
        kind: Any = operation[0] if operation else None
        entity: Any = operation[1] if len(operation) > 1 else None
        known = isinstance(kind, str) and kind.lower() in _OPERATIONS and entity is not None
        if known:
            _check_partition(entity, partition)
        part = (lean_part(operation, base=table, version=config.version)
                if known and not client._cosmos_endpoint else None)
        if part is None:
            if batch is None:
                batch = _GUARD.internals().batch_operations(
                    config=config, endpoint=endpoint, table_name=client.table_name,
                    is_cosmos_endpoint=client._cosmos_endpoint)
            batch.add_operation(operation)
            part = batch.requests[-1]
        parts.append(part)
    boundary, changeset = f"batch_{uuid.uuid4()}", f"changeset_{uuid.uuid4()}"
    return HttpRequest(
        "POST", f"{endpoint}/$batch",
        headers={"x-ms-version": client.api_version, "DataServiceVersion": "3.0",
                 "MaxDataServiceVersion": "3.0;NetFx", "Accept": "application/json",
                 "Content-Type": f"multipart/mixed; boundary={boundary}"},
        content=encode_changeset(parts, boundary=boundary, changeset=changeset,
                                 date=format_date_time(time.time())))


def encode_changeset(requests: Iterable[HttpRequest | Part], *, boundary: str, changeset: str,
                     date: str | None = None) -> bytes:
    """A batch body of one changeset with `requests` as `application/http` parts; `date` goes
    in each part's `x-ms-date` and `Date`, as the SDK's StorageHeadersPolicy sets them."""
    dated = f"x-ms-date: {date}\r\nDate: {date}\r\n" if date else ""
    out = [f"--{boundary}\r\nContent-Type: multipart/mixed; boundary={changeset}\r\n\r\n".encode()]
    for index, request in enumerate(requests):
        body = request.content or b""
        head = "".join(f"{name}: {value}\r\n" for name, value in request.headers.items()) + dated
        out += [f"--{changeset}\r\nContent-Type: application/http\r\n"
                f"Content-Transfer-Encoding: binary\r\nContent-ID: {index}\r\n\r\n"
                f"{request.method} {request.url} HTTP/1.1\r\n{head}\r\n".encode(),
                body.encode() if isinstance(body, str) else body, _CRLF]
    out.append(f"--{changeset}--\r\n\r\n--{boundary}--\r\n".encode())
    return b"".join(out)


def transaction_result(response: Any, *, table_name: str | None = None,
                       expected: int | None = None) -> list[dict[str, str]]:
    """Each operation's metadata (`{"etag": ...}`) from a read `$batch` response; raises the
    SDK's error for a failed request or operation, and, as the SDK does, a ValueError naming
    the rule when the service refused `table_name`. With `expected` (the operations sent), an
    answer of that many 2xx parts is read from its status lines and ETags alone."""
    internals = _GUARD.internals()
    too_large = {"error_message": "The transaction request was too large",
                 "error_type": internals.too_large}
    if response.status_code == 413:
        raise internals.decode_error(response, **too_large)
    if response.status_code != 202:
        _raise_checked(internals.decode_error(response), table_name)
    content = response.content
    if expected:
        statuses = _PART_STATUS.findall(content)
        if len(statuses) == expected and all(status.startswith(b"2") for status in statuses):
            etags = _PART_ETAG.findall(content)
            if len(etags) == expected:
                return [{"etag": etag.decode("latin-1").strip()} for etag in etags]
    try:
        parts = decode_changeset(content, response.headers.get("Content-Type", ""))
    except ValueError as error:
        raise DecodeError(f"unreadable $batch response: {error}", response=response) from error
    for status, _, body in parts:
        if status == 413:
            raise internals.decode_error(response, **too_large)
        if not 200 <= status < 300:
            _raise_checked(operation_error(status, body), table_name)
    return [{"etag": headers["etag"]} if "etag" in headers else {} for _, headers, _ in parts]


def _raise_checked(error: HttpResponseError, table_name: str | None) -> None:
    """Raise `error`, or the SDK's ValueError when it says the table name breaks a rule."""
    if table_name is not None:
        _GUARD.internals().validate_table_name(error, table_name)
    raise error


def operation_error(status: int, body: bytes) -> TableTransactionError:
    """The SDK's error for a failed operation: its message starts with the operation's
    index ("2:The specified entity already exists...")."""
    code, message = None, body.decode("utf-8", "replace")
    try:
        error = json.loads(body)["odata.error"]
        code, message = error.get("code"), error["message"]["value"]
    except (ValueError, KeyError, TypeError):
        pass
    failure = TableTransactionError(message=f"{message}\nErrorCode:{code}" if code else message)
    failure.status_code = status
    failure.error_code = code  # pyright: ignore[reportAttributeAccessIssue] - the SDK's decoder sets it too
    return failure


def decode_changeset(body: bytes, content_type: str) -> list[tuple[int, dict[str, str], bytes]]:
    """The HTTP responses in a `$batch` response body: (status, lowercased headers, body)."""
    responses: list[tuple[int, dict[str, str], bytes]] = []
    for part in _parts(body, content_type):
        headers, payload = _head(part)
        if headers.get("content-type", "").lower().startswith("multipart/mixed"):
            responses += [_response(_head(inner)[1])
                          for inner in _parts(payload, headers["content-type"])]
        else:
            responses.append(_response(payload))
    return responses


def _parts(body: bytes, content_type: str) -> list[bytes]:
    match = _BOUNDARY.search(content_type)
    if match is None:
        raise ValueError(f"no multipart boundary in {content_type!r}")
    delimiter = b"--" + match.group(1).encode()
    parts: list[bytes] = []
    for section in body.split(delimiter)[1:]:
        if section.startswith(b"--"):  # the close delimiter
            break
        parts.append(section.removeprefix(_CRLF).removeprefix(b"\n").removesuffix(_CRLF)
                     .removesuffix(b"\n"))
    return parts


def _head(part: bytes) -> tuple[dict[str, str], bytes]:
    """A part's (or a response's) header lines as a dict, and what follows them."""
    split = _BLANK_LINE.split(part, maxsplit=1)
    lines = split[0].decode("latin-1").splitlines()
    headers: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    return headers, split[1] if len(split) > 1 else b""


def _response(payload: bytes) -> tuple[int, dict[str, str], bytes]:
    # The status line is searched for: Azurite puts a stray boundary line before it when
    # it refuses a changeset of more than 100 operations.
    status_line = _STATUS_LINE.search(payload)
    if status_line is None:
        raise ValueError(f"no HTTP status line in a part: {payload[:200]!r}")
    rest = payload[status_line.end():]
    if not rest.strip(b"\r\n") or rest.startswith((b"\r\n", b"\n")):  # no header lines
        return int(status_line.group(1)), {}, rest.strip(b"\r\n")
    return int(status_line.group(1)), *_head(rest)


def _lean(client: Any, codec: Codec) -> bool:
    if codec not in CODECS:
        raise ValueError(f"codec={codec!r} must be one of {CODECS}")
    return codec == "lean" and _GUARD.problem(client) is None


def submit_transaction(client: Any, operations: Iterable[tuple[Any, ...]], *,
                       codec: Codec = "lean") -> list[Any]:
    """`TableClient.submit_transaction` with the lean codec (the SDK's own when `codec` is
    "sdk" or the codec cannot run)."""
    operations = list(operations)
    if not _lean(client, codec):
        return list(client.submit_transaction(operations))
    with sdk_request():
        response = client._client.send_request(transaction_request(client, operations),
                                               stream=True)
        response.read()
    return transaction_result(response, table_name=client.table_name, expected=len(operations))


async def submit_transaction_async(client: Any, operations: Iterable[tuple[Any, ...]], *,
                                   codec: Codec = "lean") -> list[Any]:
    """`submit_transaction` for an `azure.data.tables.aio.TableClient`."""
    operations = list(operations)
    if not _lean(client, codec):
        return list(await client.submit_transaction(operations))
    with sdk_request():
        response = await client._client.send_request(transaction_request(client, operations),
                                                     stream=True)
        await response.read()
    return transaction_result(response, table_name=client.table_name, expected=len(operations))
