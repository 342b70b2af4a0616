//! The folders `memsnap mcp` may touch, and every file it reads or writes, opened beneath them.
//!
//! Each root is held open as a directory handle from the start. A path a client gives is taken
//! relative to the first root (or, when absolute, relative to the root it lies below) and opened
//! once, beneath that handle, by `cap-std`: `openat2` with `RESOLVE_BENEATH` where the kernel
//! has it, else a walk that opens one component at a time without following a link out. A link
//! that leads outside, a folder swapped for such a link while calls run, and `..` past the root
//! are refused by the same open; what is read is the handle that open gave, never the name
//! again. Files are opened without waiting (`O_NONBLOCK`) and must be regular files, so a named
//! pipe or a device is refused instead of blocking the server. Outputs are created new
//! (`O_CREAT | O_EXCL`, which never follows a link in the last component, dangling or not).

use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};

use cap_std::fs::{Dir, OpenOptions, OpenOptionsExt};

/// Why a path was not opened.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// It lies, or leads through a link, outside every root.
    #[error("outside the folders this server may read")]
    Outside,
    /// A folder, a pipe, a device or a socket where a file was wanted.
    #[error("not a regular file")]
    NotRegular,
    /// Not a folder where a folder was wanted.
    #[error("not a folder")]
    NotAFolder,
    /// An output that is already there (a link counts, dangling or not).
    #[error("exists; give a new file")]
    Exists,
    /// A side file larger than it may be.
    #[error("larger than {}", memsnap::units::bytes(*.0))]
    TooLarge(u64),
    /// Anything else the system said.
    #[error("{}", memsnap::error::io_text(.0))]
    Io(io::Error),
}

impl From<io::Error> for Refused {
    fn from(e: io::Error) -> Self {
        // cap-std reports an escape as permission denied with no OS error; the kernel's
        // RESOLVE_BENEATH as EXDEV; a link loop or a link where none may be as ELOOP
        let escaped = (e.kind() == io::ErrorKind::PermissionDenied && e.raw_os_error().is_none())
            || matches!(e.raw_os_error(), Some(libc::EXDEV) | Some(libc::ELOOP));
        if escaped {
            Refused::Outside
        } else if e.kind() == io::ErrorKind::AlreadyExists {
            Refused::Exists
        } else {
            Refused::Io(e)
        }
    }
}

/// A file's identity while it stays unchanged: the same device, inode, size and modification
/// time give the same decoded snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileId {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

/// A regular file opened beneath a root.
pub struct Opened {
    pub file: std::fs::File,
    pub id: FileId,
}

struct Root {
    /// Where it is (resolved when the server started).
    path: PathBuf,
    dir: Dir,
}

/// The roots, in the order given.
pub struct Roots {
    roots: Vec<Root>,
}

impl Roots {
    /// Opens each folder (resolving links once, at start).
    pub fn open(folders: &[PathBuf]) -> io::Result<Roots> {
        let mut roots = Vec::new();
        for f in folders {
            let path = f.canonicalize()?;
            let dir = Dir::open_ambient_dir(&path, cap_std::ambient_authority())?;
            roots.push(Root { path, dir });
        }
        Ok(Roots { roots })
    }

