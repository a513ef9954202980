"""A watch's json:PATH record id walks objects and, like a pipeline's --map path, lists by index."""
import json

import pytest

from consumers.engine.record_ids import json_field, parse_spec


@pytest.mark.parametrize("path, expected", [
    ("json:order.id", "42"), ("json:items.0.sku", "S7"), ("json:items.1.sku", "S8"), ("json:items.2.sku", None),
    ("json:items.x", None), ("json:order.id.0", None), ("json:items", None), ("json:flags.1", "true"),
])
def test_a_json_path_walks_objects_and_list_indexes(path, expected):
    value = json.dumps({"order": {"id": 42}, "items": [{"sku": "S7"}, {"sku": "S8"}], "flags": [False, True]})
    assert json_field(value.encode(), parse_spec(path).path) == expected
