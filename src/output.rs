//! Every file memsnap writes goes through here, so that no output is ever half a file and no
//! command ever writes over what it reads; so do the small files it reads besides snapshots
//! (rules, sources: [`read_small`]), so that none of them can be endless or huge.
//!
//! - An output is written to a temporary file in the target's own folder and renamed over the
//!   target once complete ([`Pending::commit`]): a reader, or a second memsnap writing the same
//!   name at the same moment, sees the old file or the new one, never a mix. A target that
//!   exists and is not a regular file (`/dev/null`, a pipe) is written in place.
//! - Files this process reads are remembered ([`note_input`]) by identity (device and inode),
//!   so that the same file reached through another path (a symlink, a hard link,
//!   `dir/../in.pickle`) is recognised; writing over one is refused, `--force` or not.
//! - An existing file whose name memsnap chose itself ([`Naming::Chosen`]: the per-device image
//!   names, the charts of a `--png` folder, export tables, the default `flamegraph.svg`) is
//!   written over only when the caller forces it; a name the user gave is theirs to reuse.
//! - A target that is a symbolic link is resolved: the file it points to is replaced, the link
//!   stays.
//!
//! Unique temporary names, created exclusively and removed when dropped, come from `tempfile`.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub use crate::error::{OutputError, SmallFileError};

/// Who chose an output's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Naming {
    /// The user gave this exact name: an existing file of that name is replaced.
    Named,
    /// memsnap derived the name: an existing file is replaced only when forced.
    Chosen,
}

/// The identity of a file: the same for every path that reaches it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Identity {
    #[cfg(unix)]
    dev_ino: (u64, u64),
    #[cfg(not(unix))]
    path: PathBuf,
}

impl Identity {
    fn of_metadata(m: &fs::Metadata, _path: &Path) -> Option<Identity> {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            let _ = _path;
            Some(Identity {
                dev_ino: (m.dev(), m.ino()),
            })
        }
        #[cfg(not(unix))]
        {
            let _ = m;
            Some(Identity {
                path: fs::canonicalize(_path).ok()?,
            })
        }
    }

    fn of(path: &Path) -> Option<Identity> {
        let m = fs::metadata(path).ok()?;
        Identity::of_metadata(&m, path)
    }
}

/// The path that names standard input (`memsnap report -`).
pub const STDIN: &str = "-";

/// Files read, by identity.
#[derive(Debug, Default)]
struct Inputs(Mutex<Vec<Identity>>);

