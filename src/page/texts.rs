//! The page's strings: one table holding each string once, every name shortened to what a
//! reader can take in, and a byte budget that keeps the page within a few megabytes whatever
//! the snapshot's names.
//!
//! The page's data refers to a string as `{"$": index}` ([`Text`]); `page.js` puts the
//! strings back in place once when it loads, so a name used by fifty views is carried once. A
//! name longer than [`SHOWN_CHARS`] characters is shown as its beginning and end around its
//! length (`fff…fff … (10,485,760 characters) … fff`); its whole text is carried besides, one
//! click away, only when it is at most [`FULL_MAX_BYTES`] and the [`FULL_BUDGET_BYTES`] for
//! whole names is not spent. Once the table holds [`BUDGET_BYTES`], new names are shortened to
//! [`TIGHT_CHARS`]; past [`HARD_BUDGET_BYTES`] every new name is one placeholder.

use rustc_hash::FxHashMap;
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

/// Characters of a name the page shows; a longer one keeps its beginning and end.
pub const SHOWN_CHARS: usize = 200;
/// Characters of a name once the table holds [`BUDGET_BYTES`].
pub const TIGHT_CHARS: usize = 40;
/// Characters of each line of a text of several lines (the `oom` and `compare` texts).
pub const LINE_CHARS: usize = 400;
/// The longest whole name carried besides its shortened form.
pub const FULL_MAX_BYTES: usize = 64 << 10;
/// All whole names carried.
pub const FULL_BUDGET_BYTES: usize = 1 << 20;
/// The table's bytes before names are shortened to [`TIGHT_CHARS`].
pub const BUDGET_BYTES: usize = 2 << 20;
/// The table's bytes before every new name is [`PLACEHOLDER`].
pub const HARD_BUDGET_BYTES: usize = 3 << 20;
/// What a name becomes once the table is full.
pub const PLACEHOLDER: &str = "(name left out: the page's text budget is spent)";

/// A string of the page: an index into its one table, written as `{"$": index}`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Text(pub u32);

impl Serialize for Text {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(1))?;
        m.serialize_entry("$", &self.0)?;
        m.end()
    }
}

/// One entry: the text shown, the length in characters of the string it stands for, and the
/// whole string when it was shortened and is carried.
#[derive(Clone, Debug)]
struct Entry {
    shown: String,
    chars: usize,
    full: Option<String>,
}

/// The page's string table.
#[derive(Clone, Debug, Default)]
pub struct Texts {
    entries: Vec<Entry>,
    index: FxHashMap<String, u32>,
    bytes: usize,
    full_bytes: usize,
    /// Bytes this table may hold (the page's budgets, divided among its panels).
    scale: f64,
}

impl Texts {
    /// A table with the page's whole budget.
    pub fn new() -> Texts {
        Texts::with_share(1.0)
    }

    /// A table with `share` of the page's budgets (a panel's part of a page of several).
    pub fn with_share(share: f64) -> Texts {
        Texts {
            scale: share.clamp(0.01, 1.0),
            ..Texts::default()
        }
    }

    fn budget(&self, bytes: usize) -> usize {
        (bytes as f64 * self.scale) as usize
    }

