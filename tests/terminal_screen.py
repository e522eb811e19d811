"""A small terminal screen for tests: what a VT100-style terminal of a given width shows.

Handles what our programs write (printable text, CR, LF, ``CSI n F`` cursor-up-to-line-start,
``CSI 2K`` erase line, ``CSI ... m`` colours, ignored) with a terminal's autowrap: a character
written past the last column goes to the start of the next row. Scrolled-off rows are kept, so
the whole session can be checked.
"""

from __future__ import annotations

import re

_CSI = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])")


class Screen:
    def __init__(self, width: int) -> None:
        self.width = width
        self.rows: list[list[str]] = [[]]
        self.row = 0
        self.col = 0

    def feed(self, text: str) -> None:
        i = 0
        while i < len(text):
            ch = text[i]
            if ch == "\x1b":
                match = _CSI.match(text, i)
                if match is None:
                    i += 1
                    continue
                self._csi(match.group(1), match.group(2))
                i = match.end()
                continue
            if ch == "\r":
                self.col = 0
            elif ch == "\n":
                self._down()
            elif ch >= " ":
                if self.col >= self.width:  # autowrap
                    self._down()
                    self.col = 0
                line = self.rows[self.row]
                line.extend(" " * (self.col + 1 - len(line)))
                line[self.col] = ch
                self.col += 1
            i += 1

    def _down(self) -> None:
        self.row += 1
        while len(self.rows) <= self.row:
            self.rows.append([])

    def _csi(self, params: str, command: str) -> None:
        n = int(params) if params.isdigit() else 1
        if command == "F":
            self.row = max(0, self.row - n)
            self.col = 0
        elif command == "K" and params == "2":
            self.rows[self.row] = []

    def lines(self) -> list[str]:
        return ["".join(r).rstrip() for r in self.rows]
