//! SQL text to [`QueryPlan`]: DataFusion parses, resolves names and types;
//! this module checks that the plan is a streaming query ubik can run, finds
//! the window and the changelog key, and lowers every expression to a
//! physical expression over the source table (or over the aggregate stage).

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, FieldRef, Schema};
use datafusion_common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion_common::{Column, DFSchema, DFSchemaRef, ScalarValue};
use datafusion_expr::execution_props::ExecutionProps;
use datafusion_expr::logical_plan::{Distinct, LogicalPlan};
use datafusion_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion_expr::{Expr, expr::ScalarFunction};
use datafusion_optimizer::analyzer::Analyzer;
use datafusion_optimizer::optimizer::{Optimizer, OptimizerContext};
use datafusion_optimizer::replace_distinct_aggregate::ReplaceDistinctWithAggregate;
use datafusion_optimizer::simplify_expressions::SimplifyExpressions;
use datafusion_physical_expr::aggregate::LoweredAggregateBuilder;
use datafusion_physical_expr::create_physical_expr;
use datafusion_sql::parser::{DFParser, Statement as DFStatement};
use datafusion_sql::planner::{ParserOptions, SqlToRel};
use datafusion_sql::sqlparser::dialect::GenericDialect;

use super::context::{Catalog, PlanningContext};
use super::diagnose::{locate, sql_error};
use super::functions::{WINDOW_END, WindowFunction};
use super::join;
use crate::error::{EngineError, Result};
use crate::plan::*;
use crate::time::{interval_micros, window_type};

/// Name of the hidden column carrying each window's end in the aggregate stage.
pub const WINDOW_END_COLUMN: &str = "__ubik_window_end";

/// Plans `sql` against the tables of `catalog`.
pub fn plan_query(sql: &str, catalog: &Catalog, options: QueryOptions) -> Result<QueryPlan> {
    plan(sql, catalog, options).map_err(|e| match e {
        EngineError::DataFusion(d) => sql_error(*d, sql),
        other => locate(other, sql),
    })
}

fn plan(sql: &str, catalog: &Catalog, options: QueryOptions) -> Result<QueryPlan> {
    let ctx = PlanningContext::new(catalog);
    let (text, versioned) = super::versioned::strip_versions(sql);
    let logical = logical_plan(&text, &ctx)?;
    let mut lowering = Lowering::new(sql, options);
    lowering.versioned = versioned;
    let mut plan = lowering.lower(&logical)?;
    check_join_retention(&plan)?;
    check_state_ttl(&plan)?;
    super::reads::mark_reads(&logical, &mut plan);
    Ok(plan)
}

/// Refuses a state TTL where it does not apply: it bounds the state of a
/// continuous GROUP BY over event time; windows drop their state after
/// `retention` already.
fn check_state_ttl(plan: &QueryPlan) -> Result<()> {
    if plan.options.state_ttl_us <= 0 {
        return Ok(());
    }
    let continuous = matches!(
        &plan.kind,
        QueryKind::Aggregate(a) if a.window.is_none() && plan.join.is_none()
    );
    if !continuous {
        return Err(EngineError::unsupported(
            "state_ttl applies to a continuous GROUP BY (without windows or joins)",
            "a windowed query drops each window's state once retention has passed its end; remove state_ttl",
        ));
    }
    if let QueryKind::Aggregate(a) = &plan.kind
        && matches!(a.event_time, EventTime::Ordinal)
    {
        return Err(EngineError::unsupported(
            "state_ttl needs an event time: a group expires by how far its newest event time is behind the watermark",
            "name the event-time column with --event-time",
        ));
    }
    Ok(())
}

/// Refuses a join retention where late joined rows could not be taken in:
/// a join over a join (an inner join's late rows would be late for the
/// outer one by more than it can tell), a join of a windowed aggregation
/// (its windows join once, complete), or an aggregation over a join that
/// would dead-letter a late pair the join took (its own retention is shorter).
fn check_join_retention(plan: &QueryPlan) -> Result<()> {
    let retention = plan.options.join_retention_us;
    let Some(join) = plan.join.as_ref().filter(|_| retention > 0) else {
        return Ok(());
    };
    let refused = join.sides.iter().find_map(|s| match s.input {
        SideInput::Join { .. } => Some(
            "a join of three or more tables yet: late rows of an inner join cannot be paired by the outer one",
        ),
        SideInput::Windows { .. } => Some(
            "a join of a windowed aggregation: its windows join once, when they close, and take no late rows",
        ),
        SideInput::Rows { .. } => None,
    });
    if let Some(why) = refused {
        return Err(EngineError::unsupported(
            format!("join_retention is not supported for {why}"),
            "set join_retention to 0 (late join rows go to the dead-letter output) and raise --lateness to wait longer for out-of-order rows",
        ));
    }
    if matches!(plan.kind, QueryKind::Aggregate(_)) && retention > plan.options.retention_us {
        return Err(EngineError::unsupported(
            format!(
                "join_retention ({}s) is longer than retention ({}s): the aggregation over the join would dead-letter late pairs the join takes",
                retention as f64 / 1e6,
                plan.options.retention_us as f64 / 1e6
            ),
            "set retention at least as long as join_retention",
        ));
    }
    Ok(())
}

