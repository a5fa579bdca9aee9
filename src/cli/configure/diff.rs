//! A unified diff of two texts, line by line, as `diff -u` prints it (three lines of context),
//! so a user sees exactly what `nvshim configure` changes before and after it writes.
//!
//! Config files are small and our edits local: the common head and tail are cut first and a
//! longest-common-subsequence table is built for the rest only. Past [`MAX_TABLE`] cells the
//! middle is shown as removed-then-added, which is still a correct diff.

use std::fmt::Write as _;

const CONTEXT: usize = 3;
/// Cells of the LCS table we are willing to fill (about 4 MB).
const MAX_TABLE: usize = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Keep,
    Delete,
    Insert,
}

/// `old` → `new` as a unified diff with `---`/`+++` headers; empty if the texts are equal.
pub(crate) fn unified(old: &str, new: &str, old_label: &str, new_label: &str) -> String {
    if old == new {
        return String::new();
    }
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let ops = script(&a, &b);
    let mut out = format!("--- {old_label}\n+++ {new_label}\n");
    for hunk in hunks(&ops) {
        write_hunk(&mut out, &ops[hunk.0..hunk.1], &a, &b, &ops[..hunk.0]);
    }
    if old.ends_with('\n') != new.ends_with('\n') && !old.is_empty() && !new.is_empty() {
        out.push_str("\\ the two versions differ in the final newline\n");
    }
    out
}

/// The edit script: one op per line of `a` (Keep/Delete) and of `b` (Keep/Insert).
fn script(a: &[&str], b: &[&str]) -> Vec<Op> {
    let head = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let tail = a[head..]
        .iter()
        .rev()
        .zip(b[head..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (ma, mb) = (&a[head..a.len() - tail], &b[head..b.len() - tail]);
    let mut ops = vec![Op::Keep; head];
    if ma.len().saturating_mul(mb.len()) > MAX_TABLE {
        ops.extend(std::iter::repeat_n(Op::Delete, ma.len()));
        ops.extend(std::iter::repeat_n(Op::Insert, mb.len()));
    } else {
        ops.extend(lcs(ma, mb));
    }
    ops.extend(std::iter::repeat_n(Op::Keep, tail));
    ops
}

fn lcs(a: &[&str], b: &[&str]) -> Vec<Op> {
    let (n, m) = (a.len(), b.len());
    // len[i][j]: LCS of a[i..] and b[j..]
    let mut len = vec![0u32; (n + 1) * (m + 1)];
    let at = |i: usize, j: usize| i * (m + 1) + j;
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            len[at(i, j)] = if a[i] == b[j] {
                len[at(i + 1, j + 1)] + 1
            } else {
                len[at(i + 1, j)].max(len[at(i, j + 1)])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut ops = Vec::with_capacity(n + m);
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            ops.push(Op::Keep);
            i += 1;
            j += 1;
        } else if i < n && (j == m || len[at(i + 1, j)] >= len[at(i, j + 1)]) {
            // Deletions first, as diff prints them.
            ops.push(Op::Delete);
            i += 1;
        } else {
            ops.push(Op::Insert);
            j += 1;
        }
    }
    ops
}

/// Ranges of `ops` to print: each change with up to [`CONTEXT`] kept lines around it, ranges
/// that touch merged.
fn hunks(ops: &[Op]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (k, op) in ops.iter().enumerate() {
        if *op == Op::Keep {
            continue;
        }
        let start = k.saturating_sub(CONTEXT);
        let end = (k + 1 + CONTEXT).min(ops.len());
        match out.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => out.push((start, end)),
        }
    }
    out
}

fn write_hunk(out: &mut String, ops: &[Op], a: &[&str], b: &[&str], before: &[Op]) {
    let a_start = before.iter().filter(|o| **o != Op::Insert).count();
    let b_start = before.iter().filter(|o| **o != Op::Delete).count();
    let a_len = ops.iter().filter(|o| **o != Op::Insert).count();
    let b_len = ops.iter().filter(|o| **o != Op::Delete).count();
    // diff -u numbers an empty range by the line before it.
    let first = |start: usize, len: usize| if len == 0 { start } else { start + 1 };
    let _ = writeln!(
        out,
        "@@ -{},{a_len} +{},{b_len} @@",
        first(a_start, a_len),
        first(b_start, b_len)
    );
    let (mut i, mut j) = (a_start, b_start);
    for op in ops {
        match op {
            Op::Keep => {
                let _ = writeln!(out, " {}", a[i]);
                i += 1;
                j += 1;
            }
            Op::Delete => {
                let _ = writeln!(out, "-{}", a[i]);
                i += 1;
            }
            Op::Insert => {
                let _ = writeln!(out, "+{}", b[j]);
                j += 1;
            }
        }
    }
}
