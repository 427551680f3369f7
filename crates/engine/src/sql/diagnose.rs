//! Turns DataFusion's and sqlparser's errors, and the planner's refusals,
//! into messages in words that point at the query: the offending line is
//! quoted with a caret under the token or expression, and a hint says what
//! to write instead where one helps. A user's own mistake never shows Rust
//! Debug text or DataFusion's "file a bug report" text.

use datafusion_common::DataFusionError;
use datafusion_sql::sqlparser::parser::ParserError;

use crate::error::{EngineError, SqlPosition};

/// Functions a misspelled name is most likely meant to be.
const COMMON_FUNCTIONS: &[&str] = &[
    "count",
    "sum",
    "avg",
    "min",
    "max",
    "stddev",
    "variance",
    "approx_distinct",
    "approx_percentile_cont",
    "first_value",
    "last_value",
    "row_number",
    "rank",
    "dense_rank",
    "tumble",
    "hop",
    "session",
    "window_end",
    "coalesce",
    "concat",
    "lower",
    "upper",
    "round",
    "abs",
];

/// Keywords a misspelled word in a clause position is most likely meant to be.
const CLAUSE_KEYWORDS: &[&str] = &[
    "SELECT",
    "FROM",
    "WHERE",
    "GROUP",
    "BY",
    "HAVING",
    "JOIN",
    "ON",
    "AS",
    "AND",
    "OR",
    "NOT",
    "LEFT",
    "INNER",
    "DISTINCT",
    "OVER",
    "PARTITION",
    "ORDER",
];

/// SQL types, for a misspelled type name.
const TYPES: &[&str] = &[
    "INT",
    "INTEGER",
    "BIGINT",
    "SMALLINT",
    "DOUBLE",
    "REAL",
    "FLOAT",
    "DECIMAL",
    "VARCHAR",
    "TEXT",
    "BOOLEAN",
    "TIMESTAMP",
    "DATE",
    "INTERVAL",
];

/// DataFusion's advice to report a bug, which a user's type error carries.
const BUG_REPORT: &str = "This issue was likely caused by a bug in DataFusion's code. Please help us to resolve this by filing a bug report in our issue tracker: https://github.com/apache/datafusion/issues";

/// What an error says, where in the query, and what to do.
struct Diagnosis {
    message: String,
    at: Option<(SqlPosition, u64)>,
    hint: Option<String>,
}

impl Diagnosis {
    fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            at: None,
            hint: None,
        }
    }
    fn at(mut self, at: Option<(SqlPosition, u64)>) -> Self {
        if self.at.is_none() {
            self.at = at;
        }
        self
    }
    fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

/// A DataFusion (or parser) error about `sql`, as an [`EngineError::Sql`].
pub fn sql_error(e: DataFusionError, sql: &str) -> EngineError {
    let span = e
        .diagnostic()
        .and_then(|d| d.span)
        .filter(|s| s.start.line > 0)
        .map(|s| {
            let start = SqlPosition {
                line: s.start.line,
                column: s.start.column,
            };
            let width = if s.end.line == s.start.line && s.end.column > s.start.column {
                s.end.column - s.start.column
            } else {
                1
            };
            (start, width)
        });
    let d = match &e {
        DataFusionError::SQL(p, _) => parser_error(p, sql),
        _ => planning_error(&clean(&e.strip_backtrace()), sql),
    }
    .at(span);
    let error = EngineError::Sql {
        message: d.message,
        position: None,
        excerpt: None,
        hint: d.hint,
    };
    match d.at {
        Some((position, width)) => error.at(sql, position, width),
        None => error,
    }
}

