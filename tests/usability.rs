//! What a new user meets: one-line messages with the right exit code for every mistake, text
//! that fits a terminal, names that tell files apart.

use crate::util::*;

const SINGLE: &str = "snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz";

fn single() -> String {
    testdata(SINGLE).to_string_lossy().into_owned()
}

/// Runs memsnap, expects `code` and one stderr line containing `needle`.
fn fails_with(args: &[&str], code: i32, needle: &str) {
    one_line_failure(&memsnap(args), code, needle);
}

#[test]
fn chart_paths_that_cannot_be_written_say_why() {
    let dir = scratch();
    let missing = dir.path().join("no/such/folder/t.png");
    fails_with(
        &["timeline", &single(), "-o", &missing.to_string_lossy()],
        2,
        "does not exist",
    );
    fails_with(
        &["timeline", &single(), "-o", &dir.path().to_string_lossy()],
        2,
        "is a folder",
    );
    fails_with(
        &["timeline", &single(), "-o", "t.jpg"],
        2,
        "must end in .png or .svg",
    );
    fails_with(
        &["timeline", &single(), "-o", "t.png", "--width", "300"],
        2,
        "too small",
    );
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    fails_with(
        &["report", &single(), "--png", &file.to_string_lossy()],
        2,
        "--png takes a folder",
    );
    fails_with(
        &[
            "compare",
            &single(),
            &single(),
            "--png",
            &missing.to_string_lossy(),
        ],
        2,
        "does not exist",
    );
    fails_with(
        &["timeline", &single(), "-o", "t.png", "--device", "7"],
        2,
        "device 7 has no events",
    );
}

#[test]
fn a_bad_rules_file_is_a_usage_error() {
    let dir = scratch();
    let rules = dir.path().join("rules.toml");
    std::fs::write(&rules, "[[rule]]\ncategory = \"weights\"\n").unwrap();
    fails_with(
        &["report", &single(), "--rules", &rules.to_string_lossy()],
        2,
        "rule 1: unknown category \"weights\"",
    );
}

#[test]
fn a_text_file_is_not_a_pickle() {
    let dir = scratch();
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "hello, this is text\n").unwrap();
    fails_with(
        &["report", &text.to_string_lossy()],
        1,
        "byte 0: not a pickle",
    );
}

#[test]
fn svg_charts_name_the_embedded_font() {
    let dir = scratch();
    let svg = dir.path().join("t.svg");
    ok(&["timeline", &single(), "-o", &svg.to_string_lossy()]);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("DejaVu Sans"), "font not named");
    assert!(!text.contains("font-family=\"sans-serif\""));
}

/// Reports and comparisons of pipeline files stay within 120 columns.
#[test]
fn text_fits_in_120_columns() {
    let mut files = vec![
        testdata("snapshots/pithtrain-peak/memory_snapshot_rank0_peak_step0.pickle.xz"),
        testdata("snapshots/pithtrain-fork/memory_snapshot_rank1_fork_step0.pickle.xz"),
    ];
    if let Some(dir) = shared() {
        files.push(dir.join("pp2-stacks-all/memory_snapshot_rank0_step0.pickle.xz"));
        files.push(dir.join("ep2-two-steps/memory_snapshot_rank0_steps0-1.pickle.xz"));
        files.push(dir.join("ring-buffer-wrapped/memory_snapshot_rank0_ring100k_step0.pickle.xz"));
    }
    for f in &files {
        let f = f.to_string_lossy();
        for out in [
            ok(&["report", &f]),
            ok(&["report", &f, "--by", "op,site,phase"]),
            ok(&["compare", &f, &single()]),
        ] {
            for line in out.lines().filter(|l| !l.contains("memory_snapshot")) {
                assert!(line.chars().count() <= 120, "{f}: {line}");
            }
        }
    }
}

