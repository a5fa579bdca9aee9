//! A crate's module graph, read from its sources, for the tests that keep the
//! architecture honest: every `crate::…`, `super::…` and `self::…` path a file names
//! is an edge from the file's module to the deepest module the path reaches.
//!
//! Two checks use it:
//! - [`Graph::floor_violations`]: `lib.rs` lists the top-level modules in floors
//!   (groups of `pub mod` lines between blank lines, lowest first); a module may use
//!   only modules on lower floors, never one on its own floor or above.
//! - [`Graph::sibling_cycles`]: inside any module, its child modules must not use
//!   each other in a circle (`server::round` → `server::service` → `server::round`).
//!
//! Line comments are skipped (an intra-doc link is not a dependency); a path inside a
//! string literal would count, which no source of ours has.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// A module's path below the crate root: `["plugin", "server", "round"]`.
pub type ModPath = Vec<String>;

#[derive(Debug, Default)]
pub struct Graph {
    /// Each module and the file that defines it.
    pub modules: BTreeMap<ModPath, PathBuf>,
    /// `from` uses something in `to`.
    pub edges: BTreeSet<(ModPath, ModPath)>,
}

/// Reads every `.rs` file under `src` (but `src/bin`) into a [`Graph`].
pub fn scan(src: &Path) -> io::Result<Graph> {
    let mut files = Vec::new();
    collect_rs(src, src, &mut files)?;
    let mut graph = Graph::default();
    for (module, path) in &files {
        graph.modules.insert(module.clone(), path.clone());
    }
    for (module, path) in &files {
        let text = fs::read_to_string(path)?;
        for target in referenced_paths(&strip_line_comments(&text)) {
            let absolute = match target.first().map(String::as_str) {
                Some("crate") => target[1..].to_vec(),
                Some("super") => {
                    let supers = target.iter().take_while(|s| *s == "super").count();
                    if supers > module.len() {
                        continue;
                    }
                    let mut base = module[..module.len() - supers].to_vec();
                    base.extend_from_slice(&target[supers..]);
                    base
                }
                Some("self") => {
                    let mut base = module.clone();
                    base.extend_from_slice(&target[1..]);
                    base
                }
                _ => continue,
            };
            if let Some(to) = graph.deepest_module(&absolute)
                && &to != module
            {
                graph.edges.insert((module.clone(), to));
            }
        }
    }
    Ok(graph)
}

impl Graph {
    fn deepest_module(&self, path: &[String]) -> Option<ModPath> {
        (1..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|p| self.modules.contains_key(p))
    }

    /// Edges that break the floors: `(from, to)` where `to` is on `from`'s floor or
    /// above it. Modules not in `floors` are ignored.
    pub fn floor_violations(&self, floors: &[Vec<String>]) -> Vec<(String, String)> {
        let floor_of = |m: &str| floors.iter().position(|f| f.iter().any(|x| x == m));
        let mut out = BTreeSet::new();
        for (from, to) in &self.edges {
            let (Some(a), Some(b)) = (from.first(), to.first()) else {
                continue;
            };
            if a == b {
                continue;
            }
            if let (Some(fa), Some(fb)) = (floor_of(a), floor_of(b))
                && fb >= fa
            {
                out.insert((from.join("::"), to.join("::")));
            }
        }
        out.into_iter().collect()
    }

    /// Circles among the children of one module, each as its members' paths.
    pub fn sibling_cycles(&self) -> Vec<Vec<String>> {
        let mut sibling_edges: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
        for (from, to) in &self.edges {
            let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
            if common == from.len() || common == to.len() {
                continue; // a module and one of its ancestors
            }
            sibling_edges
                .entry(from[..=common].to_vec())
                .or_default()
                .insert(to[..=common].to_vec());
        }
        strongly_connected(&sibling_edges)
            .into_iter()
            .filter(|c| c.len() > 1)
            .map(|c| c.iter().map(|m| m.join("::")).collect())
            .collect()
    }
}

/// The floors `lib.rs` declares: runs of `pub mod x;` lines, split at blank lines.
pub fn floors_from_lib(lib_rs: &str) -> Vec<Vec<String>> {
    let mut floors = vec![Vec::new()];
    for line in lib_rs.lines() {
        let line = line.trim();
        if line.is_empty() {
            if floors.last().is_some_and(|f| !f.is_empty()) {
                floors.push(Vec::new());
            }
        } else if let Some(name) = line
            .strip_prefix("pub mod ")
            .or_else(|| line.strip_prefix("mod "))
            .and_then(|rest| rest.strip_suffix(';'))
            && let Some(floor) = floors.last_mut()
        {
            floor.push(name.trim().to_string());
        }
    }
    floors.retain(|f| !f.is_empty());
    floors
}

fn collect_rs(src: &Path, dir: &Path, out: &mut Vec<(ModPath, PathBuf)>) -> io::Result<()> {
    let mut entries: Vec<_> = fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(fs::DirEntry::file_name);
    for entry in entries {
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            if path != src.join("bin") {
                collect_rs(src, &path, out)?;
            }
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let Ok(rel) = path.strip_prefix(src) else {
            continue;
        };
        let mut module: ModPath = rel
            .with_extension("")
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if module.last().is_some_and(|m| m == "mod") {
            module.pop();
        }
        if module == ["lib"] || module == ["main"] {
            module.clear();
        }
        out.push((module, path));
    }
    Ok(())
}

