//! Reading the program's own source, when the user points memsnap at it, to map line numbers
//! to regions and methods to classes.
//!
//! Frames carry the path recorded on the training machine, and a snapshot is untrusted input:
//! it may name any file (`/proc/self/pagemap`, a sparse 6 GiB file, a secret). So a file is
//! read only where the user allowed it:
//! - below `--source-root DIR`: the recorded path's suffixes are tried below `DIR` (so
//!   `/home/user/pithtrain/pithtrain/pipeline/dualpipev.py` is found as
//!   `DIR/pithtrain/pipeline/dualpipev.py` or `DIR/pipeline/dualpipev.py`), and the file found
//!   must lie inside `DIR` once links are resolved;
//! - at the recorded path itself only with `--recorded-sources`.
//!
//! Either way only regular files named `*.py` are read, each at most [`MAX_FILE_BYTES`] and
//! [`MAX_FILE_LINES`], and all of them together at most [`MAX_TOTAL_COST`] of memory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The largest source file read.
pub const MAX_FILE_BYTES: u64 = 4 << 20;
/// The most lines of a source file read (a file of newlines costs more as lines than bytes).
pub const MAX_FILE_LINES: usize = 200_000;
/// The memory all source files read may take together: their bytes and a line's overhead.
pub const MAX_TOTAL_COST: u64 = 64 << 20;
/// What a line costs beyond its bytes (a `String`'s header and the allocator's rounding).
const LINE_OVERHEAD: u64 = 48;
/// Recorded paths with more parts than this are not looked up below a root.
const MAX_PARTS: usize = 64;

/// Finds and caches source files.
#[derive(Debug, Default)]
pub struct SourceFiles {
    /// Each root as given and resolved (links followed), for the containment check.
    roots: Vec<(PathBuf, PathBuf)>,
    recorded: bool,
    cache: HashMap<String, Option<(PathBuf, Vec<String>)>>,
    spent: u64,
}

impl SourceFiles {
    /// Looks files up below each root, and at their recorded path when `recorded`.
    pub fn new(roots: Vec<PathBuf>, recorded: bool) -> SourceFiles {
        let roots = roots
            .into_iter()
            .filter_map(|r| {
                let resolved = std::fs::canonicalize(&r).ok()?;
                Some((r, resolved))
            })
            .collect();
        SourceFiles {
            roots,
            recorded,
            cache: HashMap::new(),
            spent: 0,
        }
    }

    fn locate(&self, recorded: &str) -> Option<PathBuf> {
        if !recorded.ends_with(".py") {
            return None;
        }
        let parts: Vec<&str> = recorded
            .split('/')
            .filter(|p| !p.is_empty() && *p != "." && *p != "..")
            .collect();
        let parts = &parts[parts.len().saturating_sub(MAX_PARTS)..];
        for (root, resolved_root) in &self.roots {
            for start in 0..parts.len() {
                let candidate = parts[start..]
                    .iter()
                    .fold(root.clone(), |p, part| p.join(part));
                let inside =
                    std::fs::canonicalize(&candidate).is_ok_and(|c| c.starts_with(resolved_root));
                if inside && candidate.is_file() {
                    return Some(candidate);
                }
            }
        }
        let direct = Path::new(recorded);
        (self.recorded && direct.is_absolute() && direct.is_file()).then(|| direct.to_path_buf())
    }

    /// The file's lines within the limits, or `None` when it is no regular file or too large.
    fn read(&mut self, path: &Path) -> Option<Vec<String>> {
        let bytes = crate::output::read_small(path, MAX_FILE_BYTES).ok()?;
        let text = String::from_utf8(bytes).ok()?;
        let count = text.lines().take(MAX_FILE_LINES + 1).count();
        let cost = text.len() as u64 + LINE_OVERHEAD * count as u64;
        if count > MAX_FILE_LINES || self.spent + cost > MAX_TOTAL_COST {
            return None;
        }
        self.spent += cost;
        Some(text.lines().map(str::to_string).collect())
    }

