//! One hostile snapshot through every command and every output kind: its frame names, file
//! names, memory metadata labels and allocator settings hold terminal escapes, BEL, NUL,
//! bidirectional overrides, U+FFFE, a spreadsheet formula, table pipes, backticks and line
//! breaks. No forbidden character may reach stdout, every SVG must be XML 1.0, no CSV cell may
//! start a formula, and JSON must parse with its bidirectional controls escaped.

use std::collections::BTreeMap;
use std::path::Path;

use serde_pickle::value::{HashableValue as H, Value as V};

use crate::util::*;

/// Everything a string may hold to hurt a reader.
const EVIL: &str = "\x1b[31mred\x07bel\0nul\u{202e}evil\u{2066}iso\u{2069}\u{200e}\u{200f}\u{61c}\
                    \u{fffe}\u{ffff}|pipe|`tick`\u{85}c1\x7fdel\n# injected\rcr\ttab\u{9b}2J";

/// A spreadsheet formula (the OWASP example).
const FORMULA: &str = "=cmd|' /C calc'!A0";

fn frame(name: &str, file: &str, line: i64) -> V {
    let mut f = BTreeMap::new();
    f.insert(H::String("filename".into()), V::String(file.into()));
    f.insert(H::String("name".into()), V::String(name.into()));
    f.insert(H::String("line".into()), V::I64(line));
    V::Dict(f)
}

/// Nine allocations of 1 MiB on three hostile stacks, each with a hostile metadata label; the
/// first five freed; with `oom`, a failed request of 64 GiB at the end.
fn hostile_snapshot(oom: bool) -> Vec<u8> {
    let stacks = [
        vec![
            frame(FORMULA, &format!("/x/{EVIL}.py"), 10),
            frame(&format!("train{EVIL}"), "/x/train.py", 20),
        ],
        vec![
            frame(&format!("@SUM(1+1){EVIL}"), "+evil.py", 11),
            frame("-2+3", "\ttab.py", 21),
        ],
        vec![frame(EVIL, "/x/y.py", 5)],
    ];
    let labels = [
        FORMULA, EVIL, "+1", "-1", "@x", "\tx", "\rx", "|a|b|", "`c`",
    ];
    let t = 1_700_000_000_000_000i64;
    let base = 1i64 << 40;
    let entry = |action: &str, addr: i64, time: i64, k: usize, label: Option<&str>| {
        let mut e = trace_entry(action, addr, 1 << 20, time);
        if let V::Dict(d) = &mut e {
            d.insert(H::String("frames".into()), V::List(stacks[k % 3].clone()));
            if let Some(l) = label {
                d.insert(H::String("user_metadata".into()), V::String(l.into()));
            }
        }
        e
    };
    let mut trace = vec![trace_entry("segment_alloc", base, 20 << 20, t)];
    for (k, label) in labels.iter().enumerate() {
        let addr = base + ((k as i64) << 20);
        trace.push(entry("alloc", addr, t + 10 * k as i64 + 1, k, Some(label)));
    }
    for k in 0..5 {
        let addr = base + ((k as i64) << 20);
        trace.push(entry("free_requested", addr, t + 200 + k as i64, k, None));
        trace.push(entry("free_completed", addr, t + 201 + k as i64, k, None));
    }
    if oom {
        let mut e = entry("oom", 0, t + 400, 0, None);
        if let V::Dict(d) = &mut e {
            d.insert(H::String("size".into()), V::I64(64 << 30));
            d.insert(H::String("device_free".into()), V::I64(1 << 20));
        }
        trace.push(e);
    }
    let mut snap =
        match serde_pickle::value_from_slice(&snapshot_pickle(vec![], trace), Default::default())
            .unwrap()
        {
            V::Dict(d) => d,
            _ => unreachable!(),
        };
    let mut settings = BTreeMap::new();
    settings.insert(
        H::String("PYTORCH_CUDA_ALLOC_CONF".into()),
        V::String(format!("expandable_segments:False,{EVIL}")),
    );
    settings.insert(H::String(EVIL.into()), V::String(FORMULA.into()));
    snap.insert(H::String("allocator_settings".into()), V::Dict(settings));
    serde_pickle::value_to_vec(&V::Dict(snap), Default::default()).unwrap()
}