/// Points a refusal of an unsupported query (or a query error without a
/// place) at the construct it is about, when the query has it.
pub fn locate(e: EngineError, sql: &str) -> EngineError {
    let (message, hint) = match &e {
        EngineError::Unsupported {
            message,
            position: None,
            hint,
            ..
        }
        | EngineError::Sql {
            message,
            position: None,
            hint,
            ..
        } => (message.clone(), hint.clone().unwrap_or_default()),
        _ => return e,
    };
    // (what the message speaks of, the text to point at)
    const CONSTRUCTS: &[(&str, &str)] = &[
        ("ORDER BY", "ORDER BY"),
        ("LIMIT", "LIMIT"),
        ("DISTINCT ON", "DISTINCT ON"),
        ("UNION", "UNION"),
        ("INTERSECT", "INTERSECT"),
        ("EXCEPT", "EXCEPT"),
        ("ROW_NUMBER()", "ROW_NUMBER"),
        ("WINDOW_END", "WINDOW_END"),
        ("exactly one SELECT", ";"),
        ("GROUPING SETS", "GROUPING SETS"),
        ("ROLLUP", "ROLLUP"),
        ("CUBE", "CUBE"),
        ("HOP size", "HOP"),
        ("SESSION", "SESSION"),
        ("TUMBLE", "TUMBLE"),
        ("HOP", "HOP"),
        ("state_ttl", ""),
        ("only SELECT", ""),
        ("FOR SYSTEM_TIME", "FOR SYSTEM_TIME"),
        ("OUTER JOIN", "JOIN"),
        ("RIGHT", "RIGHT"),
        ("FULL", "FULL"),
        ("CROSS", "CROSS"),
        ("JOIN", "JOIN"),
        ("OVER", "OVER"),
    ];
    let text = format!("{message} {hint}");
    for (speaks_of, target) in CONSTRUCTS {
        if !text.contains(speaks_of) {
            continue;
        }
        if target.is_empty() {
            let first = sql.split_whitespace().next().unwrap_or("");
            return match find_word(sql, first) {
                Some(at) if !first.is_empty() => e.at(sql, at, first.chars().count() as u64),
                _ => e,
            };
        }
        // A window call the message names: the one in GROUP BY.
        let from = if message.contains("does not project its window") {
            find_word(sql, "GROUP BY").map_or(0, |p| offset_of(sql, p))
        } else {
            0
        };
        if let Some(at) = find_word_from(sql, target, from) {
            return e.at(sql, at, target.chars().count() as u64);
        }
    }
    e
}

/// sqlparser's "Expected: X, found: Y at Line: L, Column: C", in words.
fn parser_error(p: &ParserError, sql: &str) -> Diagnosis {
    let raw = match p {
        ParserError::TokenizerError(s) | ParserError::ParserError(s) => s.as_str(),
        ParserError::RecursionLimitExceeded => {
            return Diagnosis::new("the query nests too deeply to parse");
        }
    };
    let (text, at) = split_location(raw);
    if let ParserError::TokenizerError(_) = p {
        let mut d = Diagnosis::new(lowercase_first(text)).at(at.map(|p| (p, 1)));
        if text.contains("Unterminated string literal") {
            d.message = "this string literal is not closed".into();
            d = d.hint("end it with a single quote ('); write a quote inside a string as ''");
        }
        return d;
    }
    let Some((expected, found)) = text
        .strip_prefix("Expected: ")
        .and_then(|t| t.rsplit_once(", found: "))
    else {
        return Diagnosis::new(lowercase_first(text)).at(at.map(|p| (p, 1)));
    };
    let expected = match expected {
        "an SQL statement" => "a SELECT statement",
        "end of statement" => "the end of the query",
        other => other,
    };
    if found == "EOF" {
        let last = sql.trim_end().lines().count().max(1) as u64;
        let column = sql
            .trim_end()
            .lines()
            .last()
            .map_or(0, |l| l.chars().count()) as u64
            + 1;
        return Diagnosis::new(format!("the query ends where {expected} was expected"))
            .at(Some((SqlPosition { line: last, column }, 1)));
    }
    let width = found.chars().count() as u64;
    let mut d =
        Diagnosis::new(format!("expected {expected}, found `{found}`")).at(at.map(|p| (p, width)));
    if matches!(found, "-" | ".") {
        return d.hint(
            "a source name with dashes or dots (a Kafka topic) must be quoted: FROM \"my-topic\"",
        );
    }
    // A misspelled keyword: the word before the one found (read as an
    // alias), or the first word of the query.
    let before = d.at.and_then(|(p, _)| word_before(sql, p));
    if let Some((word, word_at)) = &before
        && let Some(k) = nearest(word, CLAUSE_KEYWORDS, true)
    {
        d.message = format!("unexpected `{found}` after `{word}`");
        d.at = Some((*word_at, word.chars().count() as u64));
        return d.hint(format!("did you mean {k}?"));
    }
    if before.is_none()
        && let Some(k) = nearest(found, CLAUSE_KEYWORDS, true)
    {
        return d.hint(format!("did you mean {k}?"));
    }
    match (expected, found) {
        ("the end of the query", "(") => {
            d.hint("is a comma missing between two SELECT items, or a function name misspelled?")
        }
        ("the end of the query", _) => {
            d.hint("the query goes on after what reads as its end; check for a missing comma, operator or keyword before this")
        }
        (")", _) => d.hint("a parenthesis opened before this is not closed"),
        ("an expression", _) => d.hint("an operand or argument is missing here"),
        _ => d,
    }
}