/// A file with two devices gives a row per device, with its device; files with the same name
/// in two folders are told apart.
#[test]
fn rank_tables_show_devices_and_tell_files_apart() {
    let dir = scratch();
    for sub in ["a", "b"] {
        std::fs::create_dir(dir.path().join(sub)).unwrap();
        std::fs::copy(
            testdata(SINGLE),
            dir.path()
                .join(sub)
                .join("memory_snapshot_rank0_step1.pickle.xz"),
        )
        .unwrap();
    }
    // not searched without --recursive
    let o = memsnap(&["compare", &dir.path().to_string_lossy()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--recursive"), "{}", stderr(&o));
    let out = ok(&["compare", "-r", &dir.path().to_string_lossy()]);
    assert!(out.contains("a/memory_snapshot_rank0_step1"), "{out}");
    assert!(out.contains("b/memory_snapshot_rank0_step1"), "{out}");
    assert!(out.lines().next().unwrap().contains("device"), "{out}");
    let v: serde_json::Value = serde_json::from_str(&ok(&[
        "compare",
        "-r",
        "--json",
        &dir.path().to_string_lossy(),
    ]))
    .unwrap();
    let names: Vec<&str> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 2);
    assert_ne!(names[0], names[1], "{names:?}");
}

#[test]
fn two_devices_of_one_file_are_two_rows() {
    let Some(shared) = shared() else { return };
    let two = shared.join("two-devices/two_device.pickle.xz");
    let v: serde_json::Value = serde_json::from_str(&ok(&[
        "compare",
        "--json",
        &two.to_string_lossy(),
        &single(),
        &single(),
    ]))
    .unwrap();
    let rows = v["rows"].as_array().unwrap();
    let devices: Vec<u64> = rows
        .iter()
        .filter(|r| r["file"].as_str().unwrap().contains("two_device"))
        .map(|r| r["device"].as_u64().unwrap())
        .collect();
    assert_eq!(devices, vec![0, 1]);
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "{names:?}");
}

/// `--markdown` gives GitHub-flavoured Markdown: a heading, the headline figures as a list,
/// every table with a header rule, and no box-drawing characters.
#[test]
fn markdown_reports_and_comparisons() {
    let md = ok(&["report", "--markdown", &single()]);
    assert!(md.starts_with("### `"), "{md}");
    assert!(md.contains("- **peak allocated 2.88 GiB**"), "{md}");
    assert!(md.contains("| live at the peak, by category |"), "{md}");
    assert!(md.contains("|---"), "{md}");
    assert!(!md.contains('─'), "{md}");
    let tables = md.lines().filter(|l| l.starts_with("|--")).count();
    assert!(tables >= 4, "{tables}");
    let peak = testdata("snapshots/pithtrain-peak/memory_snapshot_rank0_peak_step0.pickle.xz");
    let other = testdata("snapshots/pithtrain-peak/memory_snapshot_rank1_peak_step0.pickle.xz");
    let md = ok(&[
        "compare",
        "--markdown",
        &peak.to_string_lossy(),
        &other.to_string_lossy(),
    ]);
    assert!(md.contains("- **rank 1** peaks"), "{md}");
    assert!(md.contains("|---") && !md.contains('─'), "{md}");
    let md = ok(&[
        "compare",
        "--markdown",
        &testdata("snapshots/pithtrain-peak").to_string_lossy(),
    ]);
    assert!(md.contains("| rank |") && !md.contains('─'), "{md}");
    // Markdown and JSON exclude each other
    let o = memsnap(&["report", "--markdown", "--json", &single()]);
    assert_eq!(o.status.code(), Some(2));
}