fn logical_plan(sql: &str, ctx: &PlanningContext<'_>) -> Result<LogicalPlan> {
    let mut statements =
        DFParser::parse_sql_with_dialect(sql, &GenericDialect {}).map_err(|e| sql_error(e, sql))?;
    if statements.len() != 1 {
        return Err(EngineError::sql(
            format!(
                "expected exactly one SELECT statement, found {}",
                statements.len()
            ),
            Some("a pipeline runs one query; remove the extra ';'-separated statements".into()),
        ));
    }
    let statement = statements.pop_front().expect("one statement");
    if !matches!(&statement, DFStatement::Statement(s) if matches!(**s, datafusion_sql::sqlparser::ast::Statement::Query(_)))
    {
        return Err(EngineError::sql(
            "only SELECT queries can run as a pipeline",
            Some("write the query as SELECT ... FROM <source> ...".into()),
        ));
    }
    let planner = SqlToRel::new_with_options(
        ctx,
        ParserOptions {
            collect_spans: true,
            map_string_types_to_utf8view: false,
            ..ParserOptions::default()
        },
    );
    let plan = planner
        .statement_to_plan(statement)
        .map_err(|e| sql_error(e, sql))?;
    let plan = Analyzer::new()
        .execute_and_check(plan, ctx.options(), |_, _| {})
        .map_err(|e| sql_error(e, sql))?;
    refuse_distinct_on(&plan)?;
    // Simplification rewrites what DataFusion only evaluates simplified
    // (COALESCE, NVL and IFNULL become CASE) and folds constants.
    let optimizer = Optimizer::with_rules(vec![
        Arc::new(ReplaceDistinctWithAggregate::new()),
        Arc::new(SimplifyExpressions::new()),
    ]);
    optimizer
        .optimize(plan, &OptimizerContext::new(), |_, _| {})
        .map_err(|e| sql_error(e, sql))
}

/// `SELECT DISTINCT ON` keeps the first row per key in an order a stream
/// cannot know up front.
fn refuse_distinct_on(plan: &LogicalPlan) -> Result<()> {
    let mut found = false;
    plan.apply(|node| {
        found |= matches!(node, LogicalPlan::Distinct(Distinct::On(_)));
        Ok(if found {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    })?;
    if found {
        return Err(EngineError::unsupported(
            "SELECT DISTINCT ON is not supported on streams",
            "GROUP BY the DISTINCT ON columns and pick the other columns with an aggregate (min, max, ...)",
        ));
    }
    Ok(())
}

#[derive(Clone)]
pub(super) struct Lowering {
    sql: String,
    /// Lowering the inner aggregation of a nested one (no changelog key).
    pub(super) unkeyed: bool,
    pub(super) options: QueryOptions,
    props: ExecutionProps,
    /// Tables read `FOR SYSTEM_TIME AS OF` (the versioned side of a join).
    pub(super) versioned: Vec<super::versioned::VersionedTable>,
}

/// The nodes between an upper node and the node a chain stops at, top first.
pub(super) struct Chain<'a> {
    nodes: Vec<&'a LogicalPlan>,
    pub(super) bottom: &'a LogicalPlan,
}

impl<'a> Chain<'a> {
    /// No nodes: expressions over `bottom`'s schema stay as they are.
    pub(super) fn over(bottom: &'a LogicalPlan) -> Self {
        Self {
            nodes: Vec::new(),
            bottom,
        }
    }

    /// Walks down single-input Projection/Filter/SubqueryAlias nodes (and
    /// stops at an Aggregate or a Window if `stop_at_aggregate`: the stage).
    pub(super) fn walk(top: &'a LogicalPlan, stop_at_aggregate: bool) -> Result<Self> {
        let mut nodes = Vec::new();
        let mut node = top;
        loop {
            match node {
                LogicalPlan::Projection(p) => {
                    nodes.push(node);
                    node = &p.input;
                }
                LogicalPlan::Filter(f) => {
                    nodes.push(node);
                    node = &f.input;
                }
                LogicalPlan::SubqueryAlias(s) => {
                    nodes.push(node);
                    node = &s.input;
                }
                LogicalPlan::Aggregate(_) | LogicalPlan::Window(_) if stop_at_aggregate => break,
                LogicalPlan::TableScan(_) | LogicalPlan::Join(_) => break,
                LogicalPlan::Aggregate(_) => {
                    return Err(EngineError::unsupported(
                        "a query with more than two levels of aggregation cannot run as a stream yet",
                        "aggregate at most twice per query (an aggregation of a continuous aggregation); chain a pipeline on another one's output topic",
                    ));
                }
                other => return Err(unsupported_node(other)),
            }
        }
        Ok(Self {
            nodes,
            bottom: node,
        })
    }

    /// The aliases the chain gives its bottom (`FROM t AS x` or `(...) x`).
    pub(super) fn aliases(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter_map(|n| match n {
                LogicalPlan::SubqueryAlias(s) => Some(s.alias.table().to_string()),
                _ => None,
            })
            .collect()
    }

    /// Rewrites an expression over the top node's schema into one over the bottom's.
    pub(super) fn unproject(&self, expr: Expr) -> Result<Expr> {
        let mut expr = expr;
        for node in &self.nodes {
            expr = match node {
                LogicalPlan::Projection(p) => {
                    let schema = &p.schema;
                    expr.transform_up(|e| match e {
                        Expr::Column(c) => {
                            let i = schema.index_of_column(&c)?;
                            Ok(Transformed::yes(p.expr[i].clone().unalias_nested().data))
                        }
                        other => Ok(Transformed::no(other)),
                    })?
                    .data
                }
                LogicalPlan::SubqueryAlias(s) => {
                    let input_schema = s.input.schema();
                    let schema = &s.schema;
                    expr.transform_up(|e| match e {
                        Expr::Column(c) => {
                            let i = schema.index_of_column(&c)?;
                            Ok(Transformed::yes(Expr::Column(Column::from(
                                input_schema.qualified_field(i),
                            ))))
                        }
                        other => Ok(Transformed::no(other)),
                    })?
                    .data
                }
                _ => expr,
            };
        }
        Ok(expr)
    }

    /// The Filter predicates of the chain, each rewritten over the bottom schema.
    pub(super) fn filters(&self) -> Result<Vec<Expr>> {
        let mut out = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            if let LogicalPlan::Filter(f) = node {
                let below = Chain {
                    nodes: self.nodes[i + 1..].to_vec(),
                    bottom: self.bottom,
                };
                out.push(below.unproject(f.predicate.clone())?);
            }
        }
        Ok(out)
    }

    /// The top node's output columns, each as an expression over the bottom schema.
    pub(super) fn outputs(&self, top_schema: &DFSchema) -> Result<Vec<Expr>> {
        top_schema
            .columns()
            .into_iter()
            .map(|c| self.unproject(Expr::Column(c)))
            .collect()
    }
}

