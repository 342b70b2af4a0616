//! Pinned outputs: every text view (report, compare, oom, whatif, the folded flamegraph) as
//! text, Markdown and JSON on the bundled snapshots, compared byte for byte with the files in
//! `tests/golden/`; and every sample in the README and `docs/` compared with the output of the
//! command shown beside it. `MEMSNAP_BLESS=1 cargo test golden` rewrites both from what the
//! binary prints now (then review the diff), as inferno's `INFERNO_BLESS_TESTS` does.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::stderr;

/// Whether the pinned outputs are to be rewritten instead of compared.
fn bless() -> bool {
    std::env::var_os("MEMSNAP_BLESS").is_some_and(|v| v != "0" && !v.is_empty())
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Compares `actual` with the pinned file (or writes it when blessing); the first differing
/// line is shown on failure.
fn pinned(name: &str, actual: &str) -> Result<(), String> {
    let path = root().join("tests/golden").join(name);
    if bless() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return Ok(());
    }
    let expected = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "{}: {e} (MEMSNAP_BLESS=1 cargo test golden writes it)",
            path.display()
        )
    })?;
    if expected == actual {
        return Ok(());
    }
    Err(format!("{name}: {}", first_difference(&expected, actual)))
}

/// Where two texts part: the line number and both lines.
fn first_difference(expected: &str, actual: &str) -> String {
    let (e, a): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), actual.lines().collect());
    for i in 0..e.len().max(a.len()) {
        let (x, y) = (e.get(i), a.get(i));
        if x != y {
            return format!(
                "line {}: expected {:?}, got {:?} (MEMSNAP_BLESS=1 cargo test golden rewrites the pinned outputs)",
                i + 1,
                x.unwrap_or(&"<end>"),
                y.unwrap_or(&"<end>")
            );
        }
    }
    "the texts differ in line endings".into()
}

/// The views pinned, by the file that holds each: `memsnap ARGS` run in the repository root.
const VIEWS: &[(&str, &str)] = &[
    (
        "report-single-gpu.txt",
        "report testdata/snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz --by category,step,stage,op,site,phase,annotation",
    ),
    (
        "report-single-gpu.md",
        "report --markdown testdata/snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz",
    ),
    (
        "report-single-gpu.json",
        "report --json testdata/snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz",
    ),
    (
        "report-pipeline.txt",
        "report testdata/snapshots/pithtrain-peak/memory_snapshot_rank0_peak_step0.pickle.xz --by category,step,op,stage",
    ),
    (
        "report-lightning.txt",
        "report testdata/snapshots/programs/memory_snapshot_lightning_auto.pickle.xz",
    ),
    (
        "report-rounded.txt",
        "report --sizes rounded testdata/snapshots/fsdp/memory_snapshot_rank0_step1.pickle.xz",
    ),
    (
        "compare-fsdp.txt",
        "compare testdata/snapshots/fsdp/memory_snapshot_rank0_step1.pickle.xz testdata/snapshots/fsdp/memory_snapshot_rank1_step1.pickle.xz",
    ),
    (
        "compare-fsdp.md",
        "compare --markdown testdata/snapshots/fsdp/memory_snapshot_rank0_step1.pickle.xz testdata/snapshots/fsdp/memory_snapshot_rank1_step1.pickle.xz",
    ),
    (
        "compare-fsdp.json",
        "compare --json testdata/snapshots/fsdp/memory_snapshot_rank0_step1.pickle.xz testdata/snapshots/fsdp/memory_snapshot_rank1_step1.pickle.xz",
    ),
    (
        "compare-ranks.txt",
        "compare testdata/snapshots/pithtrain-peak",
    ),
    (
        "compare-ranks.md",
        "compare --markdown testdata/snapshots/pithtrain-peak",
    ),
    (
        "oom-cap-mid.txt",
        "oom testdata/snapshots/allocator/cap_mid.pickle.xz --cap 2581594112",
    ),
    (
        "oom-cap-mid.json",
        "oom --json testdata/snapshots/allocator/cap_mid.pickle.xz --cap 2581594112",
    ),
    (
        "oom-survived.txt",
        "oom testdata/snapshots/programs/memory_snapshot_oom_survived.pickle.xz",
    ),
    (
        "whatif-default.txt",
        "whatif testdata/snapshots/allocator/default.pickle.xz --cap 2.3GiB --try expandable_segments:True --try max_split_size_mb:64 --min-cap",
    ),
    (
        "whatif-default.json",
        "whatif --json testdata/snapshots/allocator/default.pickle.xz --cap 2.3GiB --try expandable_segments:True",
    ),
    (
        "whatif-scale-eager.md",
        "whatif --markdown --scale testdata/snapshots/sweeps/eager/memory_snapshot_eager_256.pickle.xz=256 testdata/snapshots/sweeps/eager/memory_snapshot_eager_512.pickle.xz=512 testdata/snapshots/sweeps/eager/memory_snapshot_eager_1024.pickle.xz=1024 --to 2048 --cap 20021773414 --try expandable_segments:True --min-cap",
    ),
    (
        "whatif-scale-pipeline.txt",
        "whatif --scale testdata/snapshots/sweeps/pipe/memory_snapshot_rank0_pp2n6_step0.pickle.xz=6 testdata/snapshots/sweeps/pipe/memory_snapshot_rank0_pp2n8_step0.pickle.xz=8 --to 16 32",
    ),
    (
        "whatif-scale-one.json",
        "whatif --json --scale testdata/snapshots/sweeps/pipe/memory_snapshot_rank1_pp2n8_step0.pickle.xz=8 --to 16",
    ),
    (
        "flamegraph-single-gpu.folded",
        "flamegraph --folded testdata/snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz",
    ),
    (
        "flamegraph-pipeline-stage.folded",
        "flamegraph --folded --root stage testdata/snapshots/pithtrain-peak/memory_snapshot_rank1_peak_step0.pickle.xz",
    ),
];

