"""The HTTP trigger's helper: `IdempotencyKeyEndpoint` runs a request that carries an
`Idempotency-Key` header once per caller and key, and answers a retry with the stored response.
Problems are RFC 9457 problem+json, one type per problem (`PROBLEMS`), each with its section in
the docs' HTTP page. Keys are scoped by the caller (`caller_of`), so two callers' keys never meet.
"""

from __future__ import annotations

import base64
import binascii
import functools
import inspect
import json
import logging
import re
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared._core.exceptions import (
    ConcurrencyRetriesExhaustedError,
    ConfigurationError,
    DispatchRejectedError,
    DispatchUnavailableError,
    EffectUncertainError,
    InvalidKeyError,
    PoisonMessageError,
    StoreUnavailableError,
)
from shared._core.keys import DedupKey, consumer_name, request_hash
from shared._core.payload import InvalidPayloadError, parse_json_object
from shared._core.records import Outcome, OutcomeStatus
from shared._flows.drivers import Async, Sync, flowmethod
from shared._flows.idempotency import AsyncIdempotency, BaseIdempotency, Idempotency
from shared._flows.steps import Flow

logger = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 16 * 1024  # an HTTP request body the endpoint reads
MAX_KEY_CHARS = 255  # an Idempotency-Key header

#: Problem types are a tag URI whose suffix is the anchor of the type's section in the docs' HTTP
#: page; pass the published docs' URL (ending in "#") to make each a link (RFC 9457 SHOULD).
DEFAULT_PROBLEM_BASE = "tag:idempotent-consumer,2026:problems/"
#: Problem types the endpoint answers with: slug -> (status, title). A title names the type and
#: does not change between occurrences (RFC 9457); the detail says what happened this time.
PROBLEMS: Mapping[str, tuple[int, str]] = {
    "idempotency-key-missing": (400, "Idempotency-Key header is required"),
    "idempotency-key-invalid": (400, "Invalid Idempotency-Key"),
    "caller-unreadable": (400, "Unreadable caller identity"),
    "request-invalid": (400, "Invalid request"),
    "idempotency-key-reused": (422, "Idempotency-Key reused with a different request"),
    "request-refused": (422, "Request refused"),
    "idempotency-key-in-progress": (409, "A request with this Idempotency-Key is being processed"),
}
# App Service authentication (Easy Auth) request headers.
PRINCIPAL_ID = "X-MS-CLIENT-PRINCIPAL-ID"
PRINCIPAL_IDP = "X-MS-CLIENT-PRINCIPAL-IDP"
PRINCIPAL = "X-MS-CLIENT-PRINCIPAL"
# Claims of X-MS-CLIENT-PRINCIPAL that name the caller, most specific first (Entra object id, then
# the provider's subject); Static Web Apps' form carries `userId` instead.
ID_CLAIMS = ("http://schemas.microsoft.com/identity/claims/objectidentifier", "oid",
             "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/nameidentifier", "sub")
MAX_CALLER_CHARS = 1024
MAX_PRINCIPAL_CHARS = 16 * 1024
# C0 controls and DEL: not allowed in an HTTP field value (RFC 9110 5.5). The scope separator is one
# of them, so no key a client can send ever looks like a scoped one.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_SCOPE_SEPARATOR = "\x1f"
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")  # an RFC 9110 token


@dataclass(frozen=True, slots=True)
class HttpResult:
    """A response: what a handler returns, what is stored for the key, what a retry gets."""

    status: int
    body: Any = None  # JSON
    headers: Mapping[str, str] = field(default_factory=dict[str, str])


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent a request: where the identity came from (a header, an identity provider) and
    the id it gives. Ids of different sources never share a scope."""

    source: str
    id: str

    @property
    def scope(self) -> str:
        """The caller as text (JSON: unambiguous for any source and id)."""
        return json.dumps([self.source, self.id], ensure_ascii=False, separators=(",", ":"))


class CallerError(PoisonMessageError):
    """The request's caller identity headers cannot be read; the detail says which and why."""

    def __init__(self, detail: str) -> None:
        super().__init__("caller-unreadable", detail)


