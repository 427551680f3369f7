"""ubik: streaming SQL over Kafka, webhooks and Arrow — the Arrow leg.

    import ubik
    schema = ubik.validate(Q, schema="merchant VARCHAR, ts TIMESTAMP, amount DOUBLE")
    table = ubik.stream(Q, from_=arrow_table).arrow()
    with ubik.pipeline(Q, from_="kafka://localhost:9092/orders", checkpoint="state/orders") as p:
        for batch in p:          # each closed window, as a pyarrow.RecordBatch
            commit(batch)        # your lake writer (MERGE on the key columns)
            p.checkpoint()       # commit first, checkpoint second

Results are upserts keyed by (group columns, window): a key may appear
again with a newer value (a late row updated its window). Queries that can
retract a key (HAVING, SESSION) carry a boolean ``_deleted`` column.
"""

from __future__ import annotations

import itertools
import json
from typing import Any, Iterable, Iterator, Optional

import pyarrow as pa

from ._ubik import (
    SETTINGS as _SETTINGS,
    CheckpointError,
    DecodeError,
    SchemaError,
    Session as _Session,
    SourceError,
    SqlError,
    UbikError,
    UnsupportedQueryError,
    __version__,
)
from ._ubik import validate as _validate

__all__ = [
    "validate",
    "stream",
    "pipeline",
    "key_columns",
    "Stream",
    "Pipeline",
    "UbikError",
    "SqlError",
    "UnsupportedQueryError",
    "SchemaError",
    "SourceError",
    "DecodeError",
    "CheckpointError",
    "__version__",
]

_OPTIONS = frozenset(_SETTINGS)  # the runtime's settings, one list for every surface
_HOST = ("max_rows", "max_bytes", "max_interval", "compact", "spill_dir", "spill_bytes", "resume_from")

KEY_METADATA = b"ubik.key"
KIND_METADATA = b"ubik.kind"


def _split(kwargs: dict) -> tuple[dict, dict, Optional[dict]]:
    options, host = {}, {}
    kafka = kwargs.pop("kafka", None)
    for k, v in kwargs.items():
        if k in _OPTIONS:
            options[k] = v
        elif k in _HOST:
            host[k] = v
        else:
            raise TypeError(f"unexpected keyword argument {k!r}")
    return options, host, kafka


def _arrow_input(from_: Any) -> Any:
    """A URL string, or something exporting an Arrow C stream (or a dict
    of them by table name, for a query that joins several sources)."""
    if isinstance(from_, dict):
        return {str(name): _arrow_input(value) for name, value in from_.items()}
    if isinstance(from_, str):
        return from_
    if isinstance(from_, pa.RecordBatch):
        return pa.Table.from_batches([from_])
    if hasattr(from_, "__arrow_c_stream__") or isinstance(from_, pa.RecordBatchReader):
        return from_
    if isinstance(from_, Iterable):
        it = iter(from_)
        try:
            first = next(it)
        except StopIteration:
            raise SourceError("from_ is an empty iterable: pass a Table or a RecordBatchReader to give the schema") from None
        if not isinstance(first, pa.RecordBatch):
            raise TypeError(f"from_ iterables must yield pyarrow.RecordBatch, got {type(first).__name__}")
        return pa.RecordBatchReader.from_batches(first.schema, itertools.chain([first], it))
    raise TypeError(f"from_ must be a source URL or Arrow data, got {type(from_).__name__}")


def validate(sql: str, schema: Any, table: Optional[str] = None, **options: Any) -> pa.Schema:
    """Plans ``sql`` and returns the exact schema of its result batches
    without reading any row.

    ``schema`` is a ``pyarrow.Schema`` (the one source table), a dict of
    table name to schema, or a column list such as
    ``"merchant VARCHAR, ts TIMESTAMP, amount DOUBLE"``. The changelog key
    columns are in the schema metadata (``b"ubik.key"``, a JSON list; see
    :func:`key_columns`). Raises :class:`SqlError` (with ``line``,
    ``column``, ``hint``), :class:`UnsupportedQueryError` or
    :class:`SchemaError`.
    """
    opts, _, _ = _split(dict(options))
    result, key, kind = _validate(sql, schema, table, opts)
    meta = dict(result.metadata or {})
    meta[KEY_METADATA] = json.dumps(key).encode()
    meta[KIND_METADATA] = kind.encode()
    return result.with_metadata(meta)