#[test]
fn views_are_pinned() {
    let mut failures = Vec::new();
    for (name, command) in VIEWS {
        let args: Vec<&str> = command.split_whitespace().collect();
        let o = Command::new(env!("CARGO_BIN_EXE_memsnap"))
            .args(&args)
            .current_dir(root())
            .output()
            .unwrap();
        if !o.status.success() {
            failures.push(format!("memsnap {command}: {}", stderr(&o)));
            continue;
        }
        if let Err(e) = pinned(name, &String::from_utf8_lossy(&o.stdout)) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A command shown in a document and what the document says it prints.
#[derive(Debug)]
struct Sample {
    /// The document and the line of the command.
    place: String,
    /// The command line after `$ `.
    command: String,
    /// The indentation of the block, taken off its lines.
    indent: String,
    /// The lines the document shows after it.
    output: String,
    /// Byte range of `output` in the document, to rewrite it when blessing.
    span: std::ops::Range<usize>,
}

/// The ```` ```console ```` blocks of a document: each `$ memsnap ...` line and the lines below
/// it up to the next `$ ` line or the block's end. A block indented (inside a list item) has
/// its indentation taken off its lines.
fn samples(doc: &Path, text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    let mut indent: Option<String> = None;
    let mut current: Option<Sample> = None;
    let mut at = 0;
    for (n, line) in text.split_inclusive('\n').enumerate() {
        at += line.len();
        let trimmed = line.trim_end();
        let Some(pad) = &indent else {
            if trimmed.trim_start() == "```console" {
                indent = Some(trimmed[..trimmed.len() - "```console".len()].to_string());
            }
            continue;
        };
        let inner = trimmed
            .strip_prefix(pad.as_str())
            .unwrap_or(trimmed.trim_start());
        if inner == "```" || inner.starts_with("$ ") {
            out.extend(current.take());
            if inner == "```" {
                indent = None;
                continue;
            }
            current = Some(Sample {
                place: format!("{}:{}", doc.display(), n + 1),
                command: inner[2..].to_string(),
                indent: pad.clone(),
                output: String::new(),
                span: at..at,
            });
            continue;
        }
        if let Some(s) = &mut current {
            s.output
                .push_str(line.strip_prefix(pad.as_str()).unwrap_or(line));
            s.span.end = at;
        }
    }
    out
}

/// `text` with `indent` in front of every line that is not empty.
fn indent_lines(text: &str, indent: &str) -> String {
    text.split_inclusive('\n')
        .map(|l| {
            if l.trim().is_empty() {
                l.trim_start_matches([' ', '\t']).to_string()
            } else {
                format!("{indent}{l}")
            }
        })
        .collect()
}

/// A scratch folder where the documents' commands run: `testdata` and `examples` are links
/// to the repository's, so the files they write land in the scratch folder.
fn playground() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for name in ["testdata", "examples"] {
        #[cfg(unix)]
        std::os::unix::fs::symlink(root().join(name), dir.path().join(name)).unwrap();
        #[cfg(not(unix))]
        let _ = name;
    }
    dir
}

/// Runs one document command line through `sh` (globs, pipes) with this `memsnap` first on
/// the `PATH`; its standard output, or why it failed.
fn run_shell(line: &str, cwd: &Path) -> Result<String, String> {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_memsnap"));
    let path = std::env::join_paths(std::iter::once(bin.parent().unwrap().to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    let o = Command::new("sh")
        .arg("-c")
        .arg(line)
        .current_dir(cwd)
        .env("PATH", path)
        .output()
        .unwrap();
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    } else {
        Err(format!("exit {:?}: {}", o.status.code(), stderr(&o)))
    }
}

/// The README, the agent skill and every page of `docs/`.
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![
        root().join("README.md"),
        root().join("skills/memsnap/SKILL.md"),
    ];
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    pages.sort();
    docs.extend(pages);
    docs
}

#[cfg(unix)]
#[test]
fn document_samples_are_what_the_commands_print() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let rel = doc.strip_prefix(root()).unwrap().to_path_buf();
        let found = samples(&rel, &text);
        let mut blessed = text.clone();
        // rewritten from the end, so earlier spans stay where they are
        for s in found.iter().rev() {
            assert!(
                s.command.starts_with("memsnap "),
                "{}: a console sample runs memsnap: {}",
                s.place,
                s.command
            );
            checked += 1;
            let play = playground();
            match run_shell(&s.command, play.path()) {
                Ok(actual) if bless() => {
                    blessed.replace_range(s.span.clone(), &indent_lines(&actual, &s.indent))
                }
                Ok(actual) if actual == s.output => {}
                Ok(actual) => failures.push(format!(
                    "{} `{}`: {}",
                    s.place,
                    s.command,
                    first_difference(&s.output, &actual)
                )),
                Err(e) => failures.push(format!("{} `{}`: {e}", s.place, s.command)),
            }
        }
        if bless() && blessed != text {
            std::fs::write(&doc, blessed).unwrap();
        }
    }
    assert!(checked >= 5, "only {checked} samples found");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every `memsnap` line of the documents' ```` ```sh ```` blocks that names a file of this