fn strip_line_comments(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every path that starts with `crate`, `super` or `self`, with `use` groups
/// (`crate::{a, b::{c, d}}`) expanded.
fn referenced_paths(text: &str) -> Vec<Vec<String>> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts_word = i == 0 || !is_ident(chars[i - 1]) && chars[i - 1] != ':';
        if starts_word && is_ident(chars[i]) {
            let (word, end) = ident_at(&chars, i);
            if matches!(word.as_str(), "crate" | "super" | "self") && at(&chars, end, "::") {
                let mut paths = Vec::new();
                let end = use_tree(&chars, i, Vec::new(), &mut paths);
                out.extend(paths);
                i = end.max(i + 1);
                continue;
            }
            i = end;
            continue;
        }
        i += 1;
    }
    out
}

/// Parses the use tree at `i` (a path, maybe ending in `::{…}` or `::*`), pushing
/// each leaf path (prefixed by `prefix`) to `out`; returns where it ended.
fn use_tree(
    chars: &[char],
    mut i: usize,
    prefix: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    let mut path = prefix;
    loop {
        i = skip_ws(chars, i);
        if i < chars.len() && chars[i] == '{' {
            i += 1;
            loop {
                i = skip_ws(chars, i);
                if i >= chars.len() {
                    return i;
                }
                match chars[i] {
                    '}' => return i + 1,
                    ',' => i += 1,
                    _ => {
                        let before = i;
                        i = use_tree(chars, i, path.clone(), out);
                        if i == before {
                            i += 1;
                        }
                    }
                }
            }
        }
        if i < chars.len() && is_ident(chars[i]) {
            let (word, end) = ident_at(chars, i);
            path.push(word);
            i = end;
            if at(chars, skip_ws(chars, i), "::") {
                i = skip_ws(chars, i) + 2;
                continue;
            }
        }
        out.push(path);
        return i;
    }
}

fn strongly_connected(edges: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<Vec<ModPath>> {
    // Tarjan's algorithm; the graphs are a few hundred nodes, recursion is fine.
    struct State<'a> {
        edges: &'a BTreeMap<ModPath, BTreeSet<ModPath>>,
        index: BTreeMap<ModPath, (usize, usize)>,
        stack: Vec<ModPath>,
        on_stack: BTreeSet<ModPath>,
        next: usize,
        out: Vec<Vec<ModPath>>,
    }
    fn visit(s: &mut State<'_>, v: &ModPath) {
        s.index.insert(v.clone(), (s.next, s.next));
        s.next += 1;
        s.stack.push(v.clone());
        s.on_stack.insert(v.clone());
        for w in s.edges.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.index[w].1;
                if let Some(e) = s.index.get_mut(v) {
                    e.1 = e.1.min(lw);
                }
            } else if s.on_stack.contains(w) {
                let iw = s.index[w].0;
                if let Some(e) = s.index.get_mut(v) {
                    e.1 = e.1.min(iw);
                }
            }
        }
        let (iv, lv) = s.index[v];
        if iv == lv {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(&w);
                let done = &w == v;
                comp.push(w);
                if done {
                    break;
                }
            }
            s.out.push(comp);
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn ident_at(chars: &[char], i: usize) -> (String, usize) {
    let end = (i..chars.len())
        .find(|&j| !is_ident(chars[j]))
        .unwrap_or(chars.len());
    (chars[i..end].iter().collect(), end)
}

fn at(chars: &[char], i: usize, s: &str) -> bool {
    s.chars()
        .enumerate()
        .all(|(k, c)| chars.get(i + k) == Some(&c))
}

fn skip_ws(chars: &[char], mut i: usize) -> usize {
    while i < chars.len() && chars[i].is_whitespace() {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = dir.path().join(path);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        }
        dir
    }

    #[test]
    fn use_groups_expand_to_every_leaf() {
        let paths = referenced_paths("use crate::{a::{b, c::D}, e};\nlet x = super::f::g();");
        assert_eq!(
            paths,
            vec![
                vec!["crate", "a", "b"],
                vec!["crate", "a", "c", "D"],
                vec!["crate", "e"],
                vec!["super", "f", "g"],
            ]
        );
    }

    #[test]
    fn floors_and_cycles_are_found() {
        let dir = tree(&[
            (
                "lib.rs",
                "pub mod low;\n\npub mod mid;\npub mod side;\n\npub mod top;\n",
            ),
            (
                "low.rs",
                "use crate::top::X; // crate::side::Y in a comment\n",
            ),
            ("mid.rs", "use crate::side::Y;\n"),
            ("side.rs", ""),
            ("top/mod.rs", "mod a;\nmod b;\n"),
            ("top/a.rs", "use super::b::Z;\n"),
            ("top/b.rs", "use crate::top::a::W;\n"),
        ]);
        let graph = scan(dir.path()).unwrap();
        let floors = floors_from_lib(&fs::read_to_string(dir.path().join("lib.rs")).unwrap());
        assert_eq!(floors, vec![vec!["low"], vec!["mid", "side"], vec!["top"]]);
        assert_eq!(
            graph.floor_violations(&floors),
            vec![
                ("low".to_string(), "top".to_string()),
                ("mid".to_string(), "side".to_string())
            ]
        );
        assert_eq!(graph.sibling_cycles().len(), 1);
    }
}
