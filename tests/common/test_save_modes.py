import pytest
from streamrec.errors import BadRequest, CheckpointError
from streamrec.save_modes import FULL_MODES, SAVE_MODES, SERVING_MODES, SaveMode, parse_save_mode


def test_every_mode_parses_to_itself_and_equals_its_wire_value():
    for value in SAVE_MODES:
        mode = parse_save_mode(value)
        assert mode is SaveMode(value) and mode == value and f"{mode}" == value
    assert parse_save_mode(SaveMode.DELTA) is SaveMode.DELTA
    assert set(SERVING_MODES) | FULL_MODES == set(SaveMode) and not set(SERVING_MODES) & FULL_MODES


BAD = ["full", "BASE", "", None, 1, ["base"], {"base": 1}, "x" * 10_000]


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize("error", [ValueError, BadRequest, CheckpointError])
def test_a_bad_mode_is_refused_naming_the_field_and_the_value(value, error):
    with pytest.raises(error) as caught:
        parse_save_mode(value, "meta.mode", error)
    text = str(caught.value)
    assert "'meta.mode'" in text and "['checkpoint', 'base', 'delta', 'batch']" in text
    assert repr(value)[:50] in text and len(text) < 400  # named, and bounded
