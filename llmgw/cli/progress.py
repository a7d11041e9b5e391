"""One changing status line: rewritten in place on a terminal, a new line (only when it
changes) in a log or a pipe — never a run of ``\\r`` fragments on one line."""

from __future__ import annotations


class StatusLine:
    """``show(text)`` as often as you like; ``end()`` before writing anything else.
    ``stdout`` is a Django ``OutputWrapper`` (a command's ``self.stdout``)."""

    def __init__(self, stdout) -> None:
        self.stdout = stdout
        stream = getattr(stdout, "_out", stdout)  # Django's OutputWrapper keeps the stream here
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.last = None

    def show(self, text: str) -> None:
        if text == self.last:
            return
        self.last = text
        if self.tty:
            self.stdout.write(f"\r\033[K{text}", ending="")
        else:
            self.stdout.write(text + "\n", ending="")
        self.stdout.flush()

    def end(self) -> None:
        """Close the line on a terminal, so what follows starts on a line of its own."""
        if self.tty and self.last is not None:
            self.stdout.write("\n", ending="")
            self.stdout.flush()
