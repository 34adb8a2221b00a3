"""Helpers shared by the distributed tests."""

import socket


def free_port() -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sgd(model, lr: float = 0.1) -> None:
    """Plain SGD by hand (the workers' update): ``p -= lr * grad``, then clear the gradients."""
    import flowgraph as fg

    with fg.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.sub_(p.grad * lr)
                p.grad = None
