"""Value encodings: one registry, the rules each carries, and a clear error where an all-reduce cannot carry one."""

import warnings

import pytest

from pactrain_hvd.core.encodings import ENCODINGS, PACKED_VALUES, packed_values_argument


def test_the_registry_names_every_encoding_once():
    assert PACKED_VALUES == ("inherit", "fp16", "bf16", "ternary", "int3")
    assert {name: (e.wire, e.quantized, e.levels) for name, e in ENCODINGS.items()} == {
        "inherit": (None, False, 0), "fp16": ("float16", False, 0), "bf16": ("bfloat16", False, 0),
        "ternary": ("float16", True, 1), "int3": ("float16", True, 3)}


def test_a_quantized_encoding_reports_its_fallback_where_lanes_do_not_fit():
    assert ENCODINGS["ternary"].reported(lanes_fit=True) == "ternary"
    assert ENCODINGS["ternary"].reported(lanes_fit=False) == "fp16"
    assert ENCODINGS["bf16"].reported(lanes_fit=False) == "bf16"


@pytest.mark.parametrize("op, grouped, message", [
    ("Max", False, r"packed_values='ternary' sums integer codes: op must be hvd.Average or hvd.Sum, got Max"),
    ("Sum", True, r"packed_values='ternary' cannot be combined with groups"),
])
def test_quantized_codes_need_a_sum_and_travel_alone(op, grouped, message):
    with pytest.raises(ValueError, match=message):
        ENCODINGS["ternary"].check(op, grouped)
    ENCODINGS["fp16"].check(op, grouped)  # a plain cast goes with any reduction


def test_a_wire_the_all_reduce_cannot_carry_is_refused_by_name():
    carried = {None: "as compression says", "float16": "fp16 compressor"}
    assert ENCODINGS["fp16"].wire_of(carried, "horovod.torch") == "fp16 compressor"
    assert ENCODINGS["inherit"].wire_of(carried, "horovod.torch") == "as compression says"
    with pytest.raises(ValueError, match=r"packed_values='bf16' sends bfloat16 values, which the all-reduce of "
                                         r"horovod.torch does not carry \(it carries float16 besides"):
        ENCODINGS["bf16"].wire_of(carried, "horovod.torch")


def test_the_argument_and_its_deprecated_spellings():
    assert packed_values_argument("bf16") == "bf16"
    with pytest.warns(DeprecationWarning, match="values= is deprecated"):
        assert packed_values_argument("inherit", "fp32") == "inherit"
    with pytest.raises(ValueError, match="packed_values must be one of 'inherit', 'fp16', 'bf16', 'ternary', 'int3', got 'int8'"):
        packed_values_argument("int8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        packed_values_argument("ternary")
