//! The SQL builder the listing's queries share: parameters bound in order, times and prefixes
//! as each store compares them, the cursor's conditions.

use super::{ListFilter, ListedKind, Tie};
use crate::store::dedup::RING_SLOTS;

/// A value bound to the next `$n`.
pub(in crate::store::reads) enum Param {
    I64(i64),
    Text(String),
    Key([u8; 16]),
}

/// The SQL of one kind's query, with its parameters in order.
pub(in crate::store::reads) struct Query {
    pub(in crate::store::reads) postgres: bool,
    pub(in crate::store::reads) params: Vec<Param>,
}

impl Query {
    pub(in crate::store::reads) fn bind(&mut self, param: Param) -> String {
        self.params.push(param);
        format!("${}", self.params.len())
    }

    /// A time parameter (µs) as the column's type.
    pub(in crate::store::reads) fn time(&mut self, us: i64) -> String {
        let p = self.bind(Param::I64(us));
        if self.postgres {
            format!("('epoch'::timestamptz + {p} * interval '1 microsecond')")
        } else {
            format!("({p} / 1000)")
        }
    }

    /// A time column as microseconds.
    pub(in crate::store::reads) fn at_us(&self, column: &str) -> String {
        if self.postgres {
            format!("(extract(epoch FROM {column}) * 1000000)::int8")
        } else {
            format!("({column} * 1000)")
        }
    }

    /// The conditions every kind shares: time range, type prefix, the cursor.
    pub(in crate::store::reads) fn conditions(
        &mut self,
        filter: &ListFilter,
        kind: ListedKind,
        (time, tie, type_column): (&str, &str, &str),
    ) -> Vec<String> {
        let mut conds = Vec::new();
        if let Some(since) = filter.since_us {
            conds.push(format!("{time} >= {}", self.time(since)));
        }
        if let Some(until) = filter.until_us {
            conds.push(format!("{time} < {}", self.time(until)));
        }
        if let Some(prefix) = filter.type_prefix.as_deref().filter(|p| !p.is_empty()) {
            conds.extend(prefix_range(self, type_column, prefix));
        }
        // Older rows (after the cursor in the listing's order) or newer ones (before it).
        let page = match (filter.after, filter.before) {
            (Some(after), _) => Some((after, true)),
            (None, Some(before)) => Some((before, false)),
            (None, None) => None,
        };
        if let Some((cursor, older)) = page {
            let at = self.time(cursor.at_us);
            let cond = match (kind.cmp(&cursor.kind), older) {
                // Rows of one time are listed by kind, descending: at the cursor's time, a kind
                // below the cursor's comes after it, one above came before.
                (std::cmp::Ordering::Less, true) => format!("{time} <= {at}"),
                (std::cmp::Ordering::Less, false) => format!("{time} > {at}"),
                (std::cmp::Ordering::Greater, true) => format!("{time} < {at}"),
                (std::cmp::Ordering::Greater, false) => format!("{time} >= {at}"),
                (std::cmp::Ordering::Equal, _) => {
                    let tie_value = match cursor.tie {
                        Tie::Key(key) => self.bind(Param::Key(key)),
                        Tie::Id(id) => self.bind(Param::I64(id)),
                    };
                    let op = if older { "<" } else { ">" };
                    format!("({time}, {tie}) {op} ({at}, {tie_value})")
                }
            };
            conds.push(cond);
        }
        conds
    }

    /// `column IN (the searched events' keys)`, or `column = the id`.
    pub(in crate::store::reads) fn events_by_key(
        &mut self,
        filter: &ListFilter,
        column: &str,
    ) -> Option<String> {
        if filter.events.is_empty() {
            return None;
        }
        let keys: Vec<String> = filter
            .events
            .iter()
            .map(|(key, _, _)| self.bind(Param::Key(*key)))
            .collect();
        Some(format!("{column} IN ({})", keys.join(", ")))
    }

    /// `source IN (the searched sources) AND column = the id` (the tables' `(source,
    /// event_id)` index), or, for the queue (`source_column` none: it has no such index), the
    /// id alone.
    pub(in crate::store::reads) fn events_by_id(
        &mut self,
        filter: &ListFilter,
        column: &str,
        source_column: Option<&str>,
    ) -> Option<String> {
        let (_, _, id) = filter.events.first()?;
        let id = self.bind(Param::Text(id.clone()));
        let Some(source_column) = source_column else {
            return Some(format!("{column} = {id}"));
        };
        let sources: Vec<String> = filter
            .events
            .iter()
            .map(|(_, source, _)| self.bind(Param::Text(source.clone())))
            .collect();
        Some(format!(
            "{source_column} IN ({}) AND {column} = {id}",
            sources.join(", ")
        ))
    }
}

