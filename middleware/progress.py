"""Progress of long work (`kvgate tune`, `kvgate bench ...`, `kvgate prepare`): a tqdm bar when
stderr is a terminal, and plain lines (one every `every_s` seconds, and one at the end) when it is
not, so CI logs stay readable. Messages go through `say`, which does not break a bar."""

from __future__ import annotations

import sys
import time
from typing import Callable, Iterable, Iterator, TextIO, TypeVar

from tqdm import tqdm

T = TypeVar("T")


def on_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class Progress:
    """Counts steps of one piece of work towards `total` (None: unknown); `note` sets a short
    status (a loss, a rate) shown with the count. A context manager; `close` ends the line/bar."""

    def __init__(
        self, total: int | None, desc: str, *, unit: str = "it", stream: TextIO | None = None, every_s: float = 10.0
    ) -> None:
        self.stream = stream or sys.stderr
        self.total, self.desc, self.unit, self.every_s = total, desc, unit, every_s
        self.done, self.note = 0, ""
        self.started = self._last = time.monotonic()
        self._bar = (
            tqdm(total=total, desc=desc, unit=unit, file=self.stream, dynamic_ncols=True, leave=True)
            if on_terminal(self.stream)
            else None
        )

    def update(self, n: int = 1, note: str | None = None) -> None:
        self.done += n
        if note is not None:
            self.note = note
        if self._bar is not None:
            if note is not None:
                self._bar.set_postfix_str(note, refresh=False)
            self._bar.update(n)
        elif (self.total is None or self.done < self.total) and time.monotonic() - self._last >= self.every_s:
            self._line()  # the last step's line is close()'s

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        else:
            self._line(final=True)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _line(self, final: bool = False) -> None:
        """`[desc] 120/400 it (30%), 12 s, ~28 s left; note` — or `done in 40 s` at the end."""
        self._last = now = time.monotonic()
        elapsed = now - self.started
        count = f"{self.done}/{self.total}" if self.total else f"{self.done}"
        parts = [f"[{self.desc}] {count} {self.unit}"]
        if self.total:
            parts.append(f"({100 * self.done / self.total:.0f}%)")
        if final:
            parts.append(f"done in {elapsed:.0f} s")
        else:
            left = f", ~{elapsed / self.done * (self.total - self.done):.0f} s left" if self.total and self.done else ""
            parts.append(f"{elapsed:.0f} s{left}")
        line = " ".join(parts) + (f"; {self.note}" if self.note else "")
        print(line, file=self.stream, flush=True)


def progress(
    items: Iterable[T],
    desc: str,
    *,
    total: int | None = None,
    unit: str = "it",
    stream: TextIO | None = None,
    every_s: float = 10.0,
) -> Iterator[T]:
    """Iterate `items`, one step each (total: len(items) when it has one)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with Progress(total, desc, unit=unit, stream=stream, every_s=every_s) as bar:
        for item in items:
            yield item
            bar.update()


def say(tag: str, stream: TextIO | None = None) -> Callable[[str], None]:
    """A `[tag] message` printer for stderr that keeps any bar on screen intact."""

    def emit(message: str) -> None:
        out = stream or sys.stderr
        tqdm.write(f"[{tag}] {message}", file=out)
        out.flush()

    return emit
