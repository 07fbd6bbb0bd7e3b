"""The ports the test stacks and `bench` servers take: free, never the same twice, and outside the range the kernel
gives outgoing connections, so that a server restarted on its predecessor's port can bind it again."""

import socket
from types import SimpleNamespace

from server.bench import local_server
from server.bench.local_server import EPHEMERAL_RANGE, LOWEST_PORT, free_port


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range():
    ephemeral = int(EPHEMERAL_RANGE.read_text().split()[0])
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(LOWEST_PORT <= port < ephemeral for port in ports)
    for port in ports[:20]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_in_use_is_passed_over(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        in_use = held.getsockname()[1]
        held.listen()
        vacant = next(port for port in range(LOWEST_PORT, 65536) if _bindable(port))
        drawn = iter([in_use, in_use, vacant])
        monkeypatch.setattr(local_server, "_draw", SimpleNamespace(randrange=lambda low, high: next(drawn)))
        monkeypatch.setattr(local_server, "_handed_out", set())
        monkeypatch.setattr(local_server, "EPHEMERAL_RANGE", FakeRange())
        assert free_port() == vacant


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class FakeRange:
    """An ephemeral range above every port, so that the held port counts as one free_port may draw."""

    def exists(self) -> bool:
        return True

    def read_text(self) -> str:
        return "65535 65535"