impl Query {
    /// `column = the source`, when the listing is of one source.
    pub(in crate::store::reads) fn of_source(
        &mut self,
        filter: &ListFilter,
        column: &str,
    ) -> Option<String> {
        let source = filter.source.as_deref().filter(|s| !s.is_empty())?;
        let source = self.bind(Param::Text(source.to_owned()));
        Some(format!("{column} = {source}"))
    }

    /// A duplicate of one source: its table holds no source, so each generation is probed by
    /// the row's key (its primary key). Like a type filter, it reads the rows it skips; a
    /// duplicate whose event left the window has no source and is not listed under one.
    pub(in crate::store::reads) fn duplicate_of_source(
        &mut self,
        filter: &ListFilter,
    ) -> Option<String> {
        let source = filter.source.as_deref().filter(|s| !s.is_empty())?;
        let source = self.bind(Param::Text(source.to_owned()));
        let probes = (0..RING_SLOTS)
            .map(|slot| {
                format!(
                    "EXISTS (SELECT 1 FROM processed_events_{slot} \
                     WHERE key = d.key AND source = {source})"
                )
            })
            .collect::<Vec<_>>()
            .join(" OR ");
        Some(format!("({probes})"))
    }
}

/// The order a kind's rows are read in: newest first, or, for a page of newer rows
/// (`ListFilter::before`), nearest the cursor first (the caller turns the page round).
pub(in crate::store::reads) fn direction(filter: &ListFilter) -> &'static str {
    if filter.after.is_none() && filter.before.is_some() {
        "ASC"
    } else {
        "DESC"
    }
}

/// `column` starts with `prefix`, as a range rather than LIKE: an index serves it (PostgreSQL's
/// text_pattern_ops operators compare bytes whatever the collation; SQLite's LIKE ignores case
/// and indexes), and `%` or `_` in a prefix mean themselves.
pub(in crate::store::reads) fn prefix_range(
    query: &mut Query,
    column: &str,
    prefix: &str,
) -> Vec<String> {
    let (ge, lt) = if query.postgres {
        ("~>=~", "~<~")
    } else {
        (">=", "<")
    };
    let low = query.bind(Param::Text(prefix.to_owned()));
    let mut conds = vec![format!("{column} {ge} {low}")];
    if let Some(high) = prefix_end(prefix) {
        let high = query.bind(Param::Text(high));
        conds.push(format!("{column} {lt} {high}"));
    }
    conds
}

impl Query {
    /// `sql` with the parameters bound, for PostgreSQL. Not prepared and kept: a statement
    /// reused with a generic plan would be planned without the window's or the prefix's values,
    /// and these are few.
    pub(in crate::store::reads) fn postgres_query(
        self,
        sql: &str,
    ) -> sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments> {
        let mut q = sqlx::query(sql).persistent(false);
        for param in self.params {
            q = match param {
                Param::I64(v) => q.bind(v),
                Param::Text(v) => q.bind(v),
                Param::Key(v) => q.bind(uuid::Uuid::from_bytes(v)),
            };
        }
        q
    }

    /// `sql` with the parameters bound, for SQLite (keys as 16-byte blobs).
    pub(in crate::store::reads) fn sqlite_query(
        self,
        sql: &str,
    ) -> sqlx::query::Query<'_, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'_>> {
        let mut q = sqlx::query(sql);
        for param in self.params {
            q = match param {
                Param::I64(v) => q.bind(v),
                Param::Text(v) => q.bind(v),
                Param::Key(v) => q.bind(v.to_vec()),
            };
        }
        q
    }
}

/// The smallest string greater than every string starting with `prefix` (its last character
/// one higher), or none (a prefix ending in the highest character).
pub(in crate::store::reads) fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = (last as u32 + 1..=char::MAX as u32).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

pub(in crate::store::reads) fn where_clause(conds: &[String]) -> String {
    if conds.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", conds.join(" AND "))
    }
}

/// The generation tables' rows as one relation (on SQLite, where a join needs one).
pub(in crate::store::reads) fn generations(columns: &str) -> String {
    (0..RING_SLOTS)
        .map(|slot| format!("SELECT {columns} FROM processed_events_{slot}"))
        .collect::<Vec<_>>()
        .join(" UNION ALL ")
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn a_prefix_ends_before_the_next_string_not_starting_with_it() {
        assert_eq!(prefix_end("invoice.").as_deref(), Some("invoice/"));
        assert_eq!(prefix_end("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_end("\u{10FFFF}"), None);
        assert_eq!(prefix_end("\u{D7FF}").as_deref(), Some("\u{E000}"));
    }
}
