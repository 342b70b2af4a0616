//! `memsnap timeline` and `report --png`: images that decode, at the requested size, with the
//! peak marker where the replayed peak is.

use std::path::Path;

use crate::util::*;

/// Decodes a PNG: `(width, height, RGB or RGBA bytes, bytes per pixel)`.
fn decode(path: &Path) -> (u32, u32, Vec<u8>, usize) {
    let file = std::io::BufReader::new(std::fs::File::open(path).unwrap());
    let mut reader = png::Decoder::new(file).read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let bpp = info.line_size / info.width as usize;
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf, bpp)
}

fn pixel(img: &(u32, u32, Vec<u8>, usize), x: i32, y: i32) -> (u8, u8, u8) {
    let (w, _, buf, bpp) = img;
    let i = (y as usize * *w as usize + x as usize) * bpp;
    (buf[i], buf[i + 1], buf[i + 2])
}

#[test]
fn every_snapshot_gives_an_image_of_the_requested_size() {
    let mut files = vec![
        testdata("snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz"),
        testdata("snapshots/fsdp/memory_snapshot_rank1_step1.pickle.xz"),
        testdata("snapshots/pithtrain-fork/memory_snapshot_rank0_fork_step0.pickle.xz"),
    ];
    if let Some(dir) = shared() {
        files.extend(snapshots_under(&dir));
    }
    let out = scratch();
    let mut drawn = 0;
    for (k, f) in files.iter().enumerate() {
        let target = out.path().join(format!("c{k}.png"));
        let o = memsnap(&[
            "timeline",
            &f.to_string_lossy(),
            "-o",
            &target.to_string_lossy(),
            "--width",
            "800",
            "--height",
            "450",
        ]);
        let err = stderr(&o);
        if err.contains("no device has trace events") {
            assert_eq!(o.status.code(), Some(1));
            continue;
        }
        assert!(o.status.success(), "{}: {err}", f.display());
        for line in err.lines() {
            let written = line.strip_prefix("memsnap: wrote ").unwrap();
            let (w, h, _, _) = decode(Path::new(written));
            assert_eq!((w, h), (800, 450), "{written}");
            drawn += 1;
        }
    }
    assert!(drawn >= 3);
}

#[test]
fn svg_output_and_several_devices() {
    let out = scratch();
    let svg = out.path().join("t.svg");
    ok(&[
        "timeline",
        &testdata("snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz").to_string_lossy(),
        "-o",
        &svg.to_string_lossy(),
        "--by",
        "phase",
        "--x",
        "events",
        "--title",
        "my run",
    ]);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg"));
    assert!(text.contains("my run") && text.contains("forward") && text.contains("peak"));
    let Some(dir) = shared() else { return };
    let o = memsnap(&[
        "timeline",
        &dir.join("two-devices/two_device.pickle.xz")
            .to_string_lossy(),
        "-o",
        &out.path().join("two.png").to_string_lossy(),
        "--width",
        "600",
        "--height",
        "400",
    ]);
    assert!(o.status.success());
    assert!(out.path().join("two-device0.png").is_file());
    assert!(out.path().join("two-device1.png").is_file());
}