/// repository runs and succeeds (its output is not shown, so it is not compared).
#[cfg(unix)]
#[test]
fn document_commands_run() {
    let mut failures = Vec::new();
    let mut ran = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let mut in_sh = false;
        // the block's `NAME=value` lines, set before each of its commands
        let mut assignments = String::new();
        for (n, line) in text.lines().enumerate() {
            let t = line.trim();
            if !in_sh {
                in_sh = t == "```sh";
                assignments.clear();
                continue;
            }
            if t == "```" {
                in_sh = false;
                continue;
            }
            if is_assignment(t) {
                assignments.push_str(t);
                assignments.push('\n');
                continue;
            }
            // a trailing `# comment` says what the line does
            let command = match t.find("  #") {
                Some(i) => t[..i].trim_end(),
                None => t,
            };
            let names_ours = command.contains("testdata/")
                || (command.contains('$') && assignments.contains("testdata/"));
            if !command.starts_with("memsnap ") || !names_ours {
                continue;
            }
            ran += 1;
            // each command in a folder of its own: the files one writes do not meet the next
            let play = playground();
            if let Err(e) = run_shell(&format!("{assignments}{command}"), play.path()) {
                failures.push(format!(
                    "{}:{} `{command}`: {e}",
                    doc.strip_prefix(root()).unwrap().display(),
                    n + 1
                ));
            }
        }
    }
    assert!(ran >= 5, "only {ran} commands found");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `F=testdata/...`: a shell variable set for the block's commands.