/// A planning error's text (cleaned), in words, pointed at what it is about.
fn planning_error(text: &str, sql: &str) -> Diagnosis {
    // A parser error that reached us as text (DataFusion's own parser).
    if let Some(inner) = text
        .strip_prefix("ParserError(\"")
        .and_then(|t| t.strip_suffix("\")"))
    {
        return parser_error(&ParserError::ParserError(inner.replace("\\\"", "\"")), sql);
    }
    if let Some(rest) = text.strip_prefix("No field named ") {
        let (name, rest) = rest
            .split_once(['.', ' '])
            .map_or((rest, ""), |(n, r)| (n, r));
        let name = unquote(name);
        let valid: Vec<String> = rest
            .split_once("Valid fields are ")
            .map(|(_, v)| {
                v.trim_end_matches('.')
                    .split(", ")
                    .map(|f| unquote(f.rsplit('.').next().unwrap_or(f)).to_string())
                    .collect()
            })
            .unwrap_or_default();
        let names: Vec<&str> = valid.iter().map(String::as_str).collect();
        let d = Diagnosis::new(format!("unknown column `{name}`"))
            .at(find_word(sql, name).map(|p| (p, name.chars().count() as u64)));
        return match nearest(name, &names, false) {
            Some(m) => d.hint(format!("did you mean `{m}`?")),
            None if !names.is_empty() => d.hint(format!("the columns are: {}", names.join(", "))),
            None => d,
        };
    }
    if let Some(rest) = text.strip_prefix("Invalid function ") {
        let name = unquote(rest.split(['.', '\n']).next().unwrap_or(rest));
        let d = Diagnosis::new(format!("unknown function `{name}`"))
            .at(find_call(sql, name).map(|p| (p, name.chars().count() as u64)));
        // DataFusion's own guess ranges over every function it knows
        // (`cot` for `cnt`): ubik guesses among the common ones only.
        let suggested = nearest(name, COMMON_FUNCTIONS, false);
        let common = "windows are TUMBLE, HOP and SESSION; aggregates include count, sum, avg, min, max, stddev, approx_distinct";
        return match suggested {
            Some(m) => d.hint(format!("did you mean `{m}`? ({common})")),
            None => d.hint(common),
        };
    }
    if let Some((_, inner)) = text.split_once("user-defined coercion failed with: ") {
        // ubik's own functions (TUMBLE, HOP, SESSION) explain themselves.
        let inner = inner
            .strip_prefix("Error during planning: ")
            .unwrap_or(inner);
        let inner = inner.split(". No function matches").next().unwrap_or(inner);
        let name = text
            .split_once("Function '")
            .and_then(|(_, r)| r.split_once('\''))
            .map(|(n, _)| n.to_uppercase());
        let (message, hint) = inner
            .split_once("; usage: ")
            .map_or((inner, None), |(m, u)| {
                (m, Some(format!("write {}", u.trim_end_matches('.'))))
            });
        // "..., found Float64": the type as SQL names it.
        let message = match message.rsplit_once("found ") {
            Some((head, ty)) => format!("{head}found {}", sql_type(ty.trim_end_matches('.'))),
            None => message.trim_end_matches('.').to_string(),
        };
        let mut d = Diagnosis::new(message)
            .at(name.and_then(|n| find_call(sql, &n).map(|p| (p, n.len() as u64))));
        d.hint = hint;
        return d;
    }
    if let Some((_, rest)) =
        text.split_once("No function matches the given name and argument types '")
    {
        let call = rest.split_once("'.").map_or(rest, |(c, _)| c);
        let (name, args) = call.split_once('(').unwrap_or((call, ""));
        let args: Vec<String> = split_types(args.trim_end_matches(')'))
            .into_iter()
            .map(|t| sql_type(&t))
            .collect();
        let mut takes: Vec<String> = Vec::new();
        for signature in text.lines().filter_map(|l| {
            l.trim()
                .strip_prefix(name)
                .and_then(|r| r.strip_prefix('('))
        }) {
            let types: Vec<String> = split_types(signature.trim_end_matches(')'))
                .into_iter()
                .map(|t| sql_type(&t))
                .collect();
            let types = types.join(", ");
            if !takes.contains(&types) {
                takes.push(types);
            }
        }
        let d = Diagnosis::new(format!(
            "`{name}` cannot take {}",
            if args.is_empty() {
                "no arguments".to_string()
            } else {
                args.join(", ")
            }
        ))
        .at(find_call(sql, name).map(|p| (p, name.chars().count() as u64)));
        let cast = ["DOUBLE", "VARCHAR", "BIGINT"]
            .into_iter()
            .find(|t| takes.iter().any(|k| k == t))
            .or(takes.first().map(String::as_str))
            .unwrap_or("DOUBLE");
        let takes = match takes.split_last() {
            None => String::new(),
            Some((last, [])) => format!("`{name}` takes {last}; "),
            Some((last, rest)) => format!("`{name}` takes {} or {last}; ", rest.join(", ")),
        };
        return d.hint(format!(
            "{takes}cast the argument to a type it takes, e.g. {name}(CAST(x AS {cast}))"
        ));
    }
    if let Some(rest) = text.split_once("column \"").map(|(_, r)| r)
        && text.contains("must appear in the GROUP BY clause")
    {
        let column = rest.split('"').next().unwrap_or(rest);
        let column = column.rsplit('.').next().unwrap_or(column);
        let clause = if text.starts_with("Column in HAVING") {
            "HAVING"
        } else {
            "SELECT"
        };
        let from = find_word(sql, clause).map_or(0, |p| offset_of(sql, p));
        let d = Diagnosis::new(format!(
            "column `{column}` in {clause} is neither in GROUP BY nor inside an aggregate"
        ))
        .at(find_word_from(sql, column, from).map(|p| (p, column.chars().count() as u64)));
        if let Some(call) = find_call(sql, "WINDOW_END") {
            let mut d = Diagnosis::new(format!(
                "WINDOW_END takes the window of the GROUP BY, exactly as written there; column `{column}` is not grouped"
            ));
            d.at = Some((call, "WINDOW_END".len() as u64));
            return d.hint("write WINDOW_END(<the TUMBLE/HOP/SESSION(...) of GROUP BY>), or group by this window");
        }
        // A window in SELECT but not in GROUP BY leaves its time column ungrouped.
        let group_at = sql.to_uppercase().find("GROUP BY");
        let only_selected = ["TUMBLE", "HOP", "SESSION"].into_iter().find_map(|w| {
            let call = find_call(sql, w)?;
            let in_group = group_at.is_some_and(|g| find_call(&sql[g..], w).is_some());
            (group_at.is_none_or(|g| offset_of(sql, call) < g) && !in_group).then_some((w, call))
        });
        return match only_selected {
            Some((w, call)) => {
                let mut d = d.hint(format!(
                    "a {w}(...) in SELECT must also be in GROUP BY, exactly as written"
                ));
                d.at = Some((call, w.len() as u64));
                d
            }
            None => d.hint(format!(
                "add it to GROUP BY, or wrap it in an aggregate such as max({column})"
            )),
        };
    }
    if let Some(rest) = text.strip_prefix("Cannot coerce arithmetic expression ") {
        let expr = rest.split(" to valid types").next().unwrap_or(rest);
        let parts: Vec<&str> = expr.splitn(3, ' ').collect();
        if let [l, op, r] = parts[..] {
            return Diagnosis::new(format!(
                "cannot apply `{op}` to {} and {}",
                sql_type(l),
                sql_type(r)
            ))
            .hint("cast one side to the other's type, e.g. CAST(x AS DOUBLE)");
        }
    }
    if let Some(rest) = text.strip_prefix("Cannot cast string '") {
        let (literal, rest) = rest.split_once('\'').unwrap_or((rest, ""));
        let ty = rest
            .split_once("value of ")
            .map_or("the column's type".to_string(), |(_, t)| {
                sql_type(t.trim_end_matches(" type"))
            });
        let quoted = format!("'{literal}'");
        return Diagnosis::new(format!("{quoted} is not a {ty}"))
            .at(find_text(sql, &quoted).map(|p| (p, quoted.chars().count() as u64)))
            .hint(format!(
                "compare with a {ty} value, or cast the column to the literal's type"
            ));
    }
    if let Some(rest) = text.strip_prefix("Error parsing timestamp from '") {
        let literal = rest.split('\'').next().unwrap_or(rest);
        let quoted = format!("'{literal}'");
        return Diagnosis::new(format!("{quoted} is not a valid TIMESTAMP"))
            .at(find_text(sql, &quoted).map(|p| (p, quoted.chars().count() as u64)))
            .hint("write timestamps as '2024-01-31 12:00:00' or '2024-01-31T12:00:00Z'");
    }
    if let Some(ty) = text.strip_prefix("Unsupported SQL type ") {
        let d = Diagnosis::new(format!("unknown type `{ty}`"))
            .at(find_word(sql, ty).map(|p| (p, ty.chars().count() as u64)));
        return match nearest(ty, TYPES, true) {
            Some(t) => d.hint(format!("did you mean {t}?")),
            None => d.hint(format!("types include {}", TYPES.join(", "))),
        };
    }
    if text.starts_with("Aggregate function calls cannot be nested") {
        let outer = text
            .split_once("nested inside '")
            .and_then(|(_, r)| r.split_once('('))
            .map(|(n, _)| n.to_string());
        return Diagnosis::new("an aggregate cannot take another aggregate")
            .at(outer.and_then(|n| find_call(sql, &n).map(|p| (p, n.chars().count() as u64))))
            .hint("aggregate in a subquery, then aggregate its result in the outer query");
    }
    if let Some(rest) = text.strip_prefix("Ambiguous reference to unqualified field ") {
        return Diagnosis::new(format!(
            "column `{rest}` is ambiguous: more than one source has it"
        ))
        .hint(format!(
            "qualify it with its source or alias, e.g. o.{rest}"
        ));
    }
    if text.contains("InSubquery") || text.contains("ScalarSubquery") || text.contains("Exists") {
        return Diagnosis::new("subqueries inside expressions (IN (SELECT ...), EXISTS, scalar subqueries) are not supported on streams")
            .at(find_text(sql, "(SELECT").map(|p| (SqlPosition { line: p.line, column: p.column + 1 }, 6)))
            .hint("join the sources instead (docs/joins.md)");
    }
    Diagnosis::new(lowercase_first(text))
}

