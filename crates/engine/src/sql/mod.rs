//! SQL front end: DataFusion's parser and planner with ubik's window functions.

mod changelog;
pub mod context;
mod diagnose;
pub mod functions;
pub mod join;
pub mod over;
pub mod planner;
pub mod rank;
mod reads;
pub mod regroup;
pub mod versioned;

pub use context::Catalog;
pub use planner::plan_query;

use std::ops::ControlFlow;

/// The table names a query reads, in order of appearance (without parsing
/// errors: a query that does not parse references nothing).
pub fn referenced_tables(sql: &str) -> Vec<String> {
    use datafusion_sql::sqlparser::ast::Visit;
    let (sql, _) = versioned::strip_versions(sql);
    let Ok(statements) = datafusion_sql::sqlparser::parser::Parser::parse_sql(
        &datafusion_sql::sqlparser::dialect::GenericDialect {},
        &sql,
    ) else {
        return Vec::new();
    };
    let mut names: Vec<String> = Vec::new();
    let _ = statements.visit(&mut RelationVisitor(|name: String| {
        if !names.contains(&name) {
            names.push(name);
        }
    }));
    names
}

struct RelationVisitor<F: FnMut(String)>(F);

impl<F: FnMut(String)> datafusion_sql::sqlparser::ast::Visitor for RelationVisitor<F> {
    type Break = ();
    fn pre_visit_relation(
        &mut self,
        relation: &datafusion_sql::sqlparser::ast::ObjectName,
    ) -> ControlFlow<()> {
        if let Some(last) = relation.0.last() {
            let name = match last.as_ident() {
                Some(id) if id.quote_style.is_some() => id.value.clone(),
                Some(id) => id.value.to_lowercase(),
                None => last.to_string(),
            };
            (self.0)(name);
        }
        ControlFlow::Continue(())
    }
}