@dataclass(frozen=True, slots=True)
class IdempotentRequest[T]:
    """What a handler of `IdempotencyKeyEndpoint` receives: the JSON body, what `parse` read
    from it (`item`), the key as sent, and the key in the caller's scope (pass `scoped_key` on,
    so each layer can deduplicate its own work)."""

    body: dict[str, Any]
    item: T
    key: str
    scoped_key: str
    caller: Caller | None
    headers: Mapping[str, str]


def _header(headers: Mapping[str, str], name: str) -> str | None:
    lowered = name.lower()
    return next((value for key, value in headers.items() if key.lower() == lowered), None)


def _principal(encoded: str) -> Caller:
    """The caller a base64 JSON `X-MS-CLIENT-PRINCIPAL` names (App Service's or Static Web Apps')."""
    try:
        principal = json.loads(base64.b64decode(encoded.strip(), validate=True))
    except (binascii.Error, ValueError) as error:
        raise CallerError(f"{PRINCIPAL} is not base64-encoded JSON") from error
    if not isinstance(principal, dict):
        raise CallerError(f"{PRINCIPAL} is not a JSON object")
    fields = typing.cast(dict[str, Any], principal)
    user_id = fields.get("userId")
    if isinstance(user_id, str) and user_id:  # Static Web Apps
        return Caller(f"easyauth:{fields.get('identityProvider', '')}", user_id)
    claims = fields.get("claims")
    found: dict[Any, Any] = {}
    if isinstance(claims, list):
        found = {claim.get("typ"): claim.get("val") for claim in
                 (typing.cast(dict[str, Any], c) for c in typing.cast(list[Any], claims)
                  if isinstance(c, dict))}
    for claim in ID_CLAIMS:
        value = found.get(claim)
        if isinstance(value, str) and value:
            return Caller(f"easyauth:{fields.get('auth_typ', '')}", value)
    raise CallerError(f"{PRINCIPAL} carries no caller id claim ({', '.join(ID_CLAIMS)})")


def _bounded(value: str, name: str, limit: int) -> str:
    if len(value) > limit:
        raise CallerError(f"{name} is longer than {limit} characters")
    return value


def caller_of(headers: Mapping[str, str], *, caller_header: str | None = None) -> Caller | None:
    """The caller the request identifies, or None (the shared scope of unidentified callers).

    The configured header wins: a front end that authenticates callers with one identity of
    its own names the real caller there (and must overwrite any copy a client sent). Else App
    Service authentication's client principal, which the platform sets and strips from client
    requests. CallerError for identity headers that are present but unreadable.
    """
    if caller_header:
        value = (_header(headers, caller_header) or "").strip()
        if value:
            return Caller(f"header:{caller_header.lower()}",
                          _bounded(value, caller_header, MAX_CALLER_CHARS))
    principal_id = (_header(headers, PRINCIPAL_ID) or "").strip()
    if principal_id:
        return Caller(f"easyauth:{(_header(headers, PRINCIPAL_IDP) or '').strip()}",
                      _bounded(principal_id, PRINCIPAL_ID, MAX_CALLER_CHARS))
    principal = _header(headers, PRINCIPAL)
    if principal and principal.strip():
        return _principal(_bounded(principal, PRINCIPAL, MAX_PRINCIPAL_CHARS))
    return None


def scoped_key(caller: Caller | None, key: str) -> str:
    """`key` in the caller's scope (the caller, a control character no header value holds, the
    key); without a caller, the key itself."""
    return key if caller is None else f"{caller.scope}{_SCOPE_SEPARATOR}{key}"


