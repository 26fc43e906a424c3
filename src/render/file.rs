//! Reading a file of the template directory: a regular file (or a symlink to one) of at most
//! [`MAX_FILE`] bytes, and nothing else. A FIFO with no writer there would block its read
//! forever, and a device such as `/dev/zero` would never end: the loader would hang at start, a
//! reload forever, and the process's exit behind it. Such a file is never read; the open itself
//! does not wait (`O_NONBLOCK`, which a regular file ignores), and the check is made on the
//! opened file, so a swap between a look and the read cannot slip one in.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read};
use std::path::Path;

/// The most a template file may hold: an email's HTML is kept far below it (Gmail clips a
/// message past 102 KB), and a reload reads every file of the directory.
pub const MAX_FILE: u64 = 1 << 20;

/// The bytes of `path`, or why it is not a template file (see the module's documentation).
pub fn read(path: &Path) -> io::Result<Vec<u8>> {
    let mut file = open(path)?;
    let meta = file.metadata()?;
    refuse(&meta)?;
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // It may have grown since: the bound holds for what is read, not only for what was seen.
    file.by_ref().take(MAX_FILE + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// [`read`], as UTF-8 text.
pub fn read_to_string(path: &Path) -> io::Result<String> {
    String::from_utf8(read(path)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not valid UTF-8"))
}

/// What a fingerprint of the directory takes of the file at `path`: its bytes, or, for one
/// [`read`] refuses, its kind, size and time (so its change is seen, and it is never read).
pub fn identity(path: &Path) -> io::Result<Vec<u8>> {
    let meta = std::fs::metadata(path)?;
    if refuse(&meta).is_ok() {
        return read(path);
    }
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .unwrap_or_default();
    Ok(format!("unread {} {} {modified:?}", meta.is_file(), meta.len()).into_bytes())
}

fn refuse(meta: &Metadata) -> io::Result<()> {
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file (a FIFO, socket or device?): a template directory holds only files and folders",
        ));
    }
    if meta.len() > MAX_FILE {
        return Err(too_large(meta.len()));
    }
    Ok(())
}

fn too_large(len: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{len} bytes, more than the {MAX_FILE} a template file may hold"),
    )
}

#[cfg(unix)]
fn open(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

#[cfg(not(unix))]
fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fifo(path: &Path) {
        let made = std::process::Command::new("mkfifo").arg(path).status();
        assert!(made.unwrap().success(), "mkfifo {}", path.display());
    }

    #[test]
    fn a_fifo_is_refused_without_waiting_for_a_writer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("html.hbs");
        fifo(&path);
        // A blocking open of a FIFO with no writer never returns: this test would hang.
        let e = read(&path).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        assert!(identity(&path).unwrap().starts_with(b"unread false"));
    }

    #[test]
    fn a_device_is_refused() {
        let e = read(Path::new("/dev/zero")).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }

    #[test]
    fn a_file_is_read_up_to_the_bound_and_refused_past_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("html.hbs");
        std::fs::write(&path, vec![b'a'; MAX_FILE as usize]).unwrap();
        assert_eq!(read(&path).unwrap().len() as u64, MAX_FILE);
        assert_eq!(identity(&path).unwrap().len() as u64, MAX_FILE);
        std::fs::write(&path, vec![b'a'; MAX_FILE as usize + 1]).unwrap();
        let e = read(&path).unwrap_err();
        assert!(
            e.to_string()
                .contains("1048577 bytes, more than the 1048576"),
            "{e}"
        );
        assert!(identity(&path).unwrap().starts_with(b"unread true 1048577"));
    }

    #[test]
    fn text_must_be_utf8() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("subject.hbs");
        std::fs::write(&path, [0xff, 0xfe]).unwrap();
        assert!(read_to_string(&path).is_err());
        std::fs::write(&path, "Héllo").unwrap();
        assert_eq!(read_to_string(&path).unwrap(), "Héllo");
    }
}
