"""core.address_ranges: spans inside one of a set of allocator segments."""

import pytest

from sglang_mixgraph.core.address_ranges import AddressRanges


@pytest.mark.parametrize(
    ("span", "inside"),
    [((0x1000, 16), True), ((0x1FF0, 16), True), ((0x1FF8, 16), False), ((0x3000, 0), True)],
)
def test_address_ranges(span, inside):
    ranges = AddressRanges([(0x3000, 0x100), (0x1000, 0x1000), (0x5000, 0)])
    assert len(ranges) == 2
    assert ranges.holds(*span) is inside


def test_address_ranges_refuse_overlaps():
    with pytest.raises(ValueError, match="overlapping"):
        AddressRanges([(0x1000, 0x200), (0x1100, 0x10)])
