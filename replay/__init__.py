"""Replay tool: act on parked entries and dead-lettered messages with dedup intact.

Run it as `python -m replay` (see `replay/__main__.py` and the README section
"Operate: replay parked and dead-lettered messages"). The logic is in
`replay.tool`, the brokers behind `replay.deadletters.DeadLetterSource`.
"""
