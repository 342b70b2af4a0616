//! `memsnap flamegraph`: the folded stacks add up to the allocated bytes of the moment, and
//! the SVG is well-formed.

use crate::util::*;

fn sum_folded(text: &str) -> u64 {
    text.lines()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum()
}

#[test]
fn folded_stacks_add_up_to_allocated_memory() {
    let mut files = vec![
        testdata("snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz"),
        testdata("snapshots/transformers/memory_snapshot_llama_ckpt_rank0.pickle.xz"),
        testdata("snapshots/pithtrain-peak/memory_snapshot_rank1_peak_step0.pickle.xz"),
    ];
    if let Some(dir) = shared() {
        files.extend(snapshots_under(&dir));
    }
    let mut checked = 0;
    for f in files {
        let f = f.to_string_lossy().into_owned();
        let rep = report_json(&f, &[]);
        let d = &rep["devices"][0];
        if d["events"] == 0 {
            continue;
        }
        for (at, key) in [
            ("peak", "peak_allocated_bytes"),
            ("end", "end_allocated_bytes"),
        ] {
            for root in ["step", "none"] {
                let folded = ok(&["flamegraph", &f, "--folded", "--at", at, "--root", root]);
                assert_eq!(
                    sum_folded(&folded),
                    d[key].as_u64().unwrap(),
                    "{f} at {at}, root {root}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 12, "{checked}");
}

#[test]
fn the_svg_is_well_formed() {
    let f = testdata("snapshots/transformers/memory_snapshot_moe_rank0.pickle.xz");
    let dir = scratch();
    let svg = dir.path().join("flame.svg");
    ok(&[
        "flamegraph",
        &f.to_string_lossy(),
        "-o",
        &svg.to_string_lossy(),
        "--root",
        "category",
    ]);
    let text = std::fs::read_to_string(&svg).unwrap();
    let mut reader = quick_xml::Reader::from_str(&text);
    let mut elements = 0;
    loop {
        match reader.read_event() {
            Ok(quick_xml::events::Event::Eof) => break,
            Ok(quick_xml::events::Event::Start(_)) => elements += 1,
            Ok(_) => {}
            Err(e) => panic!("not well-formed XML: {e}"),
        }
    }
    assert!(elements > 20, "{elements}");
    assert!(text.contains("activation"), "the category roots are drawn");
    assert!(
        text.contains("memory_snapshot_moe_rank0.pickle.xz"),
        "titled with the file"
    );
}

#[test]
fn bad_moments_and_outputs_are_usage_errors() {
    let f = testdata("snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz");
    let f = f.to_string_lossy();
    for args in [
        vec!["flamegraph", &f, "--folded", "--at", "#999999"],
        vec!["flamegraph", &f, "--folded", "--at", "100s"],
        vec!["flamegraph", &f, "--folded", "--at", "soon"],
        vec!["flamegraph", &f, "-o", "/no/such/folder/flame.svg"],
        vec!["flamegraph", &f, "-o", "flame.png"],
    ] {
        let o = memsnap(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        // one line (clap adds a hint line after its own)
        let first = err.lines().next().unwrap_or("");
        assert!(
            first.contains("--at") || first.contains(".svg") || first.contains("does not exist"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}
