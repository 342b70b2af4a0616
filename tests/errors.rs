//! Bad input: every failure is one line naming the file (and the byte offset when there is
//! one), with exit code 1, and never a panic.

use crate::util::*;

/// Runs `report` on a bad file and returns its one error line.
fn fails(path: &str) -> String {
    let o = memsnap(&["report", path]);
    let prefix = format!("memsnap: {path}: ");
    one_line_failure(&o, 1, &prefix);
    let err = stderr(&o);
    assert!(err.starts_with(&prefix), "{err}");
    err
}

#[test]
fn code_opcodes_are_refused() {
    let dir = scratch();
    // pickle.dumps of os.system("echo pwned"), protocol 0 and protocol 4
    let p0 = write(&dir, "p0.pickle", b"cposix\nsystem\n(Vecho pwned\ntR.");
    assert!(fails(&p0).ends_with("byte 0: opcode GLOBAL would run code; refusing to load\n"));
    let p4 = write(
        &dir,
        "p4.pickle",
        b"\x80\x04\x95\x1e\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94\x93\x94\x8c\x0aecho pwned\x94\x85\x94R\x94.",
    );
    assert!(fails(&p4).contains("byte 28: opcode STACK_GLOBAL would run code"));
}

#[test]
fn truncated_snapshot_at_every_point() {
    let full = std::fs::read(testdata("pickle/values_p4.pickle")).unwrap();
    let dir = scratch();
    for cut in (0..full.len()).step_by(37) {
        let p = write(&dir, &format!("cut{cut}.pickle"), &full[..cut]);
        let err = fails(&p);
        assert!(
            err.contains("byte") || err.contains("empty"),
            "cut at {cut}: {err}"
        );
    }
}

#[test]
fn truncated_compressed_file() {
    let Some(shared) = shared() else { return };
    let xz = std::fs::read(shared.join("two-devices/two_device.pickle.xz")).unwrap();
    let dir = scratch();
    let p = write(&dir, "half.pickle.xz", &xz[..xz.len() / 2]);
    let err = fails(&p);
    assert!(err.contains("byte"), "{err}");
}

#[test]
fn random_bytes() {
    let dir = scratch();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..20 {
        let bytes: Vec<u8> = (0..(i * 50 + 1))
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 32) as u8
            })
            .collect();
        fails(&write(&dir, &format!("r{i}.bin"), &bytes));
    }
}

#[test]
fn memo_bomb_is_not_a_snapshot_and_stays_small() {
    // [x]*1000 nested 6 levels through memo references: 10^18 elements if expanded.
    // Each level is built, memoized and popped; the last one is fetched back as the result.
    let mut p = b"\x80\x04]\x94K\x01a0".to_vec();
    for level in 0..6u32 {
        p.extend_from_slice(b"]\x94(");
        for _ in 0..1000 {
            p.push(b'j');
            p.extend_from_slice(&level.to_le_bytes());
        }
        p.extend_from_slice(b"e0");
    }
    p.extend_from_slice(b"h\x06.");
    let dir = scratch();
    let err = fails(&write(&dir, "bomb.pickle", &p));
    assert!(err.contains("not a memory snapshot"), "{err}");
    // the same bomb as 'segments' of a snapshot dict
    let mut s = b"\x80\x04}\x94\x8c\x08segments\x94".to_vec();
    s.extend_from_slice(&p[2..p.len() - 1]);
    s.extend_from_slice(b"s.");
    let err = fails(&write(&dir, "bomb2.pickle", &s));
    assert!(err.contains("invalid snapshot"), "{err}");
}

#[test]
fn huge_length_prefix() {
    let dir = scratch();
    let err = fails(&write(
        &dir,
        "huge.pickle",
        b"\x80\x04\x8d\x00\x00\x00\x00\x00\x00\x00\x40abc",
    ));
    assert!(
        err.contains("byte 2: BINUNICODE8 of 4611686018427387904 bytes"),
        "{err}"
    );
}

