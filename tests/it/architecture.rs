//! The shape of the workspace's code, checked on every run (the book's "Layout", docs/src/guide/layout.md,
//! draws it):
//!
//! * every module imports only from modules on a lower floor of the map ([`MAP`], the book's
//!   one drawing of the house; every module is on it once, and nothing else is) or from itself:
//!   configuration and the shared vocabulary at the bottom, the wiring and then the command
//!   line at the top;
//! * the binary is `main.rs` alone, one call of the library's command line, so a service's own
//!   `main` runs every command the stock binary has;
//! * the import graph has no circle, between modules and their direct submodules, and between
//!   files (two files of one folder that import each other cannot be read, or changed, one at
//!   a time), in every crate of the workspace ([`crates`]);
//! * no file of any of them is longer than [`MAX_LINES`].
//!
//! The floors are the engine's ([`ENGINE`]); the other crates are small enough that "no circle"
//! is their whole rule, and none of them imports the pipeline (their manifests say so).
//!
//! Imports are read from the source text: every `crate::…` path (in `use` or inline) and every
//! `super::…` path, outside comments (a doc link is not a dependency).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The map of the house: the book's "Layout". Its first code block draws the floors, highest
/// first, separated by rules of `─`; each line that starts at the second column begins with the
/// modules it describes (`x.rs` or `x/`, one or more, then two spaces and the description);
/// lines that start further in continue a description.
const MAP: &str = "docs/src/guide/layout.md";

/// Floors, lowest first, as the map draws them. A module may import from a lower floor only;
/// modules on one floor are independent of each other.
fn floors() -> Vec<Vec<String>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(MAP);
    let text = std::fs::read_to_string(&path).expect("read the map (docs/src/guide/layout.md)");
    let block = text
        .split("```")
        .nth(1)
        .expect("the map has a code block drawing the floors");
    let mut floors: Vec<Vec<String>> = vec![Vec::new()];
    for line in block.lines() {
        if line.trim_start().starts_with('─') {
            floors.push(Vec::new());
            continue;
        }
        // A line naming modules starts with one space; a continuation, with many.
        let Some(rest) = line.strip_prefix(' ') else {
            continue;
        };
        if rest.starts_with(' ') || rest.is_empty() {
            continue;
        }
        let names = rest.split("  ").next().unwrap_or_default();
        for name in names.split_whitespace() {
            let module = name
                .strip_suffix(".rs")
                .or_else(|| name.strip_suffix('/'))
                .unwrap_or_else(|| panic!("{MAP}: `{name}` names no module (x.rs or x/)"));
            floors.last_mut().expect("a floor").push(module.to_owned());
        }
    }
    floors.retain(|floor| !floor.is_empty());
    floors.reverse();
    floors
}

/// The engine's source folder, whose modules the map draws.
const ENGINE: &str = "crates/dedup-worker-core/src";

/// The longest a file in any crate may be.
const MAX_LINES: usize = 500;

/// The source folders of the workspace's crates, read from the root manifest's
/// `[workspace] members` (so a crate added there is checked without a second list): the
/// engine's ([`ENGINE`]) first.
fn crates() -> Vec<String> {
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
            .expect("read Cargo.toml");
    let start = manifest
        .find("members = [")
        .expect("a [workspace] members list")
        + "members = [".len();
    let end = start + manifest[start..].find(']').expect("the members list's end");
    let mut roots: Vec<String> = manifest[start..end]
        .split(',')
        .map(|member| member.trim().trim_matches('"'))
        .filter(|member| !member.is_empty())
        .map(|member| match member {
            "." => "src".to_owned(),
            other => format!("{other}/src"),
        })
        .collect();
    roots.sort_by_key(|root| root != ENGINE);
    assert!(roots.len() > 1 && roots[0] == ENGINE, "members: {roots:?}");
    roots
}

/// The engine's source folder (the pipeline, the console, the command line).
fn src_dir() -> PathBuf {
    crate_dir(ENGINE)
}

