"""`POST /api/payments` with an Idempotency-Key header."""

from __future__ import annotations

import json

import azure.functions as func

from functions.services import services

bp = func.Blueprint()


@bp.function_name("http_payments")
@bp.route(route="payments", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
def http_payments(req: func.HttpRequest) -> func.HttpResponse:
    result = services().http_payments.handle(dict(req.headers), req.get_body() or b"")
    headers = {k: v for k, v in result.headers.items() if k.lower() != "content-type"}
    mimetype = result.headers.get("Content-Type", "application/json")
    return func.HttpResponse(json.dumps(result.body), status_code=result.status, headers=headers,
                             mimetype=mimetype, charset="utf-8")
