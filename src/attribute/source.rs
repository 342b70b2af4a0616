//! Reading the program's own source, when it is at hand, to map line numbers to regions.
//!
//! Frames carry the path recorded on the training machine. The file is looked up there, or
//! under `--source-root DIR`: the recorded path's suffixes are tried below `DIR` (so
//! `/home/user/pithtrain/pithtrain/pipeline/dualpipev.py` is found as
//! `DIR/pithtrain/pipeline/dualpipev.py` or `DIR/pipeline/dualpipev.py`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Finds and caches source files.
#[derive(Debug, Default)]
pub struct SourceFiles {
    roots: Vec<PathBuf>,
    cache: HashMap<String, Option<(PathBuf, Vec<String>)>>,
}

impl SourceFiles {
    /// Looks files up at their recorded path and below each root.
    pub fn new(roots: Vec<PathBuf>) -> SourceFiles {
        SourceFiles {
            roots,
            cache: HashMap::new(),
        }
    }

    fn locate(&self, recorded: &str) -> Option<PathBuf> {
        let parts: Vec<&str> = recorded.split('/').filter(|p| !p.is_empty()).collect();
        for root in &self.roots {
            for start in 0..parts.len() {
                let candidate = parts[start..]
                    .iter()
                    .fold(root.clone(), |p, part| p.join(part));
                if candidate.is_file() {
                    return Some(candidate);
                }
            }
        }
        let direct = Path::new(recorded);
        (direct.is_absolute() && direct.is_file()).then(|| direct.to_path_buf())
    }

    /// The lines of the file recorded as `recorded`, if it can be found.
    pub fn lines(&mut self, recorded: &str) -> Option<&[String]> {
        if !self.cache.contains_key(recorded) {
            let found = self.locate(recorded).and_then(|p| {
                let text = std::fs::read_to_string(&p).ok()?;
                Some((p, text.lines().map(str::to_string).collect()))
            });
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
        let mut files = SourceFiles::new(vec![dir.path().to_path_buf()]);
        let got = files.lines("/home/user/pithtrain/pithtrain/pipeline/dualpipev.py");
        assert_eq!(got.map(|l| l.len()), Some(2));
        assert!(files.lines("/nowhere/else.py").is_none());
    }
}
