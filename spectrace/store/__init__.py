"""Python API for the store: ``spectrace.store.open(dir)`` gives a DuckDB connection.

    >>> import spectrace.store
    >>> con = spectrace.store.open("spectrace-data")
    >>> con.sql("select * from findings").df()
"""

from spectrace.store.read import StoreError, open, view_names

__all__ = ["open", "StoreError", "view_names"]