/// The error text without DataFusion's category prefixes, its wrappers and
/// its bug-report advice.
fn clean(text: &str) -> String {
    let mut t = text.replace(BUG_REPORT, "").replace(". .", ".");
    loop {
        let before = t.len();
        for prefix in [
            "Error during planning: ",
            "SQL error: ",
            "Schema error: ",
            "Internal error: ",
            "Execution error: ",
            "This feature is not implemented: ",
            "Optimizer rule 'simplify_expressions' failed\ncaused by\n",
            "Arrow error: ",
            "Cast error: ",
            "Parser error: ",
        ] {
            if let Some(rest) = t.strip_prefix(prefix) {
                t = rest.to_string();
            }
        }
        if t.len() == before {
            break;
        }
    }
    t.trim().to_string()
}

/// "… at Line: 3, Column: 14" split off the text.
fn split_location(raw: &str) -> (&str, Option<SqlPosition>) {
    let Some(i) = raw.rfind(" at Line: ") else {
        return (raw, None);
    };
    let rest = &raw[i + 10..];
    let position = rest.split_once(", Column: ").and_then(|(line, column)| {
        let column: String = column.chars().take_while(char::is_ascii_digit).collect();
        Some(SqlPosition {
            line: line.trim().parse().ok()?,
            column: column.parse().ok()?,
        })
    });
    (&raw[..i], position)
}

