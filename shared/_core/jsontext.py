"""Compact JSON text from encoders built once.

`json.dumps` with any option builds a `JSONEncoder` and its C encoder on every call, which costs
more than encoding the hot path's small values. These build it once: the text is `json.dumps`'s
with the same options, byte for byte. Without the circular check (it needs per-call state) one
C encoder serves every thread and a cyclic value raises RecursionError, not ValueError; with it
(`check_circular=True`) only the JSONEncoder is built once, and errors are `json.dumps`'s.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json import encoder as _encoder
from typing import Any

#: Builds the C encoder `json.dumps` uses (None where the C accelerator is missing).
_C_MAKE_ENCODER: Callable[..., Callable[[Any, int], Any]] | None = getattr(
    _encoder, "c_make_encoder", None)


def compact_encoder(*, sort_keys: bool = False, allow_nan: bool = False) -> Callable[[Any], str]:
    """`lambda value: json.dumps(value, separators=(",", ":"), ensure_ascii=False,
    sort_keys=sort_keys, allow_nan=allow_nan, check_circular=False)`, built once.

    TypeError for a value JSON cannot hold, ValueError for NaN or an infinity when
    `allow_nan` is False, RecursionError for a cycle or too deep a value.
    """
    return json_encoder(separators=(",", ":"), ensure_ascii=False, sort_keys=sort_keys,
                        allow_nan=allow_nan)


def json_encoder(*, separators: tuple[str, str] = (", ", ": "), ensure_ascii: bool = True,
                 sort_keys: bool = False, allow_nan: bool = True,
                 check_circular: bool = False) -> Callable[[Any], str]:
    """`lambda value: json.dumps(value, check_circular=check_circular, **options)`, built once
    (`json.dumps`'s defaults unless given). With the circular check, the C encoder is still
    built per call (its markers are per call), but the JSONEncoder is not."""
    options = json.JSONEncoder(separators=separators, ensure_ascii=ensure_ascii,
                               sort_keys=sort_keys, allow_nan=allow_nan,
                               check_circular=check_circular)
    if _C_MAKE_ENCODER is None or check_circular:  # the encoder's own one-shot path
        return options.encode
    # The arguments JSONEncoder.iterencode passes to the C encoder for a one-shot encode.
    strings = _encoder.encode_basestring_ascii if ensure_ascii else _encoder.encode_basestring
    encode = _C_MAKE_ENCODER(None, options.default, strings, None, options.key_separator,
                             options.item_separator, sort_keys, options.skipkeys, allow_nan)

    def dumps(value: Any) -> str:
        return "".join(encode(value, 0))

    return dumps
