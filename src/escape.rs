//! One escaping policy for every kind of output, applied where the output is written.
//!
//! A snapshot is untrusted, and so are its strings: frame names, file names, memory metadata
//! labels, allocator settings; so are file names and titles on the command line. None of them
//! may act on the reader of an output: move a terminal's cursor or retitle its window, reverse
//! the order of what follows it on screen, break a table, make a file unreadable as XML or run
//! a formula in a spreadsheet. Each kind of output has one rule, written here, and each writer
//! applies its kind's rule where the output leaves memsnap, so that no path around it exists:
//!
//! | output | what may not pass | written as |
//! | --- | --- | --- |
//! | terminal text (every command's stdout, the error lines) | bytes below 0x20 but tab and newline, DEL, C1 controls, bidirectional controls (U+202A-E, U+2066-9, U+200E/F, U+061C) | `\x1b`, `\u{202e}` ([`printable`], [`Stream::terminal`]) |
//! | a name on one line (a table cell, a message) | the same, and tab, newline and carriage return | `\t`, `\n`, `\r` ([`printable`]) |
//! | Markdown | a line's controls, and `\`, `\|`, backtick, `<` | `\\`, `\|`, `` \` ``, `\<` ([`markdown`]); code spans fenced by more backticks than they hold ([`code_span`]) |
//! | JSON (`--json`, JSON lines, the page's data) | C0 controls (serde_json escapes them), DEL, C1 and bidirectional controls | `\u007f`, `\u202e` ([`Stream::json`]) |
//! | XML (SVG charts and flamegraphs) | characters XML 1.0 cannot hold: C0 controls but tab, newline and carriage return, U+FFFE, U+FFFF | U+FFFD ([`Stream::xml`]) |
//! | CSV | a text cell starting with `=`, `+`, `-`, `@`, tab or carriage return (a formula) | the cell with `'` before it, as OWASP advises ([`csv_cell`]) |
//!
//! memsnap's own text holds no control character but newline and tab, so a stream escaped by
//! [`Stream::terminal`] loses nothing of it; names are escaped with [`printable`] where they
//! are formatted as well, so that a newline in one cannot break a line or a table row, and the
//! stream is the guarantee behind that. The HTML page carries strings only as JSON inside its
//! data element and sets them as text, never as markup (`crate::page`).

use std::borrow::Cow;
use std::io::{self, Write};

/// Whether `c` is a bidirectional control: an embedding, override or isolate
/// (U+202A-U+202E, U+2066-U+2069) or a mark (U+200E, U+200F, U+061C). Any of them can make a
/// line show in another order than it is written.
pub fn is_bidi(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' | '\u{61c}')
}

/// Whether `c` may not reach a terminal: a C0 control other than tab and newline, DEL, a C1
/// control, or a bidirectional control.
pub fn is_terminal_control(c: char) -> bool {
    ((c as u32) < 0x20 && c != '\t' && c != '\n')
        || ('\u{7f}'..='\u{9f}').contains(&c)
        || is_bidi(c)
}