impl Inputs {
    const fn new() -> Inputs {
        Inputs(Mutex::new(Vec::new()))
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Vec<Identity>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn note(&self, path: &Path) {
        let id = if path == Path::new(STDIN) {
            stdin_identity()
        } else {
            Identity::of(path)
        };
        if let Some(id) = id {
            let mut known = self.known();
            if !known.contains(&id) {
                known.push(id);
            }
        }
    }

    fn contains(&self, path: &Path) -> bool {
        Identity::of(path).is_some_and(|id| self.known().contains(&id))
    }
}

/// The files this process has read or will read.
static INPUTS: Inputs = Inputs::new();

/// Remembers `path` as an input of this process (standard input when it is `-`); outputs will
/// not be written over it. A path that does not exist is ignored.
pub fn note_input(path: &Path) {
    INPUTS.note(path);
}

/// The file behind standard input, when it is redirected from one.
fn stdin_identity() -> Option<Identity> {
    #[cfg(unix)]
    {
        use std::os::fd::AsFd;
        let fd = io::stdin().as_fd().try_clone_to_owned().ok()?;
        let m = fs::File::from(fd).metadata().ok()?;
        m.is_file()
            .then(|| Identity::of_metadata(&m, Path::new("")))
            .flatten()
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// The bytes of a small input (a rules file, a source file a frame names): a regular file of
/// at most `max` bytes, remembered as an input ([`note_input`]). The kind is asked before
/// opening, as opening a named pipe waits for a writer; the read stops after `max + 1` bytes
/// whatever size the file claims (files of `/proc` say they are empty and never end).
pub fn read_small(path: &Path, max: u64) -> Result<Vec<u8>, SmallFileError> {
    use io::Read;
    let meta = fs::metadata(path)?;
    if !meta.is_file() {
        return Err(SmallFileError::NotRegular);
    }
    if meta.len() > max {
        return Err(SmallFileError::TooLarge(max));
    }
    let file = fs::File::open(path)?;
    note_input(path);
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(SmallFileError::TooLarge(max));
    }
    Ok(bytes)
}

/// Follows symbolic links from `path` to the name that will be replaced (at most 40 links, as
/// the kernel does; a dangling link gives the name it points to).
fn resolve(path: &Path) -> PathBuf {
    let mut at = path.to_path_buf();
    for _ in 0..40 {
        match fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => match fs::read_link(&at) {
                Ok(link) if link.is_absolute() => at = link,
                Ok(link) => {
                    let dir = at.parent().map(Path::to_path_buf).unwrap_or_default();
                    at = dir.join(link);
                }
                Err(_) => break,
            },
            _ => break,
        }
    }
    at
}

/// The folder a file named `path` lies in (`.` for a bare name).
fn folder_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Checks that `path` may be written: its folder exists, it is no folder and no input, and,
/// for a name memsnap chose, it does not exist yet or is of the kind memsnap writes there
/// (a re-run replaces its own outputs), unless `force`. Gives the name that will be
/// replaced (symbolic links followed). Commands call it before their work, so that a refusal
/// costs nothing; [`create`] checks again.
pub fn check(path: &Path, naming: Naming, force: bool) -> Result<PathBuf, OutputError> {
    check_against(&INPUTS, path, naming, force)
}

fn check_against(
    inputs: &'static Inputs,
    path: &Path,
    naming: Naming,
    force: bool,
) -> Result<PathBuf, OutputError> {
    let target = resolve(path);
    let folder = folder_of(&target);
    if !folder.is_dir() {
        return Err(OutputError::NoFolder(folder_of(path)));
    }
    match fs::metadata(&target) {
        Ok(m) if m.is_dir() => Err(OutputError::IsFolder),
        Ok(_) if inputs.contains(&target) => Err(OutputError::IsInput),
        Ok(m) if m.is_file() && naming == Naming::Chosen && !force && !memsnap_kind(&target) => {
            Err(OutputError::Exists)
        }
        _ => Ok(target),
    }
}

/// Whether the file at `path` is of the kind memsnap writes under its name (a PNG that is a
/// PNG, a page that is HTML, a table that is CSV or Parquet): a re-run replaces it, where a
/// file of another kind under a name memsnap chose is refused unless `--force`.
fn memsnap_kind(path: &Path) -> bool {
    use std::io::Read as _;
    let mut head = [0u8; 512];
    let n = fs::File::open(path)
        .and_then(|f| f.take(head.len() as u64).read(&mut head))
        .unwrap_or(0);
    let head = &head[..n];
    let text = head.trim_ascii_start();
    let lower = text.to_ascii_lowercase();
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "png" => head.starts_with(b"\x89PNG\r\n\x1a\n"),
        "svg" => lower.starts_with(b"<?xml") || lower.starts_with(b"<svg"),
        "html" => lower.starts_with(b"<!doctype html"),
        "parquet" => head.starts_with(b"PAR1"),
        "json" | "jsonl" => text.starts_with(b"{") || text.starts_with(b"["),
        "csv" => !head.is_empty() && !head.contains(&0),
        _ => false,
    }
}

/// An output being written: a temporary file next to its target, or the target itself when
/// that is a device or a pipe.
#[derive(Debug)]
pub struct Pending {
    target: PathBuf,
    file: Temp,
    inputs: &'static Inputs,
}

#[derive(Debug)]
enum Temp {
    Renamed(tempfile::NamedTempFile),
    InPlace(fs::File),
}

/// Starts writing `path` (see [`check`] for what is refused). The file appears under its name
/// only at [`Pending::commit`]; dropped uncommitted, nothing is left behind.
pub fn create(path: &Path, naming: Naming, force: bool) -> Result<Pending, OutputError> {
    create_against(&INPUTS, path, naming, force)
}