    /// The lines of the file recorded as `recorded`, if it can be found.
    pub fn lines(&mut self, recorded: &str) -> Option<&[String]> {
        if !self.cache.contains_key(recorded) {
            let found = self
                .locate(recorded)
                .and_then(|p| Some((p.clone(), self.read(&p)?)));
            self.cache.insert(recorded.to_string(), found);
        }
        self.cache
            .get(recorded)
            .and_then(|l| l.as_ref())
            .map(|(_, lines)| lines.as_slice())
    }

    /// Where the file recorded as `recorded` was read from, once [`SourceFiles::lines`] found
    /// it.
    pub fn resolved(&self, recorded: &str) -> Option<&str> {
        self.cache
            .get(recorded)
            .and_then(|l| l.as_ref())
            .and_then(|(p, _)| p.to_str())
    }
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// Regions of a function body delimited by marker comments such as `# Step 3: ...` or
/// `# Stage 2. ...`: `(number, first line, last line)`, 1-based and inclusive.
///
/// The function is the `def NAME(` that encloses `anchor_line` (a line recorded inside it). A
/// region runs from its marker to the line before the next marker; the last one ends with the
/// block that follows its marker (the loop and its body), so code after it (`assert ...`,
/// `return ...`) belongs to no region.
pub fn marker_regions(
    lines: &[String],
    function: &str,
    anchor_line: u32,
    marker: &regex::Regex,
) -> Vec<(u32, u32, u32)> {
    let anchor = (anchor_line as usize).saturating_sub(1).min(lines.len());
    let def = format!("def {function}(");
    let Some(start) = (0..=anchor.min(lines.len().saturating_sub(1)))
        .rev()
        .find(|&i| lines[i].trim_start().starts_with(&def))
    else {
        return Vec::new();
    };
    let def_indent = indent(&lines[start]);
    let end = (start + 1..lines.len())
        .find(|&i| !lines[i].trim().is_empty() && indent(&lines[i]) <= def_indent)
        .unwrap_or(lines.len());
    let mut marks: Vec<(u32, usize)> = Vec::new();
    for (i, line) in lines.iter().enumerate().take(end).skip(start + 1) {
        if let Some(c) = marker.captures(line) {
            if let Some(n) = c.get(1).and_then(|m| m.as_str().parse::<u32>().ok()) {
                marks.push((n, i));
            }
        }
    }
    let mut out = Vec::new();
    for (k, &(n, at)) in marks.iter().enumerate() {
        let last = match marks.get(k + 1) {
            Some(&(_, next)) => next - 1,
            None => last_block_end(lines, at, end),
        };
        out.push((n, at as u32 + 1, last as u32 + 1));
    }
    out
}

/// The last line of the statements that follow a marker at `at`: lines at the marker's
/// indentation up to and including the first compound statement (`for`, `while`, `with`,
/// `if`) and its indented body.
fn last_block_end(lines: &[String], at: usize, end: usize) -> usize {
    let base = indent(&lines[at]);
    let mut last = at;
    let mut i = at + 1;
    while i < end {
        let line = &lines[i];
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            i += 1;
            continue;
        }
        if indent(line) < base {
            break;
        }
        last = i;
        let t = line.trim_start();
        if ["for ", "while ", "with ", "if "]
            .iter()
            .any(|k| t.starts_with(k))
        {
            let mut j = i + 1;
            while j < end {
                let l = &lines[j];
                if !l.trim().is_empty() && indent(l) <= base {
                    break;
                }
                if !l.trim().is_empty() {
                    last = j;
                }
                j += 1;
            }
            return last;
        }
        i += 1;
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    const STEP: &str = "class P:
    def step(self):
        x = 1
        # Step 1: nF0
        step_1 = 2
        for i in range(step_1):
            self._forward_chunk(0)

        # Step 2: nB
        step_2 = 1
        for i in range(step_2):
            self._backward_chunk(1)
            self._weight_chunk()
        assert done
        return x

    def other(self):
        # Step 9: not in step()
        pass
";

    fn lines(s: &str) -> Vec<String> {
        s.lines().map(str::to_string).collect()
    }

    #[test]
    fn step_regions_end_at_the_next_marker_or_the_loop() {
        let re = regex::Regex::new(r"^\s*#\s*Step\s+(\d+)").unwrap();
        let regions = marker_regions(&lines(STEP), "step", 7, &re);
        assert_eq!(regions, vec![(1, 4, 8), (2, 9, 13)]);
        assert!(marker_regions(&lines(STEP), "nothing", 7, &re).is_empty());
    }

    #[test]
    fn files_are_found_below_a_root_by_suffix() {
        let dir = tempfile::tempdir().unwrap();
        let pkg = dir.path().join("pipeline");
        std::fs::create_dir_all(&pkg).unwrap();
        std::fs::write(pkg.join("dualpipev.py"), "a\nb\n").unwrap();
        let mut files = SourceFiles::new(vec![dir.path().to_path_buf()], false);
        let got = files.lines("/home/user/pithtrain/pithtrain/pipeline/dualpipev.py");
        assert_eq!(got.map(|l| l.len()), Some(2));
        assert!(files.lines("/nowhere/else.py").is_none());
    }

    #[test]
    fn only_allowed_python_files_within_the_limits_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        let outside = dir.path().join("secret.py");
        std::fs::write(&outside, "token = 1\n").unwrap();
        std::fs::write(root.join("notes.txt"), "a\n").unwrap();
        std::fs::write(
            root.join("big.py"),
            vec![b'\n'; MAX_FILE_BYTES as usize + 1],
        )
        .unwrap();
        std::fs::write(root.join("lines.py"), vec![b'\n'; MAX_FILE_LINES + 1]).unwrap();
        let recorded = outside.to_str().unwrap().to_string();
        // The recorded path is read only when allowed.
        let mut files = SourceFiles::new(vec![root.clone()], false);
        assert!(files.lines(&recorded).is_none());
        assert!(SourceFiles::new(vec![], true).lines(&recorded).is_some());
        // `..` cannot climb out of a root, nor can a link.
        assert!(files.lines("x/../../secret.py").is_none());
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(&outside, root.join("link.py")).unwrap();
            assert!(files.lines("/far/away/link.py").is_none());
            std::os::unix::fs::symlink("/proc/self/pagemap", root.join("pagemap.py")).unwrap();
            let mut anything = SourceFiles::new(vec![], true);
            assert!(anything.lines("/proc/self/pagemap").is_none());
            assert!(anything
                .lines(root.join("pagemap.py").to_str().unwrap())
                .is_none());
        }
        // Not Python, too large, too many lines.
        assert!(files.lines("/x/notes.txt").is_none());
        assert!(files.lines("/x/big.py").is_none());
        assert!(files.lines("/x/lines.py").is_none());
        assert_eq!(files.spent, 0);
    }

    #[test]
    fn all_sources_together_stay_within_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let line = "x = 1\n".repeat(150_000);
        let per_file = line.len() as u64 + LINE_OVERHEAD * 150_000;
        let n = (MAX_TOTAL_COST / per_file) as usize + 2;
        for k in 0..n {
            std::fs::write(dir.path().join(format!("m{k}.py")), &line).unwrap();
        }
        let mut files = SourceFiles::new(vec![dir.path().to_path_buf()], false);
        let read = (0..n)
            .filter(|k| files.lines(&format!("/a/m{k}.py")).is_some())
            .count();
        assert_eq!(read, (MAX_TOTAL_COST / per_file) as usize);
        assert!(files.spent <= MAX_TOTAL_COST);
    }
}
