"""One map of a request's headers reads what the one-header scan reads: each name's first value,
and the same bearer token."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.middleware.server.auth import bearer_of, bearer_token
from kvgate.middleware.server.body import header, headers_of

NAMES = [b"authorization", b"content-length", b"x-kvgate-cache-control", b"x-kvgate-tags", b"host"]
VALUES = st.one_of(
    st.binary(max_size=12),
    st.sampled_from([b"Bearer k1", b"bearer  k2 ", b"Basic abc", b"Bearer", b"Bearer ", b"12", b"no-cache"]),
)


@settings(max_examples=400, deadline=None)
@given(headers=st.lists(st.tuples(st.sampled_from(NAMES), VALUES), max_size=8))
def test_the_map_reads_each_names_first_value_and_the_same_token(headers):
    scope = {"type": "http", "headers": headers}
    mapped = headers_of(scope)
    for name in NAMES:
        assert mapped.get(name) == header(scope, name)
    assert bearer_of(mapped.get(b"authorization")) == bearer_token(headers)


def test_a_scope_without_headers_maps_to_none():
    assert headers_of({"type": "http"}) == {} and bearer_of(None) is None