fn crate_dir(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src/") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file under its crate's `src/`: `queue/rabbitmq/tags.rs` is
/// `["queue", "rabbitmq", "tags"]`, `queue/mod.rs` is `["queue"]`, `lib.rs` is `[]`.
fn module_path(root: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(root).expect("under the crate's folder");
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The source without comment lines.
fn code(text: &str) -> String {
    text.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths after each `prefix` (`crate::` or `super::`): `crate::a::b::C` gives `a::b::C`,
/// and `crate::{a::B, c}` gives `a::B` and `c`.
fn paths_after(code: &str, prefix: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let preceded_by_ident = rest[..at].chars().next_back().is_some_and(is_ident_char);
        let after = &rest[at + prefix.len()..];
        rest = after;
        if preceded_by_ident {
            continue;
        }
        if let Some(group) = after.strip_prefix('{') {
            // Items separated by commas at the group's own depth.
            let (mut depth, mut item) = (1, String::new());
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 || (depth == 1 && c == ',') {
                    found.push(item.trim().to_owned());
                    item.clear();
                    if depth == 0 {
                        break;
                    }
                } else {
                    item.push(c);
                }
            }
        } else {
            let path: String = after
                .chars()
                .take_while(|c| is_ident_char(*c) || *c == ':')
                .collect();
            found.push(path);
        }
    }
    found.retain(|p| !p.is_empty());
    found
}

/// The graph node a module path belongs to: the top-level module and, if it is a folder, the
/// direct submodule (`queue::rabbitmq::tags` is node `queue::rabbitmq`).
fn node_of(path: &[String], nodes: &BTreeSet<String>) -> Option<String> {
    let top = path.first()?.clone();
    if let Some(sub) = path.get(1) {
        let candidate = format!("{top}::{sub}");
        if nodes.contains(&candidate) {
            return Some(candidate);
        }
    }
    Some(top)
}

struct Graph {
    /// node -> nodes it imports from, with one file that does it (for the failure message).
    edges: BTreeMap<String, BTreeMap<String, String>>,
}

/// How finely the graph sees `src/`.
#[derive(Clone, Copy)]
enum Grain {
    /// A node per top-level module and per direct submodule of a folder (the floors' view).
    Modules,
    /// A node per file: `a/b/c.rs` is `a::b::c`, `a/b/mod.rs` is `a::b`.
    Files,
}

/// The file node a module path belongs to: its longest prefix that is a file
/// (`idempotency::layer::tx::Lent` is node `idempotency::layer::tx`).
fn file_node_of(path: &[String], nodes: &BTreeSet<String>) -> Option<String> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].join("::"))
        .find(|candidate| nodes.contains(candidate))
}

fn import_graph(root: &Path, grain: Grain) -> Graph {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let depth = match grain {
        Grain::Modules => 2,
        Grain::Files => usize::MAX,
    };
    let nodes: BTreeSet<String> = files
        .iter()
        .map(|f| module_path(root, f))
        .filter(|p| !p.is_empty())
        .map(|p| p.iter().take(depth).cloned().collect::<Vec<_>>().join("::"))
        .collect();
    let node = |path: &[String]| match grain {
        Grain::Modules => node_of(path, &nodes),
        Grain::Files => file_node_of(path, &nodes),
    };
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for file in &files {
        let module = module_path(root, file);
        let Some(from) = node(&module) else {
            continue; // lib.rs: the crate root declares every module
        };
        let text = code(&std::fs::read_to_string(file).expect("read source"));
        let is_mod_file = file.file_name().is_some_and(|n| n == "mod.rs");
        let mut targets: Vec<Vec<String>> = paths_after(&text, "crate::")
            .into_iter()
            .map(|p| p.split("::").map(str::to_owned).collect())
            .collect();
        // `super::x` in `a/b.rs` is `a::x`; in `a/mod.rs` (or `a.rs`), the crate root's `x`.
        let parent: Vec<String> = if is_mod_file {
            module[..module.len().saturating_sub(1)].to_vec()
        } else {
            module[..module.len() - 1].to_vec()
        };
        for path in paths_after(&text, "super::") {
            let mut full = parent.clone();
            full.extend(path.split("::").map(str::to_owned));
            targets.push(full);
        }
        for target in targets {
            let Some(to) = node(&target) else {
                continue;
            };
            // Paths that name no module (a macro at the crate root, `super::*`) are no edge.
            if to != from && nodes.iter().any(|n| top(n) == top(&to)) {
                edges
                    .entry(from.clone())
                    .or_default()
                    .entry(to)
                    .or_insert_with(|| file.display().to_string());
            }
        }
    }
    Graph { edges }
}

fn top(node: &str) -> &str {
    node.split("::").next().unwrap_or(node)
}

fn floor_of(floors: &[Vec<String>], module: &str) -> usize {
    floors
        .iter()
        .position(|floor| floor.iter().any(|m| m == module))
        .unwrap_or_else(|| panic!("module `{module}` is on no floor of the map ({MAP}): add it"))
}

