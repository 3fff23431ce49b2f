//! Where adapters may be read from: an adapter's `src` must resolve, symlinks followed,
//! inside the model directory or a directory of `option.adapter_dirs`; anything else is
//! refused before a byte of it is read.

use std::path::{Path, PathBuf};

/// The directories adapters may come from, canonicalized once.
#[derive(Debug, Clone, Default)]
pub struct AllowedDirs {
    dirs: Vec<PathBuf>,
}

impl AllowedDirs {
    /// `dirs` that exist (others are logged and skipped: nothing can be inside them).
    pub fn new<'a>(dirs: impl IntoIterator<Item = &'a Path>) -> Self {
        let dirs = dirs
            .into_iter()
            .filter_map(|d| match d.canonicalize() {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::warn!("adapter directory {}: {e}", d.display());
                    None
                }
            })
            .collect();
        AllowedDirs { dirs }
    }

    #[cfg(test)]
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// The canonical path of `src` when it lies inside an allowed directory; an error that
    /// says which directories are allowed otherwise.
    pub fn check(&self, src: &Path) -> Result<PathBuf, String> {
        if !src.is_absolute() {
            return Err(format!("src {} must be an absolute path", src.display()));
        }
        let real = src
            .canonicalize()
            .map_err(|e| format!("src {}: {e}", src.display()))?;
        if self.dirs.iter().any(|d| real.starts_with(d)) {
            return Ok(real);
        }
        let allowed: Vec<String> = self.dirs.iter().map(|d| d.display().to_string()).collect();
        Err(format!(
            "src {} is outside the directories adapters may be read from ({}); add its directory to option.adapter_dirs",
            src.display(),
            allowed.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_must_resolve_inside_an_allowed_directory() {
        let root = tempfile::tempdir().unwrap();
        let allowed = root.path().join("adapters");
        let outside = root.path().join("elsewhere");
        std::fs::create_dir_all(allowed.join("a1")).unwrap();
        std::fs::create_dir_all(outside.join("evil")).unwrap();
        let dirs = AllowedDirs::new([allowed.as_path(), Path::new("/no/such/dir")]);
        assert_eq!(dirs.dirs().len(), 1);
        assert!(dirs.check(&allowed.join("a1")).is_ok());
        let e = dirs.check(&outside.join("evil")).unwrap_err();
        assert!(
            e.contains("outside the directories") && e.contains("option.adapter_dirs"),
            "{e}"
        );
        // A symlink inside that points outside is judged by where it leads.
        std::os::unix::fs::symlink(outside.join("evil"), allowed.join("sneaky")).unwrap();
        assert!(dirs.check(&allowed.join("sneaky")).is_err());
        // `..` cannot climb out either.
        assert!(dirs.check(&allowed.join("../elsewhere/evil")).is_err());
        assert!(
            dirs.check(Path::new("relative/path"))
                .unwrap_err()
                .contains("absolute")
        );
        assert!(dirs.check(&allowed.join("missing")).is_err());
    }
}
