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
import os
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Optional

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
    "DeadLetter",
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
_HOST = ("max_rows", "max_bytes", "max_interval", "compact", "spill_dir", "spill_bytes", "resume_from", "progress")

KEY_METADATA = b"ubik.key"
KIND_METADATA = b"ubik.kind"


class DeadLetter(NamedTuple):
    """A record set aside instead of processed, as ``on_dead_letter=``
    receives it (the CLI sends the same to its dead-letter topic).

    ``reason`` is machine-readable (``decode``, ``late``,
    ``null_event_time``, ``future_event_time``, ``deletion``), ``message``
    says what was wrong, ``source`` (the source URL) and ``partition`` say
    where the record came from, ``position`` is its offset (Kafka), line (file) or event
    number (webhook) as ``position_name`` says, and ``record`` holds the
    original bytes (``None`` for rows that arrived as Arrow)."""

    reason: str
    message: str
    source: str
    partition: int
    position: Optional[int]
    position_name: Optional[str]
    record: Optional[bytes]


def _dead_letter_callback(on_dead_letter: Optional[Callable[[DeadLetter], Any]]) -> Optional[Callable[..., Any]]:
    if on_dead_letter is None:
        return None
    if not callable(on_dead_letter):
        raise TypeError(f"on_dead_letter must be callable, got {type(on_dead_letter).__name__}")
    return lambda *fields: on_dead_letter(DeadLetter(*fields))


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
    ``"merchant VARCHAR, ts TIMESTAMP, amount DOUBLE"``, or an Avro source's
    URL (``"kafka://host:port/topic?format=avro&registry=http://…"``: the
    columns of the topic's value subject, read from the registry alone; with
    ``format=debezium-avro``, the table of Debezium's change events, keyed
    by the key subject's columns, as a changelog). The changelog key
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


def _session(sql: str, from_: Any, schema: Any, table: Optional[str], checkpoint: Optional[str], kwargs: dict,
             one_shot: bool = False) -> _Session:
    kwargs = dict(kwargs)
    on_dead_letter = _dead_letter_callback(kwargs.pop("on_dead_letter", None))
    opts, host, kafka = _split(kwargs)
    return _Session(sql, _arrow_input(from_), schema, table, checkpoint, opts, host, kafka, one_shot, on_dead_letter)


def stream(sql: str, from_: Any, schema: Any = None, table: Optional[str] = None, **options: Any) -> Stream:
    """The one-shot form: runs ``sql`` over what ``from_`` holds when the
    call starts, closes every window at the end, and stops.

    ``from_`` is a source URL or in-process Arrow (Table, RecordBatch,
    RecordBatchReader, iterable of batches). A ``kafka://host:port/topic``
    URL without ``end=`` is read from ``start`` (default ``earliest``) to
    the end offsets taken when the call starts: records produced later are
    not waited for. A ``webhook://`` URL without ``end=`` reads the events
    its buffer holds and serves no endpoint. An explicit ``end=`` (``latest``
    or an RFC 3339 time) is kept. ``file://`` and Arrow inputs end where
    they end. For an unbounded run use :func:`pipeline`.

    A query that joins several sources takes a dict by table name,
    ``from_={"orders": url_or_table, "merchants": table}``, and ``schema``
    as a dict by the same names (a ``PRIMARY KEY`` in a column list marks a
    versioned table). Without ``schema`` it is inferred from a sample of the
    records (every JSON number as DOUBLE; see docs/python.md).

    Records set aside (undecodable, too late; see :class:`DeadLetter`) go
    to ``on_dead_letter(letter)``, called in the calling thread while the
    stream is read (without it they are printed to stderr as JSON lines).

    When stderr is a terminal, a progress bar shows the records read of the
    total (a file's bytes, a Kafka topic's end offsets), the rate and the
    time left; ``progress=False`` turns it off."""
    return Stream(_session(sql, from_, schema, table, None, options, one_shot=True))


def pipeline(sql: str, from_: Any, checkpoint: str, schema: Any = None, table: Optional[str] = None,
             **options: Any) -> Pipeline:
    """A checkpointed, unbounded pipeline (a context manager): a Kafka topic
    without ``end=`` is followed as it grows, a webhook endpoint is served
    until the pipeline closes. Re-opening the same
    ``checkpoint`` directory after a crash hands out again, byte-identical,
    what came after the last checkpoint. ``max_rows``, ``max_bytes``,
    ``max_interval`` coalesce output into right-sized batches, ``compact``
    keeps the last row per key in each, ``spill_dir`` spills large ones to
    Arrow IPC on disk past ``spill_bytes`` (256 MiB) and hands such a batch
    out in the pieces it was spilled in (together they are the batch),
    ``resume_from`` resumes from a :attr:`Pipeline.position` token,
    ``on_dead_letter`` receives the records set aside (see :func:`stream`;
    after a crash, those after the last checkpoint are delivered again, with
    the same position)."""
    # "~/.ubik/orders", as users write it, is their home, not a directory named "~".
    return Pipeline(_session(sql, from_, schema, table, os.path.expanduser(str(checkpoint)), options))