pub(super) fn unsupported_node(plan: &LogicalPlan) -> EngineError {
    match plan {
        LogicalPlan::Sort(_) => EngineError::unsupported(
            "ORDER BY cannot apply to an unbounded stream: results are emitted as windows close",
            "remove ORDER BY; records of one emission are already ordered by key, sort downstream if needed",
        ),
        LogicalPlan::Limit(_) => EngineError::unsupported(
            "LIMIT/OFFSET cannot apply to an unbounded stream",
            "remove LIMIT; bound the input instead (e.g. kafka://...?end=latest)",
        ),
        LogicalPlan::Join(_) => EngineError::unsupported(
            "a join cannot read this input: each side is a source table, a TUMBLE/HOP aggregation of one, or another join",
            "rewrite the side as one of those",
        ),
        LogicalPlan::Window(_) => EngineError::unsupported(
            "SQL window functions (OVER ...) run only as a top-N directly over a table or a join (SELECT ... FROM (SELECT ..., ROW_NUMBER() OVER (PARTITION BY ... ORDER BY ...) AS rn FROM t) WHERE rn <= N), and as count/sum/avg/min/max over ROWS frames of a top-N's result; ubik's time windows are TUMBLE, HOP and SESSION in GROUP BY",
            "for aggregates over time, GROUP BY TUMBLE(ts, INTERVAL '1 MINUTE') instead",
        ),
        LogicalPlan::Union(_) => EngineError::unsupported("UNION is not supported yet", ""),
        LogicalPlan::EmptyRelation(_) | LogicalPlan::Values(_) => EngineError::unsupported(
            "the query reads no source table",
            "add FROM <source>, where <source> is the topic, webhook path or file stem",
        ),
        other => EngineError::unsupported(
            format!(
                "this query shape ({}) cannot run as a stream",
                other.display()
            ),
            "",
        ),
    }
}

