"""The two errors of `cts view`'s answers: ViewError (a request it cannot answer, 400) and
NotFound (no such record, 404). Apart because every part of the viewer raises them (the index's
query, the Viewer, serve's bind) and app.py maps them to statuses, without importing the rest.
"""

from __future__ import annotations


class ViewError(ValueError):
    """A request the viewer cannot answer (a bad filter value), or an address it cannot bind."""


class NotFound(LookupError):
    """No record of that run, instance, condition and seed."""
