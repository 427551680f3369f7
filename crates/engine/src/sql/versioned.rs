//! `FOR SYSTEM_TIME AS OF`: Flink's syntax for a temporal (versioned
//! table) join. The SQL dialect ubik parses does not accept table
//! versioning, so the clause is cut out of the text before parsing (blanked
//! with spaces, so every error position still points at the user's text)
//! and the table it qualified is remembered: that side of the join is the
//! versioned table.

use datafusion_sql::sqlparser::dialect::GenericDialect;
use datafusion_sql::sqlparser::keywords::Keyword;
use datafusion_sql::sqlparser::tokenizer::{Token, TokenWithSpan, Tokenizer};

/// A table read `FOR SYSTEM_TIME AS OF <time>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionedTable {
    /// The name the query knows it by: its alias, else its table name.
    pub name: String,
    /// The time column the version is taken at, as written (`o.ts`).
    pub as_of: String,
}

/// The query without its `FOR SYSTEM_TIME AS OF` clauses, and the tables
/// they qualified. Text that does not tokenize is returned unchanged (the
/// parser reports the error).
pub fn strip_versions(sql: &str) -> (String, Vec<VersionedTable>) {
    let Ok(tokens) = Tokenizer::new(&GenericDialect {}, sql).tokenize_with_location() else {
        return (sql.to_string(), Vec::new());
    };
    let tokens: Vec<&TokenWithSpan> = tokens
        .iter()
        .filter(|t| !matches!(t.token, Token::Whitespace(_)))
        .collect();
    let offsets = LineOffsets::new(sql);
    let mut text = sql.to_string();
    let mut found = Vec::new();
    let mut i = 0;
    while i + 4 < tokens.len() {
        let is = |k: usize, kw: Keyword| matches!(&tokens[i + k].token, Token::Word(w) if w.keyword == kw);
        let system_time = matches!(&tokens[i + 1].token, Token::Word(w) if w.value.eq_ignore_ascii_case("system_time"));
        if !(is(0, Keyword::FOR) && system_time && is(2, Keyword::AS) && is(3, Keyword::OF))
            || i == 0
        {
            i += 1;
            continue;
        }
        // The time: a (compound) column name.
        let mut j = i + 4;
        let mut as_of = String::new();
        while let Some(Token::Word(w)) = tokens.get(j).map(|t| &t.token) {
            as_of.push_str(&w.value);
            if matches!(tokens.get(j + 1).map(|t| &t.token), Some(Token::Period)) {
                as_of.push('.');
                j += 2;
            } else {
                j += 1;
                break;
            }
        }
        let table = match &tokens[i - 1].token {
            Token::Word(w) if w.quote_style.is_some() => w.value.clone(),
            Token::Word(w) => w.value.to_lowercase(),
            _ => {
                i += 1;
                continue;
            }
        };
        let alias = match tokens.get(j).map(|t| &t.token) {
            Some(Token::Word(w)) if w.keyword == Keyword::AS => match tokens.get(j + 1) {
                Some(TokenWithSpan {
                    token: Token::Word(a),
                    ..
                }) => Some(a),
                _ => None,
            },
            Some(Token::Word(w)) if w.keyword == Keyword::NoKeyword => Some(w),
            _ => None,
        };
        let name = match alias {
            Some(a) if a.quote_style.is_some() => a.value.clone(),
            Some(a) => a.value.to_lowercase(),
            None => table,
        };
        let (Some(start), Some(end)) = (
            offsets.byte(sql, tokens[i].span.start),
            offsets.byte(sql, tokens[j - 1].span.end),
        ) else {
            i += 1;
            continue;
        };
        let blank: String = text[start..end]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        text.replace_range(start..end, &blank);
        found.push(VersionedTable { name, as_of });
        i = j;
    }
    (text, found)
}

/// Line starts of a text, to turn (line, column) locations into byte offsets.
struct LineOffsets(Vec<usize>);

impl LineOffsets {
    fn new(text: &str) -> Self {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Self(starts)
    }

    /// The byte offset of a 1-based (line, character column) location.
    fn byte(
        &self,
        text: &str,
        at: datafusion_sql::sqlparser::tokenizer::Location,
    ) -> Option<usize> {
        let start = *self.0.get((at.line as usize).checked_sub(1)?)?;
        let column = (at.column as usize).checked_sub(1)?;
        let line = &text[start..];
        match line.char_indices().nth(column) {
            Some((k, _)) => Some(start + k),
            None => Some(text.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_the_clause_and_keeps_positions() {
        let sql = "SELECT * FROM orders o\nJOIN merchants FOR SYSTEM_TIME AS OF o.ts AS m ON o.merchant = m.id";
        let (text, found) = strip_versions(sql);
        assert_eq!(text.len(), sql.len());
        let blank = " ".repeat("FOR SYSTEM_TIME AS OF o.ts".len());
        assert_eq!(
            text,
            format!("SELECT * FROM orders o\nJOIN merchants {blank} AS m ON o.merchant = m.id")
        );
        assert_eq!(
            found,
            vec![VersionedTable {
                name: "m".into(),
                as_of: "o.ts".into()
            }]
        );
    }

    #[test]
    fn without_alias_the_table_name() {
        let (text, found) =
            strip_versions("SELECT 1 FROM o JOIN \"Merch\" FOR SYSTEM_TIME AS OF ts ON true");
        assert!(!text.contains("SYSTEM_TIME"));
        assert_eq!(found[0].name, "Merch");
        assert_eq!(found[0].as_of, "ts");
        let plain = "SELECT a FROM t WHERE x = 'FOR SYSTEM_TIME AS OF'";
        assert_eq!(strip_versions(plain), (plain.to_string(), vec![]));
    }
}
