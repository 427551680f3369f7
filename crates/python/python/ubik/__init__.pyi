from datetime import timedelta
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Optional, Union

import pyarrow as pa

__version__: str

Duration = Union[str, float, timedelta]
SchemaLike = Union[pa.Schema, str, Mapping[str, Union[pa.Schema, str]]]
OneSource = Union[str, pa.Table, pa.RecordBatch, pa.RecordBatchReader, Iterable[pa.RecordBatch], Any]
# One source, or several by SQL table name (a join).
Source = Union[OneSource, Mapping[str, OneSource]]

KEY_METADATA: bytes
KIND_METADATA: bytes

class UbikError(Exception): ...

class SqlError(UbikError):
    line: Optional[int]
    column: Optional[int]
    hint: Optional[str]

class UnsupportedQueryError(SqlError): ...
class SchemaError(UbikError): ...
class SourceError(UbikError): ...
class DecodeError(UbikError): ...
class CheckpointError(UbikError): ...

class DeadLetter(NamedTuple):
    reason: str
    message: str
    source: str
    partition: int
    position: Optional[int]
    position_name: Optional[str]
    record: Optional[bytes]

def validate(
    sql: str,
    schema: SchemaLike,
    table: Optional[str] = None,
    *,
    lateness: Optional[Duration] = None,
    retention: Optional[Duration] = None,
    join_retention: Optional[Duration] = None,
    emit_interval: Optional[Duration] = None,
    max_future: Optional[Duration] = None,
    event_time: Optional[str] = None,
    key: Optional[str] = None,
    state_ttl: Optional[Duration] = None,
    ttl_tombstones: Optional[bool] = None,
) -> pa.Schema: ...
def key_columns(schema: pa.Schema) -> list[str]: ...

class Stream:
    @property
    def schema(self) -> pa.Schema: ...
    @property
    def key(self) -> list[str]: ...
    def __iter__(self) -> Iterator[pa.RecordBatch]: ...
    def __next__(self) -> pa.RecordBatch: ...
    def arrow(self) -> pa.Table: ...
    def to_reader(self) -> pa.RecordBatchReader: ...
    def close(self) -> None: ...
    def __enter__(self) -> Stream: ...
    def __exit__(self, *exc: Any) -> None: ...

class Pipeline(Stream):
    def checkpoint(self) -> None: ...
    @property
    def position(self) -> str: ...
    @property
    def stats(self) -> dict[str, int]: ...
    def __enter__(self) -> Pipeline: ...

def stream(
    sql: str,
    from_: Source,
    schema: Optional[SchemaLike] = None,
    table: Optional[str] = None,
    *,
    lateness: Optional[Duration] = None,
    retention: Optional[Duration] = None,
    join_retention: Optional[Duration] = None,
    emit_interval: Optional[Duration] = None,
    max_future: Optional[Duration] = None,
    event_time: Optional[str] = None,
    key: Optional[str] = None,
    state_ttl: Optional[Duration] = None,
    ttl_tombstones: Optional[bool] = None,
    on_error: Optional[str] = None,
    batch_size: Optional[int] = None,
    threads: Optional[int] = None,
    idle_timeout: Optional[Duration] = None,
    state_memory: Optional[Union[int, str]] = None,
    state_dir: Optional[str] = None,
    max_rows: Optional[int] = None,
    max_bytes: Optional[int] = None,
    max_interval: Optional[Duration] = None,
    compact: bool = False,
    spill_dir: Optional[str] = None,
    spill_bytes: Optional[int] = None,
    kafka: Optional[Mapping[str, str]] = None,
    on_dead_letter: Optional[Callable[[DeadLetter], object]] = None,
    progress: Optional[bool] = None,
) -> Stream:
    """One-shot: reads what the source holds when the call starts (a Kafka
    topic without ``end=`` up to its end offsets at the call, a webhook
    buffer as it stands), closes every window and stops. On a terminal a
    progress bar shows the records read of the total, the rate and the time
    left (``progress=False``: none)."""
def pipeline(
    sql: str,
    from_: Source,
    checkpoint: str,
    schema: Optional[SchemaLike] = None,
    table: Optional[str] = None,
    *,
    lateness: Optional[Duration] = None,
    retention: Optional[Duration] = None,
    join_retention: Optional[Duration] = None,
    emit_interval: Optional[Duration] = None,
    max_future: Optional[Duration] = None,
    event_time: Optional[str] = None,
    key: Optional[str] = None,
    state_ttl: Optional[Duration] = None,
    ttl_tombstones: Optional[bool] = None,
    on_error: Optional[str] = None,
    batch_size: Optional[int] = None,
    threads: Optional[int] = None,
    idle_timeout: Optional[Duration] = None,
    state_memory: Optional[Union[int, str]] = None,
    state_dir: Optional[str] = None,
    keep_checkpoints: Optional[int] = None,
    max_rows: Optional[int] = None,
    max_bytes: Optional[int] = None,
    max_interval: Optional[Duration] = None,
    compact: bool = False,
    spill_dir: Optional[str] = None,
    spill_bytes: Optional[int] = None,
    resume_from: Optional[str] = None,
    kafka: Optional[Mapping[str, str]] = None,
    on_dead_letter: Optional[Callable[[DeadLetter], object]] = None,
) -> Pipeline:
    """Unbounded and checkpointed: a Kafka topic without ``end=`` is
    followed as it grows, a webhook endpoint is served until it closes."""
