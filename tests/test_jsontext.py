"""uform.core.jsontext: every way outside JSON fails, as one error whose text is the reason."""

from __future__ import annotations

import json

import pytest

from uform.core.jsontext import NotJSON, loads, reason


@pytest.mark.parametrize(
    "text, why",
    [
        ("{oops", "Expecting property name enclosed in double quotes at column 2"),
        ('{"a": 1,\n "b": 2,\n "c" 3}', "Expecting ':' delimiter at line 3 column 6"),
        ("", "Expecting value at column 1"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),  # a RecursionError, no ValueError, before
        (b'{"a": "\xff"}', "not UTF-8: byte 0xff at offset 7"),
        ('{"a": 1}'.encode("utf-16"), "not UTF-8: byte 0xff at offset 0"),  # json.loads itself takes UTF-16
        (b'\xef\xbb\xbf{"a": 1}', "Unexpected UTF-8 BOM (decode using utf-8-sig) at column 1"),
        pytest.param('{"a": ' + "9" * 5000 + "}", "an integer of more than 4300 digits", id="integer-too-long"),  # a bare ValueError, before
    ],
)
def test_each_failure_is_not_json_with_its_reason(text: str | bytes, why: str) -> None:
    with pytest.raises(NotJSON) as err:
        loads(text)
    assert str(err.value) == why and isinstance(err.value, ValueError)


def test_json_reads_as_json_does() -> None:
    doc = '{"a": [1, 2.5, "é", null, true], "b": {"c": "\\ud83d\\ude00"}}'
    assert loads(doc) == loads(doc.encode()) == json.loads(doc)


def test_reason_words_another_readers_failure_the_same_way() -> None:
    with pytest.raises(json.JSONDecodeError) as err:
        json.loads("[1,\n2,,]")
    assert reason(err.value) == "Expecting value at line 2 column 3"
    assert reason(RecursionError()) == "nested too deeply"


def test_unique_keys_refuses_a_key_written_twice_at_any_depth() -> None:
    assert loads('{"a": 1, "a": 2}') == {"a": 2}  # by default, as json.loads: the last counts
    for doc, key in (('{"a": 1, "b": 2, "a": 3}', "a"), ('[{"x": {"k": 1, "k": 1}}]', "k")):
        with pytest.raises(NotJSON) as err:
            loads(doc, unique_keys=True)
        assert str(err.value) == f"the key {key!r} appears twice in one object"
    assert loads('{"a": {"a": 1}, "b": [{"a": 2}]}', unique_keys=True) == {"a": {"a": 1}, "b": [{"a": 2}]}


def test_an_invalid_escape_before_wide_characters_is_refused_as_json_refuses_it() -> None:
    """A backslash before non-ASCII bytes is an invalid escape: no rewrite of the bytes ahead of
    the parse (escaping the wide characters to keep the text narrow) may turn it valid."""
    text = '{"a": "\\\u00e9", "b": "\U0001F600"}'.encode()
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    with pytest.raises(NotJSON, match="Invalid"):
        loads(text)