/// Whether XML 1.0 cannot hold `c` (its `Char` production): C0 controls other than tab,
/// newline and carriage return, and U+FFFE, U+FFFF. Rust strings hold no surrogates.
pub fn is_xml_forbidden(c: char) -> bool {
    ((c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r')) || matches!(c, '\u{fffe}' | '\u{ffff}')
}

/// Whether JSON written by memsnap spells `c` as a `\u` escape: DEL, C1 and bidirectional
/// controls (serde_json escapes the C0 controls itself).
pub fn is_json_escaped(c: char) -> bool {
    ('\u{7f}'..='\u{9f}').contains(&c) || is_bidi(c)
}

/// `c` as the escape [`printable`] writes: `\n`, `\r`, `\t`, `\x1b`, `\u{202e}`.
fn push_escape(out: &mut String, c: char) {
    use std::fmt::Write as _;
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if (c as u32) < 0x80 => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        c => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
}

/// `s` safe to print on one terminal line: control characters (newlines, tabs, the escape that
/// starts an ANSI sequence, C1 codes, bidirectional controls) written as `\n`, `\t`, `\x1b`,
/// `\u{202e}`; backslashes stay as they are. Borrowed when nothing needs escaping.
pub fn printable(s: &str) -> Cow<'_, str> {
    let escaped = |c: char| c == '\t' || c == '\n' || is_terminal_control(c);
    if !s.chars().any(escaped) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if escaped(c) {
            push_escape(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A message on one line: its lines trimmed and joined by spaces (empty ones dropped), then
/// [`printable`].
pub fn one_line(s: &str) -> String {
    let joined = s
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    printable(&joined).into_owned()
}

/// `s` as text in a Markdown line or table cell: [`printable`], then `\`, `|`, backtick and `<`
/// escaped with a backslash, so that no name can end a table cell, open a code span or an HTML
/// tag, or start a line of its own.
pub fn markdown(s: &str) -> Cow<'_, str> {
    let line = printable(s);
    if !line.contains(['\\', '|', '`', '<']) {
        return line;
    }
    let mut out = String::with_capacity(line.len() + 8);
    for c in line.chars() {
        if matches!(c, '\\' | '|' | '`' | '<') {
            out.push('\\');
        }
        out.push(c);
    }
    Cow::Owned(out)
}

/// `s` as a Markdown code span: [`printable`], fenced by one backtick more than the longest run
/// of backticks it holds (and padded with spaces when it starts or ends with one), as
/// CommonMark reads a span.
pub fn code_span(s: &str) -> String {
    let line = printable(s);
    let mut longest = 0;
    let mut run = 0;
    for c in line.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let fence = "`".repeat(longest + 1);
    let pad = if line.starts_with('`') || line.ends_with('`') {
        " "
    } else {
        ""
    };
    format!("{fence}{pad}{line}{pad}{fence}")
}

/// A CSV text cell that no spreadsheet reads as a formula: one starting with `=`, `+`, `-`,
/// `@`, tab or carriage return gets a `'` before it.
pub fn csv_cell(s: &str) -> Cow<'_, str> {
    if s.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        Cow::Owned(format!("'{s}"))
    } else {
        Cow::Borrowed(s)
    }
}

/// JSON text (serde_json's) with DEL, C1 and bidirectional controls written as `\u202e`:
/// they can only stand inside its strings, where the escape means the same character.
pub fn json(text: &str) -> Cow<'_, str> {
    use std::fmt::Write as _;
    if !text.chars().any(is_json_escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_json_escaped(c) {
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// The kinds of output a [`Stream`] escapes for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Terminal text: controls as `\x1b`, `\u{202e}`; tab and newline pass.
    Terminal,
    /// JSON text: DEL, C1 and bidirectional controls as `\u202e` (they can only stand inside
    /// strings, where that escape means the same character).
    Json,
    /// XML: characters XML 1.0 cannot hold as U+FFFD.
    Xml,
}

/// A writer that applies one kind's rule to everything written through it, whatever wrote it.
///
/// Bytes that are not UTF-8 are escaped too (`\xff` in terminal text, U+FFFD otherwise); a
/// character split between two writes is held until its end comes, and [`Stream::into_inner`]
/// writes out one that never ends (memsnap writes whole characters, so only a broken writer
/// leaves one).
pub struct Stream<W: Write> {
    inner: W,
    kind: Kind,
    /// The first bytes of a character whose rest has not been written yet.
    held: Vec<u8>,
    /// Text escaped and not yet passed on.
    buf: String,
}

impl<W: Write> Stream<W> {
    /// Escapes for `kind` what is written to `inner`.
    pub fn new(inner: W, kind: Kind) -> Stream<W> {
        Stream {
            inner,
            kind,
            held: Vec::new(),
            buf: String::new(),
        }
    }

    /// Terminal text to `inner`.
    pub fn terminal(inner: W) -> Stream<W> {
        Stream::new(inner, Kind::Terminal)
    }

    /// JSON to `inner`.
    pub fn json(inner: W) -> Stream<W> {
        Stream::new(inner, Kind::Json)
    }

    /// XML to `inner`.
    pub fn xml(inner: W) -> Stream<W> {
        Stream::new(inner, Kind::Xml)
    }

    /// The writer, after passing on what is held (an unfinished character escaped).
    pub fn into_inner(mut self) -> io::Result<W> {
        self.finish()?;
        Ok(self.inner)
    }

    /// Escapes one character into `buf` when the kind says so; returns whether it did.
    fn escape(&mut self, c: char) -> bool {
        use std::fmt::Write as _;
        match self.kind {
            Kind::Terminal if is_terminal_control(c) => push_escape(&mut self.buf, c),
            Kind::Json if is_json_escaped(c) => {
                let _ = write!(self.buf, "\\u{:04x}", c as u32);
            }
            Kind::Xml if is_xml_forbidden(c) => self.buf.push('\u{fffd}'),
            _ => return false,
        }
        true
    }

    /// An invalid byte.
    fn escape_byte(&mut self, b: u8) {
        use std::fmt::Write as _;
        match self.kind {
            Kind::Terminal => {
                let _ = write!(self.buf, "\\x{b:02x}");
            }
            Kind::Json => self.buf.push_str("\\ufffd"),
            Kind::Xml => self.buf.push('\u{fffd}'),
        }
    }

    /// Escapes valid text into `buf`.
    fn text(&mut self, s: &str) {
        let mut start = 0;
        for (at, c) in s.char_indices() {
            if self.kind_escapes(c) {
                self.buf.push_str(&s[start..at]);
                self.escape(c);
                start = at + c.len_utf8();
            }
        }
        self.buf.push_str(&s[start..]);
    }

    fn kind_escapes(&self, c: char) -> bool {
        match self.kind {
            Kind::Terminal => is_terminal_control(c),
            Kind::Json => is_json_escaped(c),
            Kind::Xml => is_xml_forbidden(c),
        }
    }

    /// Escapes `bytes` (after what is held) into `buf`, holding an unfinished last character.
    fn take(&mut self, bytes: &[u8]) {
        let joined;
        let mut rest: &[u8] = if self.held.is_empty() {
            bytes
        } else {
            self.held.extend_from_slice(bytes);
            joined = std::mem::take(&mut self.held);
            &joined
        };
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    self.text(s);
                    return;
                }
                Err(e) => {
                    let (good, after) = rest.split_at(e.valid_up_to());
                    // valid by the check above
                    self.text(std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            for &b in &after[..n] {
                                self.escape_byte(b);
                            }
                            rest = &after[n..];
                        }
                        None => {
                            self.held.extend_from_slice(after);
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Passes on the escaped text.
    fn pass(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            self.inner.write_all(self.buf.as_bytes())?;
            self.buf.clear();
        }
        Ok(())
    }

    /// Writes out what is held, an unfinished character as invalid bytes.
    fn finish(&mut self) -> io::Result<()> {
        for b in std::mem::take(&mut self.held) {
            self.escape_byte(b);
        }
        self.pass()?;
        self.inner.flush()
    }
}

impl<W: Write> Write for Stream<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.take(bytes);
        self.pass()?;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.pass()?;
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOSTILE: &str =
        "a\x1b[31mred\x07\0\u{202e}evil\u{2066}\u{200f}\u{61c}\u{9b}\x7f\u{fffe}|`<\\\n\r\t";

    fn through(kind: Kind, pieces: &[&[u8]]) -> String {
        let mut s = Stream::new(Vec::new(), kind);
        for p in pieces {
            s.write_all(p).unwrap();
        }
        String::from_utf8(s.into_inner().unwrap()).unwrap()
    }

    #[test]
    fn names_print_safely_on_one_line() {
        assert_eq!(
            printable("a\x1b[31mred\nb\u{9b}c\u{202e}"),
            "a\\x1b[31mred\\nb\\u{9b}c\\u{202e}"
        );
        assert_eq!(printable("plain/päth.pickle"), "plain/päth.pickle");
        assert!(matches!(printable("plain"), Cow::Borrowed(_)));
        assert_eq!(
            printable("\u{200e}\u{61c}\u{2069}"),
            "\\u{200e}\\u{61c}\\u{2069}"
        );
        assert_eq!(
            one_line("TOML parse error\n  |\n1 | a =\n\n  | ^\nexpected a value\n"),
            "TOML parse error | 1 | a = | ^ expected a value"
        );
    }

    #[test]
    fn markdown_cannot_break_a_table_or_a_list() {
        let md = markdown("a|b`c<d>\\e\nf");
        assert_eq!(md, "a\\|b\\`c\\<d>\\\\e\\\\nf");
        assert_eq!(code_span("x"), "`x`");
        assert_eq!(code_span("a``b"), "```a``b```");
        assert_eq!(code_span("`a"), "`` `a ``");
    }

    #[test]
    fn csv_cells_are_never_formulas() {
        for s in ["=cmd|' /C calc'!A0", "+1", "-1", "@SUM(A1)", "\tx", "\rx"] {
            assert!(csv_cell(s).starts_with('\''), "{s}");
        }
        assert_eq!(csv_cell("train.py:main:12"), "train.py:main:12");
    }

    #[test]
    fn streams_escape_for_their_kind() {
        let t = through(Kind::Terminal, &[HOSTILE.as_bytes()]);
        assert!(!t.chars().any(is_terminal_control), "{t:?}");
        assert!(
            t.starts_with("a\\x1b[31mred\\x07\\x00\\u{202e}evil"),
            "{t:?}"
        );
        assert!(t.ends_with("\\\n\\r\t"), "{t:?}");
        let j = through(Kind::Json, &[HOSTILE.as_bytes()]);
        assert!(!j.chars().any(is_json_escaped), "{j:?}");
        assert!(j.contains("\\u202e") && j.contains("\\u009b") && j.contains("\\u007f"));
        let x = through(Kind::Xml, &[HOSTILE.as_bytes()]);
        assert!(!x.chars().any(is_xml_forbidden), "{x:?}");
        assert!(x.contains('\u{202e}') && x.contains('\n') && x.contains('\r'));
    }

    #[test]
    fn a_character_split_between_writes_is_kept_whole() {
        let bidi = "\u{202e}".as_bytes();
        let t = through(
            Kind::Terminal,
            &[b"a", &bidi[..1], &bidi[1..2], &bidi[2..], b"b"],
        );
        assert_eq!(t, "a\\u{202e}b");
        let e = "é".as_bytes();
        assert_eq!(through(Kind::Json, &[&e[..1], &e[1..]]), "é");
        // an unfinished character at the end, and bytes that are no UTF-8
        assert_eq!(through(Kind::Terminal, &[b"x\xff", &e[..1]]), "x\\xff\\xc3");
        assert_eq!(through(Kind::Xml, &[b"x\xff"]), "x\u{fffd}");
    }
}
