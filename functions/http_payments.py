"""`POST /api/payments` with an Idempotency-Key header (the library's `IdempotencyKeyEndpoint`)."""

from __future__ import annotations

import azure.functions as func

from functions.services import services

bp = func.Blueprint()


@bp.function_name("http_payments")
@bp.route(route="payments", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
def http_payments(req: func.HttpRequest) -> func.HttpResponse:
    return services().http_payments.respond(req)