    /// The root a path is taken under and the path below it: a relative path is below the
    /// first root; an absolute one below the root whose folder begins it (as written, or with
    /// its folder's links resolved).
    fn locate(&self, given: &str) -> Result<(&Root, PathBuf), Refused> {
        let p = Path::new(given);
        if given.is_empty() {
            return Err(Refused::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an empty path",
            )));
        }
        if !p.is_absolute() {
            return Ok((&self.roots[0], p.to_path_buf()));
        }
        let below = |q: &Path| {
            self.roots.iter().find_map(|r| {
                q.strip_prefix(&r.path)
                    .ok()
                    .map(|rest| (r, rest.to_path_buf()))
            })
        };
        if let Some(found) = below(p) {
            return Ok(found);
        }
        // the folder written through a link to a root (`/tmp` for `/private/tmp`): resolving
        // it only finds the root; the open below is beneath the root whatever it finds
        if let (Some(parent), Some(name)) = (p.parent(), p.file_name()) {
            if let Ok(real) = parent.canonicalize() {
                if let Some((r, rest)) = below(&real) {
                    return Ok((r, rest.join(name)));
                }
            }
        }
        Err(Refused::Outside)
    }

    /// `given` as a path relative to its root, for answers (`.` for the root itself).
    pub fn relative(&self, given: &str) -> String {
        match self.locate(given) {
            Ok((_, rest)) if rest.as_os_str().is_empty() => ".".to_string(),
            Ok((_, rest)) => rest.display().to_string(),
            Err(_) => given.to_string(),
        }
    }

    /// The regular file at `given`, opened for reading beneath its root.
    pub fn read(&self, given: &str) -> Result<Opened, Refused> {
        let (root, rest) = self.locate(given)?;
        let mut options = OpenOptions::new();
        options
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
        let file = root.dir.open_with(dot(&rest), &options)?.into_std();
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(Refused::NotRegular);
        }
        Ok(Opened {
            id: file_id(&meta),
            file,
        })
    }

    /// The bytes of the small regular file at `given`, `None` when there is none; at most
    /// `max` bytes are read.
    pub fn read_small(&self, given: &Path, max: u64) -> Result<Option<Vec<u8>>, Refused> {
        let opened = match self.read(&given.to_string_lossy()) {
            Ok(o) => o,
            Err(Refused::Io(e)) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut bytes = Vec::new();
        opened.file.take(max + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > max {
            return Err(Refused::TooLarge(max));
        }
        Ok(Some(bytes))
    }

    /// Whether `given` is a folder beneath its root (links inside the root followed).
    pub fn is_folder(&self, given: &str) -> bool {
        self.locate(given)
            .ok()
            .and_then(|(root, rest)| root.dir.open_dir(dot(&rest)).ok())
            .is_some()
    }

    /// The names in the folder `given` that `keep` accepts, each as `given/NAME`, sorted; folders
    /// and anything that is not a regular file are left out.
    pub fn list(&self, given: &str, keep: impl Fn(&Path) -> bool) -> Result<Vec<String>, Refused> {
        let (root, rest) = self.locate(given)?;
        let dir = root
            .dir
            .open_dir(dot(&rest))
            .map_err(|e| match Refused::from(e) {
                Refused::Io(e) if e.raw_os_error() == Some(libc::ENOTDIR) => Refused::NotAFolder,
                other => other,
            })?;
        let mut out = Vec::new();
        for entry in dir.entries()?.flatten() {
            let is_file = entry.file_type().map(|t| t.is_file()).unwrap_or(false);
            let name = PathBuf::from(entry.file_name());
            if is_file && keep(&name) {
                out.push(Path::new(given).join(name).display().to_string());
            }
        }
        out.sort();
        Ok(out)
    }

    /// A new file at `given`, created beneath its root; fails if anything is there already.
    pub fn create(&self, given: &str) -> Result<std::fs::File, Refused> {
        let (root, rest) = self.locate(given)?;
        if rest.file_name().is_none() {
            return Err(Refused::NotRegular);
        }
        let mut options = OpenOptions::new();
        options
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOCTTY);
        Ok(root.dir.open_with(&rest, &options)?.into_std())
    }

    /// Removes the file at `given` (an output that could not be finished).
    pub fn remove(&self, given: &str) {
        if let Ok((root, rest)) = self.locate(given) {
            let _ = root.dir.remove_file(&rest);
        }
    }
}

/// The root itself for an empty path.
fn dot(rest: &Path) -> &Path {
    if rest.components().next().is_none()
        || rest.components().all(|c| matches!(c, Component::CurDir))
    {
        Path::new(".")
    } else {
        rest
    }
}

