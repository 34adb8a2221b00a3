"""The epoch history a dashboard replays to a client that joins late, held once and bounded in memory.

Each epoch is kept as the bytes sent to browsers (about 1.5 KB for 40 metrics), never also as a dict.
A run of any length holds at most ``limit`` epochs: the newest ``limit - limit // 2`` in full, and older
ones thinned evenly over the start of the run. An epoch leaving the recent window is kept when its id is a
multiple of the current stride; when the older part is full, every other one is dropped and the stride
doubles. The default limit of 10,000 holds about 15 MB for 40 metrics, whether the run has 10,000 epochs
or a million.

>>> history = EpochHistory(limit=4)
>>> for i in range(10):
...     history.append(Message("epoch", str(i), id=i))
>>> [m.id for m in history.messages()]
[0, 4, 8, 9]
"""

from __future__ import annotations

import itertools
from collections import deque


class Message:
    """One server-sent event, kept as the bytes sent to browsers: type (``epoch``, ``meta``, ``complete``),
    optional id, and JSON data (:attr:`data`, sliced from those bytes, so the text is held once).

    >>> Message("epoch", '{"epoch":1}', id=0).frame
    b'id: 0\\r\\nevent: epoch\\r\\ndata: {"epoch":1}\\r\\n\\r\\n'
    """

    __slots__ = ("event", "id", "frame", "_start", "_text")

    def __init__(self, event: str, data: str, id: int | None = None) -> None:
        self.event = event
        self.id = id
        head = f"event: {event}\r\n" if id is None else f"id: {id}\r\nevent: {event}\r\n"
        if "\n" in data or "\r" in data:  # never for compact JSON; SSE wants one data line per line
            lines = data.replace("\r\n", "\n").replace("\r", "\n").split("\n")
            self.frame = (head + "".join(f"data: {line}\r\n" for line in lines) + "\r\n").encode()
            self._start = -1
            self._text: str | None = data
        else:
            self.frame = f"{head}data: {data}\r\n\r\n".encode()
            self._start = len(head.encode()) + 6
            self._text = None

    @property
    def data(self) -> str:
        """The JSON text."""
        return self._text if self._text is not None else self.frame[self._start : -4].decode()

    @property
    def data_bytes(self) -> bytes:
        """The JSON text as UTF-8 bytes (what ``json.loads`` reads without a copy to ``str``)."""
        return self._text.encode() if self._text is not None else self.frame[self._start : -4]

    def __repr__(self) -> str:
        return f"Message({self.event!r}, {self.data!r}, id={self.id!r})"


class EpochHistory:
    """Epoch messages in order of their ids (0, 1, 2, ...), at most ``limit`` of them (see the module text).

    Not thread-safe on its own: :class:`~flowgraph.monitor.hub.EventHub` guards it with its lock.
    """

    def __init__(self, limit: int = 10_000) -> None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 2:
            raise ValueError(f"EpochHistory: limit must be an int >= 2, got {limit!r}")
        self.limit = limit
        self.recent_size = limit - limit // 2
        self.older_size = limit // 2
        self._recent: deque[Message] = deque()
        self._older: list[Message] = []
        self.stride = 1  # the older part keeps the ids that are multiples of this
        self.count = 0  # epochs appended so far, kept or not

    def append(self, message: Message) -> None:
        """Add the next epoch; ``message.id`` must be :attr:`count` (the hub numbers them)."""
        self._recent.append(message)
        self.count += 1
        if len(self._recent) <= self.recent_size:
            return
        leaving = self._recent.popleft()
        if leaving.id is not None and leaving.id % self.stride == 0:
            self._older.append(leaving)
            if len(self._older) > self.older_size:
                self.stride *= 2
                self._older = [m for m in self._older if m.id is not None and m.id % self.stride == 0]

    def messages(self) -> list[Message]:
        """The epochs held, oldest first (a new list; the messages themselves are shared and immutable)."""
        return [*self._older, *self._recent]

    def after(self, cursor: int) -> list[Message]:
        """The epochs held whose id is greater than ``cursor``, oldest first (``-1``: all of them)."""
        recent = self._recent
        if not recent:
            return []
        wanted = (recent[-1].id or 0) - cursor  # the ids in the recent window are consecutive
        if wanted <= 0:
            return []
        if wanted <= 64:  # a live client, a few epochs behind: index from the right end, O(wanted)
            return [recent[-k] for k in range(wanted, 0, -1)]
        if wanted <= len(recent):
            return list(itertools.islice(recent, len(recent) - wanted, None))
        return [m for m in self._older if m.id is not None and m.id > cursor] + list(recent)

    def __len__(self) -> int:
        return len(self._older) + len(self._recent)

    @property
    def thinned(self) -> bool:
        """True once some epoch was left out (the run outgrew :attr:`recent_size`)."""
        return len(self) < self.count
