"""What the stream readers yield: the parts and documents of an input, and the error for bytes not UTF-8."""

from __future__ import annotations

from dataclasses import dataclass

from webhook.manifests.positions import Locator


class UnreadableInput(ValueError):
    pass


class DuplicateKey(ValueError):
    """A key written twice in one mapping or object, which kubectl's strict decoding refuses."""

    def __init__(self, key: str):
        super().__init__(f"duplicate key {key!r}")
        self.key = key

    def text(self, at: tuple[int, int], first: tuple[int, int]) -> str:
        """The problem as a line, given (line, column) of the key and of its first writing."""
        return (f"duplicate key {_quoted(self.key)} (line {at[0]}, column {at[1]}; first at line {first[0]}, "
                f"column {first[1]}): kubectl refuses it; keep one")


def _quoted(key: str) -> str:
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


class NotUtf8(UnreadableInput):
    """Bytes that are not UTF-8: the first such byte and its offset in the input."""

    def __init__(self, byte: int, offset: int):
        super().__init__(f"not UTF-8: byte 0x{byte:02x} at offset {offset}: save it as UTF-8")
        self.byte, self.offset = byte, offset


@dataclass(frozen=True)
class Document:
    """One document of a file: its value, or why it could not be loaded."""

    number: int  # 1-based, counting every document of the file
    value: object = None
    problem: str = ""
    line: int = 1  # the file's line where the document starts, 1-based
    locator: Locator | None = None  # where its fields are


@dataclass
class Part:
    """What a reader found, in the order of the input: a whole document (``document``), an item of a List read
    item by item (``item``, or ``broken-item`` with why it cannot be read), the rest of that List once its items
    are done (``list``), a document that cannot be read (``problem``), or one skipped (``skipped``)."""

    kind: str
    number: int  # the document's
    value: object = None
    locator: Locator | None = None
    index: int = 0  # an item's number in its List, from 1
    more: bool = False  # another document follows (for documents and Lists)

