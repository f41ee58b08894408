"""CloudEvents parsing: structured and binary mode, `data` and `data_base64`, and the reasons
a bad event is refused with (the same InvalidEventError as any other bad input)."""

from __future__ import annotations

import base64
import json

import pytest

from shared._core.cloudevents import InvalidEventError, declares_json, parse_cloudevent

ATTRIBUTES = {"specversion": "1.0", "id": "e-1", "source": "/src", "type": "t"}
BINARY_PROPERTIES = {f"ce_{name}": value for name, value in ATTRIBUTES.items()}
RAW = bytes(range(256))  # binary data: not UTF-8, not JSON


def structured(**members) -> bytes:
    return json.dumps({**ATTRIBUTES, **members}).encode()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.parametrize("content_type", [
    "application/json", "application/json; charset=utf-8", "text/json", "Application/JSON",
    "application/vnd.acme.payment+json", "application/cloudevents+json"])
def test_data_base64_of_a_json_content_type_is_decoded_as_json(content_type):
    data = {"accountId": "a", "amountCents": 5, "note": "é"}
    event = parse_cloudevent(structured(datacontenttype=content_type,
                                        data_base64=b64(json.dumps(data).encode())))
    assert event.data == data
    assert event.datacontenttype == content_type
    assert "data_base64" not in event.extensions


@pytest.mark.parametrize("content_type", ["application/octet-stream", "image/png", "text/plain",
                                          "application/jsonx", None])
def test_data_base64_of_another_content_type_is_kept_as_bytes(content_type):
    members = {"data_base64": b64(RAW)} | ({"datacontenttype": content_type} if content_type else {})
    assert parse_cloudevent(structured(**members)).data == RAW


def test_data_is_still_read_as_a_json_value_and_a_null_data_base64_is_absent():
    assert parse_cloudevent(structured(data={"a": 1})).data == {"a": 1}
    assert parse_cloudevent(structured(data={"a": 1}, data_base64=None)).data == {"a": 1}
    assert parse_cloudevent(structured()).data is None


@pytest.mark.parametrize("data", [{"a": 1}, None, "x"])
def test_an_event_with_both_data_and_data_base64_is_refused(data):
    with pytest.raises(InvalidEventError, match="both data and data_base64") as caught:
        parse_cloudevent(structured(data=data, data_base64=b64(b'{"a":1}')))
    assert caught.value.reason == "MalformedCloudEvent"


@pytest.mark.parametrize("encoded", [
    "not base64!", "YWJjZA", "YWJj\nZA==", "YWJj ZA==", "YW-_ZA==", 5, ["YQ=="], {"b": "YQ=="}])
def test_invalid_base64_is_refused_with_a_reason(encoded):
    with pytest.raises(InvalidEventError, match="data_base64") as caught:
        parse_cloudevent(structured(datacontenttype="application/octet-stream", data_base64=encoded))
    assert caught.value.reason == "MalformedCloudEvent"


@pytest.mark.parametrize(("data", "reason"), [
    (b"{not json", "MalformedJson"), (b"[" * 100 + b"]" * 100, "TooDeeplyNested"),
    (b'{"a": NaN}', "InvalidNumber"), (b'{"a": "\\ud800"}', "InvalidText"), (b"", "MalformedJson")])
def test_json_data_base64_goes_through_the_bounded_decoder(data, reason):
    with pytest.raises(InvalidEventError) as caught:
        parse_cloudevent(structured(datacontenttype="application/json", data_base64=b64(data)))
    assert caught.value.reason == reason


def test_decoded_data_is_bounded_like_the_body():
    body = structured(datacontenttype="application/json", data_base64=b64(b'"' + b"x" * 2000 + b'"'))
    with pytest.raises(InvalidEventError) as caught:
        parse_cloudevent(body, max_bytes=len(body) - 1)
    assert caught.value.reason == "PayloadTooLarge"
    assert parse_cloudevent(body, max_bytes=len(body)).data == "x" * 2000


def test_a_datacontenttype_that_is_not_a_string_is_refused():
    with pytest.raises(InvalidEventError, match="datacontenttype") as caught:
        parse_cloudevent(structured(datacontenttype=7, data_base64=b64(b"{}")))
    assert caught.value.reason == "MalformedCloudEvent"


# -- binary mode: the body is the data, the message's content type its datacontenttype ---------
def test_binary_mode_binary_data_is_kept_as_bytes():
    event = parse_cloudevent(RAW, BINARY_PROPERTIES, "application/octet-stream")
    assert event.data == RAW and event.datacontenttype == "application/octet-stream"
    assert event.id == "e-1" and event.source == "/src"


@pytest.mark.parametrize("content_type", [None, "application/json", "application/x+json; v=1"])
def test_binary_mode_json_data_is_decoded(content_type):
    event = parse_cloudevent(b'{"a": 1}', BINARY_PROPERTIES, content_type)
    assert event.data == {"a": 1}


def test_binary_mode_datacontenttype_property_applies_when_the_message_has_no_content_type():
    properties = {**BINARY_PROPERTIES, "ce_datacontenttype": "application/octet-stream"}
    assert parse_cloudevent(RAW, properties).data == RAW
    assert parse_cloudevent(b'{"a": 1}', properties, "application/json").data == {"a": 1}


def test_binary_mode_json_content_type_still_refuses_malformed_json():
    with pytest.raises(InvalidEventError) as caught:
        parse_cloudevent(RAW, BINARY_PROPERTIES, "application/json")
    assert caught.value.reason == "MalformedJson"


@pytest.mark.parametrize(("content_type", "expected"), [
    ("application/json", True), ("text/json", True), ("application/geo+json-seq", False),
    ("application/problem+json; charset=utf-8", True), ("json", False), ("", False), (None, False),
    (5, False), ("application/octet-stream", False)])
def test_declares_json_follows_the_json_format_rule(content_type, expected):
    assert declares_json(content_type) is expected
