//! Source files a program generates at run time, whose names change from run to run: a
//! module written to a temporary file (`torch_geometric`'s message passing,
//! `…GCNConv_propagate_m3fmqp0s.py` in one run and `…_nbcrtgso.py` in the next), Inductor's
//! code named by a hash, an FX graph's `<eval_with_key>.12`.
//!
//! Without this, the same call site has two names, so the diff can pair none of its blocks:
//! every one reads as gone in the base run and new in the other. A file of one run only is
//! matched to one of the other run only when both have the same name once the generated part
//! is set aside (its random or counted part) and neither has another such match; the new
//! run's name is then read as the base run's. Files the two runs share keep their names.
//!
//! Written by hand: a few rules about names, no library's job.

use rustc_hash::{FxHashMap, FxHashSet};

use crate::snapshot::{Snapshot, StrId};

/// The new run's generated files read as the base run's.
#[derive(Default)]
pub struct Renames {
    /// A new-run file → the base run's full name.
    pub files: FxHashMap<StrId, String>,
    /// Short names as keys show them ([`Snapshot::short_file`]): the new run's → the base's.
    pub short: Vec<(String, String)>,
}

/// Characters of a name `tempfile` makes up (`tempfile._RandomNameSequence`).
fn random_char(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_'
}

/// Whether a directory is a temporary one: `/tmp`, `/var/tmp`, `/dev/shm`, a `TMPDIR` of
/// macOS (`/var/folders/…/T`), `Temp` on Windows, or one made by `tempfile.mkdtemp`
/// (`tmpk2j4_x9a`) or by Inductor (`torchinductor_<user>`).
fn temporary(dir: &str) -> bool {
    matches!(dir, "tmp" | "temp" | "Temp" | "TEMP" | "TMP" | "T" | "shm")
        || made_by_mkdtemp(dir)
        || dir.starts_with("torchinductor_")
}

/// Whether a directory's name is one `tempfile.mkdtemp` makes: `tmp` and eight random
/// characters.
fn made_by_mkdtemp(dir: &str) -> bool {
    dir.len() == 11 && dir.starts_with("tmp") && dir.bytes().all(random_char)
}

/// A file's name with its generated part set aside, when it has one; `None` for a file
/// written by hand.
pub fn generated(path: &str) -> Option<String> {
    // an FX graph's code: `<eval_with_key>.12`
    if path.starts_with('<') {
        let (head, number) = path.rsplit_once('.')?;
        return (head.ends_with('>')
            && !number.is_empty()
            && number.bytes().all(|b| b.is_ascii_digit()))
        .then(|| format!("{head}.#"));
    }
    let parts: Vec<&str> = path.split(['/', '\\']).filter(|p| !p.is_empty()).collect();
    let (file, dirs) = parts.split_last()?;
    if !dirs.iter().any(|d| temporary(d)) {
        return None;
    }
    let (stem, ext) = file.rsplit_once('.').unwrap_or((file, ""));
    let stem_key = if stem.len() >= 16 && stem.bytes().all(|b| b.is_ascii_alphanumeric()) {
        // a hash (Inductor's `c3jx…`)
        "#".to_string()
    } else if stem.len() > 8 && stem.bytes().rev().take(8).all(random_char) {
        // `tempfile`'s eight random characters after the prefix
        format!("{}#", &stem[..stem.len() - 8])
    } else {
        return None;
    };
    // the directories, those made with a random name or a hash's first characters set aside
    let dirs: Vec<&str> = dirs
        .iter()
        .map(|d| {
            let shard = d.len() == 2 && d.bytes().all(|b| b.is_ascii_alphanumeric());
            if made_by_mkdtemp(d) || (shard && stem_key == "#") {
                "#"
            } else {
                d
            }
        })
        .collect();
    Some(format!("{}/{stem_key}.{ext}", dirs.join("/")))
}

/// The file names of a snapshot's frames, each once.
fn files(snap: &Snapshot) -> FxHashMap<&str, StrId> {
    (0..snap.stacks.frame_count())
        .map(|i| {
            snap.stacks
                .frame(crate::snapshot::FrameId(i as u32))
                .filename
        })
        .map(|f| (snap.str(f), f))
        .collect()
}

/// The new run's generated files matched to the base run's ([module docs](self)).
pub fn renames(base: &Snapshot, new: &Snapshot) -> Renames {
    let (fb, fnew) = (files(base), files(new));
    // each run's files the other lacks, by their name without the generated part
    let by_key = |own: &FxHashMap<&str, StrId>, other: &FxHashMap<&str, StrId>| {
        let mut out: FxHashMap<String, Vec<StrId>> = FxHashMap::default();
        for (&name, &id) in own {
            if other.contains_key(name) {
                continue;
            }
            if let Some(k) = generated(name) {
                out.entry(k).or_default().push(id);
            }
        }
        out
    };
    let (kb, kn) = (by_key(&fb, &fnew), by_key(&fnew, &fb));
    let mut out = Renames::default();
    let mut seen = FxHashSet::default();
    for (k, ids_n) in &kn {
        let Some(ids_b) = kb.get(k) else { continue };
        // one of each, else which is which is a guess
        let ([id_n], [id_b]) = (&ids_n[..], &ids_b[..]) else {
            continue;
        };
        out.files.insert(*id_n, base.str(*id_b).to_string());
        let (short_n, short_b) = (new.short_file(*id_n), base.short_file(*id_b));
        if short_n != short_b && seen.insert(short_n.to_string()) {
            out.short.push((short_n.to_string(), short_b.to_string()));
        }
    }
    out.short.sort();
    out
}