fn unquote(s: &str) -> &str {
    s.trim_matches(|c| c == '\'' || c == '"' || c == '`')
}

fn lowercase_first(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        // An acronym (SQL, UNION) stays as it is.
        Some(f) if c.clone().next().is_some_and(char::is_lowercase) => {
            f.to_lowercase().chain(c).collect()
        }
        _ => s.to_string(),
    }
}

/// An Arrow type's name as SQL writes it.
fn sql_type(arrow: &str) -> String {
    let t = arrow.trim();
    let base = t.split('(').next().unwrap_or(t);
    match base {
        "Utf8" | "Utf8View" | "LargeUtf8" | "String" => "VARCHAR",
        "Int64" => "BIGINT",
        "Int32" => "INT",
        "Int16" => "SMALLINT",
        "Int8" => "TINYINT",
        "UInt64" => "BIGINT UNSIGNED",
        "UInt32" => "INT UNSIGNED",
        "Float64" => "DOUBLE",
        "Float32" => "REAL",
        "Boolean" => "BOOLEAN",
        "Timestamp" => "TIMESTAMP",
        "Date32" | "Date64" => "DATE",
        "Decimal" | "Decimal128" | "Decimal256" => "DECIMAL",
        "Duration" | "Interval" => "INTERVAL",
        "Null" => "NULL",
        other => return other.to_string(),
    }
    .to_string()
}