/// Golden properties instead of golden bytes: the red peak dot sits at the replayed peak,
/// and the tallest column of the stacked area is the peak's column.
#[test]
fn the_peak_marker_is_where_the_peak_is() {
    use memsnap::chart::{palette, timeline, Options};
    let mut files = vec![testdata(
        "snapshots/pithtrain-peak/memory_snapshot_rank1_peak_step0.pickle.xz",
    )];
    if let Some(dir) = shared() {
        files.push(dir.join("pp2-stacks-all/memory_snapshot_rank0_step0.pickle.xz"));
        files.push(dir.join("oom/memory_snapshot_rank0_oom.pickle.xz"));
    }
    let out = scratch();
    for file in files {
        let snap = memsnap::snapshot::Snapshot::open(&file).unwrap();
        let device = snap.devices_with_events().next().unwrap();
        let a = memsnap::analysis::analyse_device(&snap, device, &Default::default());
        let png = out.path().join("peak.png");
        let info = timeline(&png, "x", &a, &Options::default()).unwrap();
        let img = decode(&png);
        assert_eq!((img.0, img.1), (1600, 900));
        let red = (palette::PEAK.0, palette::PEAK.1, palette::PEAK.2);
        assert_eq!(
            pixel(&img, info.peak_x, info.peak_y),
            red,
            "{}",
            file.display()
        );
        // tallest column of area colours
        // Area colours, leaving out pure greys ("other"), which anti-aliased grey text can
        // produce too.
        let colours: Vec<(u8, u8, u8)> = palette::assign(&info.groups)
            .iter()
            .map(|c| (c.0, c.1, c.2))
            .filter(|c| !(c.0 == c.1 && c.1 == c.2))
            .collect();
        let (left, top, right, bottom) = info.plot;
        let tops: Vec<(i32, i32)> = (left..right)
            .filter_map(|x| {
                (top..bottom)
                    .find(|&y| colours.contains(&pixel(&img, x, y)))
                    .map(|y| (x, y))
            })
            .collect();
        let highest = tops.iter().map(|t| t.1).min().unwrap();
        // No column is visibly taller than the peak (a pipeline repeats the same peak every
        // iteration, so ties within a pixel or two are fine) ...
        assert!(
            highest >= info.peak_y - 2,
            "{}: {highest} above {}",
            file.display(),
            info.peak_y
        );
        // ... and the stack reaches the dot: just below it the peak column is area (the
        // reserved line may cross there, so look at the neighbouring pixels too).
        let below = (-2..=2)
            .flat_map(|dx| (8..=12).map(move |dy| (dx, dy)))
            .any(|(dx, dy)| colours.contains(&pixel(&img, info.peak_x + dx, info.peak_y + dy)));
        assert!(below, "{}: no area below the dot", file.display());
    }
}

