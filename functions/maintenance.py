"""`maintenance`: timer that purges expired records and parks abandoned in-progress ones."""

from __future__ import annotations

import azure.functions as func

from functions.services import services

bp = func.Blueprint()


@bp.function_name("maintenance")
@bp.timer_trigger(arg_name="timer", schedule="%MAINTENANCE_SCHEDULE%", run_on_startup=False,
                  use_monitor=True)
def maintenance(timer: func.TimerRequest) -> None:
    services().maintenance.run()