/// The Markdown views read on GitHub as they read in a terminal: rendered by a CommonMark
/// parser with tables, every table is a table with its rows, every line of prose is its own
/// list item (never run on into the one above), and no text is left as an indented code block.
#[test]
fn markdown_renders_as_tables_and_items() {
    use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};
    let peak = testdata("snapshots/pithtrain-peak/memory_snapshot_rank0_peak_step0.pickle.xz");
    let other = testdata("snapshots/pithtrain-peak/memory_snapshot_rank1_peak_step0.pickle.xz");
    let (peak, other) = (peak.to_string_lossy(), other.to_string_lossy());
    let folder = testdata("snapshots/pithtrain-peak");
    let folder = folder.to_string_lossy();
    let oom = testdata(
        "snapshots/capture_evidence/lightning_oom/memory_snapshot_rank0_step2_oom.pickle.xz",
    );
    let mut views = vec![
        ok(&["report", "--markdown", &single()]),
        ok(&[
            "report",
            "--markdown",
            &peak,
            "--by",
            "category,step,stage,site,phase",
        ]),
        ok(&["compare", "--markdown", &peak, &other]),
        ok(&["compare", "--markdown", &folder]),
    ];
    views.push(ok(&["report", "--markdown", &oom.to_string_lossy()]));
    for md in &views {
        let tables_written = md.lines().filter(|l| l.starts_with("|--")).count();
        let rows_written = md.lines().filter(|l| l.starts_with('|')).count();
        let items_written = md
            .lines()
            .filter(|l| l.trim_start().starts_with("- "))
            .count();
        let (mut tables, mut rows, mut items, mut code) = (0, 0, 0, 0);
        let mut in_item = 0usize;
        for event in Parser::new_ext(md, Options::ENABLE_TABLES) {
            match event {
                Event::Start(Tag::Table(_)) => tables += 1,
                Event::Start(Tag::TableHead) | Event::Start(Tag::TableRow) => rows += 1,
                Event::Start(Tag::Item) => {
                    items += 1;
                    in_item += 1;
                }
                Event::End(TagEnd::Item) => in_item -= 1,
                Event::Start(Tag::CodeBlock(_)) => code += 1,
                Event::SoftBreak | Event::HardBreak => {
                    assert!(in_item == 0, "a line ran on into a list item:\n{md}")
                }
                _ => {}
            }
        }
        assert_eq!(tables, tables_written, "{md}");
        // each table: its header row, then its rows (the |--- line is no row)
        assert_eq!(rows, rows_written - tables_written, "{md}");
        assert_eq!(items, items_written, "{md}");
        assert_eq!(code, 0, "{md}");
    }
}

/// Completion scripts for four shells, and every command's help ends with an example.
#[test]
fn completions_and_examples_in_help() {
    for shell in ["bash", "zsh", "fish", "powershell"] {
        let script = ok(&["completions", shell]);
        assert!(script.contains("memsnap"), "{shell}");
        assert!(
            script.contains("whatif") && script.contains("flamegraph"),
            "{shell}"
        );
    }
    for command in [
        "report",
        "timeline",
        "compare",
        "whatif",
        "oom",
        "flamegraph",
        "completions",
    ] {
        let help = ok(&[command, "--help"]);
        let last = help.trim_end().lines().last().unwrap_or("");
        assert!(
            last.trim_start().starts_with("memsnap "),
            "{command}: {help}"
        );
    }
    // --quiet is accepted anywhere
    ok(&["report", "--quiet", &single()]);
}

/// The Rust version the package declares is at least what every locked dependency declares, so
/// `cargo install --locked` on that toolchain builds; read from the registry's copies of the
/// locked crates (those of other platforms are not downloaded and are passed over).
#[test]
fn the_declared_rust_version_builds_the_locked_dependencies() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let version = |text: &str| -> Option<Vec<u32>> {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with("rust-version"))?;
        let v = line.split('"').nth(1)?;
        v.split('.').map(|p| p.parse().ok()).collect()
    };
    let ours = version(&std::fs::read_to_string(root.join("Cargo.toml")).unwrap()).unwrap();
    let home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cargo")))
        .unwrap();
    let registries: Vec<_> = std::fs::read_dir(home.join("registry/src"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    let lock = std::fs::read_to_string(root.join("Cargo.lock")).unwrap();
    let (mut read, mut newest) = (0, (vec![0], String::new()));
    let mut name = None;
    for line in lock.lines() {
        if let Some(n) = line.strip_prefix("name = ") {
            name = Some(n.trim_matches('"').to_string());
        } else if let (Some(v), Some(n)) = (line.strip_prefix("version = "), &name) {
            let dir = format!("{n}-{}", v.trim_matches('"'));
            let Some(text) = registries
                .iter()
                .find_map(|r| std::fs::read_to_string(r.join(&dir).join("Cargo.toml")).ok())
            else {
                continue;
            };
            read += 1;
            if let Some(v) = version(&text) {
                assert!(
                    v <= ours,
                    "{dir} needs Rust {v:?}, the package says {ours:?}"
                );
                if v > newest.0 {
                    newest = (v, dir);
                }
            }
        }
    }
    assert!(read > 200, "{read} locked crates found in the registry");
    assert_eq!(
        newest.0, ours,
        "the newest any locked crate needs is {}",
        newest.1
    );
}

/// The README says what a full test run needs: each thing a skipped test names as missing is
/// named in its Tests section, with how to get it.
#[test]
fn the_readme_says_what_the_tests_need() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let at = readme.find("\n## Tests\n").expect("a Tests section");
    let section = &readme[at..];
    let section = &section[..section[1..].find("\n## ").map_or(section.len(), |e| e + 1)];
    let util = std::fs::read_to_string(root.join("tests/util.rs")).unwrap();
    let view = std::fs::read_to_string(root.join("tests/view.rs")).unwrap();
    for (needed, named_in) in [
        ("../shared/snapshots", &util),
        ("npm ci --prefix tests/browser", &view),
        ("/usr/bin/chromium", &view),
        ("MEMSNAP_CHROMIUM", &view),
        ("CI=true", &util),
    ] {
        assert!(
            named_in.contains(needed),
            "the tests no longer name {needed}"
        );
        assert!(
            section.contains(needed),
            "the README's Tests section names {needed}"
        );
    }
    let ci = std::fs::read_to_string(root.join(".ci/run")).unwrap();
    assert!(ci.contains("npm ci --prefix tests/browser") && ci.contains("chromium"));
}

