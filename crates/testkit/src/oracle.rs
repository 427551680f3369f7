//! The oracle: DataFusion runs an equivalent query in one shot over the same
//! input, and its result is encoded exactly as ubik encodes a changelog, so
//! it compares with the latest-per-key fold of ubik's output.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use ubik_format::changelog::ChangelogEncoder;

use crate::changelog::State;

/// Runs `sql` with DataFusion over `input` (registered as the table
/// `orders`) and returns its rows as changelog key JSON -> value JSON, the
/// key made of `key_columns` of the result.
pub fn oracle(sql: &str, input: &[RecordBatch], key_columns: &[usize]) -> State {
    oracle_tables(sql, &[("orders", input)], key_columns)
}

/// [`oracle`] over several named tables (a join).
pub fn oracle_tables(sql: &str, tables: &[(&str, &[RecordBatch])], key_columns: &[usize]) -> State {
    let mut out = State::new();
    for b in run(sql, tables) {
        let mut enc = ChangelogEncoder::new(&b.schema(), key_columns.to_vec(), true);
        encode(&mut enc, b, |key, value| {
            let key = key.expect("a keyed result");
            assert!(
                out.insert(key.clone(), value).is_none(),
                "the oracle returned key {key} twice: is key_columns the query's key?"
            );
        });
    }
    out
}

/// The rows DataFusion returns for `sql`, each as the value JSON ubik
/// writes for it, sorted: an append-only result compares as a multiset.
pub fn oracle_rows(sql: &str, tables: &[(&str, &[RecordBatch])]) -> Vec<String> {
    let mut out = Vec::new();
    for b in run(sql, tables) {
        let mut enc = ChangelogEncoder::new(&b.schema(), Vec::new(), false);
        encode(&mut enc, b, |_, value| out.push(value));
    }
    out.sort();
    out
}

/// Runs `sql` with DataFusion over `tables` in one shot.
fn run(sql: &str, tables: &[(&str, &[RecordBatch])]) -> Vec<RecordBatch> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async {
        let ctx = SessionContext::new();
        for (name, input) in tables {
            let schema = input
                .first()
                .map(|b| b.schema())
                .expect("the oracle needs at least one (possibly empty) input batch");
            let table = MemTable::try_new(schema, vec![input.to_vec()]).expect("the input table");
            ctx.register_table(*name, Arc::new(table))
                .expect("register a table");
        }
        let df = ctx
            .sql(sql)
            .await
            .unwrap_or_else(|e| panic!("oracle sql failed: {e}\n{sql}"));
        df.collect()
            .await
            .unwrap_or_else(|e| panic!("oracle query failed: {e}\n{sql}"))
    })
}

/// Encodes `rows` as ubik encodes a changelog: (key, value) JSON per row.
fn encode(
    enc: &mut ChangelogEncoder,
    rows: RecordBatch,
    mut each: impl FnMut(Option<String>, String),
) {
    let change = ubik_engine::ChangeBatch {
        timestamps: arrow::array::Int64Array::new_null(rows.num_rows()),
        rows,
        deletes: None,
    };
    enc.encode(&change, |r| {
        let key = r.key.map(|k| String::from_utf8_lossy(k).into_owned());
        let value = String::from_utf8_lossy(r.value.expect("no tombstones")).into_owned();
        each(key, value);
        Ok::<_, ()>(())
    })
    .expect("encode the oracle's result")
    .expect("collect the oracle's result");
}

/// Decodes JSON lines with Arrow's own JSON reader (the one DataFusion's
/// `register_json` uses), independently of ubik's decoder.
pub fn read_jsonl(text: &[u8], schema: &SchemaRef) -> Vec<RecordBatch> {
    let reader = arrow::json::ReaderBuilder::new(Arc::clone(schema))
        .with_batch_size(65_536)
        .build(std::io::Cursor::new(text))
        .expect("a JSON reader");
    let mut batches: Vec<RecordBatch> = reader
        .collect::<Result<_, _>>()
        .expect("the oracle's input is valid JSON lines");
    if batches.is_empty() {
        batches.push(RecordBatch::new_empty(Arc::clone(schema)));
    }
    batches
}