/// Finds a call of a window function anywhere in `expr`.
fn find_window_call(expr: &Expr) -> Option<WindowFunction> {
    let mut found = None;
    let _ = expr.apply(|e| {
        if let Expr::ScalarFunction(f) = e
            && let Some(w) = WindowFunction::from_name(f.func.name())
        {
            found = Some(w);
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

fn refuse_window_outside_group_by(expr: &Expr, place: &str) -> Result<()> {
    if let Some(w) = find_window_call(expr) {
        return Err(EngineError::unsupported(
            format!(
                "{} is used in {place}, but a window function defines the grouping and belongs in GROUP BY",
                w.name().to_uppercase()
            ),
            format!(
                "GROUP BY ..., {}(ts, ...) and project it in SELECT",
                w.name().to_uppercase()
            ),
        ));
    }
    Ok(())
}

fn interval_arg(expr: &Expr, what: &str) -> Result<i64> {
    let mut e = expr;
    while let Expr::Cast(c) = e {
        e = &c.expr;
    }
    match e {
        Expr::Literal(ScalarValue::IntervalMonthDayNano(Some(v)), _) => interval_micros(v, what),
        Expr::Literal(ScalarValue::IntervalDayTime(Some(v)), _) => {
            Ok(v.days as i64 * 86_400_000_000 + v.milliseconds as i64 * 1000).and_then(|m| {
                if m > 0 {
                    Ok(m)
                } else {
                    Err(EngineError::unsupported(
                        format!("{what} must be positive"),
                        "",
                    ))
                }
            })
        }
        _ => Err(EngineError::unsupported(
            format!("{what} must be a constant INTERVAL literal, found {expr}"),
            "e.g. INTERVAL '1 MINUTE'",
        )),
    }
}

impl Lowering {
    fn new(sql: &str, options: QueryOptions) -> Self {
        Self {
            sql: sql.to_string(),
            unkeyed: false,
            options,
            props: ExecutionProps::new(),
            versioned: Vec::new(),
        }
    }

    /// A keyed result's key is its own: the `key` setting (for append-only
    /// results) may only name exactly those columns. `what` says what the key is.
    pub(super) fn check_key_setting(
        &self,
        key_columns: &[usize],
        output_schema: &Schema,
        what: &str,
    ) -> Result<()> {
        if self.options.key.is_empty() {
            return Ok(());
        }
        let names: Vec<&str> = key_columns
            .iter()
            .map(|&i| output_schema.field(i).name().as_str())
            .collect();
        if self.options.key == names {
            return Ok(());
        }
        Err(EngineError::unsupported(
            format!(
                "{what} ({}); the key setting is for append-only results",
                names.join(", ")
            ),
            "drop --key (or give exactly those columns)",
        ))
    }

    pub(super) fn sql(&self) -> &str {
        &self.sql
    }

    pub(super) fn physical(&self, expr: &Expr, schema: &DFSchema) -> Result<PhysicalExprRef> {
        Ok(create_physical_expr(
            expr,
            schema,
            &self.props,
            &PhysicalPlanningContext::default(),
        )?)
    }

    pub(super) fn conjunction(
        &self,
        filters: Vec<Expr>,
        schema: &DFSchema,
    ) -> Result<Option<PhysicalExprRef>> {
        match filters.into_iter().reduce(|a, b| a.and(b)) {
            Some(e) => Ok(Some(self.physical(&e, schema)?)),
            None => Ok(None),
        }
    }

    fn lower(self, root: &LogicalPlan) -> Result<QueryPlan> {
        let plan = self.lower_kind(root)?;
        super::changelog::check(&plan)?;
        Ok(plan)
    }

    fn lower_kind(self, root: &LogicalPlan) -> Result<QueryPlan> {
        refuse_duplicate_names(root.schema())?;
        let output_schema = Arc::new(root.schema().as_arrow().clone());
        let top = Chain::walk(root, true)?;
        match top.bottom {
            LogicalPlan::Aggregate(agg) => match Chain::walk(&agg.input, true)?.bottom {
                LogicalPlan::Aggregate(_) => self.lower_regroup(root, &top, agg, output_schema),
                _ => self.lower_aggregate(root, &top, agg, output_schema),
            },
            LogicalPlan::Window(w) if super::over::is_aggregate_window(w) => {
                self.lower_over(root, &top, w, output_schema)
            }
            LogicalPlan::Window(w) => self.lower_rank(root, &top, w, output_schema),
            bottom => self.lower_passthrough(root, &top, bottom, output_schema),
        }
    }

    /// What a stage reads: one source table, or a join of two.
    pub(super) fn stage_input(&self, bottom: &LogicalPlan) -> Result<StageInput> {
        match bottom {
            LogicalPlan::TableScan(scan) => Ok(StageInput {
                schema: Arc::clone(&scan.projected_schema),
                sources: vec![self.source_of(scan)],
                join: None,
            }),
            LogicalPlan::Join(join) => self.lower_join(join),
            other => Err(unsupported_node(other)),
        }
    }

    pub(super) fn source_of(&self, scan: &datafusion_expr::logical_plan::TableScan) -> SourceTable {
        SourceTable {
            name: scan.table_name.table().to_string(),
            schema: Arc::new(scan.projected_schema.as_arrow().clone()),
            reads: vec![true; scan.projected_schema.fields().len()],
        }
    }

    /// The event-time column of a continuous or pass-through query.
    pub(super) fn default_event_time(&self, input: &StageInput) -> Result<EventTime> {
        if let Some(j) = &input.join {
            return Ok(EventTime::Column(join::time_column(input, j)?));
        }
        let scan_schema = &input.schema;
        let arrow = scan_schema.as_arrow();
        let column = match &self.options.event_time {
            Some(name) => {
                let (i, field) = arrow.column_with_name(name).ok_or_else(|| {
                    EngineError::Schema(format!(
                        "event-time column '{name}' is not in the source schema"
                    ))
                })?;
                if !matches!(field.data_type(), DataType::Timestamp(_, _)) {
                    return Err(EngineError::Schema(format!(
                        "event-time column '{name}' must be a TIMESTAMP, found {}",
                        field.data_type()
                    )));
                }
                Some(i)
            }
            None => arrow
                .metadata()
                .get(join::EVENT_TIME_METADATA)
                .and_then(|name| arrow.index_of(name).ok())
                .or_else(|| only_timestamp(arrow.fields())),
        };
        match column {
            Some(i) => {
                let col = Expr::Column(Column::from(scan_schema.qualified_field(i)));
                Ok(EventTime::Column(self.physical(&col, scan_schema)?))
            }
            None => Ok(EventTime::Ordinal),
        }
    }

    fn lower_passthrough(
        &self,
        root: &LogicalPlan,
        chain: &Chain<'_>,
        bottom: &LogicalPlan,
        output_schema: Arc<Schema>,
    ) -> Result<QueryPlan> {
        let input = self.stage_input(bottom)?;
        let scan_schema = &input.schema;
        let outputs = chain.outputs(root.schema())?;
        let filters = chain.filters()?;
        for e in &outputs {
            refuse_window_outside_group_by(e, "SELECT without GROUP BY")?;
        }
        for e in &filters {
            refuse_window_outside_group_by(e, "WHERE")?;
        }
        let projection = outputs
            .iter()
            .map(|e| self.physical(e, scan_schema))
            .collect::<Result<Vec<_>>>()?;
        let filter = self.conjunction(filters, scan_schema)?;
        let event_time = self.default_event_time(&input)?;
        // A changelog passed through is keyed by its primary key (a key
        // setting of its own is refused by the changelog check).
        let changelog = super::changelog::source(&input).is_some() && self.options.key.is_empty();
        let key_columns = match changelog {
            true => super::changelog::passthrough_key(&input, &outputs)?,
            false => self.key_setting_columns(&output_schema)?,
        };
        Ok(QueryPlan {
            sql: self.sql.clone(),
            sources: input.sources,
            join: input.join,
            input_schema: Arc::new(scan_schema.as_arrow().clone()),
            output_schema,
            key_columns,
            kind: QueryKind::Passthrough(PassthroughPlan {
                filter,
                projection,
                event_time,
                changelog,
            }),
            options: self.options.clone(),
        })
    }

    /// The result columns the key setting names.
    fn key_setting_columns(&self, output_schema: &Schema) -> Result<Vec<usize>> {
        self.options
            .key
            .iter()
            .map(|name| {
                output_schema.index_of(name).map_err(|_| {
                    EngineError::Schema(format!(
                        "key column `{name}` is not in the result ({})",
                        output_schema
                            .fields()
                            .iter()
                            .map(|f| f.name().as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()
    }

    fn lower_aggregate(
        &self,
        root: &LogicalPlan,
        top: &Chain<'_>,
        agg: &datafusion_expr::logical_plan::Aggregate,
        output_schema: Arc<Schema>,
    ) -> Result<QueryPlan> {
        let lowered = self.lower_aggregation(root, top, agg)?;
        let key_columns = lowered.key_columns;
        self.check_key_setting(
            &key_columns,
            &output_schema,
            "an aggregation's changelog key is its GROUP BY columns",
        )?;
        Ok(QueryPlan {
            sql: self.sql.clone(),
            sources: lowered.input.sources,
            join: lowered.input.join,
            input_schema: Arc::new(lowered.input.schema.as_arrow().clone()),
            output_schema,
            key_columns,
            kind: QueryKind::Aggregate(lowered.plan),
            options: self.options.clone(),
        })
    }

    /// An aggregation node with the chain `top` above it up to `root`:
    /// its plan over what it reads, and its key columns among `root`'s.
    pub(super) fn lower_aggregation(
        &self,
        root: &LogicalPlan,
        top: &Chain<'_>,
        agg: &datafusion_expr::logical_plan::Aggregate,
    ) -> Result<LoweredAggregation> {
        let input = Chain::walk(&agg.input, false)?;
        let stage_input = self.stage_input(input.bottom)?;
        self.lower_aggregation_over(root, top, agg, &input, stage_input)
    }

    /// [`Self::lower_aggregation`] over a given input: `input` leads from
    /// the aggregation down to the node whose schema `stage_input` has.
    pub(super) fn lower_aggregation_over(
        &self,
        root: &LogicalPlan,
        top: &Chain<'_>,
        agg: &datafusion_expr::logical_plan::Aggregate,
        input: &Chain<'_>,
        mut stage_input: StageInput,
    ) -> Result<LoweredAggregation> {
        let scan_schema = &Arc::clone(&stage_input.schema);
        let groups = self.lower_group_by(agg, input, &mut stage_input)?;
        let mut aggregates = self.lower_aggregates(agg, input, scan_schema)?;
        let changelog = match super::changelog::source(&stage_input) {
            Some(source) => Some(super::changelog::retracting(
                source,
                groups.window,
                &mut aggregates,
                self.rows_count(scan_schema)?,
            )?),
            None => None,
        };
        let stage = stage_schema(agg)?;
        let (outputs, having) = post_aggregation(root, top, agg, groups.window_position)?;
        // A nested aggregation's inner groups are the operator's own: its
        // result needs no key of its own.
        let key_columns = match self.unkeyed {
            true => Vec::new(),
            false => key_columns(&outputs, &stage, agg, &groups)?,
        };
        // Where the window column stands in the result.
        let window_output = groups.window_position.and_then(|w| {
            outputs.iter().position(
                |e| matches!(e, Expr::Column(c) if stage.index_of_column(c).ok() == Some(w)),
            )
        });
        let projection = outputs
            .iter()
            .map(|e| self.physical(e, &stage))
            .collect::<Result<Vec<_>>>()?;
        let having = self.conjunction(having, &stage)?;
        let filter = self.conjunction(input.filters()?, scan_schema)?;
        Ok(LoweredAggregation {
            plan: AggregatePlan {
                filter,
                event_time: groups.event_time,
                window: groups.window,
                group_exprs: groups.exprs,
                group_fields: groups.fields,
                aggregates,
                stage_schema: Arc::new(stage.as_arrow().clone()),
                window_position: groups.window_position,
                having,
                projection,
                changelog,
            },
            key_columns,
            window_output,
            input: stage_input,
        })
    }

    /// GROUP BY: finds the (single) window, lowers the other keys over the source schema.
    fn lower_group_by(
        &self,
        agg: &datafusion_expr::logical_plan::Aggregate,
        input: &Chain<'_>,
        stage_input: &mut StageInput,
    ) -> Result<GroupBy> {
        let scan_schema = &Arc::clone(&stage_input.schema);
        if agg
            .group_expr
            .iter()
            .any(|g| matches!(g, Expr::GroupingSet(_)))
        {
            return Err(EngineError::unsupported(
                "GROUPING SETS, ROLLUP and CUBE are not supported on streams",
                "run one query per grouping",
            ));
        }
        let mut window = None;
        let mut window_position = None;
        let mut event_time = None;
        let mut exprs = Vec::new();
        let mut fields = Vec::new();
        for (i, g) in agg.group_expr.iter().enumerate() {
            let g = input.unproject(g.clone().unalias_nested().data)?;
            let call = match &g {
                Expr::ScalarFunction(ScalarFunction { func, args }) => {
                    WindowFunction::from_name(func.name()).map(|w| (w, args))
                }
                _ => None,
            };
            match call {
                Some((kind, args)) => {
                    if window.is_some() {
                        return Err(EngineError::unsupported(
                            "a query can group by one window function only",
                            "keep one of TUMBLE/HOP/SESSION in GROUP BY",
                        ));
                    }
                    refuse_window_outside_group_by(&args[0], "a window's time argument")?;
                    window = Some(window_spec(kind, args)?);
                    window_position = Some(i);
                    if let Some(j) = stage_input.join.as_mut() {
                        join::window_time(&stage_input.schema, j, &args[0])?;
                    }
                    event_time = Some(EventTime::Column(self.physical(&args[0], scan_schema)?));
                }
                None => {
                    refuse_window_outside_group_by(&g, "an expression of GROUP BY")?;
                    let (_, field) = agg.schema.qualified_field(i);
                    fields.push(Arc::clone(field));
                    exprs.push(self.physical(&g, scan_schema)?);
                }
            }
        }
        let event_time = match event_time {
            Some(e) => e,
            None => self.default_event_time(stage_input)?,
        };
        Ok(GroupBy {
            window,
            window_position,
            event_time,
            exprs,
            fields,
        })
    }

    /// The aggregate calls, lowered by DataFusion over the source schema.
    fn lower_aggregates(
        &self,
        agg: &datafusion_expr::logical_plan::Aggregate,
        input: &Chain<'_>,
        scan_schema: &DFSchemaRef,
    ) -> Result<Vec<AggregateSpec>> {
        let n_groups = agg.group_expr.len();
        let mut aggregates = Vec::new();
        for (j, a) in agg.aggr_expr.iter().enumerate() {
            let unaliased = a.clone().unalias_nested().data;
            refuse_window_outside_group_by(&unaliased, "an aggregate's argument")?;
            let expr = input.unproject(unaliased)?;
            let (_, field) = agg.schema.qualified_field(n_groups + j);
            let lowered = LoweredAggregateBuilder::new(
                &expr,
                scan_schema,
                scan_schema.as_arrow(),
                &self.props,
                &PhysicalPlanningContext::default(),
            )
            .with_name(field.name())
            .build()?;
            let arg_types = lowered
                .aggregate
                .expressions()
                .iter()
                .map(|e| e.data_type(scan_schema.as_arrow()))
                .collect::<datafusion_common::Result<Vec<_>>>()?;
            let all = lowered.aggregate.all_expressions();
            let input_types = all
                .args
                .iter()
                .chain(&all.order_by_exprs)
                .map(|e| e.data_type(scan_schema.as_arrow()))
                .collect::<datafusion_common::Result<Vec<_>>>()?;
            aggregates.push(AggregateSpec {
                arg_types,
                input_types,
                function: lowered.aggregate,
                filter: lowered.filter,
                field: Arc::clone(field),
                retracting: false,
            });
        }
        Ok(aggregates)
    }

    /// A hidden `count(*)`: how many rows a group holds, so that a group
    /// whose rows were all taken back out is retracted.
    pub(super) fn rows_count(&self, scan_schema: &DFSchemaRef) -> Result<AggregateSpec> {
        let expr = datafusion_functions_aggregate::count::count(Expr::Literal(
            ScalarValue::Int64(Some(1)),
            None,
        ));
        let lowered = LoweredAggregateBuilder::new(
            &expr,
            scan_schema,
            scan_schema.as_arrow(),
            &self.props,
            &PhysicalPlanningContext::default(),
        )
        .with_name("__ubik_rows")
        .build()?;
        Ok(AggregateSpec {
            arg_types: vec![DataType::Int64],
            input_types: vec![DataType::Int64],
            function: lowered.aggregate,
            filter: None,
            field: Arc::new(Field::new("__ubik_rows", DataType::Int64, false)),
            retracting: true,
        })
    }
}

/// An aggregation, lowered.
pub(super) struct LoweredAggregation {
    pub(super) plan: AggregatePlan,
    /// Indices of the key columns in the result.
    pub(super) key_columns: Vec<usize>,
    /// Index of the window column in the result, if windowed.
    pub(super) window_output: Option<usize>,
    pub(super) input: StageInput,
}

/// What a stage (pass-through or aggregation) reads.
pub(super) struct StageInput {
    /// The schema stage expressions are lowered over.
    pub(super) schema: DFSchemaRef,
    pub(super) sources: Vec<SourceTable>,
    pub(super) join: Option<JoinPlan>,
}

/// The lowered GROUP BY of an aggregation.
struct GroupBy {
    window: Option<WindowSpec>,
    /// Where the window stands among the GROUP BY expressions.
    window_position: Option<usize>,
    event_time: EventTime,
    /// The other GROUP BY expressions, over the source schema, and their fields.
    exprs: Vec<PhysicalExprRef>,
    fields: Vec<FieldRef>,
}

/// A window function call of GROUP BY as a window spec.
fn window_spec(kind: WindowFunction, args: &[Expr]) -> Result<WindowSpec> {
    Ok(match kind {
        WindowFunction::Tumble => WindowSpec::Tumble {
            size: interval_arg(&args[1], "the TUMBLE size")?,
        },
        WindowFunction::Hop => {
            let slide = interval_arg(&args[1], "the HOP slide")?;
            let size = interval_arg(&args[2], "the HOP size")?;
            if size % slide != 0 {
                return Err(EngineError::unsupported(
                    "the HOP size must be a multiple of its slide",
                    "e.g. HOP(ts, INTERVAL '1 MINUTE', INTERVAL '5 MINUTES')",
                ));
            }
            WindowSpec::Hop { slide, size }
        }
        WindowFunction::Session => WindowSpec::Session {
            gap: interval_arg(&args[1], "the SESSION gap")?,
        },
    })
}

/// The aggregate stage's schema: GROUP BY columns, aggregates, hidden window end.
fn stage_schema(agg: &datafusion_expr::logical_plan::Aggregate) -> Result<DFSchema> {
    let mut stage_fields: Vec<(Option<datafusion_common::TableReference>, FieldRef)> = agg
        .schema
        .iter()
        .map(|(q, f)| (q.cloned(), Arc::clone(f)))
        .collect();
    stage_fields.push((
        None,
        Arc::new(Field::new(WINDOW_END_COLUMN, window_type(), true)),
    ));
    Ok(DFSchema::new_with_metadata(stage_fields, HashMap::new())?)
}

/// Post-aggregation: the SELECT list and HAVING over the stage schema, with
/// `WINDOW_END(...)` resolved to the hidden window end column.
fn post_aggregation(
    root: &LogicalPlan,
    top: &Chain<'_>,
    agg: &datafusion_expr::logical_plan::Aggregate,
    window_position: Option<usize>,
) -> Result<(Vec<Expr>, Vec<Expr>)> {
    let window_column = window_position.map(|i| Column::from(agg.schema.qualified_field(i)));
    let rewrite_end = |e: Expr| -> Result<Expr> {
        Ok(e.transform_up(|e| match e {
            Expr::ScalarFunction(f) if f.func.name() == WINDOW_END => {
                match (&window_column, f.args.first()) {
                    (Some(w), Some(Expr::Column(c))) if c == w || c.name == w.name => {
                        Ok(Transformed::yes(Expr::Column(Column::new_unqualified(WINDOW_END_COLUMN))))
                    }
                    _ => datafusion_common::plan_err!(
                        "WINDOW_END takes the window expression of the GROUP BY, e.g. WINDOW_END(TUMBLE(ts, INTERVAL '1 MINUTE'))"
                    ),
                }
            }
            other => Ok(Transformed::no(other)),
        })?
        .data)
    };
    let outputs = top
        .outputs(root.schema())?
        .into_iter()
        .map(rewrite_end)
        .collect::<Result<Vec<_>>>()
        .map_err(|e| match e {
            EngineError::DataFusion(d) => sql_error(*d, ""),
            other => other,
        })?;
    let having = top
        .filters()?
        .into_iter()
        .map(rewrite_end)
        .collect::<Result<Vec<_>>>()?;
    Ok((outputs, having))
}

/// The changelog key: the projected GROUP BY columns, in SELECT order. Every
/// GROUP BY column (the window too) must be projected as a plain column.
fn key_columns(
    outputs: &[Expr],
    stage: &DFSchema,
    agg: &datafusion_expr::logical_plan::Aggregate,
    groups: &GroupBy,
) -> Result<Vec<usize>> {
    let n_groups = agg.group_expr.len();
    let mut key_columns = Vec::new();
    let mut covered = vec![false; n_groups];
    for (i, e) in outputs.iter().enumerate() {
        if let Expr::Column(c) = e {
            let j = stage.index_of_column(c)?;
            if j < n_groups && !covered[j] {
                covered[j] = true;
                key_columns.push(i);
            }
        }
    }
    if let (Some(w), Some(spec)) = (groups.window_position, groups.window)
        && !covered[w]
    {
        return Err(EngineError::unsupported(
            format!(
                "this windowed query does not project its window column: the changelog key is (group, window), so SELECT must include {}(...) itself",
                spec.name()
            ),
            format!(
                "add `{}(...) AS w` to the SELECT list, exactly as it appears in GROUP BY",
                spec.name()
            ),
        ));
    }
    if let Some(j) = covered.iter().position(|c| !c) {
        let name = agg.schema.field(j).name();
        return Err(EngineError::unsupported(
            format!(
                "GROUP BY column `{name}` is not projected as a plain column: the changelog key is the tuple of GROUP BY columns, and without it two groups would share a key"
            ),
            format!("add `{name}` to the SELECT list"),
        ));
    }
    Ok(key_columns)
}

/// The index of the only TIMESTAMP column of `fields`, if there is exactly one.
/// A result row is a JSON object keyed by column name: two columns of one
/// name (`b.date_time` and `a.date_time` of a join) would lose one.
fn refuse_duplicate_names(schema: &DFSchema) -> Result<()> {
    for (i, (q, f)) in schema.iter().enumerate() {
        let Some((q2, _)) = schema
            .iter()
            .skip(i + 1)
            .find(|(_, g)| g.name() == f.name())
        else {
            continue;
        };
        let qualified = |q: Option<&datafusion_common::TableReference>| match q {
            Some(q) => format!("{q}.{}", f.name()),
            None => f.name().to_string(),
        };
        return Err(EngineError::unsupported(
            format!(
                "two result columns are named {} ({} and {}): a result row is a JSON object, which would keep only one",
                f.name(),
                qualified(q),
                qualified(q2)
            ),
            format!(
                "name them apart in the SELECT list, e.g. {} AS {}_2",
                qualified(q2),
                f.name()
            ),
        ));
    }
    Ok(())
}

pub(super) fn only_timestamp(fields: &arrow::datatypes::Fields) -> Option<usize> {
    let mut ts = fields
        .iter()
        .enumerate()
        .filter(|(_, f)| matches!(f.data_type(), DataType::Timestamp(_, _)))
        .map(|(i, _)| i);
    match (ts.next(), ts.next()) {
        (Some(i), None) => Some(i),
        _ => None,
    }
}
