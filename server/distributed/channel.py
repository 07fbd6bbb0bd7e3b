"""Rank 0's line to each worker: one TCP connection. Rank 0 sends length-prefixed pickles (its commands); a worker
answers in fixed-size numbers only, so rank 0 never unpickles what comes from a socket.

Rank 0's end has a timeout on every send and receive. A worker's end waits for its next command as long as rank
0 lives: the connection closing (rank 0 stopped or died) ends the wait with None.
"""

import pickle
import socket
import struct

_LENGTH = struct.Struct("!Q")
_NUMBER = struct.Struct("!d")


class ChannelClosed(ConnectionError):
    """The other end closed the connection, or its process died."""


class Channel:
    def __init__(self, sock: socket.socket, timeout: float | None) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(timeout)
        self.sock = sock

    @classmethod
    def connect(cls, address: tuple[str, int]) -> "Channel":
        return cls(socket.create_connection(address), None)

    def send_message(self, message: object) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self.sock.sendall(_LENGTH.pack(len(data)) + data)

    def receive_message(self) -> object | None:
        """The next message, or None once the sender has closed the connection."""
        try:
            (length,) = _LENGTH.unpack(self._read(_LENGTH.size))
            return pickle.loads(self._read(length))
        except ChannelClosed:
            return None

    def send_number(self, value: float) -> None:
        self.sock.sendall(_NUMBER.pack(value))

    def receive_number(self) -> float:
        (value,) = _NUMBER.unpack(self._read(_NUMBER.size))
        return value

    def close(self) -> None:
        self.sock.close()

    def _read(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            try:
                chunk = self.sock.recv(size - len(data))
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                raise ChannelClosed("the connection closed")
            data += chunk
        return bytes(data)
