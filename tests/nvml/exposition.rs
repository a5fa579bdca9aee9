// SPDX-License-Identifier: Apache-2.0
//! A strict reader of the Prometheus text format 0.0.4, for checking the exporter's output
//! (`exporter`) line by line without using the exporter's own code.

use std::collections::BTreeMap;

/// A series' labels, in order.
pub type Labels = Vec<(String, String)>;

/// One metric family as the exposition gave it.
#[derive(Debug)]
pub struct Family {
    pub help: String,
    pub kind: String,
    pub samples: Vec<Sample>,
}

#[derive(Debug)]
pub struct Sample {
    pub labels: Labels,
    pub value: f64,
}

fn is_name(text: &str, colons: bool) -> bool {
    let mut chars = text.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || (colons && c == ':'))
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || (colons && c == ':'))
}

/// Parses the Prometheus 0.0.4 text format strictly: each family is `# HELP`, `# TYPE`
/// (gauge or counter) then at least one sample of that name; label values use only the
/// three escapes; no label twice, no series twice, no family twice; finite numbers only.
pub fn parse_exposition(text: &str) -> Result<BTreeMap<String, Family>, String> {
    if !text.is_empty() && !text.ends_with('\n') {
        return Err("the output does not end with a newline".into());
    }
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut lines = text.lines().enumerate().peekable();
    while let Some((at, line)) = lines.next() {
        let bad = |why: &str| format!("line {}: {why}: {line:?}", at + 1);
        if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some(name) = &current
                && families[name].samples.is_empty()
            {
                return Err(bad("the previous family has no samples"));
            }
            let (name, help) = rest
                .split_once(' ')
                .ok_or_else(|| bad("HELP without text"))?;
            if !is_name(name, true) || families.contains_key(name) {
                return Err(bad("bad or repeated family name"));
            }
            let (_, type_line) = lines.next().ok_or_else(|| bad("HELP without TYPE"))?;
            let kind = type_line
                .strip_prefix(&format!("# TYPE {name} "))
                .filter(|k| *k == "gauge" || *k == "counter")
                .ok_or_else(|| bad("HELP not followed by its gauge/counter TYPE"))?;
            families.insert(
                name.to_string(),
                Family {
                    help: help.to_string(),
                    kind: kind.to_string(),
                    samples: Vec::new(),
                },
            );
            current = Some(name.to_string());
            continue;
        }
        let name = current
            .as_ref()
            .ok_or_else(|| bad("sample before any family"))?;
        let rest = line
            .strip_prefix(name.as_str())
            .ok_or_else(|| bad("sample of another family"))?;
        let (labels, value) = match rest.strip_prefix('{') {
            Some(inner) => {
                let (labels, rest) = parse_labels(inner).map_err(|why| bad(&why))?;
                (labels, rest)
            }
            None => (Vec::new(), rest),
        };
        let value: f64 = value
            .strip_prefix(' ')
            .and_then(|v| v.parse().ok())
            .filter(|v: &f64| v.is_finite())
            .ok_or_else(|| bad("no finite value after one space"))?;
        let family = families.get_mut(name).ok_or_else(|| bad("no family"))?;
        if family.samples.iter().any(|s| s.labels == labels) {
            return Err(bad("the same series twice"));
        }
        family.samples.push(Sample { labels, value });
    }
    if let Some(name) = &current
        && families[name].samples.is_empty()
    {
        return Err(format!("family {name} has no samples"));
    }
    Ok(families)
}

/// `a="x",b="y"}` and what follows the `}`.
fn parse_labels(mut text: &str) -> Result<(Labels, &str), String> {
    let mut labels: Labels = Vec::new();
    loop {
        let (name, rest) = text.split_once("=\"").ok_or("a label without =\"")?;
        if !is_name(name, false) || labels.iter().any(|(n, _)| n == name) {
            return Err(format!("bad or repeated label name {name:?}"));
        }
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next().ok_or("unterminated label value")? {
                (_, '\\') => match chars.next().ok_or("dangling escape")?.1 {
                    '\\' => value.push('\\'),
                    '"' => value.push('"'),
                    'n' => value.push('\n'),
                    other => return Err(format!("unknown escape \\{other}")),
                },
                (at, '"') => break at,
                (_, '\n') => return Err("raw newline in a label value".into()),
                (_, c) => value.push(c),
            }
        };
        labels.push((name.to_string(), value));
        let rest = &rest[end + 1..];
        if let Some(after) = rest.strip_prefix('}') {
            return Ok((labels, after));
        }
        text = rest
            .strip_prefix(',')
            .ok_or("labels not separated by ','")?;
    }
}