    /// The shown strings, by index.
    pub fn shown(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.shown.as_str())
    }

    /// The whole strings carried besides, by the index of their shortened form.
    pub fn full(&self) -> impl Iterator<Item = (u32, &str)> {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.full.as_deref().map(|f| (i as u32, f)))
    }

    /// The text shown for `t`.
    pub fn get(&self, t: Text) -> &str {
        &self.entries[t.0 as usize].shown
    }

    /// Bytes of the shown strings.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// A name (one line): shortened when long, within the budget.
    pub fn text(&mut self, s: &str) -> Text {
        if let Some(&i) = self.index.get(s) {
            return Text(i);
        }
        let chars = s.chars().count();
        self.add(s, chars)
    }

    /// A text of several lines, memsnap's own around names: each line longer than
    /// [`LINE_CHARS`] shortened, the whole within the budget.
    pub fn block(&mut self, s: &str) -> Text {
        let lines: Vec<String> = s
            .split('\n')
            .map(|l| shorten(l, l.chars().count(), LINE_CHARS))
            .collect();
        let joined = lines.join("\n");
        let chars = joined.chars().count();
        self.add_shown(joined, chars)
    }

    /// Adds `whole`, a string of `chars` characters, shortened to the table's limit.
    fn add(&mut self, whole: &str, chars: usize) -> Text {
        let tight = self.bytes > self.budget(BUDGET_BYTES);
        let limit = if tight { TIGHT_CHARS } else { SHOWN_CHARS };
        let shown = shorten(whole, chars, limit);
        if let Some(&i) = self.index.get(&shown) {
            return Text(i);
        }
        if self.bytes + shown.len() + PLACEHOLDER.len() > self.budget(HARD_BUDGET_BYTES) {
            return self.placeholder();
        }
        let keep = chars > limit
            && whole.len() <= FULL_MAX_BYTES
            && self.full_bytes + whole.len() <= self.budget(FULL_BUDGET_BYTES);
        if keep {
            self.full_bytes += whole.len();
        }
        self.insert(shown, chars, keep.then(|| whole.to_string()))
    }

    /// Adds a string as it is to be shown (already shortened, or a text of lines).
    fn add_shown(&mut self, shown: String, chars: usize) -> Text {
        if let Some(&i) = self.index.get(&shown) {
            return Text(i);
        }
        if self.bytes + shown.len() + PLACEHOLDER.len() > self.budget(HARD_BUDGET_BYTES) {
            return self.placeholder();
        }
        self.insert(shown, chars, None)
    }

    fn insert(&mut self, shown: String, chars: usize, full: Option<String>) -> Text {
        let i = self.entries.len() as u32;
        self.bytes += shown.len();
        self.index.insert(shown.clone(), i);
        self.entries.push(Entry { shown, chars, full });
        Text(i)
    }

    fn placeholder(&mut self) -> Text {
        match self.index.get(PLACEHOLDER) {
            Some(&i) => Text(i),
            None => self.insert(PLACEHOLDER.to_string(), PLACEHOLDER.chars().count(), None),
        }
    }

    /// Takes every string of `other` into this table; gives, for each index of `other`, its
    /// index here.
    pub fn adopt(&mut self, other: &Texts) -> Vec<Text> {
        other
            .entries
            .iter()
            .map(|e| match &e.full {
                Some(whole) => self.add(whole, e.chars),
                None if !e.shown.contains('\n') && e.shown.chars().count() == e.chars => {
                    self.text(&e.shown)
                }
                None => self.add_shown(e.shown.clone(), e.chars),
            })
            .collect()
    }
}

/// `s` (of `chars` characters) within `limit` characters: its beginning and end around its
/// length, `first… (10,485,760 characters) …last`.
pub fn shorten(s: &str, chars: usize, limit: usize) -> String {
    if chars <= limit {
        return s.to_string();
    }
    let head = limit * 3 / 4;
    let tail = limit - head;
    let first: String = s.chars().take(head).collect();
    let last_start = s
        .char_indices()
        .rev()
        .nth(tail.saturating_sub(1))
        .map_or(s.len(), |(at, _)| at);
    format!(
        "{first}… ({} characters) …{}",
        crate::units::count(chars as u64),
        &s[last_start..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_string_once_and_long_names_shortened_with_their_length() {
        let mut t = Texts::new();
        let a = t.text("forward");
        assert_eq!(t.text("forward"), a);
        let huge = "f".repeat(10_485_760);
        let h = t.text(&huge);
        assert_eq!(t.text(&huge), h);
        let shown = t.get(h);
        assert!(shown.contains("… (10,485,760 characters) …"), "{shown}");
        assert!(shown.chars().count() < SHOWN_CHARS + 40);
        // too long to carry whole
        assert_eq!(t.full().count(), 0);
        let long = format!("{}:12", "g".repeat(1000));
        let l = t.text(&long);
        assert!(t.get(l).ends_with(":12"), "the end tells lines apart");
        assert_eq!(t.full().collect::<Vec<_>>(), vec![(l.0, long.as_str())]);
        assert_eq!(
            serde_json::to_string(&l).unwrap(),
            format!("{{\"$\":{}}}", l.0)
        );
    }

    #[test]
    fn the_budget_holds_whatever_the_names() {
        let mut t = Texts::new();
        for k in 0..100_000 {
            t.text(&format!("{k}{}", "x".repeat(1000)));
        }
        assert!(t.bytes() <= HARD_BUDGET_BYTES, "{}", t.bytes());
        let full: usize = t.full().map(|(_, f)| f.len()).sum();
        assert!(full <= FULL_BUDGET_BYTES);
        assert_eq!(
            t.get(t.clone().text("new name past the budget")),
            PLACEHOLDER
        );
    }

    #[test]
    fn adopting_keeps_shown_forms_and_whole_names() {
        let mut panel = Texts::with_share(0.5);
        let long = "h".repeat(500);
        let a = panel.text("main");
        let b = panel.text(&long);
        let c = panel.block("line one\nline two");
        let mut page = Texts::new();
        page.text("other");
        let map = page.adopt(&panel);
        assert_eq!(page.get(map[a.0 as usize]), "main");
        assert_eq!(page.get(map[b.0 as usize]), panel.get(b));
        assert_eq!(page.get(map[c.0 as usize]), "line one\nline two");
        assert_eq!(page.full().count(), 1);
    }
}
