"""Property-based tests of offset specs (hypothesis): whatever the operator types, parse_spec either
refuses it with Refused or returns a spec that Kafka can take (offsets within 64 bits, moments between
1970 and now) — never another exception, so web, API and CLI never crash on a value."""
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from consumers.operations.errors import Refused
from consumers.operations.offset_specs import EPOCH, MAX_OFFSET, OFFSET_MODES, parse_spec

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)

values = st.one_of(
    st.none(),
    st.text(max_size=40),
    st.integers(min_value=-(2**80), max_value=2**80).map(str),
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)).map(lambda d: d.isoformat() + "Z"),
    st.builds(lambda d, h: f"P{d}DT{h}H", st.integers(min_value=-(10**20), max_value=10**20),
              st.integers(min_value=0, max_value=10**20)),
    st.sampled_from(["PT10M", "P1D", "P0D", "-PT1H", "P1M", "P1Y", "1969-12-31T23:59:59Z", "\x00", "\ud800"]),
)


@given(st.sampled_from(OFFSET_MODES), values)
def test_every_value_is_refused_or_parsed_into_a_target_kafka_can_take(mode, value):
    try:
        spec = parse_spec(mode, value, now=NOW)
    except Refused as refusal:
        assert str(refusal)
        return
    if spec.offset is not None:
        assert -MAX_OFFSET <= spec.offset <= MAX_OFFSET
        if mode == "to-offset":
            assert spec.offset >= 0
    if spec.moment is not None:
        assert EPOCH <= spec.moment <= NOW
        assert int(spec.moment.timestamp() * 1000) >= 0  # never Kafka's special -1 / -2


@given(st.integers(min_value=1, max_value=10**6))
def test_a_duration_back_from_now_lands_that_far_back(minutes):
    spec = parse_spec("by-duration", f"PT{minutes}M", now=NOW)
    assert spec.moment == NOW - timedelta(minutes=minutes)