#[test]
fn report_writes_charts_next_to_it() {
    let out = scratch();
    let o = memsnap(&[
        "report",
        &testdata("snapshots/fsdp/memory_snapshot_rank0_step1.pickle.xz").to_string_lossy(),
        "--png",
        &out.path().join("charts").to_string_lossy(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let png = out
        .path()
        .join("charts/memory_snapshot_rank0_step1-device0-timeline.png");
    assert_eq!(decode(&png).0, 1600);
}

#[test]
fn bad_chart_requests() {
    let file = testdata("snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz");
    let file = file.to_string_lossy();
    let o = memsnap(&["timeline", &file, "-o", "chart.jpg"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains(".png or .svg"), "{}", stderr(&o));
    let o = memsnap(&["timeline", &file, "-o", "chart.png", "--device", "7"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("device 7 has no events"),
        "{}",
        stderr(&o)
    );
}

/// A trace whose first event is followed by a long idle stretch is drawn by event index (the
/// work would otherwise fill a sliver of the width), and the axis says why; `--x time` still
/// draws seconds.
#[test]
fn an_idle_start_is_drawn_by_event() {
    let event = trace_entry;
    let base = 1i64 << 40;
    let t = 1_700_000_000_000_000i64;
    let mut trace = vec![event("segment_alloc", base, 64 << 20, t)];
    // ten idle seconds, then 200 allocations and frees within 20 ms
    for i in 0..100i64 {
        let at = t + 10_000_000 + i * 200;
        trace.push(event("alloc", base + i * (1 << 20), 1 << 20, at));
    }
    for i in 0..100i64 {
        let at = t + 10_020_000 + i * 200;
        trace.push(event("free_requested", base + i * (1 << 20), 1 << 20, at));
        trace.push(event(
            "free_completed",
            base + i * (1 << 20),
            1 << 20,
            at + 1,
        ));
    }
    let dir = scratch();
    let f = write(&dir, "idle.pickle", &snapshot_pickle(vec![], trace));
    let out = dir.path().join("idle.svg").to_string_lossy().into_owned();
    ok(&["timeline", &f, "-o", &out]);
    let svg = std::fs::read_to_string(&out).unwrap();
    assert!(
        svg.contains("no event for 10.0 s of the trace&apos;s 10.0 s")
            || svg.contains("no event for 10.0 s of the trace's 10.0 s"),
        "the axis names the idle stretch"
    );
    let timed = dir.path().join("timed.svg").to_string_lossy().into_owned();
    ok(&["timeline", &f, "-o", &timed, "--x", "time"]);
    let svg = std::fs::read_to_string(&timed).unwrap();
    assert!(svg.contains("seconds from the first recorded event"));
}

/// The band of smaller groups is named with how many groups it holds and the most they reach,
/// since it can be large away from the peak.
#[test]
fn the_smaller_groups_say_what_they_hold() {
    let file = testdata("snapshots/transformers/memory_snapshot_llama_rank0.pickle.xz");
    let dir = scratch();
    let out = dir.path().join("sites.svg").to_string_lossy().into_owned();
    ok(&[
        "timeline",
        &file.to_string_lossy(),
        "-o",
        &out,
        "--by",
        "site",
    ]);
    let svg = std::fs::read_to_string(&out).unwrap();
    let at = svg.find(" more, up to ").expect("the band is named");
    // its count comes just before, as a number
    let before: String = svg[..at]
        .chars()
        .rev()
        .take_while(|c| c.is_ascii_digit() || *c == ',')
        .collect();
    assert!(!before.is_empty(), "a count precedes the name");
}

/// A pipeline rank with many micro-batches, by step: whole steps get the colours (their
/// micro-batches together, the legend says so), not eight micro-batches with the rest in one
/// grey band that covers most of the plot; the smaller groups hold almost nothing.
#[test]
fn pipeline_steps_are_coloured_whole() {
    use memsnap::analysis::{self, Dimension};
    use memsnap::chart::series::{self, XAxis};
    let mut checked = 0;
    for run in ["pp8n16", "pp4n12", "pp4n8"] {
        for file in snapshots_under(&testdata(&format!("snapshots/pipelines/{run}"))) {
            let snap = memsnap::snapshot::Snapshot::open(&file).unwrap();
            let a = analysis::analyse(&snap, &Default::default()).remove(0);
            let s = series::build(&a, Dimension::Step, XAxis::Auto, 400, 9);
            assert!(s.whole_steps, "{}: {:?}", file.display(), s.groups);
            for g in &s.groups[..s.groups.len() - 1] {
                assert!(
                    g == "before the trace" || (g.starts_with("step ") && !g.contains(" mb ")),
                    "{}: {g}",
                    file.display()
                );
            }
            // the grey band stays below 5% of the peak everywhere
            assert!(
                s.other_max() * 20 <= a.replay.peaks.allocated.bytes,
                "{}: other up to {} of {}",
                file.display(),
                s.other_max(),
                a.replay.peaks.allocated.bytes
            );
            checked += 1;
        }
    }
    assert!(checked >= 3);
    // the image says so
    let dir = scratch();
    let out = dir.path().join("steps.svg").to_string_lossy().into_owned();
    let file = testdata("snapshots/pipelines/pp8n16/memory_snapshot_rank0_pp8n16_step0.pickle.xz");
    ok(&[
        "timeline",
        &file.to_string_lossy(),
        "-o",
        &out,
        "--by",
        "step",
    ]);
    let svg = std::fs::read_to_string(&out).unwrap();
    assert!(svg.contains("by step (micro-batches together)"));
    assert!(!svg.contains("up to 0 B"));
    // a trace of few steps keeps its finer groups
    let s = {
        let snap = memsnap::snapshot::Snapshot::open(&testdata(
            "snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz",
        ))
        .unwrap();
        let a = analysis::analyse(&snap, &Default::default()).remove(0);
        series::build(&a, Dimension::Step, XAxis::Auto, 400, 9)
    };
    assert!(!s.whole_steps);
}