#[cfg(unix)]
fn file_id(meta: &std::fs::Metadata) -> FileId {
    use std::os::unix::fs::MetadataExt;
    FileId {
        dev: meta.dev(),
        ino: meta.ino(),
        len: meta.len(),
        mtime_ns: meta.mtime() as i128 * 1_000_000_000 + meta.mtime_nsec() as i128,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, Roots) {
        let top = tempfile::tempdir().unwrap();
        let root = top.path().join("root");
        let outside = top.path().join("outside");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(root.join("sub/a.pickle"), b"inside").unwrap();
        std::fs::write(outside.join("secret.pickle"), b"outside").unwrap();
        let roots = Roots::open(&[root]).unwrap();
        (top, roots)
    }

    fn read_all(roots: &Roots, p: &str) -> Result<Vec<u8>, Refused> {
        let mut o = roots.read(p)?;
        let mut v = Vec::new();
        o.file.read_to_end(&mut v).unwrap();
        Ok(v)
    }

    #[test]
    fn paths_are_relative_to_the_first_root_or_absolute_below_one() {
        let (top, roots) = setup();
        assert_eq!(read_all(&roots, "sub/a.pickle").unwrap(), b"inside");
        let abs = top.path().join("root/sub/a.pickle");
        assert_eq!(
            read_all(&roots, &abs.display().to_string()).unwrap(),
            b"inside"
        );
        assert_eq!(roots.relative(&abs.display().to_string()), "sub/a.pickle");
        let out = top.path().join("outside/secret.pickle");
        assert!(matches!(
            roots.read(&out.display().to_string()),
            Err(Refused::Outside)
        ));
        assert!(matches!(
            roots.read("../outside/secret.pickle"),
            Err(Refused::Outside)
        ));
        assert!(matches!(
            roots.read("sub/../../outside/secret.pickle"),
            Err(Refused::Outside)
        ));
    }

    #[test]
    fn links_that_leave_are_refused_for_reading_and_writing() {
        let (top, roots) = setup();
        let root = top.path().join("root");
        std::os::unix::fs::symlink("../outside/secret.pickle", root.join("leak.pickle")).unwrap();
        std::os::unix::fs::symlink("../outside", root.join("out")).unwrap();
        std::os::unix::fs::symlink("sub/a.pickle", root.join("fine.pickle")).unwrap();
        assert!(matches!(roots.read("leak.pickle"), Err(Refused::Outside)));
        assert!(matches!(
            roots.read("out/secret.pickle"),
            Err(Refused::Outside)
        ));
        assert_eq!(read_all(&roots, "fine.pickle").unwrap(), b"inside");
        // a dangling link whose target would be created outside
        std::os::unix::fs::symlink("../outside/escaped.png", root.join("new.png")).unwrap();
        assert!(roots.create("new.png").is_err());
        assert!(!top.path().join("outside/escaped.png").exists());
        assert!(roots.create("out/x.png").is_err());
        assert!(!top.path().join("outside/x.png").exists());
        // a new file beneath is fine, once
        roots.create("sub/t.png").unwrap();
        assert!(matches!(roots.create("sub/t.png"), Err(Refused::Exists)));
    }

    #[test]
    fn pipes_and_folders_are_not_files_and_do_not_block() {
        let (top, roots) = setup();
        let fifo = top.path().join("root/fifo.pickle");
        let c = std::ffi::CString::new(fifo.display().to_string()).unwrap();
        // SAFETY: a valid C string and mode
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(
            roots.read("fifo.pickle"),
            Err(Refused::NotRegular)
        ));
        assert!(matches!(roots.read("sub"), Err(Refused::NotRegular)));
        assert!(roots.is_folder("sub"));
        assert!(roots.is_folder("."));
        assert!(!roots.is_folder("sub/a.pickle"));
        let listed = roots.list("sub", |_| true).unwrap();
        assert_eq!(listed, ["sub/a.pickle"]);
        // the fifo is not listed as a file
        assert!(roots.list(".", |_| true).unwrap().is_empty());
    }
}
