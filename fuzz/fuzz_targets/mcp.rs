//! `memsnap mcp`'s request handling (the binary's `cli::mcp`, compiled in here), on any bytes:
//!
//! - the stdio transport reads them as request lines, over its length limit too: it may not
//!   panic, keeps at most the limit and a head of any line, and every answer it makes itself
//!   is one line of JSON-RPC error with a code;
//! - the same bytes, split at newlines, are paths a client asks for, opened and created below a
//!   root that holds a link out of it, a named pipe and a folder: nothing outside the root is
//!   ever opened or created, and nothing blocks.
#![no_main]

use std::io::Read;
use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

#[path = "../../src/cli/mod.rs"]
#[allow(dead_code, unused_imports, unused_macros)]
mod cli;

use cli::mcp::roots::Roots;
use cli::mcp::transport::{each_line, Incoming};

/// A small limit, so that inputs reach over it.
const MAX: usize = 256;

/// `top/root` (the server's root: a file, a folder, a link out, a pipe) and `top/outside`.
struct Sandbox {
    roots: Roots,
    outside: PathBuf,
    secret: (u64, u64),
    _top: tempfile::TempDir,
}

fn sandbox() -> &'static Sandbox {
    static S: OnceLock<Sandbox> = OnceLock::new();
    S.get_or_init(|| {
        use std::os::unix::fs::MetadataExt;
        let top = tempfile::tempdir().unwrap();
        let root = top.path().join("root");
        let outside = top.path().join("outside");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(root.join("sub/a.pickle"), b"inside").unwrap();
        std::fs::write(outside.join("secret"), b"outside").unwrap();
        std::os::unix::fs::symlink("../outside", root.join("out")).unwrap();
        std::os::unix::fs::symlink("../outside/secret", root.join("leak")).unwrap();
        std::os::unix::fs::symlink("../outside/new", root.join("dangling")).unwrap();
        let fifo = std::ffi::CString::new(root.join("fifo").display().to_string()).unwrap();
        // SAFETY: a valid C string and mode
        unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) };
        let m = std::fs::metadata(outside.join("secret")).unwrap();
        Sandbox {
            roots: Roots::open(&[root]).unwrap(),
            secret: (m.dev(), m.ino()),
            outside,
            _top: top,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    // the transport
    let mut answers = 0usize;
    each_line(data, MAX, |item| {
        if let Incoming::Reply(line) = item {
            assert!(line.ends_with(b"\n") && line.iter().filter(|&&b| b == b'\n').count() == 1);
            let v: serde_json::Value = serde_json::from_slice(&line).expect("JSON");
            assert_eq!(v["jsonrpc"], "2.0");
            assert!(v["error"]["code"].is_i64(), "{v}");
        }
        answers += 1;
        true
    });
    assert!(answers <= data.iter().filter(|&&b| b == b'\n').count() + 1);

    // the roots
    let s = sandbox();
    let text = String::from_utf8_lossy(data);
    for path in text.split('\n').take(8) {
        if let Ok(mut opened) = s.roots.read(path) {
            use std::os::unix::fs::MetadataExt;
            let m = opened.file.metadata().unwrap();
            assert!(m.is_file());
            assert_ne!((m.dev(), m.ino()), s.secret, "{path:?} opened the file outside");
            let mut head = [0u8; 8];
            let _ = opened.file.read(&mut head);
        }
        if s.roots.create(path).is_ok() {
            s.roots.remove(path);
        }
        let outside: Vec<_> = std::fs::read_dir(&s.outside).unwrap().flatten().collect();
        assert_eq!(outside.len(), 1, "{path:?} created a file outside the root");
    }
});