fn create_against(
    inputs: &'static Inputs,
    path: &Path,
    naming: Naming,
    force: bool,
) -> Result<Pending, OutputError> {
    let target = check_against(inputs, path, naming, force)?;
    if fs::metadata(&target).is_ok_and(|m| !m.is_file()) {
        let file = fs::OpenOptions::new().write(true).open(&target)?;
        return Ok(Pending {
            target,
            file: Temp::InPlace(file),
            inputs,
        });
    }
    let name = target
        .file_name()
        .map_or("output".into(), |n| n.to_string_lossy().into_owned());
    // The temporary name keeps the extension: image encoders choose the format by it.
    let suffix = target
        .extension()
        .map_or(String::new(), |e| format!(".{}", e.to_string_lossy()));
    let prefix = format!(".{name}.");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(&suffix);
    #[cfg(unix)]
    {
        // The permissions File::create gives (the umask applies), not tempfile's private 0600.
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(fs::Permissions::from_mode(0o666));
    }
    let temp = builder.tempfile_in(folder_of(&target))?;
    Ok(Pending {
        target,
        file: Temp::Renamed(temp),
        inputs,
    })
}

impl Pending {
    /// Where to write: the temporary file (for writers that open a path themselves).
    pub fn path(&self) -> &Path {
        match &self.file {
            Temp::Renamed(t) => t.path(),
            Temp::InPlace(_) => &self.target,
        }
    }

    /// The open file to write to.
    pub fn file(&mut self) -> &mut fs::File {
        match &mut self.file {
            Temp::Renamed(t) => t.as_file_mut(),
            Temp::InPlace(f) => f,
        }
    }

    /// The name the output will have.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Puts the finished file in place of its target, unless the target has meanwhile become a
    /// file this process reads.
    pub fn commit(self) -> Result<(), OutputError> {
        match self.file {
            Temp::InPlace(f) => {
                f.sync_data().or_else(ignore_unsupported)?;
                Ok(())
            }
            Temp::Renamed(temp) => {
                if self.inputs.contains(&self.target) {
                    return Err(OutputError::IsInput);
                }
                temp.persist(&self.target).map_err(|e| e.error)?;
                Ok(())
            }
        }
    }
}

/// Devices such as `/dev/null` cannot be synced; that is no failure.
fn ignore_unsupported(e: io::Error) -> io::Result<()> {
    if e.kind() == io::ErrorKind::InvalidInput || e.kind() == io::ErrorKind::Unsupported {
        Ok(())
    } else {
        Err(e)
    }
}

/// Writes `bytes` as the whole of `path`.
pub fn write(path: &Path, naming: Naming, force: bool, bytes: &[u8]) -> Result<(), OutputError> {
    write_against(&INPUTS, path, naming, force, bytes)
}

