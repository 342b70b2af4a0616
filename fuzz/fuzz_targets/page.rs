//! The page writer (`memsnap view`), on any bytes: the input is a title, a file name and a
//! pickle, split at the first two NUL bytes. Whatever decodes to a snapshot is analysed, each
//! device made a panel as `view` makes it, and the page written. The page must:
//! - hold its data as JSON that parses, inside the one data element (no `<` in it, so no
//!   string can close the element), with no control character but tab and newline anywhere;
//! - keep the template's four slots filled once: the title and the file name are shown as
//!   text, never read as a slot;
//! - stay within its byte budget: the strings table at most 3 MiB, whatever the names.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memsnap::page::{self, Budget, Page, Parts};
use memsnap::pickle::Limits;

#[global_allocator]
static ALLOCATOR: memsnap::memory::Counting = memsnap::memory::Counting;

/// The most the strings of a page hold (the page's own budget).
const STRINGS: usize = 3 << 20;

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(3, |&b| b == 0);
    let (Some(title), Some(file), Some(pickle)) = (parts.next(), parts.next(), parts.next()) else {
        return;
    };
    let title = String::from_utf8_lossy(title).into_owned();
    let file = String::from_utf8_lossy(file).into_owned();
    let Ok(snap) = memsnap::snapshot::from_pickle(pickle, Limits::default()) else {
        return;
    };
    let analyses = memsnap::analysis::analyse(&snap, &Default::default());
    let report = memsnap::report::FileReport::new(&file, &snap, &analyses);
    let names = page::names(&[file.as_str()]);
    let budget = Budget::for_panels(1);
    let panels = analyses
        .iter()
        .enumerate()
        .map(|(k, a)| page::panel(a, &file, &names[0].0, names[0].1, &budget, None, (0, k)))
        .collect();
    let page = Page::new(Parts {
        command: format!("memsnap view {file}"),
        title,
        panels,
        reports: vec![serde_json::to_value(&report).unwrap_or_default()],
        compare_text: None,
        failures: vec![(file.clone(), "{{data}}</script>".to_string())],
    });
    let strings: usize = page.strings.iter().map(String::len).sum();
    assert!(strings <= STRINGS + 64 * 1024, "strings {strings} bytes");
    let mut out = Vec::new();
    page::write(&mut out, &page).expect("writes to memory");
    let html = String::from_utf8(out).expect("UTF-8");
    assert!(
        !html
            .chars()
            .any(|c| c.is_control() && c != '\n' && c != '\t' && c != '\r'),
        "a control character in the page"
    );
    let open = r#"<script type="application/json" id="memsnap-data">"#;
    assert_eq!(html.matches(open).count(), 1, "one data element");
    let start = html.find(open).unwrap() + open.len();
    let end = start + html[start..].find("</script>").expect("the data element closes");
    let json = &html[start..end];
    assert!(!json.contains('<'), "no < in the data");
    let value: serde_json::Value = serde_json::from_str(json).expect("the data is JSON");
    assert!(value["strings"].is_array());
    // the title element holds text only: the template's slots are filled once
    let t0 = html.find("<title>").unwrap() + "<title>".len();
    let t1 = t0 + html[t0..].find("</title>").expect("the title closes");
    assert!(!html[t0..t1].contains('<'), "the title is text");
    assert_eq!(html.matches("<style>").count(), 1);
});