/// A character no terminal may receive: C0 but tab and newline, DEL, C1, bidirectional
/// controls.
fn forbidden_on_terminal(c: char) -> bool {
    ((c as u32) < 0x20 && c != '\t' && c != '\n')
        || ('\u{7f}'..='\u{9f}').contains(&c)
        || ('\u{202a}'..='\u{202e}').contains(&c)
        || ('\u{2066}'..='\u{2069}').contains(&c)
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{61c}')
}

fn bidi(c: char) -> bool {
    ('\u{202a}'..='\u{202e}').contains(&c)
        || ('\u{2066}'..='\u{2069}').contains(&c)
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{61c}')
}

/// Runs `args`, asserts success, and that stdout is UTF-8 holding no forbidden character.
fn terminal_text(args: &[&str]) -> String {
    let o = memsnap(args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    let text = String::from_utf8(o.stdout).expect("UTF-8 stdout");
    if let Some((at, c)) = text.char_indices().find(|(_, c)| forbidden_on_terminal(*c)) {
        panic!("{args:?}: {c:?} at byte {at} of stdout:\n{text}");
    }
    assert!(
        !text.lines().any(|l| l.starts_with("# injected")),
        "{args:?}: a name broke a line:\n{text}"
    );
    text
}

/// Runs `args` (which print JSON), asserts it parses and holds no raw bidirectional or C1
/// control.
fn json_text(args: &[&str]) -> serde_json::Value {
    let text = terminal_text(args);
    assert!(!text.chars().any(bidi), "{args:?}: raw bidi in {text}");
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{args:?}: {e}: {text}"))
}

/// Markdown tables keep their columns: every row of a table has as many unescaped pipes as
/// its header.
fn tables_hold(md: &str) {
    let pipes = |l: &str| {
        let mut n = 0;
        let mut escaped = false;
        for c in l.chars() {
            if c == '|' && !escaped {
                n += 1;
            }
            escaped = c == '\\' && !escaped;
        }
        n
    };
    let mut header: Option<usize> = None;
    for line in md.lines() {
        if line.starts_with('|') {
            let n = pipes(line);
            match header {
                None => header = Some(n),
                Some(h) => assert_eq!(n, h, "a row of another width: {line}"),
            }
        } else {
            header = None;
        }
    }
}

/// An SVG parses as XML 1.0, every character one XML may hold.
fn well_formed_svg(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap();
    if let Some(c) = text.chars().find(|&c| {
        ((c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r'))
            || matches!(c, '\u{fffe}' | '\u{ffff}')
    }) {
        panic!("{}: {c:?} is no XML character", path.display());
    }
    let mut reader = quick_xml::Reader::from_str(&text);
    let mut elements = 0;
    loop {
        match reader.read_event() {
            Ok(quick_xml::events::Event::Eof) => break,
            Ok(quick_xml::events::Event::Start(_) | quick_xml::events::Event::Empty(_)) => {
                elements += 1
            }
            Ok(_) => {}
            Err(e) => panic!(
                "{}: not XML at {}: {e}",
                path.display(),
                reader.buffer_position()
            ),
        }
    }
    assert!(elements > 10, "{}: {elements} elements", path.display());
}

/// The cells of a CSV text (RFC 4180 quoting).
fn csv_cells(text: &str) -> Vec<Vec<String>> {
    let mut rows = vec![];
    let mut row = vec![];
    let mut cell = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                cell.push('"');
            }
            (true, '"') => quoted = false,
            (false, '"') if cell.is_empty() => quoted = true,
            (false, ',') => row.push(std::mem::take(&mut cell)),
            (false, '\n') => {
                row.push(std::mem::take(&mut cell));
                rows.push(std::mem::take(&mut row));
            }
            (_, c) => cell.push(c),
        }
    }
    rows
}

