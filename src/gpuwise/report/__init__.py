"""Rendering: terminal tables, charts, HTML. Only this package and cli/commands print or draw."""
