//! Opcode-level tests of the VM: one object per protocol, each opcode family, hostile inputs.

use super::*;

/// Limits for bare opcode sequences, which need not start as a pickle file does.
fn opcodes() -> Limits {
    Limits {
        check_start: false,
        ..Limits::default()
    }
}

fn ok(bytes: &[u8]) -> Decoded {
    decode(bytes, opcodes()).unwrap_or_else(|e| panic!("decode failed: {e}"))
}

fn fails(bytes: &[u8]) -> DecodeError {
    match decode(bytes, opcodes()) {
        Ok(d) => panic!("decoded {}", d.heap.render(d.root, 3)),
        Err(e) => e,
    }
}

fn rendered(bytes: &[u8]) -> String {
    let d = ok(bytes);
    d.heap.render(d.root, 64)
}

#[test]
fn every_protocol_decodes_the_same_object() {
    for proto in 0..=5 {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/pickle");
        let bytes = std::fs::read(format!("{dir}/values_p{proto}.pickle")).unwrap();
        let expected = std::fs::read_to_string(format!("{dir}/values_p{proto}.txt")).unwrap();
        let d = ok(&bytes);
        assert_eq!(
            d.heap.render(d.root, 64),
            expected.trim_end(),
            "protocol {proto}"
        );
        assert_eq!(d.protocol, if proto >= 2 { proto } else { 0 });
        assert_eq!(d.bytes_read, bytes.len() as u64);
    }
}

#[test]
fn memo_references_share_one_container() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/pickle");
    let d = ok(&std::fs::read(format!("{dir}/values_p4.pickle")).unwrap());
    let Value::Dict(root) = d.root else { panic!() };
    let Some(Value::List(shared)) = d.heap.dict_get(root, d.heap.lookup("shared").unwrap()) else {
        panic!()
    };
    let items = d.heap.list(shared);
    assert_eq!(items[0], items[1], "same dict, same handle");
    assert_eq!(items[2], items[3], "same list, same handle");
}

#[test]
fn integers_signed_and_wide() {
    // BININT is signed: -1
    assert_eq!(rendered(b"J\xff\xff\xff\xff."), "-1");
    // BININT1, BININT2 are unsigned
    assert_eq!(rendered(b"K\xff."), "255");
    assert_eq!(rendered(b"M\xff\xff."), "65535");
    // LONG1 of 9 bytes: 2^64
    assert_eq!(
        rendered(b"\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01."),
        "18446744073709551616"
    );
    // LONG1 of 8 bytes, sign bit set: negative
    assert_eq!(
        rendered(b"\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80."),
        "-9223372036854775808"
    );
    // LONG1 of zero bytes is 0; LONG4 works too
    assert_eq!(rendered(b"\x8a\x00."), "0");
    assert_eq!(rendered(b"\x8b\x02\x00\x00\x00\x00\x01."), "256");
    // text forms
    assert_eq!(rendered(b"I42\n."), "42");
    assert_eq!(rendered(b"I01\n."), "True");
    assert_eq!(
        rendered(b"L123456789012345678901234L\n."),
        "123456789012345678901234"
    );
    assert!(matches!(
        fails(b"\x8b\x20\x00\x00\x00").kind,
        DecodeErrorKind::IntTooWide(32)
    ));
}

