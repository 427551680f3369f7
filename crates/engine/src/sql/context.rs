//! What the SQL planner can see: the source tables of a pipeline (name and
//! Arrow schema, no data) and the function registry (DataFusion's scalar and
//! aggregate functions plus ubik's window functions).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::datatypes::{DataType, SchemaRef};
use datafusion_common::config::ConfigOptions;
use datafusion_common::{Result, TableReference, plan_err};
use datafusion_expr::logical_plan::builder::LogicalTableSource;
use datafusion_expr::planner::{ContextProvider, ExprPlanner};
use datafusion_expr::{AggregateUDF, HigherOrderUDF, ScalarUDF, TableSource, WindowUDF};

use super::functions::{ranking_udwfs, window_udfs};

/// The tables a query may read: SQL table name to Arrow schema.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    tables: BTreeMap<String, SchemaRef>,
}

impl Catalog {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn with_table(mut self, name: impl Into<String>, schema: SchemaRef) -> Self {
        self.add_table(name, schema);
        self
    }
    pub fn add_table(&mut self, name: impl Into<String>, schema: SchemaRef) {
        self.tables.insert(name.into(), schema);
    }
    pub fn table(&self, name: &str) -> Option<&SchemaRef> {
        self.tables.get(name)
    }
    pub fn table_names(&self) -> impl Iterator<Item = &str> {
        self.tables.keys().map(String::as_str)
    }
}

pub(crate) struct PlanningContext<'a> {
    catalog: &'a Catalog,
    scalars: HashMap<String, Arc<ScalarUDF>>,
    aggregates: HashMap<String, Arc<AggregateUDF>>,
    windows: HashMap<String, Arc<WindowUDF>>,
    planners: Vec<Arc<dyn ExprPlanner>>,
    options: ConfigOptions,
}

impl<'a> PlanningContext<'a> {
    pub fn new(catalog: &'a Catalog) -> Self {
        let mut scalars = HashMap::new();
        for f in datafusion_functions::all_default_functions()
            .into_iter()
            .chain(window_udfs())
        {
            for alias in f.aliases() {
                scalars.insert(alias.clone(), Arc::clone(&f));
            }
            scalars.insert(f.name().to_string(), f);
        }
        let mut aggregates = HashMap::new();
        for f in datafusion_functions_aggregate::all_default_aggregate_functions() {
            for alias in f.aliases() {
                aggregates.insert(alias.clone(), Arc::clone(&f));
            }
            aggregates.insert(f.name().to_string(), f);
        }
        let windows = ranking_udwfs()
            .into_iter()
            .map(|f| (f.name().to_string(), f))
            .collect();
        let planners: Vec<Arc<dyn ExprPlanner>> = vec![
            Arc::new(datafusion_functions::core::planner::CoreFunctionPlanner::default()),
            Arc::new(datafusion_functions::datetime::planner::DatetimeFunctionPlanner),
            Arc::new(datafusion_functions::unicode::planner::UnicodeFunctionPlanner),
            Arc::new(datafusion_functions_aggregate::planner::AggregateFunctionPlanner),
        ];
        Self {
            catalog,
            scalars,
            aggregates,
            windows,
            planners,
            options: ConfigOptions::default(),
        }
    }

    pub fn options(&self) -> &ConfigOptions {
        &self.options
    }
}

impl ContextProvider for PlanningContext<'_> {
    fn get_table_source(&self, name: TableReference) -> Result<Arc<dyn TableSource>> {
        match self.catalog.table(name.table()) {
            Some(schema) => Ok(Arc::new(LogicalTableSource::new(Arc::clone(schema)))),
            None => {
                let known: Vec<&str> = self.catalog.table_names().collect();
                plan_err!(
                    "table '{}' is not a source of this pipeline (sources: {}); the table name is the Kafka topic, the webhook path's last segment, or the file's stem",
                    name.table(),
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                )
            }
        }
    }
    fn get_expr_planners(&self) -> &[Arc<dyn ExprPlanner>] {
        &self.planners
    }
    fn get_function_meta(&self, name: &str) -> Option<Arc<ScalarUDF>> {
        self.scalars.get(name).cloned()
    }
    fn get_higher_order_meta(&self, _name: &str) -> Option<Arc<HigherOrderUDF>> {
        None
    }
    fn get_aggregate_meta(&self, name: &str) -> Option<Arc<AggregateUDF>> {
        self.aggregates.get(name).cloned()
    }
    fn get_window_meta(&self, name: &str) -> Option<Arc<WindowUDF>> {
        self.windows.get(name).cloned()
    }
    fn get_variable_type(&self, _variable_names: &[String]) -> Option<DataType> {
        None
    }
    fn options(&self) -> &ConfigOptions {
        &self.options
    }
    fn udf_names(&self) -> Vec<String> {
        self.scalars.keys().cloned().collect()
    }
    fn higher_order_function_names(&self) -> Vec<String> {
        Vec::new()
    }
    fn udaf_names(&self) -> Vec<String> {
        self.aggregates.keys().cloned().collect()
    }
    fn udwf_names(&self) -> Vec<String> {
        self.windows.keys().cloned().collect()
    }
}
