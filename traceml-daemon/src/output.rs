//! Where the daemon writes: directories it creates for itself (`serve`'s state directory and
//! job directories) are private to the daemon's group (0750) and never followed through a
//! symbolic link planted by someone else.
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

/// Creates `dir` (and missing parents) with mode 0750, or checks an existing one: it must be a
/// real directory, not a symbolic link.
pub fn create_dir_private(dir: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.file_type().is_symlink() => {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{} is a symbolic link: refused", dir.display()),
            ));
        }
        Ok(m) if !m.is_dir() => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a directory", dir.display()),
            ));
        }
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(dir)?;
    // The umask may have narrowed the mode; never widened it.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o750))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_dirs_and_planted_links() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("state/job-1");
        create_dir_private(&d).unwrap();
        let mode = std::fs::metadata(&d).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o750);
        create_dir_private(&d).unwrap();
        let link = t.path().join("state/job-2");
        std::os::unix::fs::symlink("/tmp", &link).unwrap();
        let e = create_dir_private(&link).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        std::fs::write(t.path().join("file"), b"").unwrap();
        assert!(create_dir_private(&t.path().join("file")).is_err());
    }
}