#[test]
fn strings_bytes_and_floats() {
    assert_eq!(rendered(b"\x8c\x02hi."), "\"hi\"");
    assert_eq!(rendered(b"X\x02\x00\x00\x00hi."), "\"hi\"");
    assert_eq!(
        rendered(b"\x8d\x02\x00\x00\x00\x00\x00\x00\x00hi."),
        "\"hi\""
    );
    assert_eq!(rendered(b"U\x02hi."), "\"hi\"");
    assert_eq!(rendered(b"T\x02\x00\x00\x00hi."), "\"hi\"");
    assert_eq!(rendered(b"S'a\\nb'\n."), "\"a\\nb\"");
    assert_eq!(rendered(b"Vsnow\\u2603\n."), "\"snow\u{2603}\"");
    assert_eq!(rendered(b"C\x01z."), "b\"z\"");
    assert_eq!(rendered(b"B\x01\x00\x00\x00z."), "b\"z\"");
    assert_eq!(
        rendered(b"\x8e\x01\x00\x00\x00\x00\x00\x00\x00z."),
        "b\"z\""
    );
    assert_eq!(
        rendered(b"\x96\x01\x00\x00\x00\x00\x00\x00\x00z."),
        "b\"z\""
    );
    assert_eq!(rendered(b"G?\xe0\x00\x00\x00\x00\x00\x00."), "0.5");
    assert_eq!(rendered(b"F-2.25\n."), "-2.25");
    // invalid UTF-8 is kept, lossily, rather than failing the whole file
    assert_eq!(rendered(b"\x8c\x02\xff\x41."), "\"\u{fffd}A\"");
}

#[test]
fn containers_and_stack_opcodes() {
    assert_eq!(rendered(b"(K\x01K\x02l."), "[1, 2]");
    assert_eq!(rendered(b"(K\x01K\x02t."), "(1, 2)");
    assert_eq!(rendered(b"(K\x01K\x02d."), "{1: 2}");
    assert_eq!(rendered(b"}K\x01K\x02s."), "{1: 2}");
    assert_eq!(rendered(b"]K\x01a."), "[1]");
    assert_eq!(rendered(b"K\x01K\x02\x86."), "(1, 2)");
    assert_eq!(rendered(b"N\x85."), "(None,)");
    assert_eq!(rendered(b"\x88\x89N\x87."), "(True, False, None)");
    assert_eq!(rendered(b")."), "()");
    assert_eq!(rendered(b"\x8f(K\x01\x90."), "[1]");
    assert_eq!(rendered(b"(K\x01\x91."), "[1]");
    // DUP, POP, POP_MARK
    assert_eq!(rendered(b"]2\x86."), "([], [])");
    assert_eq!(rendered(b"K\x01K\x020."), "1");
    assert_eq!(rendered(b"K\x01(K\x02K\x031."), "1");
    // FRAME is skipped
    assert_eq!(
        rendered(b"\x80\x04\x95\x03\x00\x00\x00\x00\x00\x00\x00K\x07."),
        "7"
    );
}

#[test]
fn memo_in_every_width() {
    assert_eq!(rendered(b"]q\x05h\x05\x86."), "([], [])");
    assert_eq!(
        rendered(b"]r\x05\x00\x00\x00j\x05\x00\x00\x00\x86."),
        "([], [])"
    );
    assert_eq!(rendered(b"]p5\ng5\n\x86."), "([], [])");
    assert_eq!(rendered(b"]\x94h\x00\x86."), "([], [])");
    // a sparse index never sizes an allocation
    assert_eq!(
        rendered(b"]r\xff\xff\xff\xffj\xff\xff\xff\xff\x86."),
        "([], [])"
    );
    let e = fails(b"h\x03.");
    assert!(
        matches!(e.kind, DecodeErrorKind::MissingMemo { index: 3, .. }),
        "{e}"
    );
    assert_eq!(e.offset, 0);
}

#[test]
fn code_opcodes_are_refused_with_their_offset() {
    // pickle.dumps(os.system("echo pwned")) as protocol 0: GLOBAL first
    let e = fails(b"cposix\nsystem\n(Vecho pwned\ntR.");
    assert!(
        matches!(e.kind, DecodeErrorKind::RunsCode { op: "GLOBAL" }),
        "{e}"
    );
    assert_eq!(e.offset, 0);
    assert_eq!(
        e.to_string(),
        "byte 0: opcode GLOBAL would run code; refusing to load"
    );
    // protocol 4 form: STACK_GLOBAL after two strings
    let e = fails(b"\x80\x04\x8c\x05posix\x8c\x06system\x93.");
    assert!(matches!(
        e.kind,
        DecodeErrorKind::RunsCode { op: "STACK_GLOBAL" }
    ));
    assert_eq!(e.offset, 17);
    for (bytes, name) in [
        (&b"N)R."[..], "REDUCE"),
        (b"}}b.", "BUILD"),
        (b"(o.", "OBJ"),
        (b"N)\x81.", "NEWOBJ"),
        (b"N)}\x92.", "NEWOBJ_EX"),
        (b"\x82\x01.", "EXT1"),
        (b"\x83\x01\x00.", "EXT2"),
        (b"\x84\x01\x00\x00\x00.", "EXT4"),
        (b"Pid\n.", "PERSID"),
        (b"N\x51.", "BINPERSID"),
        (b"(imod\nname\n.", "INST"),
    ] {
        let e = fails(bytes);
        match e.kind {
            DecodeErrorKind::RunsCode { op } => assert_eq!(op, name),
            other => panic!("{name}: {other}"),
        }
    }
}

