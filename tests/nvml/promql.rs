// SPDX-License-Identifier: Apache-2.0
//! What a Grafana dashboard asks of the metrics: the metric names and labels its PromQL
//! queries, legends and template variables use. Enough PromQL for dashboards (selectors,
//! aggregations with `by`/`without`, functions, arithmetic, ranges), not a full parser:
//! anything it does not understand is a test failure, never silently skipped.

use std::collections::{BTreeMap, BTreeSet};

/// Names PromQL gives meaning to that are not metric names.
const KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
];

/// One query's references: each metric with the labels its selector matches on, and the
/// labels it groups by.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Refs {
    pub metrics: BTreeMap<String, BTreeSet<String>>,
    pub grouping: BTreeSet<String>,
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Str,
    Number,
    Punct(char),
    /// `=`, `!=`, `=~`, `!~`, `==`, `>=`, ...
    Op,
    /// `$var`, `${var}`, `[$__rate_interval]`-style durations collapse to one token.
    Variable,
    Range,
}

fn tokenize(expr: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '"' || c == '\'' || c == '`' {
            let quote = c;
            i += 1;
            while i < chars.len() && chars[i] != quote {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            if i >= chars.len() {
                return Err(format!("unterminated string in {expr:?}"));
            }
            i += 1;
            tokens.push(Token::Str);
        } else if c == '[' {
            let end = chars[i..]
                .iter()
                .position(|&c| c == ']')
                .ok_or_else(|| format!("unterminated range in {expr:?}"))?;
            i += end + 1;
            tokens.push(Token::Range);
        } else if c == '$' {
            i += 1;
            if chars.get(i) == Some(&'{') {
                while i < chars.len() && chars[i] != '}' {
                    i += 1;
                }
                i += 1;
            } else {
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
            }
            tokens.push(Token::Variable);
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
            tokens.push(Token::Number);
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            tokens.push(Token::Ident(chars[start..i].iter().collect()));
        } else if matches!(c, '=' | '!' | '<' | '>') {
            i += 1;
            if matches!(chars.get(i), Some('=' | '~')) {
                i += 1;
            }
            tokens.push(Token::Op);
        } else if matches!(
            c,
            '(' | ')' | '{' | '}' | ',' | '*' | '/' | '+' | '-' | '%' | '^'
        ) {
            tokens.push(Token::Punct(c));
            i += 1;
        } else {
            return Err(format!("unexpected {c:?} in {expr:?}"));
        }
    }
    Ok(tokens)
}

/// The metrics and labels `expr` uses.
pub fn references(expr: &str) -> Result<Refs, String> {
    let tokens = tokenize(expr)?;
    let mut refs = Refs::default();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            Token::Ident(word)
                if matches!(
                    word.as_str(),
                    "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
                ) =>
            {
                // A label list in parentheses (optional after group_left/right).
                if tokens.get(i + 1) == Some(&Token::Punct('(')) {
                    i += 2;
                    while i < tokens.len() && tokens[i] != Token::Punct(')') {
                        match &tokens[i] {
                            Token::Ident(label) => {
                                refs.grouping.insert(label.clone());
                            }
                            Token::Punct(',') => {}
                            other => return Err(format!("{other:?} in a label list of {expr:?}")),
                        }
                        i += 1;
                    }
                }
                i += 1;
            }
            Token::Ident(word) if KEYWORDS.contains(&word.as_str()) => i += 1,
            // A function or aggregation call.
            Token::Ident(_) if tokens.get(i + 1) == Some(&Token::Punct('(')) => i += 1,
            Token::Ident(metric) => {
                let labels = refs.metrics.entry(metric.clone()).or_default();
                i += 1;
                if tokens.get(i) == Some(&Token::Punct('{')) {
                    i += 1;
                    loop {
                        match (tokens.get(i), tokens.get(i + 1), tokens.get(i + 2)) {
                            (Some(Token::Punct('}')), ..) => break,
                            (Some(Token::Ident(label)), Some(Token::Op), Some(Token::Str)) => {
                                labels.insert(label.clone());
                                i += 3;
                                if tokens.get(i) == Some(&Token::Punct(',')) {
                                    i += 1;
                                }
                            }
                            _ => {
                                return Err(format!(
                                    "cannot read the selector of {metric} in {expr:?}"
                                ));
                            }
                        }
                    }
                    i += 1;
                }
            }
            Token::Punct('{') => {
                return Err(format!("a selector without a metric name in {expr:?}"));
            }
            _ => i += 1,
        }
    }
    Ok(refs)
}

/// The labels a legend format (`{{Hostname}} - GPU {{gpu}}`) prints.
pub fn legend_labels(format: &str) -> Vec<String> {
    format
        .split("{{")
        .skip(1)
        .filter_map(|part| part.split_once("}}"))
        .map(|(label, _)| label.trim().to_owned())
        .collect()
}

/// `label_values(metric{...}, label)`: the query and the label.
pub fn label_values(query: &str) -> Result<(Refs, String), String> {
    let inner = query
        .trim()
        .strip_prefix("label_values(")
        .and_then(|rest| rest.strip_suffix(')'))
        .ok_or_else(|| format!("not a label_values(...) query: {query:?}"))?;
    let (selector, label) = inner
        .rsplit_once(',')
        .ok_or_else(|| format!("label_values without a label: {query:?}"))?;
    Ok((references(selector)?, label.trim().to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_selectors_groupings_and_legends() {
        let refs = references(
            r#"sum(max(DCGM_FI_DEV_SM_CLOCK{Hostname=~"$Hostname", gpu=~"$gpu"} * 1000000) by (Hostname, UUID)) / rate(x_total[$__rate_interval])"#,
        )
        .unwrap();
        let clock: BTreeSet<String> = ["Hostname", "gpu"].map(String::from).into();
        assert_eq!(refs.metrics["DCGM_FI_DEV_SM_CLOCK"], clock);
        assert!(refs.metrics["x_total"].is_empty());
        assert_eq!(refs.metrics.len(), 2);
        assert_eq!(refs.grouping, ["Hostname", "UUID"].map(String::from).into());
        assert_eq!(
            legend_labels("{{Hostname}} GPU {{gpu}}/{{GPU_I_ID}}"),
            ["Hostname", "gpu", "GPU_I_ID"]
        );
        let (refs, label) =
            label_values(r#"label_values(DCGM_FI_DEV_FB_FREE{Hostname=~"$Hostname"}, gpu)"#)
                .unwrap();
        assert_eq!(label, "gpu");
        assert!(refs.metrics.contains_key("DCGM_FI_DEV_FB_FREE"));
        assert!(references(r#"{job="x"}"#).is_err());
        assert!(references(r#"m{a="x""#).is_err());
    }
}
