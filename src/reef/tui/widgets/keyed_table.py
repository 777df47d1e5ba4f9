"""A DataTable whose rows are kept by key: a refresh updates cells in place, adds and removes
rows, and leaves the cursor on the row the reviewer had selected."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.coordinate import Coordinate
from textual.widgets import DataTable
from textual.widgets.data_table import RowDoesNotExist

Cell = str | Text


class KeyedTable(DataTable[Cell]):
    """The first column holds each row's key (an id), so rows can be ordered by it."""

    def __init__(self, columns: Sequence[str], **kwargs: object) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)  # type: ignore[arg-type]
        self._column_names = list(columns)

    def on_mount(self) -> None:
        for name in self._column_names:
            self.add_column(name, key=name)

    @property
    def selected_key(self) -> str | None:
        if not self.row_count:
            return None
        row_key, _ = self.coordinate_to_cell_key(self.cursor_coordinate)
        return None if row_key.value is None else str(row_key.value)

    def sync(self, rows: Sequence[tuple[str, Sequence[Cell]]]) -> None:
        """Make the table hold `rows`, in this order, touching only what changed."""
        selected = self.selected_key
        wanted = dict(rows)
        for key in [str(k.value) for k in self.rows if str(k.value) not in wanted]:
            self.remove_row(key)
        for key, cells in rows:
            self._upsert(key, cells)
        order = {key: index for index, (key, _) in enumerate(rows)}
        if self.ordered_keys() != list(order):
            self.sort(self._column_names[0], key=lambda cell: order[str(cell)])
        self.select_key(selected)

    def ordered_keys(self) -> list[str]:
        """The row keys in the order they are shown."""
        cells = (self.coordinate_to_cell_key(Coordinate(row, 0)) for row in range(self.row_count))
        return [str(cell.row_key.value) for cell in cells]

    def _upsert(self, key: str, cells: Sequence[Cell]) -> None:
        try:
            current = self.get_row(key)
        except RowDoesNotExist:
            self.add_row(*cells, key=key)
            return
        for name, old, new in zip(self._column_names, current, cells, strict=True):
            if old != new:
                self.update_cell(key, name, new)

    def select_key(self, key: str | None) -> None:
        """Put the cursor back on `key` (where it moved to), if it is still there."""
        if key is None:
            return
        try:
            index = self.get_row_index(key)
        except RowDoesNotExist:
            return
        if index != self.cursor_row:
            self.move_cursor(row=index, animate=False, scroll=False)