#[test]
fn truncation_at_every_point_is_an_error() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/pickle");
    for proto in 0..=5 {
        let bytes = std::fs::read(format!("{dir}/values_p{proto}.pickle")).unwrap();
        for cut in 0..bytes.len() {
            let e = fails(&bytes[..cut]);
            assert!(e.offset <= cut as u64, "offset {} past cut {cut}", e.offset);
        }
    }
    assert!(matches!(fails(b"").kind, DecodeErrorKind::Empty));
}

#[test]
fn hostile_length_prefixes_do_not_allocate() {
    // BINUNICODE8 claiming 2^62 bytes
    let e = fails(b"\x8d\x00\x00\x00\x00\x00\x00\x00\x40");
    assert!(matches!(e.kind, DecodeErrorKind::TooLarge { .. }), "{e}");
    // BINBYTES claiming 200 MB (under the limit) with 3 bytes present: truncated
    let e = fails(b"B\x00\x00\x80\x0cabc");
    assert!(matches!(e.kind, DecodeErrorKind::Truncated { .. }), "{e}");
    // LONG4 with a negative length
    assert!(matches!(
        fails(b"\x8b\xff\xff\xff\xff").kind,
        DecodeErrorKind::BadArgument { .. }
    ));
}

#[test]
fn memo_bomb_stays_small() {
    // a = [1]; b = [a]*1000 (by GET); c = [b]*1000; ... 6 levels: 10^18 logical elements.
    let mut p = b"\x80\x04]\x94K\x01a".to_vec();
    for level in 0..6u32 {
        p.extend_from_slice(b"]\x94(");
        for _ in 0..1000 {
            p.push(b'j');
            p.extend_from_slice(&level.to_le_bytes());
        }
        p.push(b'e');
    }
    p.push(b'.');
    let d = ok(&p);
    assert!(d.heap.container_slots().0 <= 7);
    assert!(d.heap.render(d.root, 64).len() < 70_000);
}

#[test]
fn deep_nesting_does_not_recurse() {
    let depth = 200_000;
    let mut p = vec![b']'; depth];
    p.extend(std::iter::repeat_n(b'a', depth - 1));
    p.push(b'.');
    let d = ok(&p);
    assert!(d.heap.render(d.root, 5).contains("..."));
}

#[test]
fn value_budget_is_enforced() {
    let limits = Limits {
        max_values: 10,
        ..Limits::default()
    };
    let e = decode(&b"(NNNNNNNNNNNNl."[..], limits).unwrap_err();
    assert!(matches!(e.kind, DecodeErrorKind::TooManyValues(10)));
}

#[test]
fn random_bytes_never_panic() {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for round in 0..3000 {
        let len = (round % 200) + 1;
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect();
        let _ = decode(&bytes[..], Limits::default());
        let mut proto = b"\x80\x04".to_vec();
        proto.extend_from_slice(&bytes);
        let _ = decode(&proto[..], Limits::default());
    }
}

#[test]
fn wrong_types_and_protocols() {
    assert!(matches!(
        fails(b"K\x01K\x02a.").kind,
        DecodeErrorKind::WrongType { .. }
    ));
    assert!(matches!(
        fails(b"\x80\x06.").kind,
        DecodeErrorKind::Protocol(6)
    ));
    assert!(matches!(fails(b"e.").kind, DecodeErrorKind::NoMark { .. }));
    assert!(matches!(
        fails(b"a.").kind,
        DecodeErrorKind::StackUnderflow { .. }
    ));
    assert!(matches!(
        fails(b"\xff").kind,
        DecodeErrorKind::UnknownOpcode(0xff)
    ));
    assert!(matches!(fails(b"\x97.").kind, DecodeErrorKind::OutOfBand));
}