impl Renames {
    /// Whether nothing is renamed.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// A key's text (a site or a module) with the new run's generated file names read as the
    /// base run's. A name is replaced only where a file name stands: followed by `:` and not
    /// preceded by a character of a name.
    pub fn apply(&self, text: String) -> String {
        if self.short.is_empty() {
            return text;
        }
        let mut text = text;
        for (from, to) in &self.short {
            if !text.contains(from.as_str()) {
                continue;
            }
            let mut out = String::with_capacity(text.len());
            let mut rest = text.as_str();
            while let Some(at) = rest.find(from.as_str()) {
                let before = if at > 0 {
                    rest[..at].chars().last()
                } else {
                    out.chars().last()
                };
                let after = rest[at + from.len()..].chars().next();
                let whole = !before.is_some_and(|c| c.is_alphanumeric() || "_.-/".contains(c))
                    && after == Some(':');
                out.push_str(&rest[..at]);
                out.push_str(if whole { to } else { from });
                rest = &rest[at + from.len()..];
            }
            out.push_str(rest);
            text = out;
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_names_lose_their_random_part() {
        let k = |p: &str| generated(p);
        // torch_geometric's propagate module, written with `tempfile`
        assert_eq!(
            k("/var/folders/x1/q9/T/torch_geometric.nn.conv.gcn_conv_GCNConv_propagate_m3fmqp0s.py"),
            k("/var/folders/x1/q9/T/torch_geometric.nn.conv.gcn_conv_GCNConv_propagate_nbcrtgso.py")
        );
        assert!(k(
            "/var/folders/x1/q9/T/torch_geometric.nn.conv.gcn_conv_GCNConv_propagate_m3fmqp0s.py"
        )
        .is_some());
        // in a directory `mkdtemp` made
        assert_eq!(
            k("/dev/shm/tmpab12_xyz/module_k2j4_x9a.py"),
            k("/dev/shm/tmp9q8w7e6r/module_zzzzzzzz.py")
        );
        // Inductor's code, named by a hash in a directory of its first characters
        assert_eq!(
            k("/scratch/torchinductor_me/c3/cc3jxq2z7ye4w5lyb5dhjimk7zmvq2p.py"),
            k("/scratch/torchinductor_me/ab/cabx7f3nqkzq6u4lp2o5hmi3wnbq6yd.py")
        );
        // an FX graph's code
        assert_eq!(
            k("<eval_with_key>.12"),
            Some("<eval_with_key>.#".to_string())
        );
        assert_eq!(k("<eval_with_key>.3"), k("<eval_with_key>.12"));
        // files written by hand keep their names, in a temporary directory too
        assert_eq!(k("/home/me/train_my_model.py"), None);
        assert_eq!(k("/dev/shm/train.py"), None);
        // a temporary directory of any of its usual names
        assert_eq!(k("tmp/gen_k2j4x9ab.py"), Some("tmp/gen_#.py".to_string()));
        assert!(k("Temp/gen_k2j4x9ab.py").is_some());
        assert_eq!(k("<frozen runpy>"), None);
        assert_eq!(k("<string>"), None);
    }

    /// Renames of one short name only.
    fn one(from: &str, to: &str) -> Renames {
        Renames {
            files: FxHashMap::default(),
            short: vec![(from.into(), to.into())],
        }
    }

    #[test]
    fn only_file_names_are_replaced_in_keys() {
        let r = one("<eval_with_key>.3", "<eval_with_key>.12");
        assert_eq!(
            r.apply("a.py:f:1;<eval_with_key>.3:forward:7".into()),
            "a.py:f:1;<eval_with_key>.12:forward:7"
        );
        // a longer name that begins the same is another file
        assert_eq!(
            r.apply("<eval_with_key>.31:forward:7".into()),
            "<eval_with_key>.31:forward:7"
        );
        let r = one("gen_abcd1234.py", "gen_zzzz9999.py");
        assert_eq!(
            r.apply("x.py:f:1 › gen_abcd1234.py:collect".into()),
            "x.py:f:1 › gen_zzzz9999.py:collect"
        );
        assert_eq!(
            r.apply("my_gen_abcd1234.py:collect".into()),
            "my_gen_abcd1234.py:collect"
        );
    }
}