/// Types separated by commas at the top level (`Timestamp(µs, "UTC")` is one).
fn split_types(list: &str) -> Vec<String> {
    let mut out = Vec::new();
    let (mut depth, mut current) = (0, String::new());
    for c in list.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut current).trim().to_string());
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    if !current.trim().is_empty() {
        out.push(current.trim().to_string());
    }
    out
}

/// The candidate closest to `word` (edit distance at most 2, or `word` a
/// shortening of it), case-insensitively; `upper` returns it upper-cased.
fn nearest(word: &str, candidates: &[&str], upper: bool) -> Option<String> {
    let w = word.to_lowercase();
    if w.len() < 3 || candidates.iter().any(|c| c.eq_ignore_ascii_case(word)) {
        return None;
    }
    let best = candidates
        .iter()
        .map(|c| {
            let lc = c.to_lowercase();
            let score = if is_subsequence(&w, &lc) && w.len() + 2 >= lc.len() {
                1
            } else {
                edit_distance(&w, &lc)
            };
            (score, *c)
        })
        .filter(|(score, c)| *score <= if w.len() <= 4 { 1 } else { 2 } && *score < c.len())
        .min_by_key(|(score, _)| *score)?;
    Some(if upper {
        best.1.to_uppercase()
    } else {
        best.1.to_string()
    })
}

fn is_subsequence(short: &str, long: &str) -> bool {
    let mut it = long.chars();
    short.chars().all(|c| it.any(|l| l == c))
}

/// Edits (insert, delete, replace, swap two neighbours) from `a` to `b`.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            d[i][j] = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d[i][j] = d[i][j].min(d[i - 2][j - 2] + 1);
            }
        }
    }
    d[a.len()][b.len()]
}

/// The 1-based position of byte offset `at` in `sql`.
fn position_of(sql: &str, at: usize) -> SqlPosition {
    let before = &sql[..at];
    let line = before.matches('\n').count() as u64 + 1;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    SqlPosition {
        line,
        column: sql[start..at].chars().count() as u64 + 1,
    }
}