def key_columns(schema: pa.Schema) -> list[str]:
    """The changelog key columns recorded by :func:`validate`."""
    raw = (schema.metadata or {}).get(KEY_METADATA)
    return json.loads(raw) if raw else []


class Stream:
    """A query over a source; iterate for the changelog batches, or call
    :meth:`arrow` for the final result of a bounded input."""

    def __init__(self, session: _Session):
        self._s = session

    @property
    def schema(self) -> pa.Schema:
        return self._s.schema

    @property
    def key(self) -> list[str]:
        return self._s.key

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return self

    def __next__(self) -> pa.RecordBatch:
        while True:
            batch = self._s.next(0.2)
            if batch is not None:
                return batch
            if self._s.finished:
                raise StopIteration

    def arrow(self) -> pa.Table:
        """Runs the (bounded) input to its end and returns the latest row
        per key, retracted keys removed, ordered by key."""
        batches = self._s.final_batches()
        schema = batches[0].schema if batches else None
        return pa.Table.from_batches(batches, schema=schema)

    def to_reader(self) -> pa.RecordBatchReader:
        """The changelog batches as a ``pyarrow.RecordBatchReader``."""
        return pa.RecordBatchReader.from_batches(self.schema, self)

    def close(self) -> None:
        self._s.close()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Pipeline(Stream):
    """A checkpointed pipeline; iterating yields each closed window (or each
    flush of a continuous query) as a ``pyarrow.RecordBatch``.

    Commit each batch to your table first, then call :meth:`checkpoint`: a
    crash in between replays the uncommitted batches, byte-identical."""

    def checkpoint(self) -> None:
        """Persists source positions and state as of the last batch handed out."""
        self._s.checkpoint()

    @property
    def position(self) -> str:
        """A token naming the checkpoint the next :meth:`checkpoint` writes;
        store it in your table's commit (e.g. deltalake
        ``CommitProperties(app_transactions=...)``) and pass it back as
        ``resume_from=`` to resume from that point."""
        return self._s.token

    @property
    def stats(self) -> dict:
        return self._s.stats


def _session(sql: str, from_: Any, schema: Any, table: Optional[str], checkpoint: Optional[str], kwargs: dict) -> _Session:
    opts, host, kafka = _split(dict(kwargs))
    return _Session(sql, _arrow_input(from_), schema, table, checkpoint, opts, host, kafka)


def stream(sql: str, from_: Any, schema: Any = None, table: Optional[str] = None, **options: Any) -> Stream:
    """Runs ``sql`` over ``from_``: a source URL (``kafka://host:port/topic``
    with ``?end=latest`` for a bounded range, ``webhook://``, ``file://``,
    ``demo://orders``) or in-process Arrow (Table, RecordBatch,
    RecordBatchReader, iterable of batches). A query that joins several
    sources takes a dict by table name, ``from_={"orders": url_or_table,
    "merchants": table}``, and ``schema`` as a dict by the same names (a
    ``PRIMARY KEY`` in a column list marks a versioned table)."""
    return Stream(_session(sql, from_, schema, table, None, options))


def pipeline(sql: str, from_: Any, checkpoint: str, schema: Any = None, table: Optional[str] = None,
             **options: Any) -> Pipeline:
    """A checkpointed pipeline (a context manager). Re-opening the same
    ``checkpoint`` directory after a crash hands out again, byte-identical,
    what came after the last checkpoint. ``max_rows``, ``max_bytes``,
    ``max_interval`` coalesce output into right-sized batches, ``compact``
    keeps the last row per key in each, ``spill_dir`` spills large ones to
    Arrow IPC on disk, ``resume_from`` resumes from a :attr:`Pipeline.position` token."""
    return Pipeline(_session(sql, from_, schema, table, str(checkpoint), options))
