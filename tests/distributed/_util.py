"""Helpers shared by the distributed tests."""

import socket


def free_port() -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
