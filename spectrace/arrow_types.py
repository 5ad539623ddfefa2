"""The Arrow type of each DuckDB type name in ``spectrace.records``: the one map the pipeline writes its batches
with and the store reads its segments against (``spectrace.store.schema``). A leaf below both (it imports only
pyarrow), so the pipeline does not import the store it feeds."""

from __future__ import annotations

import pyarrow as pa

ARROW = {
    "VARCHAR": pa.string(),
    "JSON": pa.string(),
    "BIGINT": pa.int64(),
    "INTEGER": pa.int32(),
    "DOUBLE": pa.float64(),
    "BOOLEAN": pa.bool_(),
    "TIMESTAMP_NS": pa.timestamp("ns"),
}