class BaseIdempotencyKeyEndpoint[L: BaseIdempotency[Any, Any, Any]]:
    """An HTTP endpoint whose requests carry an `Idempotency-Key` header (IETF httpapi draft).

    First request: `handler` runs and its response is stored. A retry with the same key and
    body: the stored response, with `Idempotent-Replayed: true`. Same key, other body: 422.
    Same key while the first request runs: 409 with Retry-After. No key: 400. A transient
    failure: 503 with Retry-After; the caller's retry finishes the work. Keys are scoped per
    caller (`caller_of`): no caller reads another's stored response or learns a key exists.
    """

    def __init__(self, idempotency: L, *, name: str = "http", caller_header: str | None = None,
                 max_body_bytes: int = MAX_REQUEST_BYTES, problem_base: str = DEFAULT_PROBLEM_BASE,
                 retry_after_seconds: int = 1) -> None:
        if caller_header is not None and not _HEADER_NAME.match(caller_header):
            raise ConfigurationError(f"caller_header={caller_header!r} must be an HTTP header name")
        if caller_header is not None and caller_header.lower() == "idempotency-key":
            raise ConfigurationError("caller_header names the header that identifies the caller, "
                                     "not Idempotency-Key")
        self.name = consumer_name(name)
        self.idempotency = idempotency
        self.store = idempotency.store
        self.caller_header = caller_header
        self.max_body_bytes = max_body_bytes
        self.problem_base = problem_base
        self.retry_after = str(retry_after_seconds)

    def problem(self, slug: str, detail: str, **members: Any) -> HttpResult:
        """A problem+json response of one of `PROBLEMS`."""
        status, title = PROBLEMS[slug]
        headers = {"Content-Type": "application/problem+json"}
        if status == 409:
            headers["Retry-After"] = self.retry_after
        return HttpResult(status, {"type": f"{self.problem_base}{slug}", "title": title,
                                   "status": status, "detail": detail, **members}, headers)

    def unavailable(self, detail: str) -> HttpResult:
        """503: nothing is wrong with the request; retry it after Retry-After."""
        return _blank_problem(503, "Service Unavailable", detail, {"Retry-After": self.retry_after})

    def _request[T](self, headers: Mapping[str, str], body: bytes,
                    parse: Callable[[dict[str, Any]], T]) -> IdempotentRequest[T] | HttpResult:
        """The request, read and scoped; or the 400 problem that refuses it."""
        raw = _header(headers, "Idempotency-Key")
        if raw is None or not raw.strip():
            return self.problem("idempotency-key-missing",
                                "Send a unique key (e.g. a UUID) and reuse it on retries.")
        raw = raw.strip().strip('"')
        if len(raw) > MAX_KEY_CHARS:
            return self.problem("idempotency-key-invalid", f"at most {MAX_KEY_CHARS} characters")
        if _CONTROL.search(raw):
            return self.problem("idempotency-key-invalid",
                                "control characters are not allowed in an HTTP field value")
        try:
            caller = caller_of(headers, caller_header=self.caller_header)
            scoped = scoped_key(caller, raw)
            DedupKey.from_business_key(self.name, scoped, field="Idempotency-Key")
            parsed = parse_json_object(body, max_bytes=self.max_body_bytes)
            item = parse(parsed)
        except CallerError as error:
            return self.problem("caller-unreadable", error.detail)
        except InvalidKeyError as error:
            return self.problem("idempotency-key-invalid", str(error))
        except InvalidPayloadError as error:
            return self.problem("request-invalid", error.detail, reason=error.reason)
        return IdempotentRequest(parsed, item, raw, scoped, caller, headers)

    @flowmethod
    def _answer[T](self, request: IdempotentRequest[T],
                   handler: Callable[[IdempotentRequest[T]], Any]) -> Flow[HttpResult]:
        key = DedupKey.from_business_key(self.name, request.scoped_key, field="Idempotency-Key")
        try:
            outcome: Outcome = yield from self.idempotency.run.flow(
                key, request_hash(request.body), functools.partial(_stored, handler, request),
                context={"idempotency_key": request.key})
        except InvalidPayloadError as error:
            return self.problem("request-invalid", error.detail, reason=error.reason)
        except PoisonMessageError as error:
            return self.problem("request-refused", error.detail, reason=error.reason)
        except _TRANSIENT as error:
            return self.unavailable(str(error))
        if outcome.status is OutcomeStatus.CONFLICT:
            return self.problem("idempotency-key-reused", "Use a new key for a new request.")
        if outcome.status is OutcomeStatus.IN_PROGRESS:
            return self.problem("idempotency-key-in-progress", "Retry after it completes.")
        result: Any = outcome.result
        stored = typing.cast(dict[str, Any], result) if isinstance(result, dict) else {}
        headers: dict[str, str] = {"Content-Type": "application/json", **stored.get("headers", {})}
        if outcome.status is OutcomeStatus.DUPLICATE:
            headers["Idempotent-Replayed"] = "true"
        return HttpResult(int(stored.get("status", 200)), stored.get("body"), headers)

    def _unexpected(self, error: Exception) -> HttpResult:
        logger.error("%s: unexpected error", self.name, exc_info=error)
        return _blank_problem(500, "Internal Server Error", "the request failed; retry it later")


