//! Shell-style patterns with Go's `filepath.Match` rules, which NVIDIA's Tegra code
//! uses for `--csv.ignore-pattern` and for globs in CSV paths: `*` is any run of
//! characters but `/`, `?` one character but `/`, `[a-z]` / `[^a-z]` a class, `\`
//! escapes the next character. A pattern is checked once ([`Pattern::new`]), so a
//! malformed one is an error up front instead of never matching.

/// A checked pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    text: String,
}

/// Why a pattern is malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("unterminated [ class")]
    Unterminated,
    #[error("empty [] class")]
    EmptyClass,
    #[error("trailing \\")]
    TrailingEscape,
}

impl Pattern {
    pub fn new(text: &str) -> Result<Self, PatternError> {
        check(text.as_bytes())?;
        Ok(Self {
            text: text.to_owned(),
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `name` matches the whole pattern.
    pub fn matches(&self, name: &str) -> bool {
        let p: Vec<char> = self.text.chars().collect();
        let n: Vec<char> = name.chars().collect();
        match_from(&p, &n)
    }
}

/// Whether `text` holds a glob meta-character (then it is matched, not looked up).
pub fn has_meta(text: &str) -> bool {
    text.contains(['*', '?', '[', '\\'])
}

fn check(p: &[u8]) -> Result<(), PatternError> {
    let mut i = 0;
    while i < p.len() {
        match p[i] {
            b'\\' => {
                if i + 1 >= p.len() {
                    return Err(PatternError::TrailingEscape);
                }
                i += 2;
            }
            b'[' => {
                i += 1;
                if p.get(i) == Some(&b'^') {
                    i += 1;
                }
                let start = i;
                loop {
                    match p.get(i) {
                        None => return Err(PatternError::Unterminated),
                        Some(b']') if i > start => break,
                        Some(b']') => return Err(PatternError::EmptyClass),
                        Some(b'\\') => i += 2,
                        Some(_) => i += 1,
                    }
                }
                i += 1;
            }
            _ => i += 1,
        }
    }
    Ok(())
}

/// Backtracking match; patterns are short (a path), so the simple way is enough, and
/// `*` never crosses `/`, which bounds the work per star to one path component.
fn match_from(p: &[char], n: &[char]) -> bool {
    let Some((&first, rest)) = p.split_first() else {
        return n.is_empty();
    };
    match first {
        '*' => {
            // Any run of non-separators, shortest first.
            let mut k = 0;
            loop {
                if match_from(rest, &n[k..]) {
                    return true;
                }
                if k >= n.len() || n[k] == '/' {
                    return false;
                }
                k += 1;
            }
        }
        '?' => match n.split_first() {
            Some((&c, tail)) if c != '/' => match_from(rest, tail),
            _ => false,
        },
        '[' => {
            let Some((&c, tail)) = n.split_first() else {
                return false;
            };
            let Some((hit, after)) = class(rest, c) else {
                return false;
            };
            c != '/' && hit && match_from(after, tail)
        }
        '\\' => match (rest.split_first(), n.split_first()) {
            (Some((&e, rest)), Some((&c, tail))) => e == c && match_from(rest, tail),
            _ => false,
        },
        literal => match n.split_first() {
            Some((&c, tail)) => c == literal && match_from(rest, tail),
            None => false,
        },
    }
}

/// Matches `c` against the class whose body starts at `p` (after `[`): whether it hit,
/// and the pattern after the closing `]`.
fn class(p: &[char], c: char) -> Option<(bool, &[char])> {
    let (negated, mut i) = if p.first() == Some(&'^') {
        (true, 1)
    } else {
        (false, 0)
    };
    let start = i;
    let mut hit = false;
    loop {
        let lo = match p.get(i)? {
            ']' if i > start => return Some((hit != negated, &p[i + 1..])),
            '\\' => {
                i += 1;
                *p.get(i)?
            }
            &ch => ch,
        };
        i += 1;
        let mut hi = lo;
        if p.get(i) == Some(&'-') && p.get(i + 1).is_some_and(|&ch| ch != ']') {
            hi = match p.get(i + 1)? {
                '\\' => {
                    i += 1;
                    *p.get(i + 1)?
                }
                &ch => ch,
            };
            i += 2;
        }
        if lo <= c && c <= hi {
            hit = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_like_go_filepath_match() {
        let cases = [
            ("*.so", "libcuda.so", true),
            ("*.so", "/usr/lib/libcuda.so", false),
            ("/usr/lib/*.so", "/usr/lib/libcuda.so", true),
            ("/usr/lib/*.so", "/usr/lib/tegra/libcuda.so", false),
            ("*.so.[0-9]", "libcuda.so.1", true),
            ("*.so.[0-9]", "libcuda.so.1.1", false),
            ("*.so.[^0-9]", "libcuda.so.x", true),
            ("lib?uda.so", "libcuda.so", true),
            ("lib?uda.so", "lib/uda.so", false),
            ("a\\*b", "a*b", true),
            ("a\\*b", "axb", false),
            ("nvhost-*", "nvhost-ctrl-gpu", true),
            ("nvhost-*", "nvmap", false),
            ("", "", true),
            ("*", "", true),
        ];
        for (pattern, name, want) in cases {
            let p = Pattern::new(pattern).unwrap();
            assert_eq!(p.matches(name), want, "case {pattern:?} / {name:?}");
        }
    }

    #[test]
    fn malformed_patterns_are_errors() {
        let cases = [
            ("[a-", PatternError::Unterminated),
            ("[]", PatternError::EmptyClass),
            ("abc\\", PatternError::TrailingEscape),
        ];
        for (pattern, want) in cases {
            assert_eq!(Pattern::new(pattern), Err(want), "case {pattern:?}");
        }
    }
}