fn is_assignment(line: &str) -> bool {
    line.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c == '_')
    })
}

#[test]
fn samples_are_found_with_their_output() {
    assert!(is_assignment("F=testdata/a.pickle"));
    assert!(!is_assignment("memsnap report --by=step"));
    let doc = "text\n```console\n$ memsnap report a\nline 1\nline 2\n$ memsnap oom b\nx\n```\n```sh\n$ not this\n```\n";
    let found = samples(Path::new("d.md"), doc);
    assert_eq!(found.len(), 2);
    assert_eq!(found[0].command, "memsnap report a");
    assert_eq!(found[0].output, "line 1\nline 2\n");
    assert_eq!(&doc[found[0].span.clone()], "line 1\nline 2\n");
    assert_eq!(found[1].output, "x\n");
    assert_eq!(found[1].place, "d.md:6");
    // inside a list item
    let doc = "- item\n\n  ```console\n  $ memsnap report a\n  row\n\n  row 2\n  ```\n";
    let found = samples(Path::new("d.md"), doc);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].output, "row\n\nrow 2\n");
    assert_eq!(indent_lines(&found[0].output, "  "), "  row\n\n  row 2\n");
}

/// The README's pictures are what the commands in their captions draw, byte for byte (the
/// font is built in, so a chart is the same on every machine).
#[test]
fn the_example_pictures_are_what_the_commands_draw() {
    let dir = tempfile::tempdir().unwrap();
    let drawn = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let peak = "testdata/snapshots/pithtrain-peak";
    let rank0 = format!("{peak}/memory_snapshot_rank0_peak_step0.pickle.xz");
    let rank1 = format!("{peak}/memory_snapshot_rank1_peak_step0.pickle.xz");
    let runs: [(&str, Vec<String>); 2] = [
        (
            "timeline.png",
            vec![
                "timeline".into(),
                rank0.clone(),
                "-o".into(),
                drawn("timeline.png"),
                "--by".into(),
                "step".into(),
            ],
        ),
        (
            "compare.png",
            vec![
                "compare".into(),
                rank0,
                rank1,
                "--png".into(),
                drawn("compare.png"),
            ],
        ),
    ];
    for (name, args) in runs {
        let o = Command::new(env!("CARGO_BIN_EXE_memsnap"))
            .args(&args)
            .current_dir(root())
            .output()
            .unwrap();
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let now = std::fs::read(drawn(name)).unwrap();
        let pinned = root().join("examples").join(name);
        if bless() {
            std::fs::write(&pinned, &now).unwrap();
            continue;
        }
        assert!(
            std::fs::read(&pinned).unwrap() == now,
            "examples/{name} is not what its command draws now (MEMSNAP_BLESS=1 cargo test golden redraws it)"
        );
    }
}

/// On every bundled snapshot, the step table never has two rows in a row with one name (they
/// would be one row), and the peak's headline never says a part twice in a row
/// (`LogSoftmaxBackward0 · LogSoftmaxBackward0`).
#[test]
fn step_rows_and_headlines_do_not_repeat_themselves() {
    let files = crate::util::snapshots_under(&root().join("testdata/snapshots"));
    assert!(files.len() > 30, "{} snapshots", files.len());
    for file in &files {
        let text = crate::util::ok(&["report", &file.to_string_lossy()]);
        if let Some(line) = text.lines().find(|l| l.contains("the peak was reached in")) {
            let parts: Vec<&str> = line.split(" · ").map(str::trim).collect();
            assert!(
                parts.windows(2).all(|w| w[0] != w[1]),
                "{}: {line}",
                file.display()
            );
        }
        let v = crate::util::report_json(file, &[]);
        for d in v["devices"].as_array().unwrap() {
            let labels: Vec<&str> = d["steps"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["label"].as_str().unwrap())
                .collect();
            assert!(
                labels.windows(2).all(|w| w[0] != w[1]),
                "{}: {labels:?}",
                file.display()
            );
        }
    }
}