/// The byte offset of `p` in `sql`.
fn offset_of(sql: &str, p: SqlPosition) -> usize {
    let mut offset = 0;
    for (i, line) in sql.split_inclusive('\n').enumerate() {
        if i as u64 + 1 == p.line {
            return offset
                + line
                    .char_indices()
                    .nth(p.column.saturating_sub(1) as usize)
                    .map_or(line.len(), |(b, _)| b);
        }
        offset += line.len();
    }
    sql.len()
}

/// Where `text` first occurs (case-insensitively).
fn find_text(sql: &str, text: &str) -> Option<SqlPosition> {
    let at = sql.to_lowercase().find(&text.to_lowercase())?;
    Some(position_of(sql, at))
}

/// Where `word` first occurs as a whole word (case-insensitively), outside
/// string literals.
fn find_word(sql: &str, word: &str) -> Option<SqlPosition> {
    find_word_from(sql, word, 0)
}

fn find_word_from(sql: &str, word: &str, from: usize) -> Option<SqlPosition> {
    if word.is_empty() {
        return None;
    }
    let lower = sql.to_lowercase();
    let target = word.to_lowercase();
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut search = from.min(sql.len());
    while let Some(i) = lower[search..].find(&target) {
        let at = search + i;
        let end = at + target.len();
        // Word boundaries, where the target starts or ends with a word character.
        let before_ok =
            !target.starts_with(is_ident) || !lower[..at].chars().next_back().is_some_and(is_ident);
        let after_ok =
            !target.ends_with(is_ident) || !lower[end..].chars().next().is_some_and(is_ident);
        let quotes = lower[..at].matches('\'').count();
        if before_ok && after_ok && quotes.is_multiple_of(2) {
            return Some(position_of(sql, at));
        }
        search = end;
    }
    None
}

/// Where a call of `name` first occurs (`name` then `(`).
fn find_call(sql: &str, name: &str) -> Option<SqlPosition> {
    let mut from = 0;
    while let Some(p) = find_word_from(sql, name, from) {
        let at = offset_of(sql, p);
        let after = sql[at + name.len()..].trim_start();
        if after.starts_with('(') {
            return Some(p);
        }
        from = at + name.len();
    }
    None
}

/// The word just before position `p`, and where it starts.
fn word_before(sql: &str, p: SqlPosition) -> Option<(String, SqlPosition)> {
    let at = offset_of(sql, p);
    let before = sql[..at].trim_end();
    let start = before
        .char_indices()
        .rev()
        .take_while(|(_, c)| c.is_alphanumeric() || *c == '_')
        .last()
        .map(|(i, _)| i)?;
    Some((before[start..].to_string(), position_of(sql, start)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_misses_and_places() {
        assert_eq!(
            nearest("SELEC", CLAUSE_KEYWORDS, true).as_deref(),
            Some("SELECT")
        );
        assert_eq!(
            nearest("FORM", CLAUSE_KEYWORDS, true).as_deref(),
            Some("FROM")
        );
        assert_eq!(
            nearest("cnt", COMMON_FUNCTIONS, false).as_deref(),
            Some("count")
        );
        assert_eq!(
            nearest("my", CLAUSE_KEYWORDS, true),
            None,
            "too short to guess"
        );
        assert_eq!(nearest("amount", CLAUSE_KEYWORDS, true), None);
        let sql = "SELECT a,\n  'x' AS t, bb(1) FROM t";
        assert_eq!(
            find_call(sql, "bb"),
            Some(SqlPosition {
                line: 2,
                column: 13
            })
        );
        assert_eq!(find_word(sql, "x"), None, "inside a string");
        assert_eq!(
            find_word(sql, "t"),
            Some(SqlPosition {
                line: 2,
                column: 10
            })
        );
        assert_eq!(offset_of(sql, SqlPosition { line: 2, column: 3 }), 12);
        assert_eq!(split_types("Timestamp(µs, \"UTC\"), Int64").len(), 2);
    }
}