/// One outcome, one exit code, whatever the command: a snapshot that recorded nothing is an
/// error (1) with one line on stderr and nothing on stdout, from every command that reads one.
#[test]
fn a_snapshot_that_recorded_nothing_is_one_error_everywhere() {
    use serde_pickle::value::{HashableValue as H, Value as V};
    let dir = scratch();
    let mut snap = std::collections::BTreeMap::new();
    snap.insert(H::String("segments".into()), V::List(vec![]));
    snap.insert(
        H::String("device_traces".into()),
        V::List(vec![V::List(vec![])]),
    );
    let bytes = serde_pickle::value_to_vec(&V::Dict(snap), Default::default()).unwrap();
    let f = write(&dir, "empty.pickle", &bytes);
    let out = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let (png, html, svg, tables, trimmed) = (
        out("e.png"),
        out("e.html"),
        out("e.svg"),
        out("tables"),
        out("t.pickle"),
    );
    let commands: Vec<Vec<&str>> = vec![
        vec!["report", &f],
        vec!["report", &f, "--json"],
        vec!["oom", &f],
        vec!["whatif", &f],
        vec!["timeline", &f, "-o", &png],
        vec!["view", &f, "-o", &html],
        vec!["flamegraph", &f, "-o", &svg],
        vec!["export", &f, "-o", &tables],
        vec!["trim", &f, "-o", &trimmed],
    ];
    for args in commands {
        let o = memsnap(&args);
        one_line_failure(&o, 1, "no device has trace events");
        assert!(o.stdout.is_empty(), "{args:?}: {}", stdout(&o));
    }
}

/// A file that is not a pickle is named for what it is, with what memsnap expected; a typo
/// in a command keeps clap's suggestion.
#[test]
fn not_a_snapshot_says_what_it_is_and_typos_get_a_suggestion() {
    let dir = scratch();
    let cases: [(&str, &[u8], &str); 4] = [
        (
            "model.pt",
            b"PK\x03\x04\x14\x00\x00\x00archive/data.pkl",
            "a zip archive, as torch.save writes",
        ),
        (
            "t.png",
            b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
            "a PNG image",
        ),
        ("r.json", b"{\"devices\": []}\n", "JSON text"),
        ("notes.txt", b"step 3 peak 12 GiB\n", "but text"),
    ];
    for (name, bytes, says) in cases {
        let f = write(&dir, name, bytes);
        let o = memsnap(&["report", &f]);
        one_line_failure(&o, 1, says);
        assert!(
            stderr(&o).contains("torch.cuda.memory._dump_snapshot()"),
            "{}",
            stderr(&o)
        );
    }
    let o = memsnap(&["reprot", "x.pickle"]);
    one_line_failure(&o, 2, "'report'");
    let o = memsnap(&["report", "--jsno", "x.pickle"]);
    one_line_failure(&o, 2, "--json");
}