fn write_against(
    inputs: &'static Inputs,
    path: &Path,
    naming: Naming,
    force: bool,
    bytes: &[u8],
) -> Result<(), OutputError> {
    use io::Write;
    let mut out = create_against(inputs, path, naming, force)?;
    out.file().write_all(bytes)?;
    out.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A registry of this test's own: other tests of the process read files whose inodes a
    /// later temporary file may reuse.
    fn own() -> &'static Inputs {
        Box::leak(Box::new(Inputs::new()))
    }

    fn write(path: &Path, naming: Naming, force: bool, bytes: &[u8]) -> Result<(), OutputError> {
        write_against(OWN.with(|o| *o), path, naming, force, bytes)
    }

    thread_local! {
        static OWN: &'static Inputs = own();
    }

    #[test]
    fn an_input_is_never_written_whatever_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.pickle");
        fs::write(&input, b"original").unwrap();
        OWN.with(|o| o.note(&input));
        let sub = dir.path().join("sub");
        fs::create_dir(&sub).unwrap();
        let hard = dir.path().join("hard.pickle");
        fs::hard_link(&input, &hard).unwrap();
        let mut paths = vec![
            input.clone(),
            sub.join("..").join("in.pickle"),
            hard.clone(),
        ];
        #[cfg(unix)]
        {
            let link = dir.path().join("link.pickle");
            std::os::unix::fs::symlink(&input, &link).unwrap();
            paths.push(link);
        }
        for p in &paths {
            for force in [false, true] {
                let e = write(p, Naming::Named, force, b"new").unwrap_err();
                assert!(matches!(e, OutputError::IsInput), "{}: {e}", p.display());
            }
        }
        assert_eq!(fs::read(&input).unwrap(), b"original");
    }

    #[test]
    fn chosen_names_are_kept_unless_forced_and_named_ones_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("t-device1.png");
        fs::write(&out, b"old").unwrap();
        let e = write(&out, Naming::Chosen, false, b"new").unwrap_err();
        assert!(matches!(e, OutputError::Exists));
        assert_eq!(fs::read(&out).unwrap(), b"old");
        write(&out, Naming::Chosen, true, b"forced").unwrap();
        assert_eq!(fs::read(&out).unwrap(), b"forced");
        write(&out, Naming::Named, false, b"named").unwrap();
        assert_eq!(fs::read(&out).unwrap(), b"named");
        // No temporary file is left next to it.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_rerun_replaces_what_memsnap_wrote_under_its_names() {
        let dir = tempfile::tempdir().unwrap();
        let cases: [(&str, &[u8], &[u8]); 6] = [
            ("t-device0.png", b"\x89PNG\r\n\x1a\n....", b"not a png"),
            ("flamegraph.svg", b"<?xml version=\"1.0\"?><svg/>", b"notes"),
            ("s.html", b"<!DOCTYPE html>\n<html>", b"<p>mine</p>"),
            ("events.parquet", b"PAR1....", b"\x00\x01"),
            ("peak.jsonl", b"{\"a\": 1}\n", b"mine"),
            ("peak.csv", b"a,b\n1,2\n", b"\x00binary"),
        ];
        for (name, ours, theirs) in cases {
            let out = dir.path().join(name);
            fs::write(&out, ours).unwrap();
            write(&out, Naming::Chosen, false, b"again").unwrap();
            assert_eq!(fs::read(&out).unwrap(), b"again", "{name}");
            fs::write(&out, theirs).unwrap();
            let e = write(&out, Naming::Chosen, false, b"again").unwrap_err();
            assert!(matches!(e, OutputError::Exists), "{name}");
            assert_eq!(fs::read(&out).unwrap(), theirs, "{name}");
        }
    }

    #[test]
    fn nothing_appears_before_commit_and_nothing_stays_after_a_drop() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out.pickle");
        {
            let mut p = create_against(own(), &target, Naming::Named, false).unwrap();
            io::Write::write_all(p.file(), b"half").unwrap();
            assert!(!target.exists());
            assert_eq!(p.path().extension().unwrap(), "pickle");
        }
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
        let e = check_against(
            own(),
            &dir.path().join("no/such/out.png"),
            Naming::Named,
            false,
        )
        .unwrap_err();
        assert!(matches!(e, OutputError::NoFolder(_)), "{e}");
        let e = check_against(own(), dir.path(), Naming::Named, false).unwrap_err();
        assert!(matches!(e, OutputError::IsFolder), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn a_link_is_followed_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.svg");
        fs::write(&real, b"old").unwrap();
        let link = dir.path().join("link.svg");
        std::os::unix::fs::symlink("real.svg", &link).unwrap();
        write(&link, Naming::Named, false, b"new").unwrap();
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(fs::read(&real).unwrap(), b"new");
    }

    #[cfg(unix)]
    #[test]
    fn devices_are_written_in_place() {
        write(Path::new("/dev/null"), Naming::Named, false, b"x").unwrap();
        if Path::new("/dev/full").exists() {
            let e = write(Path::new("/dev/full"), Naming::Named, false, b"x").unwrap_err();
            assert!(e.to_string().contains("No space left"), "{e}");
        }
    }
}
