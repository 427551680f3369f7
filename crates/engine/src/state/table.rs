//! [`StoreTable`]: one named table of the query's state store, as a state
//! that spills sees it: registered on first use (a temporary store is made
//! on first use), or up front when the store is durable (a restore must
//! know its tables before any use).

use std::sync::Arc;

use arrow::array::{ArrayRef, BinaryArray, RecordBatch};
use arrow::datatypes::SchemaRef;
use ubik_state::{KeyEncoder, TableId};

use super::store::SharedStore;
use crate::error::Result;

pub(crate) struct StoreTable {
    pub store: SharedStore,
    name: String,
    id: Option<TableId>,
    /// The table's rows.
    pub schema: SchemaRef,
}

impl StoreTable {
    /// Table `name` of `store`, rows `schema`.
    pub fn new(store: SharedStore, name: &str, schema: SchemaRef) -> Result<Self> {
        let mut t = Self {
            store,
            name: name.to_string(),
            id: None,
            schema,
        };
        if t.store.is_durable() {
            t.id()?;
        }
        Ok(t)
    }

    pub fn id(&mut self) -> Result<TableId> {
        if let Some(t) = self.id {
            return Ok(t);
        }
        let (name, schema) = (&self.name, &self.schema);
        let t = self
            .store
            .with(|s| Ok(s.table(name, Arc::clone(schema))?))?;
        self.id = Some(t);
        Ok(t)
    }

    /// Whether the store holds rows of this table (none before it is registered).
    pub fn has_rows(&self) -> bool {
        self.id
            .and_then(|t| self.store.if_open(|s| s.has_rows(t)))
            .unwrap_or(false)
    }

    /// Writes `values` row `i` under `keys[i]`, or deletes the key where
    /// `deleted` says; returns the bytes written.
    pub fn write(
        &mut self,
        keys: &BinaryArray,
        values: &RecordBatch,
        deleted: Option<&[bool]>,
    ) -> Result<u64> {
        let table = self.id()?;
        self.store
            .with(|s| Ok(s.write(table, keys, values, deleted)?))
    }

    /// Writes `values` row `i` under the key `encoder` makes of row `i` of
    /// `key_columns`, or deletes it where `deleted` says; returns the bytes
    /// written. The keys are encoded and sorted off this thread.
    pub fn write_columns(
        &mut self,
        key_columns: &[ArrayRef],
        encoder: &Arc<dyn KeyEncoder>,
        values: &RecordBatch,
        deleted: Option<Vec<bool>>,
    ) -> Result<u64> {
        let table = self.id()?;
        self.store
            .with(|s| Ok(s.write_columns(table, key_columns, encoder, values, deleted)?))
    }

    /// Every stored row, batch by batch.
    pub fn scan(&mut self, mut each: impl FnMut(RecordBatch) -> Result<()>) -> Result<()> {
        let table = self.id()?;
        self.store.with(|s| {
            let mut scan = s.scan(table)?;
            while let Some((_, rows)) = scan.next_batch()? {
                each(rows)?;
            }
            Ok(())
        })
    }

    /// Drops the table and its rows from the store.
    pub fn drop(&mut self) -> Result<()> {
        if let Some(t) = self.id.take() {
            self.store.with(|s| Ok(s.drop_table(t)?))?;
        }
        Ok(())
    }
}