#[test]
fn plain_int_and_other_pickles() {
    let dir = scratch();
    let err = fails(&write(&dir, "int.pickle", b"\x80\x04K\x2a."));
    assert!(
        err.contains("not a memory snapshot: the pickle holds an int"),
        "{err}"
    );
    let err = fails(&write(
        &dir,
        "dict.pickle",
        b"\x80\x04}\x94\x8c\x01a\x94K\x01s.",
    ));
    assert!(
        err.contains("a dict without 'segments' or 'device_traces'"),
        "{err}"
    );
    let err = fails(&write(
        &dir,
        "badtype.pickle",
        b"\x80\x04}\x94\x8c\x08segments\x94K\x01s.",
    ));
    assert!(
        err.contains("invalid snapshot: segments is an int"),
        "{err}"
    );
}

#[test]
fn missing_file_and_directory() {
    let err = fails("/nonexistent/memsnap-test.pickle");
    assert!(err.contains("No such file"), "{err}");
    let dir = scratch();
    let d = dir.path().to_string_lossy().into_owned();
    let o = memsnap(&["report", &d]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).starts_with(&format!("memsnap: {d}: ")));
}

#[test]
fn good_files_are_still_reported_after_a_bad_one() {
    let dir = scratch();
    let bad = write(&dir, "bad.pickle", b"garbage");
    let good = testdata("snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz");
    let o = memsnap(&["report", &bad, &good.to_string_lossy()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("device 0"), "{}", stdout(&o));
}

#[test]
fn usage_errors_exit_2() {
    let o = memsnap(&["report"]);
    assert_eq!(o.status.code(), Some(2));
    let o = memsnap(&["frobnicate"]);
    assert_eq!(o.status.code(), Some(2));
}

/// The whole file is read: what follows the pickle, and a compressed file's checksum and end,
/// are checked; offsets in compressed files are of the decompressed stream.
#[test]
fn damaged_and_concatenated_files_are_refused() {
    use std::io::{Read, Write};
    let xz = std::fs::read(testdata(
        "snapshots/single-gpu/memory_snapshot_rank0_step1.pickle.xz",
    ))
    .unwrap();
    let mut plain = Vec::new();
    xz2::read::XzDecoder::new(&xz[..])
        .read_to_end(&mut plain)
        .unwrap();
    let dir = scratch();
    let mut junk = plain.clone();
    junk.extend_from_slice(b"garbage\n");
    let err = fails(&write(&dir, "junk.pickle", &junk));
    assert!(
        err.contains("8 more byte(s) follow the end of the pickle"),
        "{err}"
    );
    let mut two = plain.clone();
    two.extend_from_slice(&plain);
    let err = fails(&write(&dir, "two.pickle", &two));
    assert!(err.contains("a second pickle"), "{err}");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&plain).unwrap();
    let mut gz = gz.finish().unwrap();
    let n = gz.len();
    gz[n - 6] ^= 0xff; // the CRC32 of the trailer
    let err = fails(&write(&dir, "crc.pickle.gz", &gz));
    assert!(err.contains("of the decompressed stream"), "{err}");
    assert!(err.contains("damaged"), "{err}");
    let err = fails(&write(&dir, "cut.pickle.xz", &xz[..xz.len() - 20]));
    assert!(err.contains("of the decompressed stream"), "{err}");
}

/// Figures stay sound on strange traces, and the text says what was odd instead of "matches
/// exactly": a free of a block never allocated, an unknown action, a clock going backwards.
#[test]
fn anomalies_are_counted_not_hidden() {
    let event = trace_entry;
    let base = 1i64 << 40;
    let t = 1_700_000_000_000_000i64;
    let trace = vec![
        event("segment_alloc", base, 2 << 20, t),
        event("alloc", base, 512, t + 10),
        event("free_requested", base + 4096, 512, t + 5),
        event("teleport", base, 512, t + 20),
        event("free_requested", base, 512, t + 30),
        event("free_completed", base, 512, t + 31),
    ];
    let bytes = snapshot_pickle(vec![], trace);
    let dir = scratch();
    let f = write(&dir, "odd.pickle", &bytes);
    let text = ok(&["report", &f]);
    assert!(!text.contains("matches the snapshot exactly"), "{text}");
    assert!(text.contains("1 event of unknown actions"), "{text}");
    assert!(text.contains("earlier than the one before"), "{text}");
    assert!(text.contains("the replay could not place"), "{text}");
    let v = report_json(&f, &[]);
    let d = &v["devices"][0];
    assert_eq!(d["duration_us"], 31);
    assert_eq!(d["unknown_actions"], 1);
    assert_eq!(d["events_out_of_time_order"], 1);
}