#[test]
fn a_hostile_snapshot_reaches_no_output_raw() {
    let dir = scratch();
    let a = write(&dir, "a.pickle", &hostile_snapshot(false));
    let b = write(&dir, "b.pickle", &hostile_snapshot(true));
    // terminal text
    for args in [
        vec!["report", &a],
        vec!["report", &a, "--by", "site,stage,annotation,phase"],
        vec!["oom", &b],
        vec![
            "whatif",
            &a,
            "--cap",
            "5MiB",
            "--try",
            "expandable_segments:True",
        ],
        vec!["compare", &a, &b],
        vec!["flamegraph", &a, "--folded"],
        vec!["flamegraph", &a, "--folded", "--root", "stage"],
    ] {
        terminal_text(&args);
    }
    // Markdown
    for args in [
        vec!["report", &a, "--markdown", "--by", "site,stage"],
        vec!["report", &b, "--markdown"],
        vec!["compare", &a, &b, "--markdown"],
    ] {
        tables_hold(&terminal_text(&args));
    }
    // JSON
    let report = json_text(&["report", &a, "--json"]);
    let settings = report["allocator_settings"].as_str().unwrap();
    assert!(
        settings.ends_with(EVIL),
        "the JSON keeps the text whole: {settings:?}"
    );
    json_text(&["oom", &b, "--json"]);
    json_text(&["whatif", &a, "--cap", "5MiB", "--json"]);
    json_text(&["compare", &a, &b, "--json"]);
    // SVG
    for (name, args) in [
        ("flame.svg", vec!["flamegraph", &a]),
        ("site.svg", vec!["timeline", &a, "--by", "site"]),
        ("stage.svg", vec!["timeline", &a, "--by", "stage"]),
    ] {
        let out = dir.path().join(name);
        let out_text = out.to_string_lossy().into_owned();
        let mut all = args.clone();
        all.extend(["-o", &out_text]);
        terminal_text(&all);
        well_formed_svg(&out);
    }
    // CSV and JSON lines
    let csv = dir.path().join("csv");
    terminal_text(&[
        "export",
        &a,
        "-o",
        &csv.to_string_lossy(),
        "--format",
        "csv",
    ]);
    let mut formulas_seen = 0;
    for table in ["events", "blocks", "peak"] {
        let text = std::fs::read_to_string(csv.join(format!("{table}.csv"))).unwrap();
        for row in csv_cells(&text) {
            for cell in row {
                formulas_seen += usize::from(cell.starts_with("'="));
                if cell.starts_with(['=', '+', '-', '@', '\t', '\r']) {
                    assert!(cell.parse::<i64>().is_ok(), "{table}: a formula: {cell:?}");
                }
            }
        }
    }
    assert!(formulas_seen > 0, "the formula is in the tables, defused");
    let jsonl = dir.path().join("jsonl");
    terminal_text(&[
        "export",
        &a,
        "-o",
        &jsonl.to_string_lossy(),
        "--format",
        "jsonl",
    ]);
    let text = std::fs::read_to_string(jsonl.join("events.jsonl")).unwrap();
    assert!(!text.chars().any(bidi), "raw bidi in JSON lines");
    for line in text.lines() {
        let _: serde_json::Value = serde_json::from_str(line).unwrap();
    }
    assert!(text.contains("\\u202e"), "escaped, not lost");
    // the page: its data is JSON with the same escapes
    let page = dir.path().join("page.html");
    terminal_text(&["view", &a, "-o", &page.to_string_lossy()]);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(!html.chars().any(bidi), "raw bidi in the page");
    assert!(!html
        .chars()
        .any(|c| (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r')));
}
