"""Text as PostgreSQL stores it, cut to a model field's length (the rules themselves: consumers/pg_text.py)."""
from consumers.pg_text import storable


def fit(model, field: str, value) -> str:
    """`value` made storable and cut to the `max_length` of `model.field` (unlimited for a TextField)."""
    text = storable(value)
    limit = model._meta.get_field(field).max_length
    return text[:limit] if limit else text


def storable_json(value, *, max_chars: int):
    """A JSON value whose every string (keys included) is storable and at most `max_chars` long."""
    if isinstance(value, dict):
        return {storable(k)[:max_chars]: storable_json(v, max_chars=max_chars) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable_json(v, max_chars=max_chars) for v in value]
    if isinstance(value, str):
        return storable(value)[:max_chars]
    if value is None or isinstance(value, bool | int | float):
        return value
    return storable(value)[:max_chars]