def _blank_problem(status: int, title: str, detail: str,
                   headers: Mapping[str, str] | None = None) -> HttpResult:
    return HttpResult(status, {"type": "about:blank", "title": title, "status": status,
                               "detail": detail},
                      {"Content-Type": "application/problem+json", **(headers or {})})


#: Failures a retry of the same request can fix: 503 with Retry-After, never 4xx or 500.
_TRANSIENT = (StoreUnavailableError, ConcurrencyRetriesExhaustedError, DispatchUnavailableError,
              DispatchRejectedError, EffectUncertainError)


def _stored[T](handler: Callable[[IdempotentRequest[T]], Any], request: IdempotentRequest[T]) -> Any:
    """Run the handler; what is stored for the key (JSON: status, body and headers)."""
    result = handler(request)
    if inspect.isawaitable(result):
        return _stored_later(result)
    return _as_stored(result)


async def _stored_later(result: Awaitable[Any]) -> dict[str, Any]:
    return _as_stored(await result)


def _as_stored(result: Any) -> dict[str, Any]:
    if not isinstance(result, HttpResult):
        raise TypeError(f"an IdempotencyKeyEndpoint handler returns an HttpResult, not {result!r}")
    stored: dict[str, Any] = {"status": result.status, "body": result.body}
    headers = _without_content_type(result.headers)
    if headers:
        stored["headers"] = headers
    return stored


def _without_content_type(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() != "content-type"}


def http_response(result: HttpResult) -> Any:
    """The `azure.functions.HttpResponse` of a result (JSON body, its content type kept)."""
    import azure.functions as func

    mimetype = _header(result.headers, "Content-Type") or "application/json"
    return func.HttpResponse(json.dumps(result.body), status_code=result.status,
                             headers=_without_content_type(result.headers), mimetype=mimetype,
                             charset="utf-8")


def _request_parts(request: Any) -> tuple[dict[str, str], bytes]:
    return dict(request.headers), request.get_body() or b""


def _body(body: dict[str, Any]) -> Any:
    return body


class IdempotencyKeyEndpoint(BaseIdempotencyKeyEndpoint[Idempotency], Sync):
    """`BaseIdempotencyKeyEndpoint` for a sync function. `parse` reads the JSON body before
    anything is claimed (default: the body itself); its `InvalidPayloadError` answers 400, as
    the handler's does; another `PoisonMessageError` from the handler answers 422."""

    def handle[T](self, request: Any, handler: Callable[[IdempotentRequest[T]], HttpResult], *,
                  parse: Callable[[dict[str, Any]], T] = _body) -> Any:
        """Answer an `azure.functions.HttpRequest`: the `HttpResponse` to return."""
        return http_response(self.answer(*_request_parts(request), handler, parse=parse))

    def answer[T](self, headers: Mapping[str, str], body: bytes,
                  handler: Callable[[IdempotentRequest[T]], HttpResult], *,
                  parse: Callable[[dict[str, Any]], T] = _body) -> HttpResult:
        """`handle` without azure.functions: headers and body in, the result out."""
        request = self._request(headers, body, parse)
        if isinstance(request, HttpResult):
            return request
        try:
            return self._answer(request, handler)
        except Exception as error:
            return self._unexpected(error)


class AsyncIdempotencyKeyEndpoint(BaseIdempotencyKeyEndpoint[AsyncIdempotency], Async):
    """`IdempotencyKeyEndpoint` for an `async def` function (`shared.aio.IdempotencyKeyEndpoint`);
    `handler` may be async."""

    async def handle[T](self, request: Any, handler: Callable[[IdempotentRequest[T]], Any], *,
                        parse: Callable[[dict[str, Any]], T] = _body) -> Any:
        return http_response(await self.answer(*_request_parts(request), handler, parse=parse))

    async def answer[T](self, headers: Mapping[str, str], body: bytes,
                        handler: Callable[[IdempotentRequest[T]], Any], *,
                        parse: Callable[[dict[str, Any]], T] = _body) -> HttpResult:
        request = self._request(headers, body, parse)
        if isinstance(request, HttpResult):
            return request
        try:
            return await self._answer(request, handler)
        except Exception as error:
            return self._unexpected(error)
