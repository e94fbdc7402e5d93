"""Plain-text tables, shared by the CLI, the benches and the synthesis reports."""

__all__ = ["format_table"]


def format_table(header, rows):
    """A plain-text table, columns padded to their widest cell."""
    cells = [list(map(str, header))] + [list(map(str, r)) for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