#[test]
fn serde_pickle_output_decodes() {
    let v: Vec<(String, i64)> = vec![("a".into(), -3), ("b".into(), 1 << 40)];
    let bytes = serde_pickle::to_vec(&v, serde_pickle::SerOptions::new()).unwrap();
    assert_eq!(rendered(&bytes), "[(\"a\", -3), (\"b\", 1099511627776)]");
}

#[test]
fn text_is_not_a_pickle() {
    for text in [&b"hello world\n"[..], b"abc", b"#!/bin/sh\n"] {
        let e = decode(text, Limits::default()).unwrap_err();
        assert!(matches!(e.kind, DecodeErrorKind::NotAPickle { .. }), "{e}");
        assert_eq!(e.offset, 0);
    }
}

#[test]
fn a_file_that_is_not_a_pickle_is_named_for_what_it_is() {
    use super::vm::what_it_is;
    let cases: &[(&[u8], &str)] = &[
        (b"PK\x03\x04\x14\x00archive/data.pkl", "torch.save"),
        (b"\x89PNG\r\n\x1a\n", "PNG image"),
        (b"  {\"devices\": []}", "JSON text"),
        (b"[{\"ph\": \"X\"}]", "JSON text"),
        (b"<!DOCTYPE html><html>", "HTML page"),
        (b"hello, world\n", "text"),
        ("h\u{e9}llo".as_bytes(), "text"),
        (b"\x7fELF\x02\x01", "ELF"),
        (b"\x01\x02\x03\xfe", "binary data"),
    ];
    for (head, says) in cases {
        let what = what_it_is(head);
        assert!(what.contains(says), "{head:?}: {what}");
        let e = decode(*head, Limits::default()).unwrap_err();
        let line = e.to_string();
        assert!(
            line.contains(says) && line.contains("_dump_snapshot()"),
            "{line}"
        );
    }
    // a character cut by the end of the head is still text
    let cut = "\u{e9}t\u{e9}".as_bytes();
    assert_eq!(what_it_is(&cut[..cut.len() - 1]), "text");
}

#[test]
fn two_long_lists_filled_in_turns_keep_their_items() {
    use super::opcodes as op;
    // two lists of 100,000 integers, filled a batch of 1,000 at a time in turns, so that the
    // faulting-in of pages past a long list's end follows one list, then the other
    let n = 100_000u32;
    let mut b = vec![
        op::PROTO,
        4,
        op::EMPTY_LIST,
        op::MEMOIZE,
        op::EMPTY_LIST,
        op::MEMOIZE,
    ];
    for start in (0..n).step_by(1000) {
        for (list, offset) in [(0u8, 0u32), (1, 1 << 24)] {
            // the list below the other on the stack is fetched from the memo
            if list == 0 {
                b.extend_from_slice(&[op::BINGET, 0]);
            }
            b.push(op::MARK);
            for v in start..start + 1000 {
                b.push(op::BININT);
                b.extend_from_slice(&(v + offset).to_le_bytes());
            }
            b.push(op::APPENDS);
            if list == 0 {
                b.push(op::POP);
            }
        }
    }
    b.extend_from_slice(&[op::TUPLE2, op::STOP]);
    let d = ok(&b);
    let Value::Tuple(t) = d.root else {
        panic!("{}", d.heap.render(d.root, 2))
    };
    let lists = d.heap.list(t);
    for (k, offset) in [(0, 0i64), (1, 1 << 24)] {
        let Value::List(l) = lists[k] else { panic!() };
        let items = d.heap.list(l);
        assert_eq!(items.len(), n as usize);
        assert!(items
            .iter()
            .enumerate()
            .all(|(i, v)| *v == Value::Int(i as i64 + offset)));
    }
}