#[test]
fn every_module_imports_only_from_lower_floors() {
    let graph = import_graph(&src_dir(), Grain::Modules);
    let floors = floors();
    let mut wrong = Vec::new();
    for (from, targets) in &graph.edges {
        for (to, file) in targets {
            let (from_top, to_top) = (top(from), top(to));
            if from_top != to_top && floor_of(&floors, to_top) >= floor_of(&floors, from_top) {
                wrong.push(format!("{from} imports {to} ({file})"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports from the same or a higher floor:\n{}",
        wrong.join("\n")
    );
}

/// The first circle of `graph` found by a depth-first search (the path to a back edge).
fn find_circle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|n| n == node) {
            let mut circle = path[start..].to_vec();
            circle.push(node.to_owned());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.edges.get(node).into_iter().flat_map(|t| t.keys()) {
            if let Some(circle) = visit(next, graph, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .edges
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_import_graph_has_no_circle() {
    for root in crates() {
        if let Some(circle) = find_circle(&import_graph(&crate_dir(&root), Grain::Modules)) {
            panic!("import circle in {root}: {}", circle.join(" -> "));
        }
    }
}

/// Inside a folder too: files that import each other round a circle (`flow.rs` → `tx.rs` →
/// `flow.rs`) cannot be read, or changed, one at a time. A folder's `mod.rs` naming its own
/// files (`mod x; pub use x::Y;`) is how a folder is built, and is no edge here (those paths are
/// relative, not `crate::` or `super::`); a file importing from its folder's `mod.rs` is.
#[test]
fn no_circle_between_files() {
    for root in crates() {
        if let Some(circle) = find_circle(&import_graph(&crate_dir(&root), Grain::Files)) {
            panic!(
                "import circle between files in {root}: {}",
                circle.join(" -> ")
            );
        }
    }
}

#[test]
fn the_map_names_every_module_once_and_nothing_else() {
    let mut on_map: Vec<String> = floors().into_iter().flatten().collect();
    on_map.sort();
    let mut files = Vec::new();
    rust_files(&src_dir(), &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|f| module_path(&src_dir(), f).first().cloned())
        .collect();
    let twice: Vec<&String> = on_map
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| &w[0])
        .collect();
    assert!(
        twice.is_empty(),
        "on more than one floor of {MAP}: {twice:?}"
    );
    let on_map: BTreeSet<String> = on_map.into_iter().collect();
    let missing: Vec<&String> = modules.difference(&on_map).collect();
    let stale: Vec<&String> = on_map.difference(&modules).collect();
    assert!(
        missing.is_empty(),
        "modules of src/ not on the map ({MAP}): {missing:?}"
    );
    assert!(
        stale.is_empty(),
        "on the map ({MAP}) but not in src/: {stale:?}"
    );
}

/// The root crate (`src/lib.rs`) is the supported surface and nothing else: it declares no module
/// of its own and hides nothing, only re-exporting the engine's prelude, `Service`, the macros and
/// the test kit, so a module added to the engine does not widen what a handler crate is promised
/// (docs/public-api/ records the surface). The engine hides nothing either: it is internal as a
/// whole, and says so, rather than public in parts that are hidden.
#[test]
fn the_root_crate_re_exports_the_surface_and_hides_nothing() {
    let root = crate_dir("src");
    let lib = code(&std::fs::read_to_string(root.join("lib.rs")).expect("read src/lib.rs"));
    let modules: Vec<&str> = lib
        .lines()
        .map(str::trim)
        .filter(|line| line.starts_with("mod ") || line.contains("mod ") && line.starts_with("pub"))
        .collect();
    assert!(
        modules.is_empty(),
        "src/lib.rs declares modules: the root crate only re-exports the engine's surface: {modules:?}"
    );
    for dir in [root, src_dir()] {
        let mut files = Vec::new();
        rust_files(&dir, &mut files);
        for file in files {
            let text = std::fs::read_to_string(&file).expect("read");
            assert!(
                !code(&text).contains("#[doc(hidden)]"),
                "{} hides an item from the docs: the root crate promises what it shows, and the \
                 engine (internal as a whole) hides nothing",
                file.display()
            );
        }
    }
}

#[test]
fn the_binary_is_the_librarys_command_line() {
    let root = crate_dir("src");
    let main = code(&std::fs::read_to_string(root.join("main.rs")).expect("read main.rs"));
    let declares_a_module = main
        .lines()
        .any(|line| line.trim_start().starts_with("mod ") || line.contains(" mod "));
    assert!(
        !declares_a_module,
        "src/main.rs declares a module: the binary's code belongs in the engine \
         (crates/dedup-worker-core/src/cli/), where a service's own main runs it too"
    );
    assert!(
        main.contains("Service::new().run()"),
        "src/main.rs does not run the stock Service's command line (Service::new().run())"
    );
    // Nothing else is in the root crate's src/: its code is the engine's
    // (crates/dedup-worker-core/src), where a service's own main runs it too.
    for entry in std::fs::read_dir(&root).expect("read src/") {
        let name = entry.expect("dir entry").file_name();
        let name = name.to_string_lossy();
        assert!(
            ["main.rs", "lib.rs"].contains(&name.as_ref()),
            "src/{name}: the root crate is lib.rs (the surface) and main.rs (the binary); code \
             belongs in the engine, crates/dedup-worker-core/src"
        );
    }
}

#[test]
fn no_file_in_any_crate_is_over_the_limit() {
    let mut files = Vec::new();
    for root in crates() {
        rust_files(&crate_dir(&root), &mut files);
    }
    let mut long: Vec<String> = files
        .iter()
        .filter_map(|file| {
            let lines = std::fs::read_to_string(file).expect("read").lines().count();
            (lines > MAX_LINES).then(|| format!("{} ({lines} lines)", file.display()))
        })
        .collect();
    long.sort();
    assert!(
        long.is_empty(),
        "over {MAX_LINES} lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_checks_see_imports_in_both_forms() {
    let text = "use crate::{queue::Transport, store::{Store, StoreTx}};\nlet x = crate::config::Settings::load(None);\n// crate::startup in a comment\n";
    let paths = paths_after(&code(text), "crate::");
    assert_eq!(
        paths,
        vec![
            "queue::Transport",
            "store::{Store, StoreTx}",
            "config::Settings::load"
        ]
    );
}
