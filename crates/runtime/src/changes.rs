//! Change batches as Arrow IPC (output handed to the host but not yet
//! covered by a checkpoint is saved with it, so a resume can hand it again).

use std::io::Cursor;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use ubik_engine::ChangeBatch;

use crate::error::{Result, RuntimeError};

const DELETE: &str = "__ubik_delete";
const TIMESTAMP: &str = "__ubik_timestamp";

fn wire_schema(output: &SchemaRef) -> SchemaRef {
    let mut fields: Vec<Arc<Field>> = output.fields().iter().cloned().collect();
    fields.push(Arc::new(Field::new(DELETE, DataType::Boolean, true)));
    fields.push(Arc::new(Field::new(TIMESTAMP, DataType::Int64, true)));
    Arc::new(Schema::new(fields))
}

pub fn encode_changes(output: &SchemaRef, changes: &[ChangeBatch]) -> Result<Vec<u8>> {
    let schema = wire_schema(output);
    let mut buf = Vec::new();
    {
        let mut w = StreamWriter::try_new(&mut buf, &schema)?;
        for c in changes {
            let mut cols: Vec<ArrayRef> = c.rows.columns().to_vec();
            let deletes: ArrayRef = match &c.deletes {
                Some(d) => Arc::new(d.clone()),
                None => Arc::new(BooleanArray::new_null(c.num_rows())),
            };
            cols.push(deletes);
            cols.push(Arc::new(c.timestamps.clone()));
            w.write(&RecordBatch::try_new(Arc::clone(&schema), cols)?)?;
        }
        w.finish()?;
    }
    Ok(buf)
}

pub fn decode_changes(output: &SchemaRef, bytes: &[u8]) -> Result<Vec<ChangeBatch>> {
    let reader = StreamReader::try_new(Cursor::new(bytes), None)?;
    let n = output.fields().len();
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch?;
        if batch.num_columns() != n + 2 {
            return Err(RuntimeError::Checkpoint(
                "saved output does not match the query's schema".into(),
            ));
        }
        let rows = RecordBatch::try_new(Arc::clone(output), batch.columns()[..n].to_vec())?;
        let d = batch.column(n).as_boolean();
        let deletes = (d.null_count() < d.len()).then(|| d.clone());
        let timestamps: Int64Array = batch.column(n + 1).as_primitive::<Int64Type>().clone();
        out.push(ChangeBatch {
            rows,
            deletes,
            timestamps,
        });
    }
    Ok(out)
}
