//! The metric names a PromQL expression reads, by a small tokenizer: what the dashboard's and
//! the alert rules' queries need `/metrics` to expose.
//!
//! Identifiers are sorted into what PromQL makes of them: a function (followed by `(`), an
//! aggregation (`sum by (le) (…)`), a keyword or binary operator (`and`, `on`, `bool`, …), the
//! label lists after `by`/`without`/`on`/`ignoring`/`group_left`/`group_right`, label names
//! and values inside `{…}` (a `__name__="…"` matcher is a metric name), ranges and subqueries
//! inside `[…]`, numbers and durations, strings, Grafana's `$variables`. Every other identifier
//! is a metric name.

/// A token of PromQL (Grafana's variables included).
#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Number,
    Str(String),
    Variable,
    Punct(char),
    /// A binary or comparison operator.
    Op,
}

fn tokenize(expr: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    let ident_start = |c: char| c.is_ascii_alphabetic() || c == '_' || c == ':';
    let ident_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '#' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if ident_start(c) {
            let start = i;
            while i < chars.len() && ident_char(chars[i]) {
                i += 1;
            }
            tokens.push(Token::Ident(chars[start..i].iter().collect()));
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            // Numbers (0.99, 1e-3, 0x1f) and durations (5m, 1h30m).
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                let exponent =
                    matches!(chars[i], 'e' | 'E') && matches!(chars.get(i + 1), Some('+' | '-'));
                i += if exponent { 2 } else { 1 };
            }
            tokens.push(Token::Number);
        } else if matches!(c, '"' | '\'' | '`') {
            let mut value = String::new();
            i += 1;
            loop {
                let Some(&d) = chars.get(i) else {
                    return Err(format!("unterminated string in {expr:?}"));
                };
                i += 1;
                if d == c {
                    break;
                }
                if d == '\\' && c != '`' {
                    let escaped = chars.get(i).copied().ok_or("dangling escape")?;
                    value.push(escaped);
                    i += 1;
                } else {
                    value.push(d);
                }
            }
            tokens.push(Token::Str(value));
        } else if c == '$' {
            i += 1;
            if chars.get(i) == Some(&'{') {
                while i < chars.len() && chars[i] != '}' {
                    i += 1;
                }
                i += 1;
            } else {
                while i < chars.len() && ident_char(chars[i]) {
                    i += 1;
                }
            }
            tokens.push(Token::Variable);
        } else if "(){}[],".contains(c) {
            tokens.push(Token::Punct(c));
            i += 1;
        } else if "=!<>".contains(c) {
            // `=`, `==`, `!=`, `=~`, `!~`, `<=`, `>=`, `<`, `>`.
            i += 1;
            if matches!(chars.get(i), Some('=' | '~')) {
                i += 1;
            }
            tokens.push(Token::Op);
        } else if "+-*/%^@:".contains(c) {
            tokens.push(Token::Op);
            i += 1;
        } else {
            return Err(format!("unexpected {c:?} in {expr:?}"));
        }
    }
    Ok(tokens)
}

const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];
/// Followed by a list of label names in parentheses.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
const KEYWORDS: &[&str] = &[
    "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan",
];

/// The metric names `expr` reads, in order of appearance (with repeats).
pub fn metric_names(expr: &str) -> Result<Vec<String>, String> {
    let tokens = tokenize(expr)?;
    let mut names = Vec::new();
    let mut depth = 0i32;
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            Token::Punct('{') => i = skip_matchers(&tokens, i, &mut names)?,
            Token::Punct('[') => {
                i = tokens[i..]
                    .iter()
                    .position(|t| *t == Token::Punct(']'))
                    .map(|n| i + n)
                    .ok_or_else(|| format!("unclosed [ in {expr:?}"))?;
            }
            Token::Punct('(') => depth += 1,
            Token::Punct(')') => depth -= 1,
            Token::Punct('}' | ']') => return Err(format!("unbalanced brackets in {expr:?}")),
            Token::Ident(ident) => {
                let next = tokens.get(i + 1);
                let word = ident.to_ascii_lowercase();
                if LABEL_LISTS.contains(&word.as_str()) {
                    if next == Some(&Token::Punct('(')) {
                        i += tokens[i..]
                            .iter()
                            .position(|t| *t == Token::Punct(')'))
                            .ok_or_else(|| format!("unclosed label list in {expr:?}"))?;
                    }
                } else if KEYWORDS.contains(&word.as_str()) {
                } else if next == Some(&Token::Punct('(')) {
                    // A function call or an aggregation: its arguments are read in turn.
                } else if AGGREGATIONS.contains(&ident.as_str())
                    && matches!(next, Some(Token::Ident(w)) if w == "by" || w == "without")
                {
                } else {
                    names.push(ident.clone());
                }
            }
            Token::Number | Token::Str(_) | Token::Variable | Token::Op | Token::Punct(_) => {}
        }
        if depth < 0 {
            return Err(format!("unbalanced parentheses in {expr:?}"));
        }
        i += 1;
    }
    if depth != 0 {
        return Err(format!("unbalanced parentheses in {expr:?}"));
    }
    Ok(names)
}

/// Skips the matchers `{…}` opening at `open`; a `__name__` equality names a metric. Returns the
/// index of the closing brace.
fn skip_matchers(tokens: &[Token], open: usize, names: &mut Vec<String>) -> Result<usize, String> {
    let mut i = open + 1;
    while i < tokens.len() {
        match (&tokens[i], tokens.get(i + 1), tokens.get(i + 2)) {
            (Token::Punct('}'), _, _) => return Ok(i),
            (Token::Ident(label), Some(Token::Op), Some(Token::Str(value)))
                if label == "__name__" =>
            {
                names.push(value.clone());
                i += 3;
            }
            _ => i += 1,
        }
    }
    Err("unclosed {".into())
}

#[test]
fn names_are_told_from_functions_labels_and_keywords() {
    let names = |e: &str| metric_names(e).expect(e);
    assert_eq!(
        names(
            r#"histogram_quantile(0.99, sum by (le, route) (rate(dedup_ingress_request_seconds_bucket{status=~"5..", route!="x"}[$__rate_interval])))"#
        ),
        ["dedup_ingress_request_seconds_bucket"]
    );
    assert_eq!(
        names("sum by (route) (rate(a_count{status=\"5xx\"}[5m])) / sum by (route) (rate(a_count[5m])) > 0.05"),
        ["a_count", "a_count"]
    );
    assert_eq!(
        names("max by (queue) (min_over_time(depth[15m:1m])) > 1e3 and on (queue) up == 0"),
        ["depth", "up"]
    );
    assert_eq!(
        names("sum without (instance) (x) * on (job) group_left (version) build_info offset 5m"),
        ["x", "build_info"]
    );
    assert_eq!(
        names(r#"{__name__="by_name", job="j"} or max(g)"#),
        ["by_name", "g"]
    );
    assert_eq!(names("topk(3, sum(rate(c_total[1h])))"), ["c_total"]);
    assert_eq!(names("vector(1) + time()"), Vec::<String>::new());
    assert!(metric_names("sum(rate(x[5m])").is_err());
    assert!(metric_names("x{a=\"b\"").is_err());
}
