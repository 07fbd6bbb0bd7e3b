"""The connection caps, in all and per client address, without a server."""

from server.api.connection_limits import ConnectionLimits


def test_each_address_gets_its_own_share_and_the_total_stays_under_the_global_cap():
    limits = ConnectionLimits(max_connections=5, max_per_client=2)
    assert [limits.admit("a") for _ in range(2)] == [None, None]
    assert limits.admit("a").code == "too_many_connections_from_client"
    assert [limits.admit("b"), limits.admit("b"), limits.admit("c")] == [None, None, None]
    assert limits.admit("d").code == "too_many_connections"
    assert limits.open == 5  # refusals are not counted
    limits.release("a")
    assert limits.admit("a") is None and limits.admit("a") is not None


def test_zero_per_client_means_only_the_global_cap():
    limits = ConnectionLimits(max_connections=3, max_per_client=0)
    assert [limits.admit("proxy") for _ in range(3)] == [None, None, None]
    assert limits.admit("proxy").code == "too_many_connections"
