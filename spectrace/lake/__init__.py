"""The fleet lake: one DuckLake (PostgreSQL catalog + shared Parquet data) for every replica.

- ``connect``: the catalog string, DuckDB's extensions, ATTACH, the tables.
- ``sink``: the pipeline's sink that inserts each flush's tables in one transaction.
- ``read``: views over the lake for ``spectrace query --lake`` / ``report --lake``, and ``maintain``.
"""

from spectrace.lake.connect import (  # noqa: F401  (the lake's connection API, as before the package)
    ALIAS,
    EXTENSIONS,
    LakeError,
    catalog_uri,
    connect,
    ensure_tables,
    existing_columns,
    existing_tables,
    extension_file,
    first_line,
    load_extensions,
    table_ddl,
)
